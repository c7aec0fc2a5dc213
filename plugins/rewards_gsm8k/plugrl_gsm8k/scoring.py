"""The GSM8K reward: verl's ``gsm8k.compute_score`` semantics, written afresh.

Extraction (like verl, on the last :data:`CLIP_CHARS` characters of the completion):

* ``strict``: the number after the **last** ``"#### "`` (one space, as GSM8K's own
  solutions write it); a completion without one has no answer.
* ``flexible``: the last number anywhere in the text.

A "number" is what verl's pattern ``-?[0-9.,]+`` matches, provided it holds a digit.
The extracted text and the ground truth are normalised the same way (commas, ``$``
and a trailing ``.`` removed) and compared **as strings**, as verl does: ``"2.50"``
does not match ``"2.5"``, nor ``"18.0"`` ``"18"``.

Where this differs from verl (each case is one where verl gives a right answer no
credit): ``"#### $18"`` counts as ``18`` (verl's pattern cannot read past the ``$``);
commas are dropped in ``flexible`` too (verl drops them only in ``strict``); a trailing
sentence period is dropped (verl compares ``"18."`` with ``"18"``); runs of ``.`` and
``,`` without a digit are not numbers (verl's flexible mode skips only a lone ``.``).
"""

from __future__ import annotations

import numbers
import re
from typing import Any

from plugrl.specs import reward

DATA_SOURCE = "openai/gsm8k"
METHODS = ("strict", "flexible")
CLIP_CHARS = 300  # verl scores only the last 300 characters of a completion

_STRICT = re.compile(r"#### \$?(-?[0-9.,]+)")
_NUMBER = re.compile(r"-?[0-9.,]+")
_DIGIT = re.compile(r"[0-9]")


def normalize(text: str) -> str:
    """``" $1,000. "`` -> ``"1000"``: whitespace, commas, ``$`` and trailing ``.`` removed."""
    return text.strip().replace(",", "").replace("$", "").rstrip(".")


def extract_answer(completion: str, method: str = "strict", clip_chars: int | None = CLIP_CHARS) -> str | None:
    """The normalised final answer of ``completion`` by ``method`` (module doc), or None.

    ``clip_chars``: look only at the last that many characters (verl: 300); None or 0 reads it all.
    """
    if method not in METHODS:
        raise ValueError(f"gsm8k: method must be one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(completion, str):
        return None
    text = completion[-clip_chars:] if clip_chars and len(completion) > clip_chars else completion
    found = _STRICT.findall(text) if method == "strict" else _NUMBER.findall(text)
    for candidate in reversed(found):
        if _DIGIT.search(candidate):
            return normalize(candidate)
    return None


def ground_truth_answer(ground_truth: Any) -> str:
    """The normalised final answer of a ground truth: ``"72"``, ``"1,000"``, ``72``, or a full
    GSM8K ``answer`` text (``"... #### 72"``, the part after the last ``####`` is used)."""
    gt = ground_truth
    if isinstance(gt, numbers.Integral) and not isinstance(gt, bool):
        return str(int(gt))
    if isinstance(gt, numbers.Real) and not isinstance(gt, bool):
        f = float(gt)
        return str(int(f)) if f.is_integer() else repr(f)
    if not isinstance(gt, str):
        raise ValueError(f"gsm8k ground_truth must be text or a number, got {type(gt).__name__}")
    if "####" in gt:
        gt = gt.rsplit("####", 1)[1]
    answer = normalize(gt)
    if not answer:
        raise ValueError(f"gsm8k ground_truth holds no final answer: {ground_truth!r:.200}")
    return answer


@reward(DATA_SOURCE)
def gsm8k_reward(
    completion: str,
    ground_truth: Any,
    method: str = "strict",
    format_score: float = 0.0,
    correct_score: float = 1.0,
    clip_chars: int | None = CLIP_CHARS,
) -> dict[str, Any]:
    """``correct_score`` if the extracted answer equals the ground truth's, ``format_score`` if an
    answer was extracted but differs, ``0.0`` if none was found.

    Returns ``{"score", "extracted", "method"}`` (``extracted`` is None without an answer).
    """
    expected = ground_truth_answer(ground_truth)
    extracted = extract_answer(completion, method, clip_chars)
    if extracted is None:
        score = 0.0
    else:
        score = float(correct_score if extracted == expected else format_score)
    return {"score": score, "extracted": extracted, "method": method}
