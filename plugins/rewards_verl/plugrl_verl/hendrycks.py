"""The MATH dataset's answer check (Hendrycks et al.), as verl scores ``lighteval/MATH`` and its mirrors
(``verl.utils.reward_score.math_reward``), and the string normalisation Prime Math's grader starts from.

A completion is right when the content of its last ``\\boxed{...}`` normalises (:func:`strip_string`) to the same
text as the ground truth. verl's quirks are kept, since they change scores: ``\\boxed 5`` (a space, no braces) is read
up to the next ``$``; a box found by ``\\fbox`` is never unwrapped (scores 0); a normalisation that fails (``\\sqrt`` or
``\\frac`` at the very end, two ``\\text{ `` units) compares the raw texts instead.
"""

from __future__ import annotations

from typing import Any

from .boxes import closing_brace

BOXED = "\\boxed"
BOXED_SPACE = "\\boxed "
BOXED_BRACE = "\\boxed{"

# (what, replacement), in order: line breaks, thin spaces, doubled backslashes, fraction spellings, \left \right,
# degrees, dollars (a percent sign comes after the units)
_FIRST = (
    ("\n", ""),
    ("\\!", ""),
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
)
_PERCENT = (("\\\\%", ""), ("\\%", ""))


def last_boxed(text: str) -> str | None:
    """verl math_reward's ``last_boxed_only_string``: ``\\boxed ...`` up to a ``$`` when the text has ``\\boxed ``
    anywhere; else the last ``\\boxed`` (or ``\\fbox``) through the brace that closes its first one; None."""
    if BOXED_SPACE in text:
        return BOXED_SPACE + text.split(BOXED_SPACE)[-1].split("$")[0]
    start = text.rfind(BOXED)
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    end = closing_brace(text, start)
    return None if end is None else text[start : end + 1]


def unbox(boxed: str) -> str:
    """The content of ``\\boxed{...}`` or ``\\boxed ...``; ValueError for anything else (an ``\\fbox``)."""
    if BOXED_SPACE in boxed:
        if not boxed.startswith(BOXED_SPACE):
            raise ValueError(f"not a box: {boxed[:40]!r}")
        return boxed[len(BOXED_SPACE) :]
    if not (boxed.startswith(BOXED_BRACE) and boxed.endswith("}")):
        raise ValueError(f"not a box: {boxed[:40]!r}")
    return boxed[len(BOXED_BRACE) : -1]


def _braced_fracs(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{7}`` -> ``\\frac{1}{7}``; the text unchanged when a bare ``\\frac``
    has fewer than two characters after it. IndexError for a ``\\frac`` at the very end (verl raises there too)."""
    head, *rest = text.split("\\frac")
    out = [head]
    for part in rest:
        if part[0] == "{":
            out.append("\\frac" + part)
            continue
        if len(part) < 2:
            return text
        num, den, tail = part[0], part[1], part[2:]
        out.append("\\frac{" + num + "}" + (den + tail if den == "{" else "{" + den + "}" + tail))
    return "".join(out)


def _slash_fraction(text: str) -> str:
    """``3/4`` (two integers written plainly) -> ``\\frac{3}{4}``."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        num, den = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{num}}}{{{den}}}" if text == f"{num}/{den}" else text


def _without_unit(text: str) -> str:
    """Drop a unit written ``\\text{ unit}`` at the end; ValueError when there are two."""
    if "\\text{ " not in text:
        return text
    parts = text.split("\\text{ ")
    if len(parts) != 2:
        raise ValueError("more than one \\text{ unit")
    return parts[0]


def _braced_sqrts(text: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``. IndexError for a ``\\sqrt`` at the very end (verl raises there too)."""
    if "\\sqrt" not in text:
        return text
    head, *rest = text.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:]) for p in rest)


def strip_string(text: str) -> str:
    """The MATH normalisation of an answer (may raise, as verl's does; see the module doc)."""
    for old, new in _FIRST:
        text = text.replace(old, new)
    text = _without_unit(text)
    for old, new in _PERCENT:
        text = text.replace(old, new)
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "k = 5" -> "5"
        text = sides[1]
    text = _braced_sqrts(text).replace(" ", "")
    text = _braced_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_fraction(text)


def is_equiv(answer: str | None, truth: str | None) -> bool:
    """Both normalise to one text (the raw texts are compared when normalising fails)."""
    if answer is None or truth is None:
        return answer is None and truth is None
    try:
        return strip_string(answer) == strip_string(truth)
    except Exception:
        return answer == truth


def math_score(completion: str, ground_truth: Any) -> float:
    """verl's score for ``lighteval/MATH``, ``DigitalLearningGmbH/MATH-lighteval``, ``HuggingFaceH4/MATH-500``:
    1.0 when the last box's content :func:`is_equiv` the ground truth, else 0.0."""
    try:
        boxed = last_boxed(completion)
        if boxed is not None and is_equiv(unbox(boxed), ground_truth):
            return 1.0
    except Exception:  # verl: a box it cannot unwrap, a ground truth that is not text, scores 0
        pass
    return 0.0
