"""Checking a math answer against the ground truth with math-verify, within bounded time and size.

How a check runs (:func:`check_answer`):

1. **Gold.** The ground truth (a text, a number, or a list of acceptable answers; anything
   else raises ``ValueError``, see :func:`gold_text`) is parsed leniently: bare LaTeX or
   numbers (``\\frac{1}{2}``, ``0.5``, ``(1, 2]``, ``5 cm``) are read as math (``$...$``),
   falling back to math-verify's plain-number extraction; text that already has math
   delimiters or ``\\boxed`` (a whole MATH solution) is searched as it is, ``\\boxed`` first.
   Parsed golds are cached.
2. **Prediction.** The content of the last ``<answer>...</answer>`` when there is one, else
   the whole completion (its last ``max_chars`` characters). Inside it, math-verify looks for
   ``\\boxed{}`` first (the last one; boxes close together are read as one set), then
   ``answer: ...`` / ``final answer is ...``, then (inside ``<answer>`` tags, or with
   ``require_anchor=False``) any LaTeX or number, rightmost first; only the first match found
   is tried (``extraction_mode="first_match"``). A short bare answer such as
   ``\\frac{\\sqrt3}{2}`` or ``(1, 2]`` is read as one formula first (math-verify alone finds
   only numbers in bare LaTeX).
3. **Guards.** Before parsing, the gold texts and the prediction alike are cut to their last
   ``max_chars`` characters, and a text is refused (a prediction as ``refused``, a gold text
   as no gold) when its brackets nest deeper than ``max_nesting`` (math-verify's ANTLR LaTeX
   parser takes exponential time in nesting depth: ~1 s at depth 10, minutes at 15; a
   10k-deep text would also exhaust Python's recursion limit) or when it has a run of over
   :data:`MAX_EXPR_RUN` characters math-verify's expression regex reads as arithmetic
   (quadratic time in C: see :func:`long_expression_run`). Parsed answers whose value
   would need more than :data:`MAX_BITS` bits to compute (``9^{9^{9^{9}}}``, ``(10^{10})!``,
   ``\\binom{10^9}{k}``, sums over more than ~10^6 terms) are refused before comparing: sympy
   would compute them with big integers in C, where no time budget can stop it.
4. **Compare** with ``math_verify.verify(gold, pred)``. A prediction and a gold that are both plain decimal
   literals (``-12``, ``4.50``), one with more digits than the guards let through, are compared exactly
   instead (:func:`_long_literal_check`): a 5,000-digit number equals itself (``correct``), two different
   integers are ``wrong``; the guards refuse them otherwise.

Errors: a ground truth of the wrong type raises ``ValueError``; every other input, however
hostile, ends as a :class:`MathCheck`. A gold that the guards refuse (or that does not parse) is ``no_gold``
for every prediction, checked before the prediction's own guards. An error the parsers raise on a pathological text
(``RecursionError`` included; math-verify turns most of them into "nothing found" itself)
makes a gold text count as no gold and a prediction ``refused``; no ``RecursionError`` escapes.

Time: math-verify's own time limits (``parsing_timeout``, ``timeout_seconds``) use
``signal.alarm``: whole seconds, one alarm per call (a parse and several comparisons can
each use it all), and they raise ``ValueError`` outside the main thread. They are switched
off here (``None``); instead the whole check (parse gold + parse prediction + compare) runs
under one ``time_limit_s`` budget (:class:`_Budget`), in any thread (``None``, ``0``, ``inf``, NaN or more than a
year: no budget of its own, only the guards):

* in the main thread (plugrl's reward worker processes, ``reward.num_workers: 0``), by
  ``signal.setitimer``, unless another real-time timer is already running;
* in any other thread (TRL's reward threads, plugrl's async lanes, an event loop's executor),
  and in a main thread whose timer is taken, by one watchdog thread per process that raises
  the timeout in the checking thread with CPython's ``PyThreadState_SetAsyncExc``.

Both stop Python code only, between bytecodes, and not while it runs standard-library code
(which takes locks, such as the import lock, in ways an exception could leave held: a
deadlock; the alarm repeats every 20 ms until it lands outside). The ANTLR parser and most
of sympy are Python, so a check ends within about ``time_limit_s`` plus the linear
pre-parse work. A single long C
call (big-integer arithmetic, one regex search) would run to its end first: the guards above
keep such work off the inputs (values over :data:`MAX_BITS`, texts over ``max_chars``), and in
plugrl's worker processes the kernel's ``reward.timeout_s`` (which kills the worker) is the
backstop. Where neither mechanism exists (no ``setitimer`` in the main thread, no
``ctypes.pythonapi`` elsewhere: not CPython) the guards are the only bound.

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
import os
import queue
import re
import signal
import sys
import threading
import time
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
MAX_GOLDS = 100  # a ground truth listing more acceptable answers than this raises ValueError
MAX_GOLD_DEPTH = 8  # ... and one whose lists nest deeper
DEFAULT_TIME_LIMIT_S = 3.0
DEFAULT_MAX_CHARS = 20_000
DEFAULT_MAX_NESTING = 8

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[A-Za-z]{2,}")
_BARE_ANSWER_CHARS = 200  # a prediction this short, without words, is read as one formula first
_GOLD_FORMULA_CHARS = 2_000  # a gold this short without math delimiters is read as one formula first
# math-verify's plain-expression regex needs time quadratic in the length of a run of the characters it reads
# as arithmetic (digits, whitespace, ``. + - * × / ^ ( ) ÷``): 20,000 of them take 3-10 s, in C, where only a
# signal (main thread) can stop the regex engine. A text with a longer run that has a digit is refused before
# parsing; the worst text within the limit costs well under a second (measured: 0.03 s per 1,000-run).
MAX_EXPR_RUN = 1_000
_EXPR_RUN = re.compile(r"[\d.\s+\-*×/^()÷]+")
_DIGIT = re.compile(r"\d")
_LITERAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")  # a plain decimal number


class _OutOfTime(BaseException):
    """Raised by the alarm inside math-verify/sympy; a BaseException so their ``except Exception`` let it through."""


class _DropTimeoutDisabled(logging.Filter):
    """math-verify warns once per process that its timeouts are off; that is intended here."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


