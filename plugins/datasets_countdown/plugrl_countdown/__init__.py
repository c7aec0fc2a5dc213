"""plugrl plugin: the countdown task (TinyZero-compatible).

Registers the dataset ``countdown``, the templates ``countdown`` (chat messages) and
``countdown_r1`` (base-model text), and the reward ``countdown_reward`` for data
source ``countdown``. The plugin loader collects the decorated functions below.
"""

from .arith import ArithError, evaluate
from .problems import countdown_dataset, countdown_r1_template, countdown_template
from .scoring import countdown_reward

__all__ = [
    "ArithError",
    "countdown_dataset",
    "countdown_r1_template",
    "countdown_reward",
    "countdown_template",
    "evaluate",
]
