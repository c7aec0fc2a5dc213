"""The verifier's prompts, and the texts they are built from (question, the policy's answer).

Two kinds of template (``reward.options.tinyv.template``), each with a built-in text that
``reward.options.tinyv.prompt_template`` may replace (:func:`check_template` says which placeholders a
replacement may and must hold):

* ``tinyv``: the question, the ground-truth answer and the policy's final answer (the text after
  its reasoning); the verifier replies ``True`` or ``False``.
* ``rubric``: the question, scoring criteria (``extra_info["rubric"]`` or ``extra_info["criteria"]``)
  and the policy's whole answer; the verifier reviews it and ends with ``Total Score: x/10``.

Every piece of text is cut to a bounded length before it goes into a prompt, so a huge completion
makes a request of bounded size: first in characters (``max_question_chars`` / ``max_answer_chars``),
then in tokens (``max_prompt_tokens``), since the server's context is counted in tokens and a
character holds up to one token (digits) or several (CJK, emoji: SmolLM2 takes 2.2 tokens per CJK
character). Tokens are counted with the verifier's tokenizer when one is given, else bounded from
above: a text's UTF-8 bytes (a byte-level BPE token covers at least one byte) and the templates' own
English text at :data:`TEMPLATE_CHARS_PER_TOKEN` characters a token.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping
from typing import Any

THINK_CLOSE = "</think>"
CUT_MARK = "\n[...]\n"
# what a server's chat template adds around the one user message (role markers, a default system
# prompt: 27 tokens for SmolLM2's, about 30 for Qwen2.5's)
CHAT_MARKUP_TOKENS = 64
# the templates' own text is plain English: 4.6 characters a token with SmolLM2's tokenizer
TEMPLATE_CHARS_PER_TOKEN = 3

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
# the placeholders a template of each kind may hold, and those it must (without them the verifier cannot judge)
TEMPLATE_FIELDS = {
    "tinyv": ("question", "ground_truth", "answer"),
    "rubric": ("question", "ground_truth", "criteria", "answer"),
}
REQUIRED_FIELDS = {"tinyv": ("ground_truth", "answer"), "rubric": ("criteria", "answer")}


def placeholders(text: str) -> list[str]:
    """The ``{name}`` placeholders of a template text, in order (a ValueError for an unmatched brace)."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def check_template(kind: str, text: str) -> str | None:
    """What is wrong with ``text`` as a template of kind ``kind`` (``tinyv`` or ``rubric``), or None.

    A template holds named placeholders only (``{answer}``, no ``{}``, ``{0}``, ``{answer!r}`` or
    ``{answer:>9}``), from :data:`TEMPLATE_FIELDS` for its kind, among them every one of :data:`REQUIRED_FIELDS`;
    a literal brace is written ``{{`` or ``}}``.
    """
    allowed, required = TEMPLATE_FIELDS[kind], REQUIRED_FIELDS[kind]
    names = ", ".join("{" + n + "}" for n in allowed)
    try:
        parts = list(string.Formatter().parse(text))
    except ValueError as e:
        return f"is not a valid template ({e}): write {{{{ and }}}} for a literal brace"
    found: list[str] = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name or name.isdigit():
            return f"has a positional placeholder {{{name}}}: name the field, one of {names}"
        if spec or conversion:
            return (
                f"has {{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}: write {{{name}}}"
            )
        found.append(name)
    unknown = sorted(set(found) - set(allowed))
    if unknown:
        return (
            f"has unknown placeholders {', '.join('{' + u + '}' for u in unknown)}: a {kind} template takes {names} "
            "(write {{ and }} for a literal brace)"
        )
    missing = [n for n in required if n not in found]
    if missing:
        optional = " or ".join("{" + n + "}" for n in allowed if n not in required)
        return (
            f"lacks {', '.join('{' + m + '}' for m in missing)}: a {kind} template must hold "
            f"{' and '.join('{' + r + '}' for r in required)}, and may hold {optional}"
        )
    return None


def template_text(template: str) -> str:
    """The text of a template: a built-in's name (``tinyv``, ``rubric``) or the text itself."""
    return TEMPLATES.get(template, template)


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


def utf8_bytes(text: str) -> int:
    """An upper bound on the tokens of ``text`` for any byte-level BPE tokenizer: its UTF-8 bytes."""
    return len(text.encode("utf-8", errors="replace"))


