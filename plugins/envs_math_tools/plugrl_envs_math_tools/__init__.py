"""plugrl plugin: math word problems solved with tools.

Registers the tool ``calculator`` (exact arithmetic by walking the expression's syntax tree, never ``eval``),
the environment ``math_tools`` (offers ``environment_options.tools``, by default ``calculator`` and plugrl's
sandboxed ``python``; the episode ends at the first reply without a tool call; the reward plugins score it by
``data_source``) and the template ``math_tools`` (the problem, an invitation to use the tools and the answer
format of the sample's reward: ``#### 42`` for GSM8K, ``\\boxed{42}`` for MATH).
The plugin loader collects the decorated objects below.
"""

from .calculator import CalcError, calculator, evaluate, format_number
from .env import DEFAULT_TOOLS, MathTools, MathToolsOptions
from .prompt import ANSWER_FORMATS, answer_instruction, math_tools_template, sample_question

__all__ = [
    "ANSWER_FORMATS",
    "DEFAULT_TOOLS",
    "CalcError",
    "MathTools",
    "MathToolsOptions",
    "answer_instruction",
    "calculator",
    "evaluate",
    "format_number",
    "math_tools_template",
    "sample_question",
]
