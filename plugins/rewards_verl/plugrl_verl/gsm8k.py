"""GSM8K as verl scores ``openai/gsm8k`` (``verl.utils.reward_score.gsm8k``): the number after the last ``#### ``
in the completion's last 300 characters, compared as text with the ground truth.

plugrl's own GSM8K plugin (``plugrl-rewards-gsm8k``) reads a few right answers verl gives no credit (``#### $18``,
``#### 18.``); this one keeps verl's scores exactly, for runs that must match a verl run.
"""

from __future__ import annotations

import re
from typing import Any

CLIP_CHARS = 300  # verl reads only the end of a completion
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_ANY_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")


def extract(completion: str, method: str = "strict") -> str | None:
    """The final answer verl reads: ``strict``, after the last ``#### `` (commas and ``$`` dropped); ``flexible``,
    the last run of digits, dots and commas that is not a lone ``.`` (kept as written)."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be strict or flexible, got {method!r}")
    text = completion[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(text)
        return found[-1].replace(",", "").replace("$", "") if found else None
    candidates = _ANY_NUMBER.findall(text)
    if not candidates:
        return None
    return next((c for c in reversed(candidates) if c not in ("", ".")), candidates[0])


def gsm8k_score(
    completion: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` when the extracted answer equals the ground truth, ``format_score`` when it differs, 0 without one."""
    answer = extract(completion, method)
    if answer is None:
        return 0.0
    return float(score if answer == ground_truth else format_score)
