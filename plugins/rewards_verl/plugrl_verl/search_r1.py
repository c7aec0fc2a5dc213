"""Search-R1's exact match, as verl scores the ``searchR1_*`` sources (verl's ``search_r1_like_qa_em``): the last
``<answer>...</answer>`` equals one of ``ground_truth["target"]`` after SQuAD's normalisation (lower case, no
punctuation, no articles, single spaces). More than 10 opening or closing answer tags cut a right answer's score to a
quarter.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
MAX_TAGS = 10


def normalize_answer(text: str) -> str:
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golden: str | Iterable[str]) -> bool:
    golden = [golden] if isinstance(golden, str) else golden
    pred = normalize_answer(prediction)
    return any(normalize_answer(g) == pred for g in golden)


def extract(completion: str) -> str | None:
    found = _ANSWER.findall(completion)
    return found[-1].strip() if found else None


def search_r1_score(completion: str, ground_truth: Any, format_score: float = 0.0, score: float = 1.0) -> float:
    """``score`` for an exact match (a quarter of it with more than 10 answer tags), ``format_score`` for an answer
    that does not match, 0 without one. ``ground_truth``: ``{"target": answer or [answers]}``, as verl's data."""
    answer = extract(completion)
    if answer is None:
        return 0.0
    if not exact_match(answer, ground_truth["target"]):
        return float(format_score)
    many = completion.count("<answer>") > MAX_TAGS or completion.count("</answer>") > MAX_TAGS
    return float(score / 4 if many else score)
