"""The ``math_tools`` template: the problem, an invitation to use the tools, and the answer format that the
reward for the sample's ``data_source`` reads.

* ``openai/gsm8k`` (and any source not listed below): the final answer after ``####``, as the gsm8k plugin's
  strict reward reads it (the number after the last ``"#### "``);
* ``math``, ``lighteval/MATH``, ``HuggingFaceH4/MATH-500``: the final answer in ``\\boxed{}``, which the math
  plugin's ``math_accuracy`` reads (math-verify).

The question is the row's ``question`` (GSM8K's files), ``extra_info.question`` (the ``gsm8k`` dataset),
``problem`` (MATH's files), else the text of the sample's last user message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from plugrl.specs import template

HASH_FORMAT = 'end your final reply with the answer as a number after "####", for example "#### 42"'
BOXED_FORMAT = "end your final reply with the answer in \\boxed{}, for example \\boxed{42}"
ANSWER_FORMATS: dict[str, str] = {
    "openai/gsm8k": HASH_FORMAT,
    "math": BOXED_FORMAT,
    "lighteval/MATH": BOXED_FORMAT,
    "HuggingFaceH4/MATH-500": BOXED_FORMAT,
}


def answer_instruction(data_source: str) -> str:
    """What the template asks of the model for a sample of ``data_source``."""
    answer = ANSWER_FORMATS.get(data_source, HASH_FORMAT)
    return (
        "Solve the problem step by step. Use the tools to calculate whenever you need a number. "
        f"When you are done, {answer}."
    )


def sample_question(sample: Any) -> str:
    """The problem text of a :class:`plugrl.data.Sample` (or of a row mapping); a ValueError without one."""
    if isinstance(sample, Mapping):
        row, extra, prompt = sample, sample.get("extra_info") or {}, sample.get("prompt")
    else:
        row = getattr(sample, "row", None) or {}
        extra, prompt = getattr(sample, "extra_info", None) or {}, getattr(sample, "prompt", None)
    for value in (row.get("question"), extra.get("question"), row.get("problem")):
        if isinstance(value, str) and value.strip():
            return value.strip()
    if isinstance(prompt, str) and prompt.strip():
        return prompt.strip()
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users and isinstance(users[-1], str) and users[-1].strip():
            return users[-1].strip()
    raise ValueError(
        "template 'math_tools' needs the problem in the row's 'question' or 'problem' field, in "
        "extra_info.question, or as the prompt"
    )


def _data_source(sample: Any) -> str:
    value = sample.get("data_source") if isinstance(sample, Mapping) else getattr(sample, "data_source", "")
    return value if isinstance(value, str) else ""


@template("math_tools")
def math_tools_template(sample: Any) -> list[dict[str, str]]:
    """One user message: the problem, then :func:`answer_instruction` for the sample's data source."""
    return [{"role": "user", "content": f"{sample_question(sample)}\n\n{answer_instruction(_data_source(sample))}"}]