log = logging.getLogger(__name__)
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabled())


# --------------------------------------------------------------------------- time budget


class _Budget:
    """``with _Budget(s):`` raises :class:`_OutOfTime` in the block after ``s`` seconds, in any thread.

    In the main thread, when no real-time timer is running, the alarm is ``signal.setitimer``.
    Elsewhere (another thread, or a main thread whose timer is taken, which it leaves alone) the
    :class:`_Watchdog` thread raises :class:`_OutOfTime` in the checking thread with CPython's
    ``PyThreadState_SetAsyncExc``. Both interrupt Python code only, between bytecodes: a single
    long C call (a huge big-integer operation, one regex search) runs to its end first.
    Not armed (no limit) when ``s`` is None or <= 0, when a budget already runs in this thread,
    or where neither mechanism exists (no ``setitimer`` and no CPython ``ctypes.pythonapi``).
    The alarm repeats every :data:`_REPEAT_S` until disarmed: an exception raised while
    Python runs a gc callback or a ``__del__`` is printed and dropped, and the next alarm
    then stops the block instead. Neither raises while the thread runs standard-library
    code (:func:`_safe_to_raise`: a lock taken there could be left held); the next alarm
    tries again. Use :meth:`stop` after catching :class:`_OutOfTime`.
    """

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.armed: str | None = None  # "signal", "watchdog" or None
        self._previous: Any = None
        self._thread_id = 0

    def __enter__(self) -> _Budget:
        s = self.seconds
        if s is None or not 0 < s <= _LONGEST_BUDGET_S:  # None, 0, NaN, inf, over a year: no budget of its own
            return self
        if (
            hasattr(signal, "setitimer")
            and threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        ):
            self._previous = signal.signal(signal.SIGALRM, _on_alarm)
            self.armed = "signal"
            signal.setitimer(signal.ITIMER_REAL, float(s), _REPEAT_S)
        elif _WATCHDOG.usable:
            self._thread_id = threading.get_ident()
            self.armed = "watchdog"  # before arming: a short budget can run out before arm() returns
            if not _WATCHDOG.arm(self._thread_id, float(s), self):
                self.armed = None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disarm()

    def disarm(self) -> None:
        if self.armed == "signal":
            signal.setitimer(signal.ITIMER_REAL, 0.0)
            self.armed = None
            signal.signal(signal.SIGALRM, self._previous)
        elif self.armed == "watchdog":
            _WATCHDOG.disarm(self._thread_id, self)
            self.armed = None

    def stop(self) -> None:
        """Disarm after :class:`_OutOfTime`, even if a repeat alarm interrupts the disarming."""
        while True:
            try:
                self.disarm()
                return
            except _OutOfTime:
                continue


