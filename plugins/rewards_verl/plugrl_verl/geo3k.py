"""Geometry3K, as verl scores ``hiyouga/geometry3k`` (``verl.utils.reward_score.geo3k``): 0.9 x accuracy + 0.1 x
format. Accuracy: the content of the last ``\\boxed{}`` (the text ``None`` without one) graded by PRM800K's grader
in mathruler's flavour (:data:`plugrl_verl.prm800k.MATHRULER`); format: ``<think>...</think>`` then a ``\\boxed{}``.
"""

from __future__ import annotations

import re
from typing import Any

from .boxes import closing_brace
from .prm800k import MATHRULER, grade_answer

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def boxed_content(text: str) -> str:
    """mathruler's ``extract_boxed_content``: the last ``\\boxed{`` up to its closing brace, trimmed; ``"None"``."""
    start = text.rfind("\\boxed{")
    end = None if start == -1 else closing_brace(text, start)
    return "None" if end is None else text[start + len("\\boxed{") : end].strip()


def geo3k_score(completion: str, ground_truth: Any, use_boxed: bool = True, format_score: float = 0.1) -> float:
    answer = boxed_content(completion) if use_boxed else completion
    accuracy = 1.0 if grade_answer(answer, ground_truth, MATHRULER) else 0.0
    well_formed = 1.0 if _FORMAT.fullmatch(completion) else 0.0
    return (1.0 - format_score) * accuracy + format_score * well_formed