def frame_tokens(template: str, fields: Mapping[str, str], count: Callable[[str], int] | None = None) -> int:
    """The tokens of a prompt without its texts: the template's own words (``template``: a built-in's name or
    the text) and the chat markup."""
    frame = template_text(template).format(**{k: "" for k in fields})
    own = count(frame) if count is not None else -(-len(frame) // TEMPLATE_CHARS_PER_TOKEN)
    return CHAT_MARKUP_TOKENS + own


def prompt_tokens(template: str, fields: Mapping[str, str], count: Callable[[str], int] | None = None) -> int:
    """The tokens the server will count for a prompt: exact (plus the chat markup) with the verifier's
    tokenizer ``count``, else an upper bound (:func:`utf8_bytes` of the texts, the template estimated)."""
    if count is not None:
        return CHAT_MARKUP_TOKENS + count(template_text(template).format(**fields))
    return frame_tokens(template, fields) + sum(utf8_bytes(v) for v in fields.values())


def _fair_shares(sizes: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split ``budget`` over the texts: a short one keeps what it needs, long ones share the rest equally."""
    shares, left = {}, max(0, budget)
    order = sorted(sizes, key=lambda k: sizes[k])
    for i, name in enumerate(order):
        shares[name] = min(sizes[name], left // (len(order) - i))
        left -= shares[name]
    return shares


def _cut_to(text: str, allowance: int, count: Callable[[str], int], keep_end: bool) -> str:
    """The longest cut of ``text`` (its end, or its start and end) that ``count`` puts within ``allowance``."""
    shape = tail if keep_end else head_and_tail
    lo, hi = 0, len(text)  # characters kept: the most that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(shape(text, mid)) <= allowance:
            lo = mid
        else:
            hi = mid - 1
    return shape(text, lo)


def fit_to_tokens(
    template: str,
    fields: dict[str, str],
    max_prompt_tokens: int,
    count: Callable[[str], int] | None = None,
    keep_end: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """``fields`` cut so the prompt holds at most ``max_prompt_tokens`` tokens (:func:`prompt_tokens`).

    The template stays whole; the texts over their fair share of the room left are cut: those named in
    ``keep_end`` keep their end (a final answer), the others their start and end.
    """
    over = prompt_tokens(template, fields, count) - max_prompt_tokens
    if over <= 0:
        return fields
    measure = count if count is not None else utf8_bytes
    sizes = {k: measure(v) for k, v in fields.items()}
    budget = sum(sizes.values()) - over
    cut = fields
    for _ in range(8):  # texts counted apart may tokenize a little differently together: shrink until it fits
        shares = _fair_shares(sizes, budget)
        cut = {
            k: v if sizes[k] <= shares[k] else _cut_to(v, shares[k], measure, k in keep_end) for k, v in fields.items()
        }
        over = prompt_tokens(template, cut, count) - max_prompt_tokens
        if over <= 0 or budget <= 0:
            break
        budget -= over
    return cut


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
    max_prompt_tokens: int | None = None,
    count_tokens: Callable[[str], int] | None = None,
    prompt_template: str | None = None,
) -> list[dict[str, str]]:
    """The chat messages of one verification request (a single user turn).

    ``template`` is the kind (``tinyv``, ``rubric``): which texts go in and how they are cut;
    ``prompt_template`` the text they go into (the kind's built-in when None; checked by
    :func:`check_template`). With ``max_prompt_tokens``, the prompt holds at most that many tokens of the
    verifier (counted by ``count_tokens``, its tokenizer, or bounded from above without it; see
    :func:`prompt_tokens`).
    """
    question = head_and_tail(question_text(extra_info, sample, prompt), max_question_chars)
    gold = head_and_tail(ground_truth_text(ground_truth), max_question_chars)
    if template == "tinyv":
        answer = tail(strip_reasoning(completion).strip(), max_answer_chars) or "(no answer)"
        fields = {"question": question, "ground_truth": gold, "answer": answer}
        keep_end = frozenset({"answer"})  # the final answer is at its end
    elif template == "rubric":
        answer = head_and_tail(completion.strip(), max_answer_chars) or "(empty response)"
        criteria = head_and_tail(criteria_text(extra_info), max_question_chars)
        fields = {"question": question, "ground_truth": gold, "criteria": criteria, "answer": answer}
        keep_end = frozenset()
    else:
        raise ValueError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")
    text = TEMPLATES[template] if prompt_template is None else prompt_template
    used = set(placeholders(text))
    fields = {k: v for k, v in fields.items() if k in used}  # a text the template leaves out takes no room
    if max_prompt_tokens is not None:
        fields = fit_to_tokens(text, fields, max_prompt_tokens, count_tokens, keep_end)
    return [{"role": "user", "content": text.format(**fields)}]