_REPEAT_S = 0.02
# a longer budget is none: setitimer refuses seconds past the platform's time_t (1e10 s here: OverflowError)
_LONGEST_BUDGET_S = 365 * 24 * 3600.0


def _on_alarm(signum: int, frame: Any) -> None:
    if _safe_to_raise(frame):
        raise _OutOfTime  # else the alarm repeats in _REPEAT_S


_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


def _safe_to_raise(frame: Any) -> bool:
    """May the timeout be raised in ``frame``, the code the thread runs now? Not in the standard library: it takes
    locks as ``lock.acquire()`` then ``try:`` (importlib's module-lock callbacks take the import lock so, logging's
    handlers, ``threading.Condition``), and an exception raised between the two leaves the lock held: every later
    import (or log call) in the process would wait forever. math-verify, latex2sympy and sympy take no such locks."""
    if frame is None:
        return True
    module = frame.f_globals.get("__name__") or ""
    return module.partition(".")[0] not in _STDLIB


def _async_raiser() -> tuple[Any, Any]:
    """CPython's ``PyThreadState_SetAsyncExc(thread_id, exc)`` as a private ctypes prototype, and the NULL
    ``exc`` that clears a pending exception; (None, None) where there is no ``ctypes.pythonapi`` (not CPython)."""
    try:
        import ctypes

        proto = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)
        return proto(("PyThreadState_SetAsyncExc", ctypes.pythonapi)), ctypes.py_object()
    except (ImportError, AttributeError, OSError):
        return None, None


class _Watchdog:
    """One daemon thread per process that raises :class:`_OutOfTime` in threads whose budget ran out.

    Checking threads register ``(thread id, deadline)``; at the deadline the watchdog sets the
    thread's pending asynchronous exception (CPython raises it where the thread resumes), then
    again every :data:`_REPEAT_S` until the thread disarms; a round when the thread runs
    standard-library code is skipped (:func:`_safe_to_raise`). Disarming removes the deadline
    and clears a pending exception under the same lock the watchdog raises under, so nothing
    is raised in a thread after its :meth:`disarm` returns. The checking threads only take a
    plain ``threading.Lock`` with ``with`` (never a Python-level lock an exception could leave
    held) and wake the watchdog through a ``queue.SimpleQueue`` (C code, no lock).
    """

    def __init__(self) -> None:
        self._raise, self._null = _async_raiser()
        self.usable = self._raise is not None
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[int, tuple[float, object]] = {}  # thread id -> (when to raise next, owning budget)
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def arm(self, thread_id: int, seconds: float, owner: object) -> bool:
        """Raise in ``thread_id`` after ``seconds`` until ``owner`` disarms; False (not armed) if a budget
        already runs there."""
        with self._lock:
            if thread_id in self._due:
                return False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="plugrl-math-budget", daemon=True)
                self._thread.start()
            self._due[thread_id] = (time.monotonic() + seconds, owner)
        self._wake.put(None)
        return True

    def disarm(self, thread_id: int, owner: object) -> None:
        with self._lock:
            if self._due.get(thread_id, (0.0, owner))[1] is owner:
                self._due.pop(thread_id, None)
            self._raise(thread_id, self._null)  # clear an exception raised but not yet delivered

    def _run(self) -> None:
        wait: float | None = None
        while True:
            try:
                self._wake.get(timeout=wait)
            except queue.Empty:
                pass
            with self._lock:
                now = time.monotonic()
                late = [(thread_id, owner) for thread_id, (due, owner) in self._due.items() if due <= now]
                frames = sys._current_frames() if late else {}
                for thread_id, owner in late:
                    # the thread waits for the GIL this thread holds: it resumes (and raises) where its frame is now
                    if _safe_to_raise(frames.get(thread_id)):
                        self._raise(thread_id, _OutOfTime)
                    self._due[thread_id] = (now + _REPEAT_S, owner)
                wait = max(0.0, min(due for due, _ in self._due.values()) - now) if self._due else None


