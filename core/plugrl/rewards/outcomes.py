"""What one reward call came to, as a small picklable tuple; and the error of misconfigured rewards.

Shared by the runner (inline, async and batch calls) and the worker processes of the pool, so it
imports nothing from the rest of the package.
"""

from __future__ import annotations

import math
import numbers
import traceback
from typing import Any


class RewardError(RuntimeError):
    """Rewards are misconfigured (no route, bad options, unpicklable function); the message says how to fix it."""


class StopRun(RewardError):
    """Raised by a reward function when scoring cannot go on (a verifier server that stopped answering, a verifier
    that answers in another template's form): the runner stops the run with its message, after the batch, instead of
    scoring ``reward.error_score`` and training on. Picklable, so it comes back from the reward workers too."""


# Outcomes: ("ok", score, extras) | ("skip",) | ("error", message, traceback) | ("timeout", message)
# | ("stop", message): a StopRun, which ends the run
Outcome = tuple

_MSG_LIMIT = 500


def _short(text: str) -> str:
    return text if len(text) <= _MSG_LIMIT else text[: _MSG_LIMIT - 3] + "..."


def _error(e: BaseException) -> Outcome:
    if isinstance(e, StopRun):
        return ("stop", str(e))
    return ("error", _short(f"{type(e).__name__}: {e}"), "".join(traceback.format_exception(e)))


def _normalize(result: Any) -> Outcome:
    """A function's return value -> outcome; non-numeric or non-finite scores are errors."""
    extras: dict[str, Any] = {}
    value = result
    if isinstance(result, dict):
        if "score" not in result:
            keys = ", ".join(sorted(map(str, result))[:10])
            return ("error", f"returned a dict without 'score' (keys: {keys})", "")
        value = result["score"]
        extras = {str(k): v for k, v in result.items() if k != "score"}
    if isinstance(value, (str, bytes)) or not (isinstance(value, numbers.Real) or hasattr(type(value), "__float__")):
        return ("error", _short(f"returned {type(value).__name__} {value!r}, expected a float"), "")
    try:
        score = float(value)
    except Exception as e:  # e.g. a tensor with several elements
        return ("error", _short(f"returned {type(value).__name__}, not convertible to float ({e})"), "")
    if not math.isfinite(score):
        return ("error", f"returned a non-finite score ({score})", "")
    return ("ok", score, extras)
