"""Training data: the sample schema, loaders for files / hub / plugin datasets, validation, batching.

Every row becomes a :class:`Sample` before any generation starts, so a bad row fails the run at load time with a
message naming the file, the row and the field. Three row layouts are accepted:

(a) verl's parquet as it is: ``data_source``, ``prompt`` (chat messages),
    ``reward_model: {"ground_truth": ..., "style": ...}``, ``extra_info``, ``ability``;
(b) plugrl's schema: ``prompt`` (text or chat messages), ``data_source``, ``ground_truth``, ``extra_info``;
(c) a field mapping: ``data.question_field`` (plain text, one user message), ``data.answer_field`` (ground truth).

Other columns stay in :attr:`Sample.row` (reward functions and templates read them, e.g. countdown's ``nums``).
Origins: ``data/train.parquet row 17`` (parquet, ``.json`` and hub rows count from 0, as pandas does),
``data/train.jsonl line 18`` (JSON Lines count lines from 1, as editors do).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from plugrl.config import DataConfig
    from plugrl.specs import Registry

log = logging.getLogger("plugrl.data")

ROLES = ("system", "user", "assistant")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
HUB_PREFIX = "hub:"
_SHOWN_INVALID = 3  # invalid rows that data.skip_invalid logs one by one

T = TypeVar("T")


class DataError(ValueError):
    """A data problem; the message names the origin (file and row), the field and the fix."""


@dataclass
class Sample:
    """One prompt of the training or validation data, validated.

    prompt: raw text, or chat messages ``[{"role": ..., "content": ...}]`` (roles system/user/assistant); ``""``
        only when ``data.template`` / ``data.raw_template`` builds it from the row.
    data_source: routes the sample to its reward functions.
    ground_truth: what the reward function compares against; None only for a row of a data source that no
        reward function scores (its environment does) and that has none.
    extra_info: verl's ``extra_info`` (``{}`` when absent).
    row: the original row with all its columns.
    origin: where the row came from, e.g. ``data/train.parquet row 17``; uid: a stable id derived from it.
    images: the row's images (plugrl-vision's ``RowImage``: ``.open()`` gives the RGB ``PIL.Image``), in the
        order of their ``<image>`` places in the prompt; [] for a text sample.
    """

    prompt: str | list[dict[str, str]]
    data_source: str
    ground_truth: Any
    extra_info: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    uid: str = ""
    images: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.uid:
            self.uid = make_uid(self.origin)


def make_uid(origin: str) -> str:
    """A short stable id for a sample from its origin."""
    return hashlib.sha1(origin.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# --------------------------------------------------------------------------- reading rows


def _is_data_file(p: Path) -> bool:
    return p.suffix.lower() in DATA_SUFFIXES


def _looks_local(text: str) -> bool:
    """True for strings that can only mean a local path (a data-file suffix or a path prefix)."""
    return text.lower().endswith(DATA_SUFFIXES) or text.startswith(("/", "./", "../", "~", "."))


def _read_jsonl_lines(path: Path, data: bytes) -> Iterator[tuple[str, dict[str, Any] | DataError]]:
    # Undecodable bytes become lone surrogates (surrogateescape); row validation
    # then reports them with the field they sit in.
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        line = raw.decode("utf-8", "surrogateescape").strip()
        if not line:
            continue
        origin = f"{path} line {lineno}"
        try:
            row = json.loads(line)
        except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
            yield (
                origin,
                DataError(
                    f"{origin}: not valid JSON ({_json_problem(e)}); each line of a .jsonl file must be one JSON object"
                ),
            )
            continue
        yield origin, row


def _json_problem(e: BaseException, *, line: bool = False) -> str:
    """What json.loads objected to: a syntax error's place, nesting too deep, a number too long."""
    if isinstance(e, json.JSONDecodeError):
        return f"{e.msg} at {f'line {e.lineno} ' if line else ''}column {e.colno}"
    if isinstance(e, RecursionError):
        return "arrays or objects nested too deeply"
    return str(e).split(";")[0]  # e.g. "Exceeds the limit (4300 digits) for integer string conversion: ..."


