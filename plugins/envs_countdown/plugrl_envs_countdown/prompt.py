"""The ``countdown_multiturn`` template: the countdown task for a model that must write the tags itself.

The ``countdown`` template asks for reasoning in ``<think>`` tags before the answer, which the default job
skips with the assistant prefill ``<answer>``; a multi-turn run has no prefill (every turn would need it),
and a small model's turn is only a few dozen tokens. So this template asks for the equation alone, in
``<answer> </answer>`` tags, and tells the model that a wrong answer gets feedback and another try.
"""

from __future__ import annotations

from typing import Any

from plugrl.specs import template
from plugrl_countdown.problems import sample_problem  # the ground truth, else the row's TinyZero columns


def multiturn_instruction(numbers: list[int | float], target: int | float) -> str:
    return (
        f"Using the numbers {list(numbers)}, create an equation that equals {target}. "
        "You may use +, -, * and /, and must use each number exactly once. "
        "Reply with only the equation inside <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>. "
        "If it is wrong, you will be told why and may try again."
    )


@template("countdown_multiturn")
def countdown_multiturn_template(sample: Any) -> list[dict[str, str]]:
    """Chat messages: one user message with the task, the answer format and the promise of another try."""
    target, numbers = sample_problem(sample)
    return [{"role": "user", "content": multiturn_instruction(numbers, target)}]
