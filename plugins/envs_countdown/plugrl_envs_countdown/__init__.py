"""plugrl plugin: countdown as a multi-turn task: a wrong answer gets feedback and another try.

Registers the environment ``countdown_retry`` (options: ``max_attempts``, ``feedback``, ``reward_decay``)
and the template ``countdown_multiturn`` (asks for ``<answer>expression</answer>`` and says that another
try may follow). Problems, answer extraction and arithmetic are the ``countdown`` plugin's
(``plugrl-datasets-countdown``), so an answer is correct here exactly when its reward calls it correct.
The plugin loader collects the decorated objects below.
"""

from .prompt import countdown_multiturn_template, multiturn_instruction
from .retry import CountdownRetry, CountdownRetryOptions, Verdict, judge

__all__ = [
    "CountdownRetry",
    "CountdownRetryOptions",
    "Verdict",
    "countdown_multiturn_template",
    "judge",
    "multiturn_instruction",
]
