"""The ``math_tools`` environment: a math problem, with tools to compute while solving it.

Each episode starts with the sample's own prompt (as ``data.template`` renders it; the ``math_tools`` template
asks for tool use and the answer format) and offers the tools named in ``environment_options.tools``. The
episode goes on while the model calls tools (the kernel runs the calls and appends their results) and ends at
the first reply without a tool call, or when ``rollout.max_turns`` or the token budget runs out: the default of
:class:`plugrl.Environment`. It returns no reward, so the reward plugins score the last reply by the sample's
``data_source`` (``openai/gsm8k``: the gsm8k plugin's ``#### <number>``; ``math``: math-verify on ``\\boxed{}``),
exactly as they score a single-turn answer.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from plugrl.rollout.environment import Environment, EnvStart
from plugrl.specs import environment

DEFAULT_TOOLS = ("calculator", "python")
_TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")  # the kernel's rule for tool names


class MathToolsOptions(BaseModel):
    """``environment_options`` of ``math_tools``."""

    model_config = ConfigDict(extra="forbid")

    tools: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TOOLS),
        description="Registered tools offered in every episode, added to rollout.tools: 'calculator' (this "
        "plugin), 'python' (plugrl's sandbox) or any other plugin's; [] offers none (a baseline without tools).",
    )

    @field_validator("tools")
    @classmethod
    def _names(cls, tools: list[str]) -> list[str]:
        for name in tools:
            if not _TOOL_NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a tool name (letters, digits, '_' or '-'; at most 64)")
        repeated = sorted({n for n in tools if tools.count(n) > 1})
        if repeated:
            raise ValueError(f"names a tool more than once: {', '.join(repeated)}")
        return tools


@environment("math_tools", options=MathToolsOptions, tool_options=("tools",))
class MathTools(Environment):
    """One math episode: the sample's prompt and the configured tools; ends at the first reply without a tool
    call (the inherited ``step``); scored by the reward plugins (no reward of its own)."""

    def __init__(self, **options: Any):
        self.options = MathToolsOptions(**options)

    def start(self, sample: Any) -> EnvStart:
        return EnvStart(tools=list(self.options.tools))  # messages=None: the sample's own prompt
