"""plugrl plugin: rewards for math problems with a known final answer.

Registers, for the data sources ``math``, ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval`` and
``HuggingFaceH4/MATH-500``:

* ``math_accuracy`` (weight 1.0): 1.0 when the completion's final answer equals the
  ground truth according to math-verify, else 0.0; its options (``reward.options.math_accuracy``)
  are declared by :class:`MathAccuracyOptions`;
* ``think_answer_format`` (weight 0.2): 1.0 for ``<think>...</think> <answer>...</answer>``;
* ``tag_count`` (weight 0.0, enable with ``reward.weights.tag_count``): 0.25 per
  well-placed tag, as in open-r1.

:func:`math_equal` is the accuracy check as a plain function, for other plugins.
"""

from .formats import count_tags, has_think_answer_format
from .rewards import DATA_SOURCES, MathAccuracyOptions, math_accuracy, tag_count, think_answer_format
from .verify import MathCheck, check_answer, extract_answer_tag, math_equal

__all__ = [
    "DATA_SOURCES",
    "MathAccuracyOptions",
    "MathCheck",
    "check_answer",
    "count_tags",
    "extract_answer_tag",
    "has_think_answer_format",
    "math_accuracy",
    "math_equal",
    "tag_count",
    "think_answer_format",
]