def _read_json(path: Path) -> Iterator[tuple[str, dict[str, Any] | DataError]]:
    data = path.read_bytes()
    text = data.decode("utf-8", "surrogateescape")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError is a ValueError
        if isinstance(e, json.JSONDecodeError) and e.msg == "Extra data":  # JSON Lines saved as .json
            yield from _read_jsonl_lines(path, data)  # (what datasets' to_json writes)
            return
        raise DataError(f"{path}: not valid JSON ({_json_problem(e, line=True)})") from None
    if isinstance(doc, Mapping) and isinstance(doc.get("data"), list):
        doc = doc["data"]
    if not isinstance(doc, list):
        raise DataError(
            f'{path}: a .json data file must hold a list of rows or {{"data": [rows]}}, '
            f"got {type(doc).__name__}; JSON Lines files should be named .jsonl"
        )
    for i, row in enumerate(doc):
        yield f"{path} row {i}", row


def _read_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any] | DataError]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - any reader failure means the same thing to the user
        raise DataError(f"{path}: cannot be read as parquet ({type(e).__name__}: {e})") from None
    batches = pf.iter_batches(batch_size=1024)
    i = 0
    while True:
        try:
            batch = next(batches, None)
        except Exception as e:  # noqa: BLE001 - a damaged page or column chunk
            raise DataError(
                f"{path}: cannot be read as parquet from row {i} on ({type(e).__name__}: {e}); the file is damaged"
            ) from None
        if batch is None:
            return
        try:
            rows: list[Any] = batch.to_pylist()  # nested structs/lists become dicts/lists, not numpy
        except UnicodeDecodeError:
            rows = [_parquet_row(path, batch, i, j) for j in range(batch.num_rows)]
        for row in rows:
            yield f"{path} row {i}", row
            i += 1


def _parquet_row(path: Path, batch: Any, start: int, j: int) -> dict[str, Any] | DataError:
    """Row ``j`` of a record batch that holds invalid UTF-8 somewhere: the row, or a DataError naming its column."""
    try:
        return batch.slice(j, 1).to_pylist()[0]
    except UnicodeDecodeError as e:
        error = e
    names = batch.schema.names
    column = next((n for n, c in zip(names, batch.columns, strict=True) if _undecodable(c.slice(j, 1))), None)
    where = f"field '{column}' " if column is not None else ""
    return DataError(
        f"{path} row {start + j}: {where}holds text that is not valid UTF-8 ({error.reason} at byte {error.start}); "
        "re-write the file with UTF-8 text"
    )


def _undecodable(column: Any) -> bool:
    try:
        column.to_pylist()
    except UnicodeDecodeError:
        return True
    return False


def _split_files(directory: Path, split: str) -> list[Path]:
    files = sorted(
        p
        for p in directory.rglob("*")
        if p.is_file() and _is_data_file(p) and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )
    # HF-style directories hold train-0000.parquet next to test-0000.parquet: keep the split's files if
    # any file names it, else use them all.
    pattern = re.compile(rf"(^|[-_./]){re.escape(split)}([-_.]|$)")
    named = [p for p in files if pattern.search(str(p.relative_to(directory)))]
    return named or files


def _read_local(path: Path, split: str) -> Iterator[tuple[str, dict[str, Any] | DataError, Path]]:
    """Rows of a local file (or a directory of them) with their origin and the folder of their file."""
    if path.is_dir():
        files = _split_files(path, split)
        if not files:
            raise DataError(f"directory {str(path)!r} holds no {'/'.join(DATA_SUFFIXES)} files")
        for f in files:
            yield from _read_local(f, split)
        return
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        rows = _read_parquet(path)
    elif suffix == ".jsonl":
        rows = _read_jsonl_lines(path, path.read_bytes())
    elif suffix == ".json":
        rows = _read_json(path)
    else:
        raise DataError(f"{path}: unsupported file type {suffix!r}; use {', '.join(DATA_SUFFIXES)}")
    for origin, row in rows:
        yield origin, row, path.parent


