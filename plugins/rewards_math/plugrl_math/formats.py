"""Format checks for ``<think>...</think><answer>...</answer>`` completions (plain functions, linear time)."""

from __future__ import annotations

import re

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_BRIDGE = re.compile(r"</think>\s*<answer>")

# The pattern the format reward stands for; has_think_answer_format decides the same without backtracking.
FORMAT_PATTERN = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def has_think_answer_format(text: str) -> bool:
    """True iff ``text`` fully matches :data:`FORMAT_PATTERN`
    (``^\\s*<think>.*?</think>\\s*<answer>.*?</answer>\\s*$``, DOTALL).

    That is: after optional whitespace it starts with ``<think>``, ends with ``</answer>``
    and optional whitespace, and somewhere between, a ``</think>`` is followed (after
    optional whitespace) by an ``<answer>`` that opens before the final ``</answer>``.
    Both parts may be empty and may contain anything, tags included. Decided in linear
    time (the regex can take quadratic time on texts full of tags).
    """
    if not isinstance(text, str):
        return False
    # str.strip() and the regex's \s agree on what whitespace is for str patterns
    body = text.strip()
    if not body.startswith(THINK_OPEN) or not body.endswith(ANSWER_CLOSE):
        return False
    last_close = len(body) - len(ANSWER_CLOSE)
    # the earliest "</think> <answer>" gives the most room for the answer; the answer's "<answer>"
    # must end at or before the final "</answer>" starts
    m = _BRIDGE.search(body, len(THINK_OPEN))
    return m is not None and m.end() <= last_close


def count_tags(text: str) -> float:
    """open-r1's tag count: 0.25 for each of ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``
    and ``\\n</answer>`` that occurs exactly once (counting non-overlapping occurrences)."""
    if not isinstance(text, str):
        return 0.0
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return 0.25 * sum(text.count(tag) == 1 for tag in tags)
