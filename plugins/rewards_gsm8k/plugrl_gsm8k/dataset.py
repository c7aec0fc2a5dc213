"""GSM8K rows for plugrl: the dataset (a local copy or the hub) and the prompt template.

The prompt is verl's (``examples/data_preprocess/gsm8k.py``): the question, a space,
and :data:`INSTRUCTION`, as one user message.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from plugrl.data import DataError, load_rows
from plugrl.specs import dataset, template

from .scoring import DATA_SOURCE

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"


def gsm8k_messages(question: str) -> list[dict[str, str]]:
    """The chat prompt for ``question``: one user message, the question then :data:`INSTRUCTION`."""
    return [{"role": "user", "content": f"{question} {INSTRUCTION}"}]


def final_answer(answer: str) -> str:
    """The final answer of a GSM8K solution: the text after its last ``####``, commas removed."""
    _, sep, tail = answer.rpartition("####")
    value = tail.strip().replace(",", "")
    if not sep or not value:
        raise ValueError("the answer has no final answer after '####'")
    return value


def gsm8k_row(question: Any, answer: Any, split: str, index: int, origin: str) -> dict[str, Any]:
    """One row in plugrl's schema from a GSM8K ``question``/``answer`` pair (``origin`` names it in errors)."""
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{origin}: field 'question' must be non-empty text, got {question!r:.80}")
    if not isinstance(answer, str):
        raise DataError(f"{origin}: field 'answer' must be text, got {type(answer).__name__}")
    try:
        ground_truth = final_answer(answer)
    except ValueError as e:
        raise DataError(f"{origin}: field 'answer': {e} (GSM8K solutions end with '#### <number>')") from None
    return {
        "prompt": gsm8k_messages(question),
        "data_source": DATA_SOURCE,
        "ability": "math",
        "ground_truth": ground_truth,
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def _source_rows(split: str, path: str | None, hub_id: str, config: str) -> Iterable[tuple[str, Any]]:
    if path is not None:
        p = Path(path).expanduser()
        if not p.exists():
            raise DataError(
                f"gsm8k: data.dataset_options.path {str(path)!r} does not exist (working directory: {Path.cwd()}); "
                "give a .jsonl/.json/.parquet file with 'question' and 'answer' fields, or a directory of them"
            )
        return load_rows(str(p), split)
    try:
        import datasets

        ds = datasets.load_dataset(hub_id, config, split=split)
    except Exception as e:  # noqa: BLE001 - offline, unknown id or split: the same advice
        raise DataError(
            f"gsm8k: could not load {hub_id!r} (config {config!r}, split {split!r}) from the Hugging Face hub "
            f"({type(e).__name__}: {e}). Offline, pass a local copy: data.dataset_options.path = a .jsonl file "
            "in the original question/answer format (e.g. a copy of the hub's train split) or a directory "
            "holding train.jsonl and test.jsonl"
        ) from None
    return ((f"hub:{hub_id} [{split}] row {i}", row) for i, row in enumerate(ds))


def _rows(sources: Iterable[tuple[str, Any]], split: str) -> Iterator[dict[str, Any]]:
    for index, (origin, row) in enumerate(sources):
        if not isinstance(row, Mapping):
            raise DataError(f"{origin}: a row must be a JSON object with 'question' and 'answer'")
        yield gsm8k_row(row.get("question"), row.get("answer"), split, index, origin)


@dataset("gsm8k")
def gsm8k_dataset(
    split: str,
    path: str | None = None,
    hub_id: str = HUB_ID,
    config: str = HUB_CONFIG,
    **_: Any,
) -> Iterator[dict[str, Any]]:
    """GSM8K rows for ``split`` in plugrl's schema (verl's preprocessing).

    ``path``: a local file (``.jsonl``/``.json``/``.parquet``) or directory in the original
    ``question``/``answer`` format; a directory holding ``train.jsonl`` and ``test.jsonl``
    serves each split its own file. Without ``path`` the rows come from the hub
    (``datasets.load_dataset(hub_id, config, split=split)``; needs the network or a cache).
    """
    return _rows(_source_rows(split, path, hub_id, config), split)


def _sample_question(sample: Any) -> str:
    if isinstance(sample, Mapping):
        row, extra = sample, sample.get("extra_info") or {}
    else:
        row, extra = getattr(sample, "row", None) or {}, getattr(sample, "extra_info", None) or {}
    question = row.get("question") or extra.get("question")
    if not isinstance(question, str) or not question.strip():
        fields = ", ".join(map(str, row)) or "none"
        raise ValueError(f"template 'gsm8k' needs a non-empty 'question' field in the row (fields: {fields})")
    return question


@template("gsm8k")
def gsm8k_template(sample: Any) -> list[dict[str, str]]:
    """The gsm8k prompt built from the row's ``question`` (or ``extra_info.question``)."""
    return gsm8k_messages(_sample_question(sample))
