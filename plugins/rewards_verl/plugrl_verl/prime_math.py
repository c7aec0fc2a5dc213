"""Prime Math, as verl scores the ``numina_*`` sources (``verl.utils.reward_score.prime_math``), and the fallback of
TinyV's verl fork for every data source without ``_tinyv`` (seed 003: ``reward.default: verl_prime_math``).

The answer is read from the completion (:func:`match_answer`: after the last "answer:" / "answer is", before "is the
answer", inside the last ``\\boxed{}``, after the last "is" / "=" / ":" ...), then graded by PRM800K's grader
(:func:`plugrl_verl.prm800k.grade_answer`) and, when that says no, by Prime's numeric checks (:func:`math_equal`:
numbers within 1e-4 relative, also x100 and /100 for percentages; ``\\pi`` as 3.14159... and as 3.14; intervals,
tuples, points and matrices element by element).

Nothing the model wrote is executed: where verl ``eval``s a text (an expression with ``\\pi``, a matrix written as a
Python list) it is read by :func:`plugrl_verl.safe_eval.arithmetic`. verl 0.9.1's last step, a sympy comparison under
``with timeout_limit(...)``, never runs: ``timeout_limit`` is a decorator, and using it as a context manager raises,
which verl catches; that step always says no there, and so it does here.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any

from .boxes import closing_brace
from .prm800k import grade_answer
from .safe_eval import arithmetic

MAX_PREDICTION_CHARS = 1000
_LAST_MARKERS = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")
_NUMBER_DOLLARS = re.compile(r"\$\d+(\.\d+)?")
_PERCENT = (re.compile(r"^\d+(\.\d+)?%$"), re.compile(r"^\d+(\.\d+)?\\%$"))
_INTERVALS = (
    (re.compile(r"^Interval\((.*)\)$"), "[{}]"),
    (re.compile(r"^Interval\.Ropen\((.*)\)$"), "[{})"),
    (re.compile(r"^Interval\.Lopen\((.*)\)$"), "({}]"),
    (re.compile(r"^Interval\.open\((.*)\)$"), "({})"),
)


def _box_content(text: str) -> str | None:
    """What the last ``\\boxed`` (else ``\\fbox``) holds between its first brace and the brace closing it, trimmed."""
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    opened, end = text.find("{", start), closing_brace(text, start)
    return None if opened < 0 or end is None else text[opened + 1 : end].strip()


def _after_last(response: str, markers: tuple[str, ...]) -> tuple[str, bool]:
    found = False
    for marker in markers:
        at = response.lower().rfind(marker)
        if at != -1:
            found = True
            response = response[at + len(marker) :].strip()
            if response.endswith("\n"):
                response = response[:-2]
    return response, found


def match_answer(response: str) -> tuple[bool, str]:
    """(whether an answer was found, the answer text), as Prime reads it (an answer must hold a digit)."""
    response, matched = _after_last(response, ("answer:", "answer is", "answers are"))
    for marker in ("is answer", "is the answer", "are answers", "are the answers"):
        at = response.lower().rfind(marker)
        if at != -1:
            matched = True
            response = response[:at].strip()
            if response.endswith("\n"):
                response = response[:-2]
    boxed = _box_content(response)
    if boxed:
        matched, response = True, boxed
    if ". " in response:
        response = response[: response.lower().rfind(". ")].strip()
    response, found = _after_last(response, _LAST_MARKERS)
    matched = (matched or found) and any(c.isdigit() for c in response)
    return matched, response


def _number(value: Any) -> float | None:
    """The float Prime reads a value as (``{,}`` and ``,`` dropped), or None."""
    text = str(value)
    try:
        return float(text.replace("{,}", "") if "{,}" in text else text.replace(",", ""))
    except ValueError:
        return None


def _with_pi(text: str, pi: float) -> Any:
    """``\\pi`` replaced by ``pi`` (times the digit before it), and the result computed when it is arithmetic."""
    at = text.find("\\pi")
    while at != -1:
        text = text[:at] + ("*" if at > 0 and text[at - 1].isdigit() else "1*") + f"{pi}" + text[at + 3 :]
        at = text.find("\\pi", at + 1)
    with contextlib.suppress(Exception):
        return arithmetic(text)
    return text


def normalize(answer: Any, pi: float) -> Any:
    """Prime's ``normalize``: ``$5`` -> ``5``, ``5%`` -> ``5``, a base subscript dropped (``101_2`` -> 101: raises
    ValueError for a non-number before ``_``, as verl does), ``\\pi`` computed."""
    if isinstance(answer, str) and _NUMBER_DOLLARS.match(answer):
        return answer[1:]
    if isinstance(answer, str) and any(p.match(answer) for p in _PERCENT):
        return answer.replace("\\%", "").replace("%", "")
    if isinstance(answer, str) and "_" in answer:
        return int(float(answer.split("_")[0]))
    if isinstance(answer, str) and "\\pi" in answer:
        return _with_pi(answer, pi)
    return answer


def _intervals(prediction: str) -> str:
    for pattern, form in _INTERVALS:
        found = pattern.match(prediction)
        if found:
            return form.format(found.group(1))
    return prediction


def _all_equal(preds: list[Any], refs: list[Any], include_percentage: bool, tolerance: float) -> bool:
    return len(preds) == len(refs) and all(
        math_equal(p, r, include_percentage, tolerance) for p, r in zip(preds, refs, strict=False)
    )


def _numbers_equal(prediction: Any, reference: Any, include_percentage: bool, tolerance: float) -> bool | None:
    pred, ref = _number(prediction), _number(reference)
    if pred is None or ref is None:
        return None
    candidates = (ref / 100, ref, ref * 100) if include_percentage else (ref,)
    for candidate in candidates:
        with contextlib.suppress(Exception):
            if math.isclose(candidate, pred, rel_tol=tolerance):
                return True
    return False


def _rows_equal(rows: list[Any], reference: str, include_percentage: bool, tolerance: float) -> bool:
    """A matrix the model wrote as a list of rows against a ``pmatrix`` reference, row by row."""
    inner = reference
    for affix in ("\\\\begin{pmatrix}", "\\begin{pmatrix}"):
        inner = inner.removeprefix(affix)
    for affix in ("\\\\end{pmatrix}", "\\end{pmatrix}"):
        inner = inner.removesuffix(affix)
    ref_rows = [row.split("&") if "&" in row else row for row in inner.split("\\")]
    return _all_equal(rows, ref_rows, include_percentage, tolerance)


def _structured_equal(prediction: str, reference: str, include_percentage: bool, tolerance: float) -> bool:
    """Intervals, tuples, points and matrices compared element by element."""
    if prediction and reference and prediction[0] in "([" and prediction[-1] in ")]":
        if prediction[0] == reference[0] and prediction[-1] == reference[-1]:
            parts = (prediction[1:-1].split(","), reference[1:-1].split(","))
            if _all_equal(*parts, include_percentage, tolerance):
                return True
    if "," in prediction and "," in reference:
        preds = [p.strip() for p in prediction.split(",")]
        refs = [r.strip() for r in reference.split(",")]
        if len(preds) == len(refs):
            return _all_equal(preds, refs, include_percentage, tolerance)
    if prediction.startswith("Point") and reference[:1] == "(" and reference[-1:] == ")":
        parts = (prediction[prediction.find("(") + 1 : -1].split(","), reference[1:-1].split(","))
        if _all_equal(*parts, include_percentage, tolerance):
            return True
    # a matrix: verl hands "Matrix(...)" to sympy's parser (eval), which is not done here; a list of rows it evals
    if "\\begin{pmatrix}" in reference and prediction.startswith("[") and prediction.endswith("]"):
        rows = arithmetic(prediction)  # raises for what is not a list of numbers, as verl's eval does for most
        if isinstance(rows, list):
            with contextlib.suppress(Exception):
                return _rows_equal(rows, reference, include_percentage, tolerance)
    return False


def math_equal(
    prediction: Any, reference: Any, include_percentage: bool = True, tolerance: float = 1e-4, pi: float = math.pi
) -> bool:
    """Prime's ``grader.math_equal`` without its sympy step (module doc). May raise, as verl's does."""
    prediction, reference = normalize(prediction, pi), normalize(reference, pi)
    if isinstance(prediction, str) and len(prediction) > MAX_PREDICTION_CHARS:
        prediction = prediction[:MAX_PREDICTION_CHARS]
    if isinstance(prediction, str) and isinstance(reference, str):
        if prediction.strip().lower() == reference.strip().lower():
            return True
        if prediction.replace(" ", "") == reference.replace(" ", ""):
            return True
    numeric = _numbers_equal(prediction, reference, include_percentage, tolerance)
    if numeric is not None:
        return numeric
    if not prediction and prediction not in (0, False):
        return False
    reference, prediction = str(reference).strip(), _intervals(str(prediction).strip())
    pred_bare, ref_bare = prediction, reference
    opens_list = prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")
    opens_tuple = prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    if opens_list or opens_tuple:
        pred_bare, ref_bare = pred_bare.strip("[]()"), ref_bare.strip("[]()")
    for bracket in "{}()":
        pred_bare, ref_bare = pred_bare.replace(bracket, ""), ref_bare.replace(bracket, "")
    if pred_bare == ref_bare:
        return True
    return _structured_equal(prediction, reference, include_percentage, tolerance)


def prime_math_score(completion: Any, ground_truth: Any) -> dict[str, Any]:
    """verl's Prime Math verdict as a score: 1.0 right, 0.0 wrong; ``format`` (Prime's "Step 2:" and a box) and
    ``pred`` (the answer read) beside it."""
    completion, truth = str(completion), str(ground_truth)
    _, pred = match_answer(completion)
    well_formed = "Step 2:" in completion and "\\box" in completion
    if grade_answer(pred, truth):
        return {"score": 1.0, "format": True, "pred": pred}
    try:
        if "\\pi" in pred or "\\pi" in truth:
            right = any(math_equal(pred, truth, pi=pi) for pi in (math.pi, 3.14))
        else:
            right = math_equal(pred, truth)
    except Exception:
        right = False
    return {"score": 1.0 if right else 0.0, "format": well_formed, "pred": pred}
