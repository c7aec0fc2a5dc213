"""Random dataset rows through the kernel's real loaders and validators (hypothesis).

Rows are random dicts (missing and extra fields, wrong types, nested junk, empty and huge strings), written
to real ``.jsonl`` / ``.json`` / ``.parquet`` files, with non-UTF-8 bytes spliced into some of them, broken
JSON lines, and verl parquet rows whose ``reward_model`` / ``extra_info`` are of the wrong kind. They go
through :func:`plugrl.data.load_samples`, then :func:`plugrl.prompts.encode_prompts` (the length limit,
with the real SmolLM2 tokenizer) and :func:`plugrl.rewards.check_routes` (unknown ``data_source``).

The properties, against an oracle written from the documented rules (not from the kernel's code):

- a file whose rows are all valid gives one :class:`Sample` per row, with the row's prompt, ground truth
  and data source;
- otherwise the kernel raises :class:`DataError` (never any other exception) whose message names the
  file, the line (JSON Lines, from 1) or row (from 0) of the first invalid row, and one of its bad fields;
- with ``data.skip_invalid`` exactly the invalid rows are skipped and counted, every valid row is kept;
- prompts over ``data.max_prompt_length`` are filtered and counted, truncated, or a DataError naming the
  row; an unroutable ``data_source`` is a RewardError naming every such source.
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from plugrl.config import DataConfig
from plugrl.data import DataError, load_samples
from plugrl.prompts import encode_prompts
from plugrl.rewards import RewardError, check_routes
from plugrl.specs import Registry, RewardSpec

ROLES = ("system", "user", "assistant")
BAD = "\ue000"  # stands for invalid UTF-8 bytes, spliced into the file in its place
BAD_BYTES = [b"\xff", b"\xc3", b"\xe9 ", b"\x80", b"\xed\xa0\x80", b"\xf0\x9f"]
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# --------------------------------------------------------------------------- strategies

CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters=BAD)
TEXT = st.one_of(
    st.text(CHARS, max_size=12),
    st.sampled_from(["", " ", "\n\t ", "What is 2 + 2?", "\u00a0", "é€😀", "{x}", "\\boxed{1}"]),
    st.builds(lambda: "word " * 8000),  # huge: 40 000 characters
)
BAD_TEXT = st.tuples(st.text(CHARS, max_size=5), st.text(CHARS, max_size=5)).map(lambda t: t[0] + BAD + t[1])
SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    TEXT,
)
JUNK = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(CHARS, max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.one_of(st.sampled_from([*ROLES, "tool", "User", ""]), JUNK),
            "content": st.one_of(TEXT, JUNK),
            "name": TEXT,
        },
    ),
    st.builds(lambda r, c: {"role": r, "content": c}, st.sampled_from(ROLES), TEXT),  # mostly well-formed
    JUNK,
)
PROMPT = st.one_of(TEXT, st.lists(MESSAGE, max_size=3), JUNK)
GROUND_TRUTH = st.one_of(TEXT, st.integers(), st.floats(allow_nan=False), st.none(), JUNK)
DATA_SOURCE = st.one_of(
    st.sampled_from(
        ["math", "gsm8k_main", "x_tinyv", "gsm8k_x_tinyv", "unknown", "", " ", "MATH", "[", "*", "gsm8k_*"]
    ),
    st.none(),
    JUNK,
)
EXTRA_INFO = st.one_of(st.none(), st.dictionaries(st.text(CHARS, max_size=6), JUNK, max_size=3), JUNK)
REWARD_MODEL = st.one_of(
    st.fixed_dictionaries({}, optional={"ground_truth": GROUND_TRUTH, "style": TEXT}),
    JUNK,
)
FIELDS = {
    "prompt": PROMPT,
    "ground_truth": GROUND_TRUTH,
    "reward_model": REWARD_MODEL,
    "data_source": DATA_SOURCE,
    "extra_info": EXTRA_INFO,
    "question": st.one_of(TEXT, JUNK),
    "answer": GROUND_TRUTH,
    "ability": TEXT,
}


@st.composite
def rows(draw) -> Any:
    """One row: a dict of some known fields (valid or not) and extra junk, sometimes not a dict at all,
    sometimes with invalid UTF-8 (``BAD``) in one of its strings."""
    if draw(st.integers(0, 19)) == 0:
        return draw(JUNK)  # not a mapping
    row = {k: draw(s) for k, s in FIELDS.items() if draw(st.booleans())}
    row.update(draw(st.dictionaries(st.text(CHARS, min_size=1, max_size=8), JUNK, max_size=2)))
    if draw(st.integers(0, 5)) == 0:  # splice invalid UTF-8 into a value or a key
        key = draw(st.sampled_from(sorted(row) or ["extra"]))
        if draw(st.booleans()):
            row[key] = draw(BAD_TEXT)
        elif key in row and isinstance(row[key], list) and row[key] and isinstance(row[key][0], dict):
            row[key][0]["content"] = draw(BAD_TEXT)
        else:
            row[draw(BAD_TEXT)] = 1
    return row


GOOD_ROW = st.builds(
    lambda q, gt, ds, chat: {
        "prompt": [{"role": "user", "content": q}] if chat else q,
        "ground_truth": gt,
        "data_source": ds,
    },
    st.text(CHARS, min_size=1, max_size=20).filter(lambda s: s.strip()),
    st.text(CHARS, max_size=5),
    st.sampled_from(["math", "gsm8k_main", "x_tinyv", "no_such_source", "gsm8k_x_tinyv"]),
    st.booleans(),
)
HUGE_ROW = GOOD_ROW.map(lambda r: {**r, "prompt": "Why? " * 3000})  # 15 000 characters

CONFIGS = st.sampled_from(
    [
        {},
        {"data_source": "math"},  # rows without a data_source get this one
        {"question_field": "question", "answer_field": "answer", "data_source": "x_tinyv"},
    ]
)

# --------------------------------------------------------------------------- the oracle (the documented rules)


def has_bad(value: Any) -> bool:
    if isinstance(value, str):
        return BAD in value
    if isinstance(value, dict):
        return any(has_bad(k) or has_bad(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_bad(v) for v in value)
    return False


def prompt_ok(p: Any) -> bool:
    if isinstance(p, str):
        return bool(p.strip())
    if not isinstance(p, list) or not p:
        return False
    for m in p:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            return False
        if not isinstance(m["role"], str) or m["role"] not in ROLES or not isinstance(m["content"], str):
            return False
    return any(m["content"].strip() for m in p)


def bad_fields(row: Any, cfg: dict) -> set[str] | None:
    """None for a valid row; else the names that may appear in the error ('' = the row as a whole)."""
    if not isinstance(row, dict):
        return {""}
    bad = {str(k) for k, v in row.items() if has_bad(k) or has_bad(v)}
    if any(has_bad(k) for k in row):
        bad.add("<key>")
    q = cfg.get("question_field")
    if q:
        if not (isinstance(row.get(q), str) and row[q].strip()):
            bad.add(q)
    elif "prompt" not in row or row["prompt"] is None or not prompt_ok(row["prompt"]):
        bad.add("prompt")
    a = cfg.get("answer_field")
    if a:
        if row.get(a) is None:
            bad.add(a)
    elif "ground_truth" in row:
        if row["ground_truth"] is None:
            bad.add("ground_truth")
    elif isinstance(row.get("reward_model"), dict) and "ground_truth" in row["reward_model"]:
        if row["reward_model"]["ground_truth"] is None:
            bad.add("reward_model.ground_truth")
    else:
        bad.add("ground_truth")
    ds = row.get("data_source")
    if ds is None or ds == "":
        if not cfg.get("data_source"):
            bad.add("data_source")
    elif not isinstance(ds, str):
        bad.add("data_source")
    if not (row.get("extra_info") is None or isinstance(row.get("extra_info"), dict)):
        bad.add("extra_info")
    return bad or None


def expected_sample(row: dict, cfg: dict) -> tuple[Any, Any, str]:
    q, a = cfg.get("question_field"), cfg.get("answer_field")
    if q:
        prompt = [{"role": "user", "content": row[q]}]
    elif isinstance(row["prompt"], str):
        prompt = row["prompt"]
    else:
        prompt = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
    if a:
        gt = row[a]
    else:
        gt = row["ground_truth"] if "ground_truth" in row else row["reward_model"]["ground_truth"]
    ds = row.get("data_source") or cfg["data_source"]
    return prompt, gt, ds


# --------------------------------------------------------------------------- writing files


def splice_bad_bytes(data: bytes, which: int) -> bytes:
    """Each BAD (raw, or as the JSON escape \\ue000) becomes invalid UTF-8."""
    bad = BAD_BYTES[which % len(BAD_BYTES)]
    return data.replace(BAD.encode(), bad).replace(b"\\ue000", bad)


def write_jsonl(path: Path, items: list, ascii_: bool, which: int) -> list[int]:
    """``items``: rows, or raw lines (``("raw", text)``). Returns the line number of each item (from 1)."""
    lines, numbers = [], []
    for item in items:
        if isinstance(item, tuple):
            lines.append(item[1])
        else:
            lines.append(json.dumps(item, ensure_ascii=ascii_))
        numbers.append(len(lines))
        if len(lines) % 3 == 0:
            lines.append("   ")  # blank lines count as lines, never as rows
    path.write_bytes(splice_bad_bytes("\n".join(lines).encode("utf-8", "surrogatepass") + b"\n", which))
    return numbers


RAW_LINES = st.sampled_from(
    [
        "{",
        "[1, 2",
        '{"prompt": "q", "ground_truth": }',
        "1",
        '"just a string"',
        "null",
        "[]",
        "{}",
        '{"prompt": "q", "ground_truth": 1, "data_source": "math"} trailing',
        "[" * 5000 + "]" * 5000,  # nested deeper than the JSON parser's recursion limit
        '{"prompt": "q", "ground_truth": ' + "7" * 5000 + ', "data_source": "math"}',  # a 5000-digit integer
        '{"prompt": "q", "ground_truth": NaN, "data_source": "math"}',
        '{"prompt": "q", "ground_truth": 1e999, "data_source": "math"}',
        '{"prompt": "q\\ud800", "ground_truth": "1", "data_source": "math"}',  # an escaped lone surrogate
        "\x00",
    ]
)


def raw_line_verdict(text: str, cfg: dict) -> tuple[set[str] | None, Any]:
    """What the oracle expects of a raw line: None when it holds a valid row (then also the row)."""
    try:
        row = json.loads(text)
    except (ValueError, RecursionError):
        return {""}, None
    if has_surrogate(row):
        return {"prompt"}, row
    return bad_fields(row, cfg), row


def has_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, dict):
        return any(has_surrogate(k) or has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_surrogate(v) for v in value)
    return False


# --------------------------------------------------------------------------- the checks


def same(a: Any, b: Any) -> bool:
    """Equality where NaN equals NaN (a JSON Lines row may hold NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def check_load(path: Path, origins: list[str], verdicts: list[tuple[set[str] | None, Any]], cfg: dict) -> None:
    """Load ``path`` with and without skip_invalid and compare with the oracle's ``verdicts`` (one per row)."""
    if not verdicts:  # an empty file: no samples, an error naming it, whatever skip_invalid says
        for skip in (False, True):
            with pytest.raises(DataError, match=re.escape(f"no samples in {path}")):
                load_samples(DataConfig(**cfg, skip_invalid=skip), Registry(), files=[str(path)])
        return
    first_bad = next((i for i, (bad, _) in enumerate(verdicts) if bad is not None), None)
    n_valid = sum(bad is None for bad, _ in verdicts)
    event(f"valid rows: {'none' if not n_valid else 'all' if n_valid == len(verdicts) else 'some'}")
    # without skip_invalid: all valid -> every row a Sample; else the first bad row's error
    try:
        samples, counts = load_samples(DataConfig(**cfg), Registry(), files=[str(path)])
    except DataError as e:
        msg = str(e)
        if first_bad is None:
            pytest.fail(f"a valid file was rejected: {msg}\nrows: {[r for _, r in verdicts]!r}"[:3000])
        bad, row = verdicts[first_bad]
        assert msg.startswith(f"{origins[first_bad]}:"), (origins[first_bad], msg[:500])
        named = [f for f in bad if f and f"'{f}" in msg]
        assert named or "" in bad, (bad, msg[:500], row)
    else:
        assert first_bad is None, f"invalid row {origins[first_bad]} accepted: {verdicts[first_bad]!r}"[:3000]
        assert counts == {"data/rows": len(verdicts), "data/invalid_rows": 0, "data/samples": len(verdicts)}
        for s, origin, (_, row) in zip(samples, origins, verdicts, strict=True):
            prompt, gt, ds = expected_sample(row, cfg)
            assert s.origin == origin
            assert s.prompt == prompt and same(s.ground_truth, gt) and s.data_source == ds, (s, row)
    # with skip_invalid: exactly the invalid rows skipped and counted, every valid row kept, in order
    try:
        samples, counts = load_samples(DataConfig(**cfg, skip_invalid=True), Registry(), files=[str(path)])
    except DataError as e:
        assert n_valid == 0, str(e)
        assert "no samples in" in str(e)
        if verdicts:
            assert origins[0] in str(e)  # "all N rows were invalid, the first: <origin>: ..."
    else:
        assert [s.origin for s in samples] == [o for o, (bad, _) in zip(origins, verdicts, strict=True) if bad is None]
        assert counts == {
            "data/rows": len(verdicts),
            "data/invalid_rows": len(verdicts) - n_valid,
            "data/samples": n_valid,
        }


ITEMS = st.lists(st.one_of(rows(), GOOD_ROW, RAW_LINES.map(lambda t: ("raw", t))), max_size=8)


@SETTINGS
@given(items=ITEMS, cfg=CONFIGS, ascii_=st.booleans(), which=st.integers(0, 100))
@example(items=[("raw", "[" * 5000 + "]" * 5000)], cfg={}, ascii_=True, which=0)  # RecursionError in json.loads
@example(items=[("raw", '{"ground_truth": ' + "7" * 5000 + "}")], cfg={}, ascii_=True, which=0)  # int digits limit
def test_random_jsonl_rows(items, cfg, ascii_, which):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        numbers = write_jsonl(path, items, ascii_, which)
        verdicts = [raw_line_verdict(i[1], cfg) if isinstance(i, tuple) else (bad_fields(i, cfg), i) for i in items]
        check_load(path, [f"{path} line {n}" for n in numbers], verdicts, cfg)


@SETTINGS
@given(rows_=st.lists(st.one_of(rows(), GOOD_ROW), max_size=8), cfg=CONFIGS, wrapped=st.booleans(), which=st.integers())
def test_random_json_rows(rows_, cfg, wrapped, which):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.json"
        doc = {"data": rows_} if wrapped else rows_
        path.write_bytes(splice_bad_bytes(json.dumps(doc).encode(), which))
        if not rows_:
            with pytest.raises(DataError, match=re.escape(str(path))):
                load_samples(DataConfig(**cfg), Registry(), files=[str(path)])
            return
        check_load(path, [f"{path} row {i}" for i in range(len(rows_))], [(bad_fields(r, cfg), r) for r in rows_], cfg)


# verl parquet: one column plan per file (parquet columns have one type), values valid or not
INT64 = st.integers(-(2**63), 2**63 - 1)
MSG_STRUCT = st.builds(
    lambda r, c: {"role": r, "content": c},
    st.one_of(st.sampled_from([*ROLES, "tool", ""]), st.none()),
    st.one_of(TEXT, st.none()),
)
COLUMN_KINDS = {
    "data_source": {"str": st.one_of(st.none(), st.sampled_from(["math", "gsm8k_main", "x_tinyv", "nope", ""]))},
    "prompt": {
        "messages": st.one_of(st.none(), st.lists(MSG_STRUCT, max_size=3)),
        "str": st.one_of(st.none(), TEXT),
        "int": st.one_of(st.none(), st.integers(-5, 5)),
    },
    "reward_model": {
        "struct_str": st.one_of(st.none(), st.fixed_dictionaries({"ground_truth": st.one_of(st.none(), TEXT)})),
        "struct_int": st.one_of(st.none(), st.fixed_dictionaries({"ground_truth": st.one_of(st.none(), INT64)})),
        "struct_no_gt": st.one_of(st.none(), st.fixed_dictionaries({"style": TEXT})),
        "str": st.one_of(st.none(), TEXT),  # broken: a string where verl has a struct
    },
    "extra_info": {
        "struct": st.one_of(st.none(), st.fixed_dictionaries({"index": st.integers(0, 9), "split": TEXT})),
        "str": st.one_of(st.none(), TEXT),  # broken
        "list": st.one_of(st.none(), st.lists(INT64, max_size=2)),  # broken
    },
    "ability": {"str": st.one_of(st.none(), TEXT)},
}


VERL_ROW = st.builds(
    lambda q, gt, ds, index: {
        "data_source": ds,
        "prompt": [{"role": "user", "content": q}],
        "reward_model": {"ground_truth": gt},
        "extra_info": {"index": index, "split": "train"},
        "ability": "math",
    },
    st.text(CHARS, min_size=1, max_size=20).filter(lambda s: s.strip()),
    st.text(CHARS, max_size=5),
    st.sampled_from(["math", "gsm8k_main", "x_tinyv"]),
    st.integers(0, 9),
)


@st.composite
def parquet_table(draw) -> tuple[list[dict], set[int]]:
    verl = draw(st.booleans())
    if verl:  # verl's own layout, rows mostly valid
        plan = {"data_source": "str", "prompt": "messages", "reward_model": "struct_str", "extra_info": "struct"}
        plan["ability"] = "str"
    else:
        plan = {c: draw(st.sampled_from(sorted(kinds))) for c, kinds in COLUMN_KINDS.items() if draw(st.booleans())}
    n = draw(st.integers(1, 6))
    table = [
        draw(VERL_ROW) if verl and draw(st.booleans()) else {col: draw(COLUMN_KINDS[col][k]) for col, k in plan.items()}
        for _ in range(n)
    ]
    non_utf8 = set(draw(st.lists(st.integers(0, n - 1), max_size=2))) if "ability" in plan else set()
    return table, non_utf8


@SETTINGS
@given(data=parquet_table(), cfg=CONFIGS.filter(lambda c: "question_field" not in c), which=st.integers())
@example(  # invalid UTF-8 in a string column: the error named no column before
    data=([{"data_source": "math", "prompt": "q?", "reward_model": {"ground_truth": "1"}, "ability": "x"}], {0}),
    cfg={},
    which=0,
)
def test_random_verl_parquet_rows(data, cfg, which):
    table_rows, non_utf8 = data
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.parquet"
        table = pa.Table.from_pylist(table_rows)
        if non_utf8:  # the 'ability' column with invalid UTF-8 in some rows
            values = [
                (BAD_BYTES[which % 2] if i in non_utf8 else (r.get("ability") or "").encode())
                for i, r in enumerate(table_rows)
            ]
            column = pa.array(values, pa.binary()).view(pa.string())
            table = table.set_column(table.schema.get_field_index("ability"), "ability", column)
            for i, r in enumerate(table_rows):
                r["ability"] = BAD if i in non_utf8 else (r.get("ability") or "")
        pq.write_table(table, path)
        # parquet gives every row every column (null where the row had none)
        full = [{c: r.get(c) for c in table.column_names} for r in table_rows]
        if not table.column_names:
            full = []  # a parquet file without columns holds no rows
        verdicts = [(bad_fields(r, cfg), r) for r in full]
        check_load(path, [f"{path} row {i}" for i in range(len(full))], verdicts, cfg)


# --------------------------------------------------------------------------- the length limit and routing

REGISTRY = Registry(
    rewards=[
        RewardSpec(name="acc", fn=lambda c, g: 0.0, data_sources=("math",), plugin="math"),
        RewardSpec(name="gsm", fn=lambda c, g: 0.0, data_sources=("gsm8k_*",), plugin="gsm8k"),
        RewardSpec(name="tinyv", fn=lambda c, g: 0.0, data_sources=("*_tinyv",), plugin="tinyv"),
    ]
)


def route_count(ds: str) -> int:
    """How many plugins' reward functions serve ``ds``: an exact name wins over globs; 1 is the only good answer."""
    return 1 if ds == "math" else sum(fnmatch.fnmatchcase(ds, p) for p in ("gsm8k_*", "*_tinyv"))


@SETTINGS
@given(
    rows_=st.lists(st.one_of(rows(), GOOD_ROW, HUGE_ROW), min_size=1, max_size=6),
    limit=st.integers(1, 200),
    mode=st.sampled_from(["filter", "error", "left", "right"]),
    system_prompt=st.one_of(st.none(), TEXT),
    prefill=st.one_of(st.none(), st.sampled_from(["<think>", "", "\\boxed{"])),
)
def test_prompt_length_limit_and_routing_after_loading(smol_tokenizer, rows_, limit, mode, system_prompt, prefill):
    cfg = DataConfig(
        max_prompt_length=limit,
        filter_overlong_prompts=mode == "filter",
        truncation="error" if mode == "filter" else mode,
        skip_invalid=True,
        system_prompt=system_prompt,
        prefill=prefill,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.jsonl"
        path.write_bytes(splice_bad_bytes("".join(json.dumps(r) + "\n" for r in rows_).encode(), 0))
        try:
            samples, _ = load_samples(cfg, REGISTRY, files=[str(path)])
        except DataError as e:
            assert "no samples in" in str(e) and str(path) in str(e)
            return
        # routing: every data_source without a reward is named, all at once
        sources = {s.data_source for s in samples}
        unroutable = sorted(ds for ds in sources if route_count(ds) != 1)  # none, or several plugins' globs
        try:
            routes = check_routes(REGISTRY, sources)
        except RewardError as e:
            event("routing: error")
            assert unroutable, str(e)
            assert all(repr(ds) in str(e) for ds in unroutable), (unroutable, str(e))
        else:
            assert not unroutable and set(routes) == sources
        # the length limit
        try:
            prompts, counts = encode_prompts(samples, cfg, smol_tokenizer, REGISTRY)
        except DataError as e:
            msg = str(e)
            event(f"encode: {msg.split(':')[0] if msg.startswith('no prompts') else 'overlong error'}")
            if msg.startswith("no prompts left"):
                assert f"no prompts left of {len(samples)}:" in msg and f"max_prompt_length={limit}" in msg
                return
            assert mode == "error" and f"max_prompt_length={limit}" in msg, msg
            assert any(msg.startswith(f"{s.origin}:") for s in samples), msg
            return
        event(f"encode: {mode}, {counts['data/filtered_overlong'] + counts['data/truncated']} overlong")
        assert all(len(p.ids) <= limit for p in prompts)
        assert counts["data/prompts"] == len(prompts)
        assert counts["data/prompts"] + counts["data/filtered_overlong"] + counts["data/invalid_prompts"] == len(
            samples
        )
        if mode != "filter":
            assert counts["data/filtered_overlong"] == 0
        if mode == "error":
            assert counts["data/truncated"] == 0
        kept = {p.sample.origin for p in prompts}
        assert kept <= {s.origin for s in samples}


# --------------------------------------------------------------------------- damaged files

GOOD_PARQUET_ROWS = [
    {
        "data_source": "math",
        "prompt": [{"role": "user", "content": f"What is {i} + {i}? " * 5}],
        "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
        "extra_info": {"index": i},
    }
    for i in range(40)
]


@SETTINGS
@given(
    flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.floats(0, 1)),
    compression=st.sampled_from(["snappy", "none", "zstd"]),
)
@example(flips=[(0.5, 0)], cut=0.5, compression="snappy")
@example(flips=[(0.015625, 0)], cut=None, compression="snappy")  # a damaged data page: was an OSError traceback
def test_damaged_parquet_files(flips, cut, compression):
    """Bytes overwritten or the file cut short: rows (the damage may hit only values), or a DataError naming
    the file; never another exception."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.parquet"
        pq.write_table(pa.Table.from_pylist(GOOD_PARQUET_ROWS), path, compression=compression)
        data = bytearray(path.read_bytes())
        for where, value in flips:
            data[int(where * len(data))] = value
        if cut is not None:
            data = data[: int(cut * len(data))]
        path.write_bytes(bytes(data))
        for skip in (False, True):
            try:
                samples, counts = load_samples(DataConfig(skip_invalid=skip), Registry(), files=[str(path)])
            except DataError as e:
                event(f"damaged: {str(e).replace(str(path), '<file>')[:40]}")
                assert str(path) in str(e)
            else:
                event("damaged: loaded")
                assert counts["data/rows"] <= len(GOOD_PARQUET_ROWS)
                assert all(s.origin.startswith(f"{path} row ") for s in samples)
