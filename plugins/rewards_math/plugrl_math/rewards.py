"""The reward functions (module level, so plugrl's reward workers import them by reference)."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from plugrl.specs import reward

from .formats import count_tags, has_think_answer_format
from .verify import DEFAULT_MAX_CHARS, DEFAULT_MAX_NESTING, DEFAULT_TIME_LIMIT_S, check_answer

# the MATH names verl's default scorer routes to its math reward, and plugrl's own `math`
DATA_SOURCES = ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")


class MathAccuracyOptions(BaseModel):
    """The options of ``math_accuracy`` (``reward.options.math_accuracy``), declared once: the kernel validates
    them at start-up, before any model loads, and passes the validated values to the function as keywords."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    time_limit_s: float | None = Field(
        DEFAULT_TIME_LIMIT_S,
        description="the time budget of one check (parse gold + parse prediction + compare), in seconds, in any "
        "thread: a finite number, kept below reward.timeout_s; 0 or null: no budget of its own (reward.timeout_s "
        "still applies in the reward workers; the size and nesting guards always do)",
    )
    max_chars: int = Field(
        DEFAULT_MAX_CHARS,
        ge=1,
        description="only the last max_chars characters of the answer text (and of each ground-truth text) are read",
    )
    max_nesting: int = Field(
        DEFAULT_MAX_NESTING,
        ge=1,
        description="an answer with deeper nesting of ( [ { is refused before parsing (a ground-truth text that "
        "deep counts as no gold)",
    )
    use_answer_tag: bool = Field(True, description="read the last <answer>...</answer> when there is one")
    require_anchor: bool = Field(
        True,
        description="without <answer> tags, only \\boxed{}, 'answer: ...' or 'final answer is ...' count; "
        "false: the rightmost number or formula anywhere counts",
    )

    @field_validator("time_limit_s", mode="before")
    @classmethod
    def _time_limit(cls, value: Any) -> float | None:
        if value is None:
            return None
        try:
            seconds = math.nan if isinstance(value, bool) else float(value)
        except (TypeError, ValueError, OverflowError):
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                "must be a finite number of seconds >= 0, below reward.timeout_s (0 or null: no budget of its own)"
            )
        return seconds

    @field_validator("max_chars", "max_nesting", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a whole number, not true or false")
        return value


@reward(*DATA_SOURCES, name="math_accuracy", options=MathAccuracyOptions)
def math_accuracy(
    completion: str,
    ground_truth: Any,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_nesting: int = DEFAULT_MAX_NESTING,
    use_answer_tag: bool = True,
    require_anchor: bool = True,
) -> dict:
    """1.0 when the completion's final answer equals ``ground_truth`` (math-verify), else 0.0.

    Result fields: ``score``, ``status`` (``correct``, ``wrong``, ``no_answer``, ``no_gold``,
    ``refused``, ``timeout``; see :class:`plugrl_math.MathCheck`) and ``extracted`` (the
    answer text found). A ground truth that cannot be parsed scores 0.0 with status
    ``no_gold`` for every completion of the prompt, so under GRPO that prompt gives the
    accuracy no signal (TRL skips such samples, returning None).

    Contract, for any input, in the main thread or any other: it returns such a dict (score 0.0
    or 1.0), or raises ``ValueError`` for a ground truth of the wrong type (not a text, number or
    list of them; lists nested deeper than 8 or holding over 100 answers); it never raises for a
    bad completion, and nothing escapes as ``RecursionError``. It takes about ``time_limit_s`` at
    most (plus linear work on the raw texts): see :mod:`plugrl_math.verify` for what enforces the
    budget in the main thread (``setitimer``) and in other threads (a watchdog thread).

    Options (``reward.options.math_accuracy``): the keywords after ``ground_truth``, declared with
    their meaning and checks by :class:`MathAccuracyOptions` (the kernel validates the config against it
    at start-up and passes the validated values; the defaults here are the same constants).
    """
    check = check_answer(
        completion,
        ground_truth,
        time_limit_s=time_limit_s,
        max_chars=int(max_chars),
        max_nesting_depth=int(max_nesting),
        use_answer_tag=bool(use_answer_tag),
        require_anchor=bool(require_anchor),
    )
    return {"score": 1.0 if check.correct else 0.0, "status": check.status, "extracted": check.extracted}


@reward(*DATA_SOURCES, name="think_answer_format", weight=0.2)
def think_answer_format(completion: str, ground_truth: Any) -> float:
    """1.0 if the completion is ``<think>...</think>`` then ``<answer>...</answer>`` and nothing else
    (``^<think>.*?</think>\\s*<answer>.*?</answer>$``, DOTALL, surrounding whitespace allowed), else 0.0."""
    return 1.0 if has_think_answer_format(completion) else 0.0


@reward(*DATA_SOURCES, name="tag_count", weight=0.0)
def tag_count(completion: str, ground_truth: Any) -> float:
    """0.25 for each of ``<think>\\n``, ``\\n</think>\\n``, ``\\n<answer>\\n``, ``\\n</answer>`` present exactly once
    (open-r1). Weight 0 unless enabled: ``reward.weights.tag_count: 0.5``."""
    return count_tags(completion)