_WATCHDOG = _Watchdog()
if hasattr(os, "register_at_fork"):  # a forked child has no watchdog thread, and maybe a held lock
    os.register_at_fork(after_in_child=_WATCHDOG._reset)


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


def long_expression_run(text: str) -> bool:
    """Has ``text`` a run of over :data:`MAX_EXPR_RUN` characters math-verify reads as arithmetic, with a digit?"""
    runs = (m for m in _EXPR_RUN.finditer(text) if m.end() - m.start() > MAX_EXPR_RUN)
    return any(_DIGIT.search(m.group()) for m in runs)


def _refused_text(text: str, max_nesting_depth: int) -> bool:
    """The guards before parsing: nested deeper than ``max_nesting_depth``, or a long arithmetic run."""
    return max_nesting(text) > max_nesting_depth or long_expression_run(text)


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
    """The ground truth as answer texts: a string, a number, or a list/tuple of them (any one may match).

    Lists may nest up to :data:`MAX_GOLD_DEPTH` levels and hold up to :data:`MAX_GOLDS` answers in all;
    anything else (other types, ``nan``, deeper or larger lists, a list that contains itself) raises
    ``ValueError``. Read without recursion, so no input makes it raise ``RecursionError``.
    """
    texts: list[str] = []
    stack: list[tuple[Any, int]] = [(ground_truth, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple)):
            if depth >= MAX_GOLD_DEPTH:
                raise ValueError(f"math: ground_truth lists may nest at most {MAX_GOLD_DEPTH} deep")
            if len(item) + len(texts) + len(stack) > MAX_GOLDS:
                raise ValueError(f"math: ground_truth may list at most {MAX_GOLDS} acceptable answers")
            stack.extend((x, depth + 1) for x in reversed(item))
        else:
            texts.append(_one_gold_text(item))
    return texts


def _one_gold_text(ground_truth: Any) -> str:
    if isinstance(ground_truth, str):
        return ground_truth
    if isinstance(ground_truth, bool) or ground_truth is None:
        raise ValueError(f"math: ground_truth must be an answer text or number, got {ground_truth!r}")
    if isinstance(ground_truth, numbers.Integral):  # str() refuses ints of over 4,300 digits; Decimal does not
        return str(Decimal(int(ground_truth)))
    if isinstance(ground_truth, numbers.Real):
        value = float(ground_truth)
        if not math.isfinite(value):
            raise ValueError(f"math: ground_truth must be finite, got {ground_truth!r}")
        return format(Decimal(repr(value)), "f")  # 1e-07 -> 0.0000001, which LaTeX reads
    raise ValueError(f"math: ground_truth must be an answer text or number, got {type(ground_truth).__name__}")


def _tail(text: str, max_chars: int) -> str:
    """``text`` stripped, only its last ``max_chars`` characters (the final answer is at the end)."""
    text = text.strip()
    return text[-max_chars:].strip() if len(text) > max_chars else text


