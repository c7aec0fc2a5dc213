"""Checking a math answer against the ground truth with math-verify, within bounded time and size.

How a check runs (:func:`check_answer`):

1. **Gold.** The ground truth is parsed leniently: bare LaTeX or numbers (``\\frac{1}{2}``,
   ``0.5``, ``(1, 2]``, ``5 cm``) are read as math (``$...$``), falling back to math-verify's
   plain-number extraction; text that already has math delimiters or ``\\boxed`` (a whole
   MATH solution) is searched as it is, ``\\boxed`` first. Parsed golds are cached.
2. **Prediction.** The content of the last ``<answer>...</answer>`` when there is one, else
   the whole completion (its last ``max_chars`` characters). Inside it, math-verify looks for
   ``\\boxed{}`` first (the last one; boxes close together are read as one set), then
   ``answer: ...`` / ``final answer is ...``, then (inside ``<answer>`` tags, or with
   ``require_anchor=False``) any LaTeX or number, rightmost first; only the first match found
   is tried (``extraction_mode="first_match"``). A short bare answer such as
   ``\\frac{\\sqrt3}{2}`` or ``(1, 2]`` is read as one formula first (math-verify alone finds
   only numbers in bare LaTeX).
3. **Guards.** Text whose brackets nest deeper than ``max_nesting`` is refused before
   parsing (math-verify's ANTLR LaTeX parser takes exponential time in nesting depth:
   ~1 s at depth 10, minutes at 15). Parsed answers whose value would need more than
   :data:`MAX_BITS` bits to compute (``9^{9^{9^{9}}}``, ``(10^{10})!``, ``\\binom{10^9}{k}``,
   sums over more than ~10^6 terms) are refused before comparing: sympy would compute them
   with big integers in C, where no signal can stop it.
4. **Compare** with ``math_verify.verify(gold, pred)``.

Time: math-verify's own time limits (``parsing_timeout``, ``timeout_seconds``) use
``signal.alarm``: whole seconds, one alarm per call (a parse and several comparisons can
each use it all), and they raise ``ValueError`` outside the main thread. They are switched
off here (``None``); instead the whole check runs under one ``time_limit_s`` budget
(``signal.setitimer``) when it runs in the main thread, which it does in plugrl's reward
worker processes and inline. Elsewhere (other threads) there is no inner budget, and the
kernel's ``reward.timeout_s`` (which kills the worker) is the limit. The budget stops Python
code only; a long C computation is stopped by the kernel's timeout.

Nothing is executed: LaTeX goes through latex2sympy2_extended's ANTLR parser (no ``eval``);
math-verify's plain-expression path calls sympy's ``parse_expr`` (which does ``eval``) only
on text its regex restricted to digits, ``.``, whitespace and ``+ - * × / ÷ ^ ( )``, with
``evaluate=False``.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import re
import signal
import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from sympy import Basic, Float, Integer, Pow, Product, Rational, Sum, binomial, factorial
from sympy.matrices import MatrixBase

# \boxed{} before "final answer is", the rest as math-verify's defaults (malformed LaTeX repaired, units dropped).
LATEX = LatexExtractionConfig(boxed_match_priority=0)
EXPR = ExprExtractionConfig()
# Only answers marked by \boxed{}, "answer: ..." or "final answer is ..." (TRL's choice for completions).
LATEX_ANCHORED = LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)
EXPR_ANCHORED = ExprExtractionConfig(try_extract_without_anchor=False)
MAX_BITS = 100_000  # a parsed number needing more bits than this to compute is refused (10^30103)
MAX_TERMS_BITS = 20  # a sum or product whose limits need more bits (over ~10^6 terms) is refused
MAX_NODES = 5_000  # a parsed expression with more nodes than this is refused
DEFAULT_TIME_LIMIT_S = 3.0
DEFAULT_MAX_CHARS = 20_000
DEFAULT_MAX_NESTING = 8

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_BARE_ANSWER_CHARS = 200  # a prediction this short, without words, is read as one formula first
_GOLD_FORMULA_CHARS = 2_000  # a gold this short without math delimiters is read as one formula first


class _OutOfTime(BaseException):
    """Raised by the alarm inside math-verify/sympy; a BaseException so their ``except Exception`` let it through."""


class _DropTimeoutDisabled(logging.Filter):
    """math-verify warns once per process that its timeouts are off; that is intended here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabled())


# --------------------------------------------------------------------------- time budget