def _read_hub(ident: str, split: str) -> Iterator[tuple[str, dict[str, Any] | DataError]]:
    """``owner/name`` or ``owner/name:config`` through ``datasets.load_dataset`` (needs the network or a cache)."""
    name, _, config = ident.partition(":")
    try:
        import datasets

        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # noqa: BLE001 - offline, unknown id, missing split: all reported the same way
        raise DataError(
            f"{ident!r} does not exist locally and could not be loaded from the Hugging Face hub "
            f"(split {split!r}): {type(e).__name__}: {e}. Check the path (local files must end in "
            f"{', '.join(DATA_SUFFIXES)} or be a directory of them), or go online for hub datasets"
        ) from None
    for i, row in enumerate(ds):
        yield f"hub:{ident} [{split}] row {i}", row


def _iter_rows(path_or_id: str, split: str) -> Iterator[tuple[str, dict[str, Any] | DataError, Path | None]]:
    """Rows with their origin and the folder of the local file they came from (relative image paths are read
    there; None for a hub dataset); a row that cannot even be parsed comes as a DataError instead of a dict."""
    text = str(path_or_id)
    path = Path(text).expanduser()
    if not text.startswith(HUB_PREFIX) and path.exists():
        yield from _read_local(path, split)
        return
    if not text.startswith(HUB_PREFIX) and _looks_local(text):
        raise DataError(
            f"data file {text!r} does not exist (working directory: {Path.cwd()}); fix the path in "
            "data.train_files / data.val_files, or write hub datasets as 'hub:owner/name'"
        )
    for origin, row in _read_hub(text.removeprefix(HUB_PREFIX), split):
        yield origin, row, None