@functools.lru_cache(maxsize=1024)
def _parse_gold(text: str) -> tuple[Any, ...]:
    """The parsed gold values of ``text`` (stripped, at most ``max_chars``, nesting checked); () if none.

    math-verify turns its parser's errors into "nothing found"; an error raised here around it
    (``RecursionError`` on a pathological value) also means no gold, and is cached like one."""
    try:
        got = _read(text, first_match=False, as_formula=len(text) <= _GOLD_FORMULA_CHARS)
        return tuple(g for g in got if not too_big(g))
    except Exception:  # never _OutOfTime (a BaseException): a timeout is not cached
        log.debug("math: ground truth could not be parsed", exc_info=True)
        return ()


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
    prediction), ``no_gold`` (the ground truth could not be parsed: no math found, refused by
    the guards, a value too big, or an error in the parser), ``refused`` (the prediction is
    nested deeper than ``max_nesting``, has a long arithmetic run (:func:`long_expression_run`)
    or a value too big to compute, or made the parser fail), ``timeout`` (over ``time_limit_s``).
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
    list of acceptable answers (raises ``ValueError`` for other types, see :func:`gold_text`);
    any other input returns a :class:`MathCheck`, never raises, in about ``time_limit_s`` at
    most in any thread (see the module docstring for what bounds it where). ``require_anchor``:
    outside ``<answer>`` tags, only an answer marked by ``\\boxed{}``, ``answer: ...`` or
    ``final answer is ...`` counts (a short bare answer such as ``"0.5"`` counts as it is);
    False: the rightmost number or formula anywhere in the completion counts.
    """
    golds = gold_text(ground_truth)
    if not isinstance(prediction, str):
        return MathCheck(False, "no_answer")
    tagged = extract_answer_tag(prediction) if use_answer_tag else None
    answer = prediction if tagged is None else tagged
    text = _tail(answer, max_chars)
    if not text:
        return MathCheck(False, "no_answer")
    literal = _long_literal_check(answer, golds, max_chars)
    if literal is not None:
        return literal
    # the guards before parsing apply to the gold as to the prediction (a gold they refuse is no gold, whatever
    # the prediction: every completion of its prompt gets no_gold)
    gold_texts = [t for t in (_tail(g, max_chars) for g in golds) if not _refused_text(t, max_nesting_depth)]
    if not gold_texts:
        return MathCheck(False, "no_gold")
    if _refused_text(text, max_nesting_depth):
        return MathCheck(False, "refused")
    budget = _Budget(time_limit_s)
    try:
        with budget:
            gold: list[Any] = [g for t in gold_texts for g in _parse_gold(t)]
            if not gold:
                return MathCheck(False, "no_gold")
            return _check_prediction(text, gold, tagged is not None, require_anchor)
    except _OutOfTime:
        budget.stop()
        return MathCheck(False, "timeout")


def _decimal_literal(text: str, max_chars: int) -> Decimal | None:
    """``text`` as a number when it is a plain decimal literal (``-123``, ``4.50``) of at most ``max_chars``
    characters (a longer one would be read cut), else None."""
    text = text.strip()
    if len(text) > max_chars or not _LITERAL.fullmatch(text):
        return None
    return Decimal(text)


def _long_literal_check(answer: str, golds: list[str], max_chars: int) -> MathCheck | None:
    """A prediction and a gold that are both plain decimal literals, one of them a run of digits longer than
    the guards let math-verify read (:func:`long_expression_run`, :data:`MAX_EXPR_RUN`), compared exactly in
    linear time: equal is ``correct``, two different integers ``wrong``; None (the usual path) otherwise."""
    pred = _decimal_literal(answer, max_chars)
    if pred is None:
        return None
    literal_golds = [(g, value) for g in golds if (value := _decimal_literal(g, max_chars)) is not None]
    if not literal_golds or not any(long_expression_run(t) for t in (answer, *(g for g, _ in literal_golds))):
        return None
    extracted = _extracted([answer.strip()])
    if any(value == pred for _, value in literal_golds):
        return MathCheck(True, "correct", extracted)
    if pred == pred.to_integral_value() and all(v == v.to_integral_value() for _, v in literal_golds):
        return MathCheck(False, "wrong", extracted)
    return None


def _check_prediction(text: str, gold: list[Any], tagged: bool, require_anchor: bool) -> MathCheck:
    extracted = ""
    try:
        bare = _bare_math(text)
        anchored = require_anchor and not tagged and not bare
        pred = _read(text, first_match=True, as_formula=bare, anchored=anchored)
        extracted = _extracted(pred)
        if not pred:
            return MathCheck(False, "no_answer")
        if any(too_big(p) for p in pred):
            return MathCheck(False, "refused", extracted)
        ok = bool(verify(gold, pred, timeout_seconds=None))
    except Exception:  # RecursionError or another error math-verify let through, on a hostile prediction
        log.debug("math: prediction could not be checked", exc_info=True)
        return MathCheck(False, "refused", extracted)
    return MathCheck(ok, "correct" if ok else "wrong", extracted)


def math_equal(pred_text: str, gold_text: Any, *, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S) -> bool:
    """True iff the final answer in ``pred_text`` equals ``gold_text`` (math-verify, as :func:`check_answer`).

    ``pred_text`` may be a whole completion (its last ``<answer>`` or ``\\boxed{}`` counts) or
    a bare answer (``"0.5"``, ``"\\frac{1}{2}"``). False for anything unparseable, refused or
    over time; never raises for a bad prediction (``ValueError`` for a ground truth of the wrong
    type only). Bounded by ``time_limit_s`` in any thread, as :func:`check_answer`.
    """
    return check_answer(pred_text, gold_text, time_limit_s=time_limit_s).correct
