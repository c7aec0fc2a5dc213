"""Reading the verifier's reply: a True/False verdict (``tinyv``) or a Total Score (``rubric``).

Only the text after the verifier's reasoning counts (after the last ``</think>``); a reply whose
reasoning never closes (cut off by ``max_tokens``) holds no verdict. Anything that is not a clear
verdict is ``None`` ("garbage"), which the reward retries and then treats as a failure.
"""

from __future__ import annotations

import re

from plugrl_grade import parse_total_score

from .prompts import strip_reasoning

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# Only the end of a reply is read: a verdict is short, and the work stays bounded for any reply.
MAX_REPLY_CHARS = 4000

_VERDICT = re.compile(r"(?<![a-z])(true|false)(?![a-z])")
_NEGATED = re.compile(r"(?<![a-z])(?:not|isn't|is not|n't)\W{0,4}(?:true|false)(?![a-z])")
# a verdict word that opens the reply and ends its first sentence or line ("False. True would need ...")
_LEADING = re.compile(r"\W*(true|false)(?![a-z])[*_`'\"]*\s*(?:[.!,;:\n]|$)")


def answer_part(reply: str) -> str | None:
    """The part of a verifier reply after its reasoning; None when the reasoning is unfinished."""
    if THINK_CLOSE not in reply and THINK_OPEN in reply:
        return None  # "<think> ... " cut off before the verdict
    return strip_reasoning(reply)[-MAX_REPLY_CHARS:]


def parse_verdict(reply: object) -> bool | None:
    """``True``/``False`` from a TinyV reply, or None when there is no single clear verdict.

    Accepted: the bare word in any case, with markdown or punctuation around it (``"true."``,
    ``"**True**"``, ``"\\boxed{False}"``), or inside a sentence (``"The answer is True"``). A verdict
    that opens the reply as a sentence of its own decides, whatever follows (``"False. True would
    need ..."``); otherwise a reply that names both words (``"True or False"``) or negates one
    (``"not true"``) is garbage.
    """
    if not isinstance(reply, str):
        return None
    text = answer_part(reply)
    if text is None:
        return None
    text = text.lower().strip()
    lead = _LEADING.match(text)
    if lead:  # a verdict that opens the reply as a sentence of its own decides
        return lead.group(1) == "true"
    if _NEGATED.search(text):
        return None
    found = {m.group(1) for m in _VERDICT.finditer(text)}
    if len(found) == 1:
        return found.pop() == "true"
    return None


def parse_rubric(reply: object) -> float | None:
    """The ``Total Score: x/10`` of a rubric reply as a fraction in [0, 1] (clamped), or None when unreadable.

    Read with :func:`plugrl_grade.parse_total_score` (the text after the last ``Total Score``;
    a reply without it is read whole, so a bare ``"7/10"`` counts).
    """
    if not isinstance(reply, str):
        return None
    text = answer_part(reply)
    if text is None:
        return None
    value = parse_total_score(text)
    if value is None:
        return None
    return min(10.0, max(0.0, value)) / 10.0


def reply_form(reply: object, template: str) -> str | None:
    """Which template's form ``reply`` has: ``template`` when it parses as that one's verdict, else the other
    template's name when it parses as that (a rubric reward model asked for True/False still writes
    ``Total Score: 7/10``), else None (no verdict of either form)."""
    if (parse_rubric if template == "rubric" else parse_verdict)(reply) is not None:
        return template
    if template == "rubric":
        return "tinyv" if parse_verdict(reply) is not None else None
    text = answer_part(reply) if isinstance(reply, str) else None
    if text is not None and "total score" in text.lower() and parse_rubric(reply) is not None:
        return "rubric"
    return None
