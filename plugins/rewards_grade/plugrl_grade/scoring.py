"""Reading the ``Total Score`` of a grader's output, and the reward that compares it to the true grade.

Semantics follow the reference RRM reward (data source ``grade`` in the TinyV-based
verl fork): take the text after the last ``Total Score``, drop ``:``, ``[``,
``points``, ``point``, ``*``, ``|`` and quotes, keep what precedes the first ``/``
and read it with ``float``; the grade is ``min(10, x) / 10`` and the reward
``(1 - |grade - ground_truth|) ** 2``; anything unreadable scores 0.

Where this implementation deliberately differs (see README):

* ``nan`` and ``inf`` (which ``float`` accepts) are unreadable, not 1.0;
* double quotes are dropped as well as single quotes;
* a number candidate longer than :data:`MAX_NUMBER_CHARS` characters is unreadable
  (bounded work on huge completions);
* the reward is ``max(0, 1 - |grade - ground_truth|) ** 2``: the reference's square
  grows again when the grade is more than 1 away from the truth, so ``Total Score: -1e9``
  would score about 1e16 there; here it scores 0. For grades in ``[0, 1]`` and true
  grades in ``[0, 1]`` nothing changes.
"""

from __future__ import annotations

import math
from typing import Any

from plugrl.specs import reward

DATA_SOURCE = "grade"
MARKER = "Total Score"
# Removed in this order: "points" must go before "point", or "8 points" would leave "8 s".
STRIP = (":", "[", "points", "point", "*", "|", "'", '"')
# Longer candidates are no grade a grader writes; refusing them keeps the work bounded.
MAX_NUMBER_CHARS = 64


def parse_total_score(text: str) -> float | None:
    """The number a grader wrote after its last ``Total Score``, as written (``"7/10"`` -> 7.0).

    Like the reference, a text without ``Total Score`` is read whole (``"8/10"`` -> 8.0),
    matching is case-sensitive, and ``]`` is *not* removed (``"[8 points]"`` is
    unreadable, ``"[8/10]"`` reads 8). Returns None when nothing finite can be read:
    no number, ``nan``/``inf``, or a candidate over :data:`MAX_NUMBER_CHARS` characters.
    Negative numbers are returned as they are.
    """
    if not isinstance(text, str):
        return None
    start = text.rfind(MARKER)
    tail = text if start < 0 else text[start + len(MARKER) :]
    # Only the part before the first "/" matters. None of the removed tokens contains "/", so cutting
    # before the replacements (the reference cuts after) gives the same result with less work.
    slash = tail.find("/")
    if slash >= 0:
        tail = tail[:slash]
    for token in STRIP:
        tail = tail.replace(token, "")
    candidate = tail.strip()
    if not candidate or len(candidate) > MAX_NUMBER_CHARS:
        return None
    try:
        value = float(candidate)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def grade_to_score(value: float) -> float:
    """``min(10, value) / 10``: a grade out of 10 as a fraction (12/10 -> 1.0, -3 -> -0.3)."""
    return min(10.0, value) / 10.0


def _ground_truth(ground_truth: Any) -> float:
    try:
        gt = float(ground_truth)
    except (TypeError, ValueError):
        msg = f"grade: ground_truth must be a number (the true grade in [0, 1]), got {ground_truth!r}"
        raise ValueError(msg) from None
    if not math.isfinite(gt):
        raise ValueError(f"grade: ground_truth must be finite, got {ground_truth!r}")
    return gt


@reward(DATA_SOURCE, casefold=True)  # verl's default scorer: data_source.lower().strip() == 'grade'
def grade_reward(completion: str, ground_truth: Any) -> dict:
    """``max(0, 1 - |min(10, x)/10 - ground_truth|) ** 2`` for the grader's ``Total Score: x``; 0 if unreadable.

    ``ground_truth`` is the true grade as a fraction (``0.7`` or ``"0.7"``); a ground
    truth that is not a finite number raises ``ValueError`` (a data error, scored
    ``reward.error_score`` and logged by the kernel). Result fields: ``score`` and
    ``grade`` (the parsed grade as a fraction, or None when unreadable).
    """
    gt = _ground_truth(ground_truth)
    value = parse_total_score(completion)
    if value is None:
        return {"score": 0.0, "grade": None}
    grade = grade_to_score(value)
    return {"score": max(0.0, 1.0 - abs(grade - gt)) ** 2, "grade": grade}