def load_rows(path_or_id: str, split: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(origin, row)`` from a local ``.parquet`` / ``.jsonl`` / ``.json`` file, a directory of them,
    or a hub dataset (``hub:owner/name[:config]``, or any id that is not a local path).

    A directory yields its files sorted, only those whose names contain ``split`` when some do
    (``train-00000.parquet``, ``data/test.jsonl``). Unparseable rows (bad JSON) raise :class:`DataError`;
    undecodable bytes in JSON files are kept as lone surrogates for :func:`row_to_sample` to report.
    """
    for origin, row, _ in _iter_rows(path_or_id, split):
        if isinstance(row, DataError):
            raise row
        yield origin, row


# --------------------------------------------------------------------------- validation


def _find_bad_text(value: Any, where: str) -> str | None:
    """Describe the first string under ``value`` that cannot be encoded as UTF-8, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            code = ord(value[e.start])
            what = (
                f"the byte 0x{code - 0xDC00:02x}, which is not valid UTF-8,"
                if 0xDC80 <= code <= 0xDCFF
                else f"a lone surrogate U+{code:04X}"
            )
            return f"field '{where}' holds {what} at character {e.start} ({value[max(0, e.start - 20) : e.start]!r}…)"
        return None
    if isinstance(value, Mapping):
        for k, v in value.items():
            key = str(k)
            bad = _find_bad_text(key, f"{where}.<key>" if where else "<key>") or _find_bad_text(
                v, f"{where}.{key}" if where else key
            )
            if bad:
                return bad
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            bad = _find_bad_text(v, f"{where}[{i}]")
            if bad:
                return bad
    return None


def validate_messages(messages: Any, where: str) -> list[dict[str, str]]:
    """Check chat messages and return them as plain ``{"role", "content"}`` dicts; ``where`` starts every error
    message (e.g. ``"data/x.parquet row 3: field 'prompt'"``)."""
    if not isinstance(messages, list | tuple):
        raise DataError(f"{where} must be text or a list of chat messages, got {type(messages).__name__}")
    if not messages:
        raise DataError(f"{where} is an empty list of messages; every prompt needs at least one user message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise DataError(f"{where}[{i}] must be a message {{'role': ..., 'content': ...}}, got {type(m).__name__}")
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            raise DataError(f"{where}[{i}] has no {' or '.join(repr(k) for k in missing)}; messages need both")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise DataError(f"{where}[{i}] has role {role!r}; known roles are {', '.join(ROLES)}")
        if isinstance(content, list | tuple):
            content = _joined_parts(content, f"{where}[{i}].content")
        if not isinstance(content, str):
            raise DataError(f"{where}[{i}].content must be a string or a list of parts, got {type(content).__name__}")
        out.append({"role": role, "content": content})
    if not any(m["content"].strip() for m in out):
        raise DataError(f"{where} is empty: every message has blank content")
    return out


def _joined_parts(parts: Sequence[Any], where: str) -> str:
    """Multi-part content (the processors' chat format) as one text: text parts joined, each image part an
    ``<image>`` placeholder at its place (the images themselves travel in :attr:`Sample.images`)."""
    text = []
    for k, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
        elif kind == "image":
            text.append("<image>")
        else:
            raise DataError(
                f"{where}[{k}] must be {{'type': 'text', 'text': ...}} or {{'type': 'image'}}, got "
                f"{part if isinstance(part, Mapping) else type(part).__name__}"
            )
    return "".join(text)


def _fields(row: Mapping[str, Any]) -> str:
    return ", ".join(repr(str(k)) for k in row) or "none"


def _question_prompt(row: dict[str, Any], origin: str, field: str) -> list[dict[str, str]]:
    """The prompt from a plain-question field (``data.question_field``): one user message."""
    if field not in row:
        raise DataError(f"{origin}: no field '{field}' (data.question_field); the row has {_fields(row)}")
    q = row[field]
    if not isinstance(q, str):
        raise DataError(f"{origin}: field '{field}' (data.question_field) must be text, got {type(q).__name__}")
    if not q.strip():
        raise DataError(f"{origin}: field '{field}' (data.question_field) is empty")
    return [{"role": "user", "content": q}]


def _row_prompt(row: dict[str, Any], origin: str, cfg: DataConfig) -> str | list[dict[str, str]]:
    """The row's prompt: the question field, else the prompt field (text or messages), else "" for a template."""
    if cfg.question_field:
        return _question_prompt(row, origin, cfg.question_field)
    if cfg.prompt_key in row and row[cfg.prompt_key] is not None:
        p = row[cfg.prompt_key]
        where = f"{origin}: field '{cfg.prompt_key}'"
        if isinstance(p, str):
            if not p.strip():
                raise DataError(f"{where} is empty")
            return p
        return validate_messages(p, where)
    if cfg.template or cfg.raw_template:
        return ""  # the template builds it from the row
    raise DataError(
        f"{origin}: no prompt: field '{cfg.prompt_key}' is missing or null (the row has {_fields(row)}); "
        "set data.prompt_key to the field holding the prompt, data.question_field to a plain-question field, "
        "or data.template / data.raw_template to build it from the row"
    )


_VERL_GROUND_TRUTH = "reward_model.ground_truth"


def _ground_truth_field(row: dict[str, Any], cfg: DataConfig) -> str | None:
    """Which field holds the row's ground truth: ``data.answer_field``, else ``ground_truth``, else verl's
    ``reward_model.ground_truth``; None when the row has none of them."""
    if cfg.answer_field:
        return cfg.answer_field if cfg.answer_field in row else None
    if "ground_truth" in row:
        return "ground_truth"
    if isinstance(row.get("reward_model"), Mapping) and "ground_truth" in row["reward_model"]:
        return _VERL_GROUND_TRUTH
    return None


def _row_ground_truth(row: dict[str, Any], origin: str, cfg: DataConfig) -> Any:
    """The ground truth, from the field :func:`_ground_truth_field` names."""
    gt_field = _ground_truth_field(row, cfg)
    if gt_field is None and cfg.answer_field:
        raise DataError(f"{origin}: no field '{cfg.answer_field}' (data.answer_field); the row has {_fields(row)}")
    if gt_field is None:
        raise DataError(
            f"{origin}: no ground truth: the row has neither 'ground_truth' nor verl's "
            f"'reward_model.ground_truth' (fields: {_fields(row)}); add one, or set data.answer_field"
        )
    nested = gt_field == _VERL_GROUND_TRUTH and not cfg.answer_field
    gt = row["reward_model"]["ground_truth"] if nested else row[gt_field]
    if gt is None:
        raise DataError(f"{origin}: field '{gt_field}' (the ground truth) is null; every row needs a ground truth")
    if isinstance(gt, bytes | bytearray):
        raise DataError(f"{origin}: field '{gt_field}' (the ground truth) is binary; store it as text")
    return gt


def _row_data_source(row: dict[str, Any], origin: str, cfg: DataConfig) -> str:
    """The row's ``data_source``, or ``data.data_source`` when the row has none (null or empty)."""
    ds = row.get("data_source")
    if ds is None or ds == "":
        if not cfg.data_source:
            raise DataError(
                f"{origin}: no 'data_source' (it routes the row to its reward function); "
                "add a data_source column or set data.data_source"
            )
        return cfg.data_source
    if not isinstance(ds, str):
        raise DataError(f"{origin}: field 'data_source' must be text, got {type(ds).__name__}")
    return ds


def _row_extra_info(row: dict[str, Any], origin: str) -> dict[str, Any]:
    """A copy of the row's ``extra_info`` mapping ({} when it is missing or null)."""
    extra = row.get("extra_info")
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise DataError(f"{origin}: field 'extra_info' must be a mapping (JSON object), got {type(extra).__name__}")
    return dict(extra)


def row_to_sample(
    row: Mapping[str, Any],
    origin: str,
    cfg: DataConfig,
    ground_truth_optional: Callable[[str], bool] | None = None,
    base_dir: Path | None = None,
    prompt_from_environment: Callable[[str], bool] | None = None,
) -> Sample:
    """Validate one row (any layout of the module doc) into a :class:`Sample`; ``base_dir``: the folder of its
    data file, where relative image paths are read (None: the working directory).

    Raises :class:`DataError` naming ``origin``, the field and the fix, checking in this order: the row, its text,
    the prompt, the ground truth, ``data_source``, ``extra_info``. ``ground_truth_optional(data_source)``: true
    where a row may have no ground truth, and gets None (:func:`plugrl.rewards.routing.ground_truth_optional`).
    ``prompt_from_environment(data_source)``: true where the episodes' environment writes the prompt (TRL's
    ``reset()`` returns it): a row without a prompt field gets TRL's placeholder, one empty user message.
    """
    if not isinstance(row, Mapping):
        raise DataError(f"{origin}: a row must be a mapping of fields (a JSON object), got {type(row).__name__}")
    row = dict(row)
    bad = _find_bad_text(row, "")
    if bad:
        raise DataError(f"{origin}: {bad}; re-save the data as UTF-8 text")
    try:
        prompt = _row_prompt(row, origin, cfg)
    except DataError as missing:
        if prompt_from_environment is None or cfg.question_field or row.get(cfg.prompt_key) is not None:
            raise
        try:
            written = prompt_from_environment(_row_data_source(row, origin, cfg))
        except DataError:
            raise missing from None
        if not written:
            raise
        prompt = [{"role": "user", "content": ""}]  # TRL's: the environment's reset() returns the prompt
    try:
        gt = _row_ground_truth(row, origin, cfg)
    except DataError as missing:
        if ground_truth_optional is None or _ground_truth_field(row, cfg) is not None:
            raise
        try:
            ds = _row_data_source(row, origin, cfg)
        except DataError:
            raise missing from None  # the checks' order: the ground truth is reported first
        if not ground_truth_optional(ds):
            raise
        gt = None
    ds = _row_data_source(row, origin, cfg)
    extra = _row_extra_info(row, origin)
    images = _row_images(row, origin, prompt, cfg, base_dir)
    return Sample(
        prompt=prompt,
        data_source=ds,
        ground_truth=gt,
        extra_info=extra,
        row=row,
        origin=origin,
        images=images,
    )


def _row_images(
    row: dict[str, Any], origin: str, prompt: str | list[dict[str, str]], cfg: DataConfig, base: Path | None
) -> list[Any]:
    """The row's images (``data.image_key``, else inside its content parts), each checked to decode by
    plugrl-vision (relative paths read in ``base``) and given its place in the prompt. A text row never loads
    plugrl-vision."""
    from plugrl import vlm

    raw = row.get(cfg.prompt_key) if not cfg.question_field else None
    values = _image_values(row, _image_key(cfg), origin) or [
        (v, f"{origin}: an image inside '{cfg.prompt_key}'") for v in _inline_images(raw)
    ]
    images: list[Any] = []
    if values:
        try:
            images = vlm.vision_support().row_images(values, prompt, bool(cfg.question_field), base)
        except vlm.NoVisionSupport as e:
            raise DataError(f"{origin}: the row has images: {e}") from None
    places = vlm.count_places(prompt) if prompt != "" else len(images)  # "": a template's, counted when rendered
    if places != len(images):
        raise DataError(
            f"{origin}: the prompt marks {places} image place(s) ('<image>' in its text or {{'type': 'image'}} "
            f"parts) but the row has {len(images)} image(s) (data.image_key={_image_key(cfg)!r}); give every image "
            "one place in the prompt, in the images' order"
        )
    return images


def _image_key(cfg: DataConfig) -> str:
    return getattr(cfg, "image_key", "images")  # plugrl-vision's key


def _image_values(row: Mapping[str, Any], key: str, origin: str) -> list[tuple[Any, str]]:
    """(value, where) of each image in the row's ``key`` column (one image or a list), else in an ``image`` column
    when ``key`` is the default ``images``; [] when the row has neither (or an empty/None value)."""
    value, field = row.get(key), key
    if value is None and key == "images" and row.get("image") is not None:
        value, field = row["image"], "image"
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    return [(v, f"{origin}: {field}[{i}]") for i, v in enumerate(items)]


def _inline_images(prompt: Any) -> list[Any]:
    """The images written inside a prompt's content parts (``{"type": "image", "image": ...}``), in order."""
    if not isinstance(prompt, (list, tuple)):
        return []
    found = []
    for m in prompt:
        content = m.get("content") if isinstance(m, Mapping) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, Mapping) and part.get("type") == "image" and part.get("image") is not None:
                found.append(part["image"])
    return found


# --------------------------------------------------------------------------- loading samples


def _dataset_rows(cfg: DataConfig, registry: Registry, split: str) -> Iterator[tuple[str, Any]]:
    name = cfg.dataset
    spec = registry.datasets.get(name or "")
    if spec is None:
        known = ", ".join(sorted(registry.datasets)) or "none (load a plugin that provides one in `plugins:`)"
        raise DataError(f"unknown dataset {name!r} (data.dataset); registered datasets: {known}")
    by = f" (plugin {spec.plugin})" if spec.plugin else ""
    try:
        rows = spec.fn(split, **cfg.dataset_options)
        for i, row in enumerate(rows):
            yield f"dataset '{name}' [{split}] row {i}", row
    except DataError:
        raise
    except Exception as e:
        raise DataError(
            f"dataset {name!r}{by} failed for split {split!r} with options {cfg.dataset_options}: "
            f"{type(e).__name__}: {e}"
        ) from e


def load_samples(
    cfg: DataConfig,
    registry: Registry,
    split: str | None = None,
    *,
    files: Sequence[str] | None = None,
    ground_truth_optional: Callable[[str], bool] | None = None,
    prompt_from_environment: Callable[[str], bool] | None = None,
) -> tuple[list[Sample], dict[str, int]]:
    """Load and validate every row, before any generation.

    Source: ``files`` when non-empty; else ``cfg.train_files`` (only when ``files`` is None); else ``cfg.dataset``
    (a plugin's, called ``fn(split, **cfg.dataset_options)``). Validation passes ``split=cfg.val_split,
    files=cfg.val_files``; ``split`` defaults to ``cfg.split``. Stops after ``cfg.max_samples`` valid samples.
    With ``cfg.skip_invalid`` an invalid row is skipped and counted (the first few logged), otherwise it raises
    :class:`DataError`; no valid sample at all is an error. The callables: see :func:`row_to_sample`.

    Returns the samples and counts: ``data/rows`` (rows read), ``data/invalid_rows``, ``data/samples``.
    """
    split = split or cfg.split
    if isinstance(files, str):
        files = [files]
    if files is None:
        if cfg.dataset and cfg.train_files:
            raise DataError(
                f"both data.dataset ({cfg.dataset!r}) and data.train_files ({list(cfg.train_files)}) are set; "
                "set only one"
            )
        files = cfg.train_files
    if files:  # relative image paths are read beside the file a row came from
        sources: Iterable[tuple[str, Any, Path | None]] = (item for f in files for item in _iter_rows(f, split))
        what = ", ".join(map(str, files))
    elif cfg.dataset:
        sources = ((origin, row, None) for origin, row in _dataset_rows(cfg, registry, split))
        what = f"dataset {cfg.dataset!r}"
    else:
        raise DataError("no data: set data.train_files (or data.val_files) or data.dataset")

    known: dict[str, bool] = {}

    def optional(data_source: str) -> bool:  # asked for each row without a ground truth: once per data source
        if data_source not in known:
            known[data_source] = ground_truth_optional is not None and ground_truth_optional(data_source)
        return known[data_source]

    samples: list[Sample] = []
    n_rows = n_invalid = 0
    first_error: DataError | None = None
    for origin, row, base_dir in sources:
        if cfg.max_samples is not None and len(samples) >= cfg.max_samples:
            break
        n_rows += 1
        try:
            if isinstance(row, DataError):
                raise row
            samples.append(row_to_sample(row, origin, cfg, optional, base_dir, prompt_from_environment))
        except DataError as e:
            if not cfg.skip_invalid:
                raise
            n_invalid += 1
            first_error = first_error or e
            if n_invalid <= _SHOWN_INVALID:
                log.warning("skipping invalid row (data.skip_invalid): %s", e)
    if n_invalid > _SHOWN_INVALID:
        log.warning("skipped %d invalid rows in %s (data.skip_invalid)", n_invalid, what)
    if not samples:
        why = f"; all {n_rows} rows were invalid, the first: {first_error}" if first_error else ""
        raise DataError(f"no samples in {what} (split {split!r}){why}")
    if _image_key(cfg) != "images" and not any(s.images for s in samples):  # a named column that is never there
        raise DataError(
            f"data.image_key={_image_key(cfg)!r}: no row of {what} (split {split!r}) has images in that field; name "
            f"the column that holds them (the rows have {_fields(samples[0].row)}), or leave data.image_key out"
        )
    return samples, {"data/rows": n_rows, "data/invalid_rows": n_invalid, "data/samples": len(samples)}


# --------------------------------------------------------------------------- batching


def shard_batch(batch: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Rank ``rank``'s contiguous share of a global batch (whole prompts, so a prompt's group stays on one rank);
    shares differ in size by at most one, the first ranks getting the extra items."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    base, extra = divmod(len(batch), world_size)
    start = rank * base + min(rank, extra)
    return list(batch[start : start + base + (rank < extra)])


class PromptBatcher(Generic[T]):
    """Deterministic epoch-wise batches of prompts, resumable at the exact data position.

    Epoch ``e`` visits the items in the order of ``numpy.random.RandomState(seed + e)`` (a stream numpy keeps
    frozen across versions), or in file order without ``shuffle``; ``drop_last`` skips the tail that does not fill
    a batch. Every rank builds the same batcher; :meth:`next_batch` is this rank's share of the global batch.
    ``state_dict()`` holds ``epoch`` and ``position`` (items of the epoch already used).
    """

    def __init__(
        self,
        items: Sequence[T],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of size {world_size}")
        if batch_size % world_size:
            raise DataError(
                f"data.train_batch_size ({batch_size}) is not a multiple of the number of ranks ({world_size}); "
                "each rank must get the same number of prompts"
            )
        if drop_last and len(items) < batch_size:
            raise DataError(
                f"only {len(items)} prompts but data.train_batch_size is {batch_size}; lower the batch size or add data"
            )
        if not items:
            raise DataError("no prompts to batch")
        self.items = items
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self.position = 0
        self._order_epoch: int | None = None
        self._order: list[int] = []

    @classmethod
    def from_config(
        cls, items: Sequence[T], cfg: DataConfig, *, rank: int = 0, world_size: int = 1, batch_size: int | None = None
    ) -> PromptBatcher[T]:
        """Training batches: ``batch_size`` (default ``data.train_batch_size``), ``data.shuffle``, ``data.seed``,
        drop_last."""
        size = batch_size or cfg.train_batch_size
        return cls(items, size, shuffle=cfg.shuffle, seed=cfg.seed, rank=rank, world_size=world_size)

    @property
    def batches_per_epoch(self) -> int:
        n = len(self.items)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def order(self, epoch: int) -> list[int]:
        """The item indices of ``epoch`` in visiting order."""
        if self._order_epoch != epoch:
            n = len(self.items)
            if self.shuffle:
                import numpy as np

                self._order = np.random.RandomState((self.seed + epoch) % 2**32).permutation(n).tolist()
            else:
                self._order = list(range(n))
            self._order_epoch = epoch
        return self._order

    def _epoch_end(self) -> int:
        return self.batches_per_epoch * self.batch_size if self.drop_last else len(self.items)

    def next_global_batch(self) -> list[T]:
        """The next batch of all ranks together (``batch_size`` items; the last one of an epoch may be
        smaller without ``drop_last``); advances to the next epoch after an epoch's last batch."""
        if self.position >= self._epoch_end():  # e.g. a state saved by a batcher with another batch size
            self.epoch, self.position = self.epoch + 1, 0
        order = self.order(self.epoch)
        idx = order[self.position : min(self.position + self.batch_size, self._epoch_end())]
        self.position += len(idx)
        if self.position >= self._epoch_end():
            self.epoch, self.position = self.epoch + 1, 0
        return [self.items[i] for i in idx]

    def next_batch(self) -> list[T]:
        """This rank's share of the next global batch."""
        return shard_batch(self.next_global_batch(), self.rank, self.world_size)

    def __iter__(self) -> Iterator[list[T]]:
        """This rank's batches for the rest of the current epoch (all of it on a fresh epoch)."""
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_items": len(self.items),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        n = state.get("num_items", len(self.items))
        if n != len(self.items):
            raise DataError(
                f"cannot resume the data position: the checkpoint was taken with {n} prompts, now there are "
                f"{len(self.items)}; the data (files, filters or max_samples) changed since"
            )
        for key in ("seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise DataError(
                    f"cannot resume the data position: the checkpoint used data.{key}={state[key]!r}, "
                    f"now it is {getattr(self, key)!r}"
                )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
