"""The verifier's prompts, and the texts they are built from (question, the policy's answer).

Two templates:

* ``tinyv``: the question, the ground-truth answer and the policy's final answer (the text after
  its reasoning); the verifier replies ``True`` or ``False``.
* ``rubric``: the question, scoring criteria (``extra_info["rubric"]`` or ``extra_info["criteria"]``)
  and the policy's whole answer; the verifier reviews it and ends with ``Total Score: x/10``.

Every piece of text is cut to a bounded length before it goes into a prompt, so a huge completion
makes a request of bounded size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

THINK_CLOSE = "</think>"
CUT_MARK = "\n[...]\n"

TINYV_TEMPLATE = """\
Decide whether a student's final answer to a problem is correct.

## Problem
{question}

## Reference answer
{ground_truth}

## Student's final answer
{answer}

## How to decide
The student's answer is correct when it means the same as the reference answer, even if it is \
written differently: an equivalent expression or number, another notation, a different but equal \
form of a fraction, root or interval, added units or words, or rounding that keeps the reference's \
precision. It is incorrect when it gives a different value, leaves out part of the answer, gives \
several conflicting answers, or gives no final answer at all. Judge only the final answer, not \
the reasoning or the style.

Reply with one word: True if the student's final answer is correct, False if it is not."""

RUBRIC_TEMPLATE = """\
Grade a response to a problem against scoring criteria.

## Problem
{question}

## Reference answer
{ground_truth}

## Scoring criteria
{criteria}

## Response to grade
{answer}

## How to grade
Check the response against each criterion in turn and say briefly which ones it meets. Then \
finish with one last line, in exactly this form, where x is a number from 0 to 10:
Total Score: x/10"""

DEFAULT_CRITERIA = (
    "- The final answer agrees with the reference answer (an equivalent form counts): 10 points.\n"
    "- A wrong, missing or ambiguous final answer: 0 points, however good the reasoning."
)

TEMPLATES = {"tinyv": TINYV_TEMPLATE, "rubric": RUBRIC_TEMPLATE}


def strip_reasoning(text: str) -> str:
    """The text after the last ``</think>`` (a thinking model's answer), or all of ``text`` when there is none."""
    cut = text.rfind(THINK_CLOSE)
    return text if cut < 0 else text[cut + len(THINK_CLOSE) :]


def tail(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text`` (a final answer is at the end), marked when cut."""
    if len(text) <= limit:
        return text
    return CUT_MARK.lstrip("\n") + text[len(text) - limit :]


def head_and_tail(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters by dropping its middle (keeps the start and the conclusion)."""
    if len(text) <= limit:
        return text
    half = max(1, limit // 2)
    return text[:half] + CUT_MARK + text[len(text) - half :]


def _content(message: Any) -> str:
    if isinstance(message, Mapping):
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):  # OpenAI-style content parts
            return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def question_text(extra_info: Any = None, sample: Any = None, prompt: Any = None) -> str:
    """The problem statement: ``extra_info["question"]`` when present, else the sample's prompt
    (its last user message when it is chat messages), else the rendered prompt text."""
    if isinstance(extra_info, Mapping):
        q = extra_info.get("question")
        if isinstance(q, str) and q.strip():
            return q.strip()
    raw = getattr(sample, "prompt", None)
    if isinstance(raw, str) and raw.strip():
        return raw.strip()
    if isinstance(raw, list):
        users = [_content(m) for m in raw if isinstance(m, Mapping) and m.get("role") == "user"]
        users = [u for u in users if u.strip()]
        if users:
            return users[-1].strip()
    if isinstance(prompt, str) and prompt.strip():
        return prompt.strip()
    return "(the problem statement is not available)"


def criteria_text(extra_info: Any) -> str:
    """The scoring criteria from ``extra_info["rubric"]`` or ``extra_info["criteria"]`` (text, or a list of items)."""
    if isinstance(extra_info, Mapping):
        for key in ("rubric", "criteria"):
            value = extra_info.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip()
            if isinstance(value, (list, tuple)) and value:
                return "\n".join(f"- {item}" for item in value)
    return DEFAULT_CRITERIA


def ground_truth_text(ground_truth: Any) -> str:
    if isinstance(ground_truth, (list, tuple)):
        return " or ".join(str(g) for g in ground_truth)  # several acceptable answers
    return str(ground_truth)


def build_messages(
    template: str,
    completion: str,
    ground_truth: Any,
    *,
    extra_info: Any = None,
    sample: Any = None,
    prompt: Any = None,
    max_question_chars: int = 4000,
    max_answer_chars: int = 4000,
) -> list[dict[str, str]]:
    """The chat messages of one verification request (a single user turn)."""
    question = head_and_tail(question_text(extra_info, sample, prompt), max_question_chars)
    gold = head_and_tail(ground_truth_text(ground_truth), max_question_chars)
    if template == "tinyv":
        answer = tail(strip_reasoning(completion).strip(), max_answer_chars) or "(no answer)"
        text = TINYV_TEMPLATE.format(question=question, ground_truth=gold, answer=answer)
    elif template == "rubric":
        answer = head_and_tail(completion.strip(), max_answer_chars) or "(empty response)"
        criteria = head_and_tail(criteria_text(extra_info), max_question_chars)
        text = RUBRIC_TEMPLATE.format(question=question, ground_truth=gold, criteria=criteria, answer=answer)
    else:
        raise ValueError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")
    return [{"role": "user", "content": text}]
