"""Reading the group ids out of a chat model's reply, which is rarely just the JSON that was asked for."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_DECODER = json.JSONDecoder()
# `"groups": [1, 2, 1]` in a reply that is not valid JSON (single quotes, a trailing comma, a cut-off object)
_GROUPS_RE = re.compile(r"""["']?groups["']?\s*[:=]\s*\[([-+\d\s,"']*)\]""", re.IGNORECASE)
_INT_RE = re.compile(r"^[-+]?\d+$")


def _json_values(text: str) -> Iterator[Any]:
    """Every JSON object or array embedded in ``text``, outermost first, left to right.

    A span that does not parse is skipped one character at a time, so values nested in a broken
    outer object are still found.
    """
    i = 0
    while i < len(text):
        if text[i] in "{[":
            try:
                value, end = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            yield value
            i = end
        else:
            i += 1


def _as_int(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and _INT_RE.match(x.strip()):
        return int(x.strip())
    return None


def _ids(value: Any, n: int) -> list[int] | None:
    """``value`` as ``n`` group ids: a list of integers, or a partition of the solution numbers.

    A partition is a list of lists of solution numbers (1-based, or 0-based), every solution in
    exactly one list: ``[[1, 2, 4], [3]]`` -> ``[0, 0, 1, 0]``.
    """
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(v, list) for v in value):
        members = [[_as_int(x) for x in group] for group in value]
        flat = [x for group in members for x in group]
        if None in flat or len(flat) != n or len(set(flat)) != n:
            return None
        base = 1 if set(flat) == set(range(1, n + 1)) else 0 if set(flat) == set(range(n)) else None
        if base is None:
            return None
        ids = [0] * n
        for g, group in enumerate(members):
            for x in group:
                ids[x - base] = g
        return ids
    ids = [_as_int(v) for v in value]
    if None in ids or len(ids) != n:
        return None
    return ids  # type: ignore[return-value]


def _candidates(text: str) -> tuple[list[Any], str]:
    """The values that may hold the answer, most specific kind first, and what kind they are."""
    values = list(_json_values(text))
    keyed = [
        v[k] for v in values if isinstance(v, dict) for k in v if isinstance(k, str) and k.strip().lower() == "groups"
    ]
    if keyed:
        return keyed, '"groups" object'
    loose = [
        [x for x in m.group(1).replace('"', " ").replace("'", " ").split(",") if x.strip()]
        for m in _GROUPS_RE.finditer(text)
    ]
    if loose:
        return loose, '"groups" list'
    return [v for v in values if isinstance(v, list)], "JSON list"


def parse_groups(text: str | None, n: int) -> list[int]:
    """The ``n`` group ids in a classifier reply; ValueError when there are none, or not exactly ``n``.

    Accepted, in order of preference: a JSON object with a ``groups`` key (anywhere in the text,
    inside code fences or prose), a ``groups: [...]`` list that is not strict JSON (single quotes,
    trailing comma), then a bare JSON list. The ids may be integers (also as ``2.0`` or ``"2"``) or
    a partition of the solution numbers (``[[1, 2], [3]]``). When several candidates of the
    preferred kind appear, the last valid one wins (models tend to restate the format first and
    answer last).
    """
    if text is None or not text.strip():
        raise ValueError("the classifier model's reply is empty")
    candidates, kind = _candidates(text)
    for value in reversed(candidates):
        ids = _ids(value, n)
        if ids is not None:
            return ids
    snippet = " ".join(text.split())[:300]
    if candidates:
        sizes = sorted({len(v) if isinstance(v, list) else -1 for v in candidates})
        shown = ", ".join("not a list" if s < 0 else str(s) for s in sizes)
        raise ValueError(f"no valid {kind} of {n} group ids in the reply (found entries: {shown}): {snippet!r}")
    raise ValueError(f"no JSON group ids in the reply: {snippet!r}")
