"""The judge's prompt: a template with placeholders filled from the sample, in one pass.

Placeholders are ``{name}`` with ``name`` one of :data:`FIELDS`, or ``{extra_info.KEY}`` for a field of the row's
``extra_info``. Anything else in braces that is not a name (a JSON example such as ``{"score": 7}``) is kept as
written; a ``{name}`` that is not a placeholder is an error at start, so a typo never reaches the judge.

Filling is one pass over the template: text put in (the policy's completion, which is untrusted) is never read
for placeholders again, so a completion that writes ``{ground_truth}`` does not get the answer filled in.
"""

from __future__ import annotations

import json
import re
from typing import Any

# name -> what it holds (the README's table)
FIELDS = {
    "question": "extra_info.question when the row has one, else the sample's prompt (a chat prompt's last user "
    "message), else the rendered prompt",
    "prompt": "the prompt as the policy saw it (rendered by the chat template)",
    "completion": "the policy's completion (its last max_completion_chars characters)",
    "answer": "the same as completion",
    "ground_truth": "the row's ground truth (empty when it has none)",
    "data_source": "the row's data source",
}
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?)\}")


def placeholders(text: str) -> list[str]:
    return [m.group(1) for m in PLACEHOLDER.finditer(text)]


def check_template(text: str) -> str | None:
    """What is wrong with a template (None: nothing), worded to follow the option's key."""
    names = placeholders(text)
    unknown = sorted({n for n in names if n not in FIELDS and not n.startswith("extra_info.")})
    if unknown:
        return (
            f"has unknown placeholders {', '.join('{' + n + '}' for n in unknown)}; known: "
            f"{', '.join('{' + n + '}' for n in FIELDS)} and {{extra_info.KEY}}"
        )
    if "completion" not in names and "answer" not in names:
        return "must show the judge the completion: put {completion} (or {answer}) in it"
    return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def question_of(sample: Any, prompt: Any, extra_info: Any) -> str:
    """``extra_info.question``, else the sample's own prompt (a chat prompt's last user message), else ``prompt``."""
    info = extra_info if isinstance(extra_info, dict) else getattr(sample, "extra_info", None)
    if isinstance(info, dict) and isinstance(info.get("question"), str):
        return info["question"]
    raw = getattr(sample, "prompt", None)
    if isinstance(raw, str) and raw.strip():
        return raw
    if isinstance(raw, list):
        users = [m.get("content") for m in raw if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    return _text(prompt)


def cut(text: str, limit: int) -> str:
    """The last ``limit`` characters of ``text`` (answers come at the end), marked when cut."""
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]{text[-limit:]}"


class MissingField(KeyError):
    """A placeholder names an ``extra_info`` key the row does not have."""


def render(
    template: str,
    *,
    completion: str,
    ground_truth: Any = None,
    prompt: Any = None,
    sample: Any = None,
    extra_info: Any = None,
    data_source: Any = None,
    max_completion_chars: int | None = None,
) -> str:
    """The template filled from one sample (one pass). :class:`MissingField` for an absent ``extra_info.KEY``."""
    shown = completion if max_completion_chars is None else cut(completion, max_completion_chars)
    values = {
        "question": lambda: question_of(sample, prompt, extra_info),
        "prompt": lambda: _text(prompt),
        "completion": lambda: shown,
        "answer": lambda: shown,
        "ground_truth": lambda: _text(ground_truth),
        "data_source": lambda: _text(data_source if data_source is not None else getattr(sample, "data_source", "")),
    }
    info = extra_info if isinstance(extra_info, dict) else {}

    def fill(m: re.Match[str]) -> str:
        name = m.group(1)
        if name in values:
            return values[name]()
        if name.startswith("extra_info."):
            key = name.split(".", 1)[1]
            if key not in info:
                raise MissingField(
                    f"the prompt_template's {{{name}}}: this row's extra_info has no {key!r} "
                    f"(it has: {', '.join(sorted(map(str, info))) or 'nothing'})"
                )
            return _text(info[key])
        return m.group(0)  # not a placeholder (check_template refuses these at start)

    return PLACEHOLDER.sub(fill, template)
