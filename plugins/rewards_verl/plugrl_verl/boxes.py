"""The one brace scan verl's scorers share: where a ``\\boxed{...}`` that starts at some index closes."""

from __future__ import annotations


def closing_brace(text: str, start: int) -> int | None:
    """The index of the ``}`` at which the braces counted from ``start`` first come back to none open, or None.

    As verl's scans: a ``}`` before any ``{`` counts too (the count goes below zero and never comes back on a ``}``).
    """
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None
