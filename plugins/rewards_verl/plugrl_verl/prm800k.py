"""OpenAI's PRM800K answer grader, the first check of Prime Math (``verl.utils.reward_score.prime_math``) and the
whole check of verl's geometry3k reward (through ``mathruler.grader``, the same grader with two small differences).

An answer is right when (a) it and the ground truth normalise to one text the MATH way
(:func:`plugrl_verl.hendrycks.strip_string`), or (b) they normalise to one text PRM800K's way (units, ``$``, ``%``,
"million", LaTeX rendered as plain text by pylatexenc, mixed numbers), or (c) element by element (a tuple or
interval), sympy simplifies their difference to 0: unreduced fractions must match as written, an integer only an
integer, and sympy sees at most two distinct letters. Step (c) reads the text with sympy's parser built without
``eval`` (:func:`plugrl_verl.safe_eval.sympy_expr`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .hendrycks import strip_string
from .safe_eval import sympy_expr

TUPLE_CHARS = "()[]"
_BAD_SUBSTRINGS = ("^{", "^(")
_BAD_PATTERNS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_TEXT_WRAPPED = re.compile(r"^\\text\{(?P<text>.+?)\}$")
_THOUSANDS = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_MIXED_NUMBER = re.compile(r"([0-9]) +([0-9])")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_UNITS = (
    "degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
    "foot", "feet", "inch", "yard",
)  # fmt: skip
_SYMBOLS = (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*"))


@dataclass(frozen=True)
class Flavour:
    """Where verl's two copies of the grader differ: Prime Math's also drops "liter" as a unit; mathruler's
    (geometry3k) also removes spaces and leftover braces after rendering LaTeX."""

    units: tuple[str, ...]
    squeeze: bool


PRIME = Flavour(units=(*_UNITS, "liter"), squeeze=False)
MATHRULER = Flavour(units=_UNITS, squeeze=True)


def mathd_normalize(answer: str | None) -> str | None:
    """PRM800K's ``math_normalize.normalize_answer``: trimmed, ``\\text{...}`` unwrapped, then the MATH
    normalisation (the text as it was when that fails)."""
    if answer is None:
        return None
    answer = answer.strip()
    try:
        wrapped = _TEXT_WRAPPED.search(answer)
        if wrapped is not None:
            answer = wrapped.group("text").strip()
        return strip_string(answer)
    except Exception:
        return answer


def _latex_to_text(expr: str) -> str:
    from pylatexenc import latex2text

    expr = expr.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    expr = latex2text.LatexNodes2Text().latex_to_text(expr)
    for old, new in _SYMBOLS:
        expr = expr.replace(old, new)
    return expr.strip()


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _without_thousands_commas(expr: str) -> str:
    while True:
        changed = _THOUSANDS.sub(r"\1\3\4", expr)
        if changed == expr:
            return expr
        expr = changed


def _is_int_text(text: str) -> bool:
    try:
        value = float(_without_thousands_commas(text))
        return abs(value - int(round(value))) <= 1e-7
    except Exception:
        return False


def _drop_units(expr: str, units: tuple[str, ...]) -> str:
    for unit in units:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    return re.sub(r"\^ *\\circ", "", expr)


def normalize(expr: str | None, flavour: Flavour = PRIME) -> str | None:
    """PRM800K's ``_normalize`` (see the module doc)."""
    if expr is None:
        return None
    wrapped = _TEXT_WRAPPED.search(expr)
    if wrapped is not None:
        expr = wrapped.group("text")
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "), (" and ", " , ")):
        expr = expr.replace(old, new)
    for word, power in (("million", "*10^6"), ("billion", "*10^9"), ("trillion", "*10^12")):
        expr = expr.replace(word, power)
    expr = _drop_units(expr, flavour.units)
    if expr[:1] == "{" and expr[-1:] == "}":
        expr = expr[1:-1]
    expr = re.sub(",\\\\! *", "", expr)
    if _is_float(expr) and _is_int_text(expr):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        try:
            expr = _latex_to_text(expr)
        except Exception:
            pass
    expr = _MIXED_NUMBER.sub(r"\1+\2", re.sub("- *", "-", expr))
    if flavour.squeeze:
        expr = expr.replace(" ", "").replace("{", "").replace("}", "")
    expr = expr.lower()
    if _is_int_text(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _may_evaluate(expr: str) -> bool:
    """Few unknown letters (functions of more variables are not tried) and no power sympy might hang on."""
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or any(bad in expr for bad in _BAD_SUBSTRINGS):
        return False
    return not any(p.search(expr) for p in _BAD_PATTERNS)


def equal_under_sympy(truth: str, given: str) -> bool:
    """sympy simplifies ``(truth)-(given)`` to 0 (read with implicit multiplication, as PRM800K does)."""
    import sympy

    expr = f"({truth})-({given})"
    if not _may_evaluate(expr):
        return False
    try:
        return sympy.simplify(sympy_expr(expr.replace("^", "**"), implicit=True)) == 0
    except Exception:
        return False


def split_tuple(expr: str) -> list[str]:
    """The elements of a tuple or interval written ``(a, b)`` / ``[a, b)``, else ``[expr]``."""
    expr = _without_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if (
        len(expr) > 2
        and expr[0] in TUPLE_CHARS
        and expr[-1] in TUPLE_CHARS
        and not any(c in inner for c in TUPLE_CHARS)
    ):
        return [e.strip() for e in inner.split(",")]
    return [expr]


def grade_answer(given: str | None, truth: str, flavour: Flavour = PRIME) -> bool:
    """PRM800K's verdict on ``given`` against ``truth`` (see the module doc)."""
    if given is None:
        return False
    if mathd_normalize(truth) == mathd_normalize(given):
        return True
    truth_n, given_n = normalize(truth, flavour), normalize(given, flavour)
    if truth_n is None or given_n is None:
        return False
    if truth_n == given_n:
        return True
    if not given_n:
        return False
    truth_parts, given_parts = split_tuple(truth_n), split_tuple(given_n)
    if len(truth_parts) > 1 and (truth_n[0] != given_n[0] or truth_n[-1] != given_n[-1]):
        return False  # an interval's brackets must agree
    if len(truth_parts) != len(given_parts):
        return False
    for t, g in zip(truth_parts, given_parts, strict=True):
        if _FRACTION.search(t) and _FRACTION.search(g):
            right = t == g  # unreduced fractions are not simplified
        elif _is_int_text(t) != _is_int_text(g):
            right = False
        else:
            right = equal_under_sympy(t, g)
        if not right:
            return False
    return True
