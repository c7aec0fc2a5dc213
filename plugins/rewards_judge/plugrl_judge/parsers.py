"""Reading a verdict out of the judge's reply, and reducing several verdicts to one score.

The reply is untrusted model output: it is only searched (regular expressions, a JSON decoder), never run. A
``module:function`` parser is the user's own function, imported at start; it gets the reply's text.

Every parser first drops the judge's reasoning (``<think>...</think>``); a reply whose reasoning never closes (cut
off by ``max_tokens``) holds no verdict. A parser returns the score, or None when the reply holds no verdict.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
# a number; "7/10" reads 7 (the denominator is the scale), "8.5 / 10" reads 8.5
_NUMBER = re.compile(r"(?<![\w.])([-+]?\d+(?:\.\d+)?)(?:\s*/\s*\d+(?:\.\d+)?)?(?![\w])")
_DECODER = json.JSONDecoder()
_MARKUP = "*_`'\" \t\r\n.:;,!()[]"

Parser = Callable[[str | None], float | None]


def strip_reasoning(text: str | None) -> str | None:
    """The reply without its ``<think>`` sections; None when reasoning is left open (the verdict never came)."""
    if text is None:
        return None
    text = _THINK.sub("", text)
    if "<think>" in text.lower():
        return None
    return text


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _scaled(x: float | None, bounds: Sequence[float] | None) -> float | None:
    """``x`` mapped from ``bounds`` (lo, hi) onto [0, 1]; None outside it (the judge ignored its scale)."""
    if x is None or bounds is None:
        return x
    lo, hi = bounds
    if not lo <= x <= hi:
        return None
    return (x - lo) / (hi - lo)


def _last(pattern: re.Pattern[str] | None, text: str) -> str | None:
    """The verdict's text: the first group (else the whole match) of the pattern's last match."""
    if pattern is None:
        return text
    matches = list(pattern.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    return m.group(1) if pattern.groups else m.group(0)


def parse_number(reply: str | None, pattern: re.Pattern[str] | None = None, bounds: Sequence[float] | None = None):
    """The last number in the reply (or in the pattern's last match); scaled from ``bounds`` onto [0, 1]."""
    text = strip_reasoning(reply)
    found = _last(pattern, text) if text is not None else None
    if found is None:
        return None
    numbers = _NUMBER.findall(found)
    if not numbers:
        return None
    return _scaled(_finite(float(numbers[-1])), bounds)


def _norm(label: str) -> str:
    return label.strip(_MARKUP).casefold()


def parse_label(reply: str | None, labels: Mapping[str, float], pattern: re.Pattern[str] | None = None):
    """The score of the label in the reply: the pattern's last match (its group) looked up case-insensitively;
    without a pattern, the last of the labels the reply mentions as a whole word."""
    text = strip_reasoning(reply)
    if text is None:
        return None
    table = {_norm(k): float(v) for k, v in labels.items()}
    if pattern is not None:
        found = _last(pattern, text)
        return None if found is None else table.get(_norm(found))
    words = "|".join(re.escape(k) for k in sorted(labels, key=len, reverse=True))
    matches = list(re.finditer(rf"(?<!\w)({words})(?!\w)", text, re.IGNORECASE))
    return table.get(_norm(matches[-1].group(1))) if matches else None


def _json_objects(text: str) -> list[Any]:
    """Every JSON object embedded in ``text``, left to right (a span that does not parse is skipped)."""
    found, i = [], 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return found
        try:
            value, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        found.append(value)
        i = end


def _lookup(obj: Any, path: Sequence[str]) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


_MISSING = object()


def parse_json(
    reply: str | None,
    key: str,
    labels: Mapping[str, float] | None = None,
    bounds: Sequence[float] | None = None,
) -> float | None:
    """The value under ``key`` (``a.b`` for nested) of the last JSON object in the reply that has it: a number
    (scaled from ``bounds``), true/false (1/0), or a string (a label of ``labels``, else a number)."""
    text = strip_reasoning(reply)
    if text is None:
        return None
    path = key.split(".")
    for obj in reversed(_json_objects(text)):
        value = _lookup(obj, path)
        if value is _MISSING:
            continue
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, (int, float)):
            return _scaled(_finite(float(value)), bounds)
        if isinstance(value, str):
            if labels:
                return {_norm(k): float(v) for k, v in labels.items()}.get(_norm(value))
            try:
                return _scaled(_finite(float(value.strip())), bounds)
            except ValueError:
                return None
        return None
    return None


def load_function(spec: str) -> Callable[[str], Any]:
    """The user's ``module:function`` (dots in the function part for attributes). ImportError, AttributeError or
    TypeError (not callable) say what failed."""
    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is a {type(obj).__name__}, not a function")
    return obj


def call_function(fn: Callable[[str], Any], reply: str | None) -> float | None:
    """The user's parser on the reply's text: a number (bool as 1/0) or None; anything else is no verdict."""
    if reply is None:
        return None
    value = fn(reply)
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return _finite(float(value))
    return None


REDUCTIONS = ("mean", "median", "majority", "min", "max")


def reduce_scores(scores: Sequence[float], how: str) -> float:
    """One score from several judgements' scores. ``majority``: the most frequent score, the lowest of a tie (a
    split judge does not hand out the higher reward)."""
    if not scores:
        raise ValueError("no scores to reduce")
    if how == "mean":
        return sum(scores) / len(scores)
    if how == "median":
        return float(statistics.median(scores))
    if how == "min":
        return min(scores)
    if how == "max":
        return max(scores)
    if how == "majority":
        counts = Counter(scores)
        top = max(counts.values())
        return min(s for s, c in counts.items() if c == top)
    raise ValueError(f"unknown reduction {how!r}; known: {', '.join(REDUCTIONS)}")
