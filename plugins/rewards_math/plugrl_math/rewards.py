"""The reward functions (module level, so plugrl's reward workers import them by reference)."""

from __future__ import annotations

from typing import Any

from plugrl.specs import reward

from .formats import count_tags, has_think_answer_format
from .verify import DEFAULT_MAX_CHARS, DEFAULT_MAX_NESTING, DEFAULT_TIME_LIMIT_S, check_answer

DATA_SOURCES = ("math", "lighteval/MATH", "HuggingFaceH4/MATH-500")


@reward(*DATA_SOURCES, name="math_accuracy")
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
    Options (``reward.options.math_accuracy``): ``time_limit_s`` (budget of one check, keep it
    below ``reward.timeout_s``; 0 or null: none), ``max_chars`` (only the last ``max_chars``
    characters of the answer text are read), ``max_nesting`` (deeper bracket nesting is
    refused), ``use_answer_tag`` (read the last ``<answer>...</answer>`` when present),
    ``require_anchor`` (without ``<answer>`` tags, only ``\\boxed{}``, ``answer: ...`` or
    ``final answer is ...`` count, as in TRL; false: the rightmost number anywhere counts).
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
