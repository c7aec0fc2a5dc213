"""DAPO's math check, as verl scores ``math_dapo``, ``math``, ``math_dapo_reasoning`` and ``aime*``
(``verl.utils.reward_score.math_dapo``): +1.0 right, -1.0 wrong, with ``acc`` and ``pred`` beside the score.

The answer is read from the completion's last 300 characters: the last ``Answer: ...`` line (Minerva's form),
normalised (units, ``\\text{}``, ``\\boxed{}``, shorthand ``\\frac12`` / ``\\sqrt2``, thousands commas) and compared
with the normalised ground truth; without such a line, the last ``\\boxed{...}`` of the final 100 characters, compared
with the ground truth as written (``strict_box_verify`` uses only that).
"""

from __future__ import annotations

import re
from typing import Any

from .boxes import closing_brace

CLIP_CHARS = 300  # "The longest answer in MATH-500 has 159 characters"
BOX_CHARS = 100
INVALID = "[INVALID]"
ANSWER_LINE = r"(?i)Answer\s*:\s*([^\n]+)"

_REPLACE = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_DROP = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
_REWRITE = (  # (pattern, replacement), in order
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),  # the first $...$ alone
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),
)


def last_box(text: str) -> str | None:
    """The last ``\\boxed{`` through the brace that closes it, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    end = closing_brace(text, start)
    return None if end is None else text[start : end + 1]


def normalize(answer: str) -> str:
    """Minerva's normalisation of a final answer."""
    answer = answer.split("=")[-1]
    for old, new in _REPLACE:
        answer = answer.replace(old, new)
    for unit in _DROP:
        answer = answer.replace(unit, "")
    for pattern, replacement in _REWRITE:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def _boxed_answer(text: str) -> str | None:
    box = last_box(text[-BOX_CHARS:])
    return None if box is None else box[len("\\boxed{") : -1]


def verify(text: str, truth: str, strict_box_verify: bool = False) -> tuple[bool, str | None]:
    """(right, what was read): the ``Answer:`` line first, else the last box (only the box when strict)."""
    if strict_box_verify:
        boxed = _boxed_answer(text)
        return boxed == truth, boxed
    lines = re.findall(ANSWER_LINE, text)
    pred = normalize(lines[-1] if lines else INVALID)
    right = pred == normalize(truth)
    if pred != INVALID:
        return right, pred
    boxed = _boxed_answer(text)
    if boxed is not None:
        return boxed == truth, boxed
    return right, pred


def dapo_score(completion: str, ground_truth: Any, strict_box_verify: bool = False) -> dict[str, Any]:
    """``{"score": 1.0 or -1.0, "acc": bool, "pred": the answer read}``."""
    right, pred = verify(completion[-CLIP_CHARS:], ground_truth, strict_box_verify)
    return {"score": 1.0 if right else -1.0, "acc": right, "pred": pred}