class _Budget:
    """``with _Budget(s):`` raises :class:`_OutOfTime` in the block after ``s`` seconds (main thread only).

    Not armed (no limit) when ``s`` is None or <= 0, off the main thread, where
    ``setitimer`` is missing, or when another real-time timer is already running.
    The alarm repeats every :data:`_REPEAT_S` until disarmed: an exception raised while
    Python runs a gc callback or a ``__del__`` is printed and dropped, and the next alarm
    then stops the block instead. Use :meth:`stop` after catching :class:`_OutOfTime`.
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.armed = False
        self._previous: Any = None

    def __enter__(self) -> _Budget:
        s = self.seconds
        if (
            s is not None
            and s > 0
            and hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        ):
            self._previous = signal.signal(signal.SIGALRM, _on_alarm)
            self.armed = True
            signal.setitimer(signal.ITIMER_REAL, float(s), _REPEAT_S)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disarm()

    def disarm(self) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            self.armed = False
            signal.signal(signal.SIGALRM, self._previous)

    def stop(self) -> None:
        """Disarm after :class:`_OutOfTime`, even if a repeat alarm interrupts the disarming."""
        while True:
            try:
                self.disarm()
                return
            except _OutOfTime:
                continue


_REPEAT_S = 0.02


def _on_alarm(signum: int, frame: Any) -> None:
    raise _OutOfTime


# --------------------------------------------------------------------------- guards


def max_nesting(text: str) -> int:
    """Deepest nesting of ``( [ {`` in ``text`` (any closer closes any opener; stray closers are ignored)."""
    depth = deepest = 0
    for ch in re.sub(r"[^()\[\]{}]+", "", text):
        if ch in "([{":
            depth += 1
            if depth > deepest:
                deepest = depth
        elif depth:
            depth -= 1
    return deepest


def _bits(e: Any, budget: list[int]) -> float:
    """An upper bound on the bits needed to hold the value of ``e`` if sympy evaluated it (inf: too big)."""
    budget[0] -= 1
    if budget[0] < 0:
        return math.inf
    if isinstance(e, Integer):
        return max(1, int(e.p).bit_length())
    if isinstance(e, Rational):
        return max(int(e.p).bit_length(), int(e.q).bit_length(), 1)
    if isinstance(e, Float):
        _, _, exp, bc = e._mpf_  # value = man * 2**exp with man of bc bits
        return max(1, abs(exp + bc))
    if isinstance(e, Pow):
        base, exp = e.args
        b, x = _bits(base, budget), _bits(exp, budget)
        if x > 60:
            return math.inf
        return b * 2.0**x
    if isinstance(e, (factorial, binomial)):  # n! < n**n, binomial(n, k) < 2**n
        n = _bits(e.args[0], budget)
        if n > 40:
            return math.inf
        return 2.0**n * n + sum(_bits(a, budget) for a in e.args[1:])
    if isinstance(e, (Sum, Product)):  # summed term by term when there is no closed form
        limits = [_bits(b, budget) for lim in e.limits for b in lim[1:]]
        if any(b > MAX_TERMS_BITS for b in limits):
            return math.inf
        return _bits(e.function, budget) * 2.0 ** max(limits, default=0) + 1
    if isinstance(e, MatrixBase):
        return max((_bits(a, budget) for a in e), default=1)
    args = getattr(e, "args", ())
    if not args:
        return 2  # symbols, constants (pi, E, oo), strings
    return sum(_bits(a, budget) for a in args) + 1


def too_big(e: Any) -> bool:
    """Would evaluating ``e`` mean computing a number of more than :data:`MAX_BITS` bits (or is it huge)?"""
    if not isinstance(e, (Basic, MatrixBase)):
        return False
    try:
        return _bits(e, [MAX_NODES]) > MAX_BITS
    except RecursionError:
        return True


# --------------------------------------------------------------------------- reading gold and prediction


def _sympy(items: list[Any]) -> bool:
    return any(isinstance(i, (Basic, MatrixBase)) for i in items)


def _parse(text: str, configs: tuple[Any, ...], first_match: bool) -> list[Any]:
    mode = "first_match" if first_match else "any_match"
    return parse(text, list(configs), extraction_mode=mode, parsing_timeout=None)  # type: ignore[arg-type]


def _read(text: str, first_match: bool, as_formula: bool, anchored: bool = False) -> list[Any]:
    """Parse ``text`` as it is and, with ``as_formula``, as one formula ``$text$``; the first reading with a
    sympy value wins (else the first with any text). The formula comes first unless ``text`` has math
    delimiters of its own (``\\$18.90`` has none that math-verify uses, so it then comes second).
    ``anchored``: the plain reading takes only answers marked by ``\\boxed``, ``answer:``, ``final answer is``."""
    configs = (LATEX_ANCHORED, EXPR_ANCHORED) if anchored else (LATEX, EXPR)
    plain = lambda: _parse(text, configs, first_match)  # noqa: E731
    readings = [plain]
    if as_formula:
        formula = lambda: _parse(f"${text}$", (LATEX,), first_match)  # noqa: E731
        readings = [plain, formula] if _DELIMITED.search(text) else [formula, plain]
    fallback: list[Any] = []
    for read in readings:
        got = read()
        if _sympy(got):
            return got
        fallback = fallback or got
    return fallback


def gold_text(ground_truth: Any) -> list[str]:
    """The ground truth as answer texts: a string, a number, or a list/tuple of them (any one may match)."""
    if isinstance(ground_truth, (list, tuple)):
        return [t for g in ground_truth for t in gold_text(g)]
    if isinstance(ground_truth, str):
        return [ground_truth]
    if isinstance(ground_truth, bool) or ground_truth is None:
        raise ValueError(f"math: ground_truth must be an answer text or number, got {ground_truth!r}")
    if isinstance(ground_truth, numbers.Integral):
        return [str(int(ground_truth))]
    if isinstance(ground_truth, numbers.Real):
        value = float(ground_truth)
        if not math.isfinite(value):
            raise ValueError(f"math: ground_truth must be finite, got {ground_truth!r}")
        return [format(Decimal(repr(value)), "f")]  # 1e-07 -> 0.0000001, which LaTeX reads
    raise ValueError(f"math: ground_truth must be an answer text or number, got {type(ground_truth).__name__}")


@functools.lru_cache(maxsize=1024)
def _parse_gold(text: str) -> tuple[Any, ...]:
    text = text.strip()
    got = _read(text, first_match=False, as_formula=len(text) <= _GOLD_FORMULA_CHARS)
    return tuple(g for g in got if not too_big(g))


def _bare_math(text: str) -> bool:
    """A short answer that is a formula rather than prose: no words outside LaTeX commands (``x = 2``,
    ``\\frac{1}{2}``, ``(1, 2]``), or a single token (``Evelyn``, ``(B)``). Read as one formula first."""
    if len(text) > _BARE_ANSWER_CHARS:
        return False
    return not _WORD.search(_COMMAND.sub(" ", text)) or len(text.split()) == 1


def extract_answer_tag(completion: str) -> str | None:
    """The content of the last ``<answer>...</answer>``, or None (linear time however many tags)."""
    last = None
    pos = 0
    while (start := completion.find(ANSWER_OPEN, pos)) != -1:
        end = completion.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end == -1:
            break
        last = completion[start + len(ANSWER_OPEN) : end]
        pos = end + len(ANSWER_CLOSE)
    return last


# --------------------------------------------------------------------------- the check


@dataclass(frozen=True)
class MathCheck:
    """The outcome of :func:`check_answer`.

    ``status``: ``correct``, ``wrong``, ``no_answer`` (nothing math-like found in the
    prediction), ``no_gold`` (the ground truth could not be parsed), ``refused`` (too
    deeply nested, or a value too big to compute), ``timeout`` (over ``time_limit_s``).
    ``extracted``: the answer text math-verify took from the prediction (at most 100 chars).
    """

    correct: bool
    status: str
    extracted: str = ""


def _extracted(items: list[Any]) -> str:
    # math-verify appends the matched text; never str() a parsed expression (it can take forever)
    text = next((i for i in items if isinstance(i, str)), "")
    return text if len(text) <= 100 else text[:97] + "..."


def check_answer(
    prediction: str,
    ground_truth: Any,
    *,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_nesting_depth: int = DEFAULT_MAX_NESTING,
    use_answer_tag: bool = True,
    require_anchor: bool = True,
) -> MathCheck:
    """Is the final answer of ``prediction`` (a completion or a bare answer) equal to ``ground_truth``?

    See the module docstring for the steps. ``ground_truth``: answer text, number, or a
    list of acceptable answers (raises ``ValueError`` for other types). ``require_anchor``:
    outside ``<answer>`` tags, only an answer marked by ``\\boxed{}``, ``answer: ...`` or
    ``final answer is ...`` counts (a short bare answer such as ``"0.5"`` counts as it is);
    False: the rightmost number or formula anywhere in the completion counts.
    """
    golds = gold_text(ground_truth)
    if not isinstance(prediction, str):
        return MathCheck(False, "no_answer")
    tagged = extract_answer_tag(prediction) if use_answer_tag else None
    text = prediction if tagged is None else tagged
    if len(text) > max_chars:
        text = text[-max_chars:]  # the final answer is at the end
    text = text.strip()
    if not text:
        return MathCheck(False, "no_answer")
    if max_nesting(text) > max_nesting_depth:
        return MathCheck(False, "refused")
    budget = _Budget(time_limit_s)
    try:
        with budget:
            gold: list[Any] = [g for t in golds for g in _parse_gold(t)]
            if not gold:
                return MathCheck(False, "no_gold")
            bare = _bare_math(text)
            anchored = require_anchor and tagged is None and not bare
            pred = _read(text, first_match=True, as_formula=bare, anchored=anchored)
            extracted = _extracted(pred)
            if not pred:
                return MathCheck(False, "no_answer")
            if any(too_big(p) for p in pred):
                return MathCheck(False, "refused", extracted)
            ok = bool(verify(gold, pred, timeout_seconds=None))
            return MathCheck(ok, "correct" if ok else "wrong", extracted)
    except _OutOfTime:
        budget.stop()
        return MathCheck(False, "timeout")


def math_equal(pred_text: str, gold_text: Any, *, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S) -> bool:
    """True iff the final answer in ``pred_text`` equals ``gold_text`` (math-verify, as :func:`check_answer`).

    ``pred_text`` may be a whole completion (its last ``<answer>`` or ``\\boxed{}`` counts) or
    a bare answer (``"0.5"``, ``"\\frac{1}{2}"``). False for anything unparseable, refused or
    over time; never raises for a bad prediction.
    """
    return check_answer(pred_text, gold_text, time_limit_s=time_limit_s).correct
