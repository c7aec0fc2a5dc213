"""The countdown reward (TinyZero semantics, with a safe evaluator instead of ``eval``)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from plugrl.specs import reward

from .arith import ArithError, analyze
from .problems import DATA_SOURCE, row_problem

OPEN, CLOSE = "<answer>", "</answer>"
TOLERANCE = Fraction(1, 100_000)
_RESULT_SUFFIX = re.compile(r"\s*-?\d+(?:\.\d+)?\s*")


def extract_answer(completion: str) -> str | None:
    """The content of the last ``<answer>...</answer>``, or None.

    Same matches as ``re.findall(r"<answer>(.*?)</answer>", s, re.DOTALL)[-1]``, but in
    linear time however many unclosed tags a completion holds.
    """
    last = None
    pos = 0
    while (start := completion.find(OPEN, pos)) != -1:
        end = completion.find(CLOSE, start + len(OPEN))
        if end == -1:
            break
        last = completion[start + len(OPEN) : end]
        pos = end + len(CLOSE)
    return last


def strip_result(equation: str) -> str:
    """``"(1 + 2) * 3 = 9"`` -> ``"(1 + 2) * 3"``; anything else is returned unchanged."""
    lhs, sep, rhs = equation.rpartition("=")
    if sep and _RESULT_SUFFIX.fullmatch(rhs):
        return lhs
    return equation


def check_equation(equation: str, target: float, numbers: list[int | float]) -> bool:
    """True iff ``equation`` uses every number exactly once and evaluates to ``target`` (within 1e-5)."""
    equation = equation.strip()
    if len(equation) > 1024:  # the evaluator rejects anything near this long anyway
        return False
    try:
        ev = analyze(strip_result(equation))
    except ArithError:
        return False
    if sorted(ev.numbers) != sorted(Fraction(n) for n in numbers):
        return False
    return abs(ev.value - Fraction(target)) < TOLERANCE


@reward(DATA_SOURCE)
def countdown_reward(
    completion: str,
    ground_truth: Any = None,
    format_score: float = 0.1,
    correct_score: float = 1.0,
    target: Any = None,
    nums: Any = None,
    numbers: Any = None,
    **_: Any,
) -> float | dict:
    """``correct_score`` for a correct last ``<answer>``, ``format_score`` for any other, 0 without one.

    The problem is the ground truth ``{"target": t, "numbers": [...]}`` (a dict or JSON). Without one it is
    the row's TinyZero columns ``target`` and ``nums`` (or ``numbers``), which the kernel passes as keywords;
    the default ``ground_truth=None`` tells the kernel that rows may leave the ground truth out. A ground
    truth that is the target alone (``data.answer_field: target``) takes its numbers from ``nums``.
    """
    target, numbers = row_problem(ground_truth, target, nums, numbers)
    answer = extract_answer(completion) if isinstance(completion, str) else None
    if answer is None:
        return {"score": 0.0, "formatted": False, "correct": False}
    correct = check_equation(answer, target, numbers)
    return {"score": float(correct_score if correct else format_score), "formatted": True, "correct": correct}
