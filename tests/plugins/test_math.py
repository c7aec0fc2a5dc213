"""Tests for the math rewards (plugins/rewards_math): math-verify behaviours, guards, formats, registration."""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import math
import signal
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plugrl_math
from plugrl.config import ConfigError, RewardConfig, build_config
from plugrl.plugins import check_config, load_plugins
from plugrl.rewards import RewardItem, RewardRunner
from plugrl.specs import RewardSpec, specs_of
from plugrl_math import (
    MathAccuracyOptions,
    check_answer,
    count_tags,
    extract_answer_tag,
    has_think_answer_format,
    math_accuracy,
    math_equal,
    tag_count,
    think_answer_format,
)
from plugrl_math.formats import FORMAT_PATTERN
from plugrl_math.verify import _Budget, _OutOfTime, max_nesting, too_big
from reward_fixtures import FakeSample

SOURCES = ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")


def status(pred, gold, **kw):
    return check_answer(pred, gold, **kw).status


# --------------------------------------------------------------------------- gold forms


@pytest.mark.parametrize(
    "gold",
    [
        "\\frac{1}{2}",
        "\\frac12",
        "\\dfrac{1}{2}",
        "0.5",
        "1/2",
        "$\\frac{1}{2}$",
        "$\\boxed{\\frac{1}{2}}$",
        "\\boxed{0.5}",
        "The probability is $\\boxed{\\dfrac{1}{2}}$.",  # a whole MATH solution: its \boxed counts
        0.5,
        ["0.5"],
    ],
)
@pytest.mark.parametrize("pred", ["<answer>\\frac{1}{2}</answer>", "<answer>0.5</answer>", "\\boxed{1/2}"])
def test_gold_forms_half(gold, pred):
    assert math_equal(pred, gold)


@pytest.mark.parametrize("gold", ["3", 3, "3.0", "$3$", "$\\boxed{3}$", "\\boxed{3}", "  3  "])
def test_gold_forms_three(gold):
    assert math_equal("<answer>3</answer>", gold)
    assert not math_equal("<answer>4</answer>", gold)


def test_gold_bare_latex_is_read_as_math():
    # math-verify alone finds no number in a bare "\frac{\sqrt{3}}{2}", and reads "(1, 2]" as 2
    assert math_equal("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}")
    assert math_equal("\\boxed{\\frac{\\sqrt3}{2}}", "\\frac{\\sqrt{3}}{2}")  # malformed \sqrt3 is fixed
    assert math_equal("\\boxed{(1,2]}", "(1, 2]")
    assert not math_equal("\\boxed{2}", "(1, 2]")
    assert math_equal("<answer>2\\sqrt{2}</answer>", "2\\sqrt2")
    assert not math_equal("<answer>2</answer>", "2\\sqrt{2}")


def test_unparseable_gold_scores_zero_with_status():
    for gold in ("", "   ", "\\text{}"):
        out = math_accuracy("<answer>3</answer>", gold)
        assert out == {"score": 0.0, "status": "no_gold", "extracted": ""}


def test_gold_that_is_only_text_is_compared_as_text():
    assert math_equal("<answer>\\text{Evelyn}</answer>", "\\text{Evelyn}")
    assert math_equal("<answer>Evelyn</answer>", "\\text{Evelyn}")
    assert math_equal("<answer>B</answer>", "\\text{(B)}")


@pytest.mark.parametrize("gold", [None, True, {"answer": 3}, float("nan"), float("inf"), object()])
def test_bad_ground_truth_raises(gold):
    with pytest.raises(ValueError, match="ground_truth"):
        math_accuracy("<answer>3</answer>", gold)


def test_small_float_ground_truth():
    assert math_equal("<answer>0.0000001</answer>", 1e-7)  # not "1e-07", which LaTeX does not read


# --------------------------------------------------------------------------- the traps


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        # where the answer is (see also test_anchors): "answer ..." counts, not a later bare number
        ("The answer is 3 and then I double-checked with 7.", "3", True),
        ("The answer is 3 and then I double-checked with 7.", "7", False),
        ("I got 3. Then 7.", "7", False),  # no \boxed, no "answer": nothing is read
        ("\\boxed{3}. To check: 2 + 2 = 4.", "3", True),  # \boxed beats every other match
        ("The final answer is 4. \\boxed{3}", "3", True),
        # several \boxed: the last one ...
        ("\\boxed{3} but wait \\boxed{4}", "4", True),
        ("\\boxed{3} but wait \\boxed{4}", "3", False),
        ("$\\boxed{3}$ but wait $\\boxed{4}$", "4", True),
        # ... unless they are close (< 10 chars apart, or < 70 with and/or/,/; between): then all, as a set
        ("\\boxed{3} and \\boxed{4}", "4", False),
        ("\\boxed{3} and \\boxed{4}", "3, 4", True),
        ("First \\boxed{3}. Hmm, no. Final: \\boxed{4}.", "4", False),
        ("\\boxed{3}\n\nWait, actually \\boxed{4}", "4", False),
        # units
        ("<answer>5 cm</answer>", "5", True),
        ("\\boxed{5 \\text{ cm}}", "5", True),
        ("\\boxed{5\\,\\mathrm{cm}}", "5", True),
        ("<answer>5</answer>", "5 cm", True),
        ("<answer>5</answer>", "5 \\text{ cm}", True),
        # negative numbers
        ("<answer>-3</answer>", "-3", True),
        ("\\boxed{-3}", "-3", True),
        ("<answer>3</answer>", "-3", False),
        ("<answer>-3</answer>", "3", False),
        ("\\boxed{-\\infty}", "\\infty", False),
        # thousands separators
        ("<answer>1,000</answer>", "1000", True),
        ("<answer>1000</answer>", "1,000", True),
        ("\\boxed{1{,}000}", "1000", True),
        ("<answer>1,000,000</answer>", "10^6", True),
        ("<answer>1 000</answer>", "1000", False),  # a space separator inside a bare answer is not understood
        # fractions and decimals
        ("<answer>\\frac{1}{2}</answer>", "0.5", True),
        ("<answer>1/2</answer>", "\\frac{1}{2}", True),
        ("<answer>\\dfrac{1}{2}</answer>", "0.5", True),
        ("\\boxed{0.5}", "\\frac12", True),
        ("<answer>0.333333</answer>", "\\frac{1}{3}", True),  # compared after rounding to 6 decimals
        ("<answer>0.33</answer>", "\\frac{1}{3}", False),
        ("<answer>3.0</answer>", "3", True),
        ("<answer>1000.</answer>", "1000", True),
        ("<answer>1e3</answer>", "1000", False),  # scientific notation is not read
        # percentages: math-verify accepts x% for x and for x/100
        ("<answer>50</answer>", "50\\%", True),
        ("<answer>0.5</answer>", "50\\%", True),
        ("\\boxed{50\\%}", "50", True),
        ("\\boxed{50\\%}", "0.5", True),
        ("<answer>10%</answer>", "0.1", True),
        ("<answer>51</answer>", "50\\%", False),
        # currency
        ("<answer>18.9</answer>", "\\$18.90", True),
        ("The answer is $18.90.", "\\$18.90", True),
        ("\\boxed{\\$18.90}", "18.9", True),
        # intervals: endpoints and open/closed ends must agree
        ("\\boxed{(1,2]}", "(1, 2]", True),
        ("\\boxed{(1,2)}", "(1, 2]", False),
        ("\\boxed{[1, 2)}", "[1,2)", True),
        ("\\boxed{(-\\infty,3)}", "(-\\infty, 3)", True),
        ("<answer>(1, 2]</answer>", "(1,2]", True),
        # symbolic equality, equations, sets
        ("<answer>x^2+2x+1</answer>", "(x+1)^2", True),
        ("<answer>x = 2</answer>", "2", True),
        ("\\boxed{x = 2}", "2", True),
        ("<answer>1, 2, 3</answer>", "1,2,3", True),
        ("\\boxed{\\{3, 1, 2\\}}", "\\{1,2,3\\}", True),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", True),
        ("<answer>0.8660254</answer>", "\\frac{\\sqrt{3}}{2}", True),
        # the answer tag: bare numbers right after ">" are found
        ("<think>7 is wrong</think><answer>3</answer>", "3", True),
        ("<answer>The answer is 42.</answer>", "42", True),
    ],
)
def test_traps(pred, gold, expected):
    assert math_equal(pred, gold) is expected


def test_anchors():
    """Outside <answer> tags only \\boxed{}, "answer ..." and "final answer is ..." count (as TRL), unless
    require_anchor is off: then math-verify takes the rightmost number or formula anywhere."""
    rambling = "I got 3. Then 7."
    assert status(rambling, "7") == "no_answer"
    assert check_answer(rambling, "7", require_anchor=False).correct
    assert not check_answer(rambling, "3", require_anchor=False).correct
    assert check_answer("So x = 3, which we verify by computing 2 + 5 = 7.", "7", require_anchor=False).correct
    assert math_equal("Final answer: 7", "7")
    assert math_equal("Therefore, the answer is $\\frac{1}{2}$.", "0.5")
    # inside <answer> tags, and for a short bare answer, no anchor is needed
    assert math_equal("<think>2 + 5</think><answer>7</answer>", "7")
    assert math_equal("7", "7") and math_equal("\\frac{1}{2}", "0.5") and math_equal(" (1, 2] ", "(1,2]")
    # an echoed expression is its value: with anchors off, a question's "2/4" would earn a "1/2"
    assert check_answer("bananas are the 2/4 ratio", "\\frac{1}{2}", require_anchor=False).correct
    assert not math_equal("bananas are the 2/4 ratio", "\\frac{1}{2}")


def test_answer_tag_wins_over_the_rest():
    text = "<think>maybe \\boxed{4}</think><answer>3</answer> and afterwards \\boxed{4}"
    assert math_equal(text, "3")
    assert not math_equal(text, "4")
    assert math_equal(text, "4") is False
    # the last complete <answer> counts (an example in the reasoning does not)
    assert math_equal("e.g. <answer>4</answer> ... <answer>3</answer>", "3")
    # without reading tags, the \boxed wins
    assert check_answer(text, "4", use_answer_tag=False).correct
    # an empty answer is no answer, whatever follows it
    assert status("<answer> </answer> \\boxed{3}", "3") == "no_answer"


def test_extract_answer_tag():
    assert extract_answer_tag("a <answer>1</answer> b <answer>2</answer>") == "2"
    assert extract_answer_tag("<answer>1</answer><answer>2") == "1"
    assert extract_answer_tag("<answer>" * 100_000) is None
    assert extract_answer_tag("no tags") is None


def test_result_fields():
    assert math_accuracy("<think>..</think><answer>\\frac{1}{2}</answer>", "0.5") == {
        "score": 1.0,
        "status": "correct",
        "extracted": "\\frac{1}{2}",
    }
    assert math_accuracy("<answer>7</answer>", "3") == {"score": 0.0, "status": "wrong", "extracted": "7"}
    assert math_accuracy("I don't know", "3") == {"score": 0.0, "status": "no_answer", "extracted": ""}
    assert math_accuracy("", "3")["status"] == "no_answer"
    assert math_accuracy(None, "3")["status"] == "no_answer"  # type: ignore[arg-type]


# --------------------------------------------------------------------------- guards and time


def test_nesting_and_size_guards():
    assert max_nesting("\\frac{(1+[2])}{3}") == 3
    assert max_nesting(")))(((") == 3 and max_nesting("(]") == 1
    deep = "\\boxed{" + "{" * 9 + "3" + "}" * 9 + "}"
    assert status(deep, "3") == "refused"
    assert check_answer(deep, "3", max_nesting_depth=12).correct  # allowed when asked (and slow: ~0.5 s)
    for pred in ("\\boxed{9^{9^{9^{9}}}}", "answer: 9^9^9^9", "\\boxed{(10^{10})!}", "\\boxed{2^{2^{20}}}"):
        assert status(pred, "3") == "refused", pred
    assert math_equal("\\boxed{2^{10}}", "1024")
    assert math_equal("\\boxed{10^{100}}", "10^{100}")
    assert math_equal("\\boxed{5!}", "120")


def test_the_guards_apply_to_the_gold_too():
    deep = "\\boxed{" + "{" * 9 + "3" + "}" * 9 + "}"
    assert status("<answer>3</answer>", deep) == "no_gold"  # nested deeper than max_nesting: no gold
    assert check_answer("<answer>3</answer>", deep, max_nesting_depth=12).correct
    assert math_equal("<answer>3</answer>", "x" * 30_000 + " so $\\boxed{3}$")  # its last max_chars are read
    assert status("<answer>3</answer>", "$\\boxed{3}$ " + "x" * 30_000) == "no_gold"


def test_long_arithmetic_runs_are_refused():
    """math-verify's expression regex is quadratic in such runs, in C (no budget can stop it in a thread)."""
    from plugrl_math.verify import MAX_EXPR_RUN, long_expression_run

    run = "+".join(["1"] * (MAX_EXPR_RUN // 2 + 1))
    assert long_expression_run(run) and long_expression_run("1 " * MAX_EXPR_RUN)
    assert not long_expression_run(run[:MAX_EXPR_RUN]) and not long_expression_run(" " * 5_000 + "-" * 5_000)
    assert status(f"<answer>{run}</answer>", "3") == "refused"
    assert status("<answer>3</answer>", run) == "no_gold"
    assert math_equal("<answer>" + "1+" * 10 + "1</answer>", "11")


def test_a_5000_digit_literal_equals_itself():
    """Past the 1,000-character run the guards refuse (math-verify's regex is quadratic there), two plain decimal
    literals are compared exactly: a 5,000-digit number and itself is correct (was `refused`), also as a Python int
    gold (str() of it raised ValueError past 4,300 digits), as a float-like spelling, and in <answer> tags; another
    integer is wrong; a gold the guards refuse is no_gold whatever the prediction."""
    digits = "7" * 5_000
    assert math_equal(digits, digits)
    assert math_accuracy(digits, digits) == {"score": 1.0, "status": "correct", "extracted": digits[:97] + "..."}
    assert check_answer(digits, 7 * (10**5_000 - 1) // 9).status == "correct"
    assert check_answer(f"<answer>{digits}.00</answer>", ["5", digits]).status == "correct"
    assert status(digits, digits[:-1] + "8") == "wrong" and status(digits, "3") == "wrong"
    assert status("3", digits) == "wrong"
    assert status("\\boxed{x}", "1+" * 2_000 + "1") == "no_gold"  # a refused gold, not a literal
    assert status("1+" * 2_000 + "1", "1+" * 2_000 + "1") == "no_gold"


@pytest.mark.parametrize("limit", [math.inf, math.nan, 1e300, -1.0])
def test_a_time_limit_of_inf_means_no_budget_when_called_directly(limit):
    """The config path refuses time_limit_s=inf (it must be finite there); called as a function, inf (or NaN, or
    one past what setitimer takes) is no budget of its own, like 0 or None: it was OverflowError from setitimer."""
    before = signal.getsignal(signal.SIGALRM)
    assert math_accuracy("<answer>\\frac{1}{2}</answer>", "0.5", time_limit_s=limit)["status"] == "correct"
    box = []
    thread = threading.Thread(target=lambda: box.append(check_answer("<answer>2</answer>", "2", time_limit_s=limit)))
    thread.start()
    thread.join(30)
    assert [c.status for c in box] == ["correct"]
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_too_big():
    from sympy import Integer, Pow, Symbol, factorial

    nine = Integer(9)
    assert not too_big(Pow(Integer(2), Integer(1000), evaluate=False))
    assert too_big(Pow(nine, Pow(nine, Pow(nine, nine, evaluate=False), evaluate=False), evaluate=False))
    assert too_big(factorial(Integer(10**6), evaluate=False))
    assert too_big(Pow(Symbol("x"), Pow(nine, Pow(nine, nine, evaluate=False), evaluate=False), evaluate=False))
    assert not too_big("a string")


def _slow_pred(tag: str) -> str:
    # depth-10 nesting: math-verify's LaTeX parser needs ~1 s; a unique text so no cache answers it
    return "\\boxed{" + "{" * 9 + tag + "}" * 9 + "}"


def test_time_limit_stops_the_check_and_restores_the_alarm():
    before = signal.getsignal(signal.SIGALRM)
    start = time.perf_counter()
    out = check_answer(_slow_pred("31"), "3", time_limit_s=0.05, max_nesting_depth=20)
    assert out.status == "timeout" and not out.correct
    assert time.perf_counter() - start < 0.5
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert math_equal("\\boxed{3}", "3")  # and the next check is unaffected


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_alarm_dropped_inside_a_finalizer_rings_again():
    # CI once saw the alarm land in hypothesis' gc callback, where Python prints and drops the exception
    class SlowFinalizer:
        def __del__(self) -> None:
            end = time.perf_counter() + 0.1
            while time.perf_counter() < end:
                pass

    budget = _Budget(0.02)
    start = time.perf_counter()
    with pytest.raises(_OutOfTime):
        with budget:
            SlowFinalizer()  # the first alarm rings in __del__ and is lost
            while time.perf_counter() - start < 2.0:
                pass
    budget.stop()
    assert time.perf_counter() - start < 0.5  # without the repeat: 2 s and no exception
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_running_timer_is_left_alone():
    handler = lambda *a: None  # noqa: E731
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 30.0)
    try:
        assert check_answer("\\boxed{3}", "3", time_limit_s=3.0).correct
        # the timer is someone else's: the budget is kept by the watchdog thread instead
        start = time.perf_counter()
        assert check_answer(_slow_pred("32"), "3", time_limit_s=0.05, max_nesting_depth=20).status == "timeout"
        assert time.perf_counter() - start < 1.0
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
        assert signal.getsignal(signal.SIGALRM) is handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def test_works_outside_the_main_thread():
    # math-verify's own signal timeouts raise ValueError off the main thread; they are off here
    results = []

    def run():
        results.append(check_answer("\\boxed{\\frac12}", "0.5", time_limit_s=3.0))

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert [r.status for r in results] == ["correct"]


# --------------------------------------------------------------------------- hostile input, in any thread

CALL_BOUND_S = 3.0  # per call with time_limit_s=1 (measured: <0.5 s guarded, ~1.0 s on the budget); the old
# code took 5-60+ s for some of these in a thread, where it had no budget
N = 10_000
HOSTILE = {
    "10k braces": "{" * N + "3" + "}" * N,
    "10k brackets": "[" * N + "3" + "]" * N,
    "10k parentheses, boxed": "\\boxed{" + "(" * N + "3" + ")" * N + "}",
    "10k braces, boxed": "\\boxed{" + "{" * N + "3" + "}" * N + "}",
    "frac 2000 deep": "\\frac{" * 2000 + "1" + "}{2}" * 2000,
    "frac 2000 deep, math": "$" + "\\frac{" * 2000 + "1" + "}{2}" * 2000 + "$",
    "sqrt 2000 deep": "\\sqrt{" * 2000 + "2" + "}" * 2000,
    "sqrt 2000 deep, math": "$" + "\\sqrt{" * 2000 + "2" + "}" * 2000 + "$",
    "depth 12": "\\boxed{" + "{" * 11 + "3" + "}" * 11 + "}",
    "power tower": "9^{9^{9^{9}}}",
    "power tower, plain": "9^9^9^9",
    "factorial": "(10^{10})!",
    "binomial": "\\binom{10^{9}}{5 \\cdot 10^{8}}",
    "1 MB of text": "x" * 1_000_000,
    "1 MB of digits": "1" * 1_000_000,
    "1 MB sum": "+".join(["1"] * 500_000),
    "1 MB boxed sum": "\\boxed{" + "1+" * 500_000 + "1}",
}
# slow for the parser though allowed once the size and nesting guards are opened: only the time budget stops them
SLOW = {
    "frac 300 deep": "$" + "\\frac{" * 300 + "1" + "}{2}" * 300 + "$",
    "sqrt 300 deep": "$" + "\\sqrt{" * 300 + "2" + "}" * 300 + "$",
    "10k-term sum": "$" + "+".join(["x"] * N) + "$",
}
OPEN_GUARDS = {"max_nesting": 100_000, "max_chars": 10_000_000}
GOLD_STATUSES = {"no_gold", "wrong", "timeout"}  # a hostile ground truth text scores 0, whatever happens
PRED_STATUSES = {"refused", "no_answer", "wrong", "timeout"}


def _timed(fn):
    start = time.perf_counter()
    try:
        out = fn()
    except BaseException as exc:  # noqa: BLE001 - reported by the caller
        out = exc
    return out, time.perf_counter() - start


def _run(where, fn):
    """``fn()`` in the main thread or in a fresh (daemon) thread: (result or exception, seconds)."""
    if where == "main":
        return _timed(fn)
    box = []
    thread = threading.Thread(target=lambda: box.append(_timed(fn)), daemon=True)
    thread.start()
    thread.join(30)
    assert box, "still running after 30 s in a thread"
    return box[0]


def _fresh_caches():
    """Forget parsed golds (and math-verify's small parse caches), so that each call does the work again."""
    import math_verify.parser as mvp

    import plugrl_math.verify as mv

    mv._parse_gold.cache_clear()
    for name in ("parse_latex_cached", "parse_expr_cached", "extract_latex"):
        cached = getattr(mvp, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()


def _accuracy_call(side, text, **options):
    def call():
        _fresh_caches()
        if side == "gold":
            return math_accuracy("<answer>3</answer>", text, time_limit_s=1, **options)
        return math_accuracy(f"<answer>{text}</answer>", "3", time_limit_s=1, **options)

    return call


def _assert_documented(side, out, seconds):
    assert not isinstance(out, BaseException), f"raised {type(out).__name__}: {str(out)[:200]}"
    assert out["score"] == 0.0 and out["status"] in (GOLD_STATUSES if side == "gold" else PRED_STATUSES), out
    assert seconds < CALL_BOUND_S, f"took {seconds:.1f} s"


@pytest.mark.parametrize("where", ["main", "thread"])
@pytest.mark.parametrize("side", ["gold", "pred"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_keeps_the_contract_in_any_thread(name, side, where):
    """Hostile ground truths and completions score 0 with a documented status, raise nothing (no
    RecursionError), and finish within the bound, in the main thread and in a thread alike."""
    out, seconds = _run(where, _accuracy_call(side, HOSTILE[name]))
    _assert_documented(side, out, seconds)


@pytest.mark.parametrize("where", ["main", "thread"])
@pytest.mark.parametrize("side", ["gold", "pred"])
@pytest.mark.parametrize("name", list(SLOW))
def test_the_time_budget_holds_in_any_thread(name, side, where):
    """With the guards opened the parser would take minutes; the budget stops it in a thread too."""
    out, seconds = _run(where, _accuracy_call(side, SLOW[name], **OPEN_GUARDS))
    _assert_documented(side, out, seconds)


@pytest.mark.parametrize("side", ["gold", "pred"])
def test_a_check_in_a_thread_stops_on_its_budget(side):
    """Depth 15 would keep math-verify's parser busy for minutes: in a thread the budget stops it as in the main
    thread (the old code had no budget off the main thread)."""
    deep = "\\boxed{" + "{" * 14 + f"3{side}" + "}" * 14 + "}"
    options = {"time_limit_s": 0.3, "max_nesting": 20}
    if side == "gold":
        call = lambda: math_accuracy("<answer>3</answer>", deep, **options)  # noqa: E731
    else:
        call = lambda: math_accuracy(deep, "3", **options)  # noqa: E731
    out, seconds = _run("thread", call)
    assert not isinstance(out, BaseException), repr(out)
    assert out == {"score": 0.0, "status": "timeout", "extracted": ""}
    assert seconds < 1.5


def test_the_time_budget_holds_in_a_thread_pool():
    """Several checks at once in a ThreadPoolExecutor (as TRL runs reward functions): each bounded."""
    calls = [_accuracy_call(side, text, **OPEN_GUARDS) for text in SLOW.values() for side in ("gold", "pred")]
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_timed, call) for call in calls]
        done, not_done = cf.wait(futures, timeout=60)
    assert not not_done
    for side, future in zip(["gold", "pred"] * len(SLOW), futures, strict=True):
        _assert_documented(side, *future.result())
    assert math_equal("\\boxed{3}", "3")


def _nested_list(depth):
    gold = inner = []
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    inner.append("3")
    return gold


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_pathological_ground_truth_raises_value_error_not_recursion_error(where):
    looped = ["3"]
    looped.append(looped)
    for gold in (_nested_list(10_000), looped, ["1"] * 1_000_000):
        out, seconds = _run(where, lambda gold=gold: math_accuracy("<answer>3</answer>", gold, time_limit_s=1))
        assert isinstance(out, ValueError) and "ground_truth" in str(out), repr(out)[:200]
        assert seconds < CALL_BOUND_S
    # a list of acceptable answers, even nested a little, still works
    assert math_accuracy("<answer>3</answer>", ["1", ("2", ["3"])])["status"] == "correct"


def test_a_parser_error_is_no_gold_or_refused(monkeypatch):
    """An error that escapes the parsers (RecursionError on a pathological value) ends as the documented
    status: no gold for the ground truth, refused for the prediction."""
    import plugrl_math.verify as mv

    def deep(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(mv, "verify", deep)
    assert math_accuracy("<answer>3</answer>", "3")["status"] == "refused"
    monkeypatch.setattr(mv, "parse", deep)
    assert math_accuracy("<answer>3</answer>", "4 + 0 \\cdot 77")["status"] == "no_gold"  # a gold not cached yet
    mv._parse_gold.cache_clear()  # the failure was cached for this text


def test_the_thread_budget_never_fires_after_the_check():
    """Many checks whose budget ends about when they do: the watchdog never raises after a check returned."""
    import plugrl_math.verify as mv

    errors = []

    def many():
        try:
            for i in range(150):
                check_answer(f"\\boxed{{{i}}}", str(i), time_limit_s=0.001 * (i % 15 + 1))
            end = time.perf_counter() + 0.2
            while time.perf_counter() < end:  # a stray alarm would land here
                pass
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=many) for _ in range(2)]
    for t in threads:
        t.start()
    many()  # and the main thread at the same time, on its own alarm
    for t in threads:
        t.join(60)
    assert errors == []
    assert not mv._WATCHDOG._due


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_alarm_dropped_inside_a_finalizer_rings_again_in_a_thread():
    class SlowFinalizer:
        def __del__(self) -> None:
            end = time.perf_counter() + 0.1
            while time.perf_counter() < end:
                pass

    def body():
        budget = _Budget(0.02)
        start = time.perf_counter()
        try:
            with budget:
                SlowFinalizer()
                while time.perf_counter() - start < 2.0:
                    pass
        except _OutOfTime:
            budget.stop()
            return time.perf_counter() - start
        return None

    out, _ = _run("thread", body)
    assert out is not None and out < 0.5


def test_nothing_is_executed(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"<answer>__import__('os').system('touch {marker}')</answer>",
        f"\\boxed{{__import__('os').system('touch {marker}')}}",
        f"The final answer is open('{marker}', 'w')",
        f"$\\text{{{marker}}}$ answer: exec(\"open('{marker}','w')\")",
        "<answer>().__class__.__bases__[0].__subclasses__()</answer>",
        "answer: lambda: 1",
    ]
    for p in payloads:
        assert not math_equal(p, "3")
    assert not marker.exists()


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("<think>reasoning</think><answer>3</answer>", True),
        ("<think>\nreasoning\n</think>\n<answer>\n3\n</answer>", True),
        ("  \n<think>a</think>   \n\t <answer>3</answer>\n\n", True),
        ("<think></think><answer></answer>", True),
        ("<think>a</think><answer>3</answer><answer>4</answer>", True),  # .*? may span tags
        ("<think>a</think> text <answer>3</answer>", False),
        ("<think>a</think><answer>3</answer> trailing", False),
        ("leading <think>a</think><answer>3</answer>", False),
        ("<answer>3</answer>", False),
        ("<think>a</think>", False),
        ("<think>a<answer>3</answer>", False),
        ("<think>a</think><answer>3", False),
        ("", False),
    ],
)
def test_think_answer_format(text, ok):
    assert has_think_answer_format(text) is ok
    assert bool(FORMAT_PATTERN.match(text)) is ok
    assert think_answer_format(text, "3") == (1.0 if ok else 0.0)


_FORMAT_PIECES = ["<think>", "</think>", "<answer>", "</answer>", " ", "\n", "x", "3", "<", ">", "\u2003"]


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(_FORMAT_PIECES), max_size=10).map("".join))
def test_format_matches_the_regex(text):
    assert has_think_answer_format(text) is bool(FORMAT_PATTERN.match(text))


def test_format_is_linear_on_hostile_text():
    hostile = [
        "<think>" + "</think><answer>" * 50_000 + "x",
        "<think>" + "</think>" * 100_000 + "</answer>",
        "<think>" + " " * 1_000_000 + "</answer>",
        "<think>" + "</think> " * 50_000 + "<answer>" * 50_000,
    ]
    start = time.perf_counter()
    for h in hostile:
        assert think_answer_format(h, "") == 0.0
    assert time.perf_counter() - start < 0.5
    assert think_answer_format(None, "") == 0.0  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("<think>\nx\n</think>\n<answer>\n3\n</answer>", 1.0),
        ("<think>\nx\n</think>\n<answer>3</answer>", 0.5),  # "\n<answer>\n" and "\n</answer>" missing
        ("<think>x</think><answer>3</answer>", 0.0),
        ("<think>\n<think>\nx\n</think>\n<answer>\n3\n</answer>", 0.75),  # "<think>\n" twice
        ("", 0.0),
    ],
)
def test_tag_count(text, count):
    assert count_tags(text) == count
    assert tag_count(text, "3") == count


# --------------------------------------------------------------------------- registration and the kernel


def test_module_exposes_specs():
    specs = {s.name: s for name in dir(plugrl_math) for s in specs_of(getattr(plugrl_math, name))}
    assert set(specs) == {"math_accuracy", "think_answer_format", "tag_count"}
    assert all(isinstance(s, RewardSpec) and s.data_sources == SOURCES for s in specs.values())
    assert {n: s.weight for n, s in specs.items()} == {
        "math_accuracy": 1.0,
        "think_answer_format": 0.2,
        "tag_count": 0.0,
    }


MATH_CONFIG = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}, "plugins": ["math"]}


def test_math_accuracy_options_are_declared_once():
    """MathAccuracyOptions is the declaration the kernel validates against; the function's keywords are the
    same options with the same defaults (it stays a plain function other plugins call)."""
    (spec,) = [r for r in load_plugins(["math"]).rewards if r.name == "math_accuracy"]
    assert spec.options is MathAccuracyOptions
    params = inspect.signature(math_accuracy).parameters
    fields = MathAccuracyOptions.model_fields
    assert list(params)[2:] == list(fields)
    assert {name: params[name].default for name in fields} == {name: f.default for name, f in fields.items()}
    assert all(f.description for f in fields.values())


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "-1", "true", "soon"])
def test_a_time_limit_that_is_no_finite_number_stops_the_run_at_start_up(value):
    cfg = build_config(MATH_CONFIG, [f"reward.options.math_accuracy.time_limit_s={value}"])
    with pytest.raises(ConfigError) as info:
        check_config(cfg, load_plugins(["math"]))
    text = str(info.value)
    assert "  reward.options.math_accuracy.time_limit_s: must be a finite number of seconds >= 0" in text, text
    assert "before any model was loaded" in text


def test_valid_options_pass_the_check_and_reach_the_function(monkeypatch):
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return check_answer(*args, **kwargs)

    monkeypatch.setattr(plugrl_math.rewards, "check_answer", spy)
    overrides = ["reward.num_workers=0", "reward.options.math_accuracy.time_limit_s=1.5"]
    cfg = build_config(MATH_CONFIG, [*overrides, "reward.options.math_accuracy.max_nesting=12"])
    registry = load_plugins(["math"])
    check_config(cfg, registry)
    assert cfg.reward.options["math_accuracy"] == {
        "time_limit_s": 1.5,
        "max_chars": 20_000,
        "max_nesting": 12,
        "use_answer_tag": True,
        "require_anchor": True,
    }
    with RewardRunner(registry, cfg.reward) as runner:
        out = runner.score([item(GOOD)])
    assert out.details[0]["math_accuracy"] == 1.0
    assert [(kw["time_limit_s"], kw["max_nesting_depth"]) for kw in seen] == [(1.5, 12)]
    for off in ("0", "null"):  # no budget of its own: documented, still accepted
        check_config(build_config(MATH_CONFIG, [f"reward.options.math_accuracy.time_limit_s={off}"]), registry)


def item(completion, gold="3", data_source="math"):
    sample = FakeSample(prompt=[{"role": "user", "content": "Q"}], data_source=data_source, ground_truth=gold)
    return RewardItem(sample, "Q", completion)


GOOD = "<think>\n2 + 1\n</think>\n<answer>\n3\n</answer>"


def test_weights_sum_inline():
    registry = load_plugins(["math"])
    items = [
        item(GOOD),  # accuracy 1 + format 0.2
        item("<think>x</think><answer>4</answer>"),  # format only
        item("\\boxed{3}", data_source="HuggingFaceH4/MATH-500"),  # accuracy only
        item("nothing", data_source="lighteval/MATH"),
    ]
    with RewardRunner(registry, RewardConfig(num_workers=0)) as runner:
        out = runner.score(items)
    assert out.scores == pytest.approx([1.2, 0.2, 1.0, 0.0])
    assert out.details[0]["tag_count"] == 1.0  # computed, weight 0
    assert out.details[0]["math_accuracy/status"] == "correct"
    with RewardRunner(registry, RewardConfig(num_workers=0, weights={"tag_count": 0.5})) as runner:
        assert runner.score(items[:1]).scores == pytest.approx([1.7])


ADVERSARIAL = {
    "100 KB of text": "x" * 100_000,
    "100 KB digits in the answer": "<answer>" + "1" * 100_000 + "</answer>",
    "100 KB sum": "answer: " + "+".join(["1"] * 50_000),
    "10k nested braces, boxed": "\\boxed{" + "{" * 10_000 + "3" + "}" * 10_000 + "}",
    "10k nested braces, inline math": "$" + "{" * 10_000 + "3" + "}" * 10_000 + "$",
    "10k nested parentheses": "<answer>" + "(" * 10_000 + "3" + ")" * 10_000 + "</answer>",
    "frac bomb, 500 deep": "\\boxed{" + "\\frac{" * 500 + "1" + "}{2}" * 500 + "}",
    "frac bomb, 500 deep, bare": "<answer>" + "\\frac{" * 500 + "1" + "}{2}" * 500 + "</answer>",
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "power tower, plain": "The final answer is 9^9^9^9",
    "factorial": "\\boxed{(10^{10})!}",
    "binomial": "\\boxed{\\binom{10^{9}}{5 \\cdot 10^{8}}}",
    "huge sum": "\\boxed{\\sum_{i=1}^{10^{9}} i^{i}}",
    "many boxed": ", ".join(f"\\boxed{{{i}}}" for i in range(3_000)),
    "unclosed boxed": "\\boxed{" * 14_000,
    "many dollars": "$1$ " * 25_000,
    "many tags": "<answer>" * 20_000 + "</answer>" * 20_000,
}


def test_adversarial_inputs_through_the_kernel():
    """Every hostile completion finishes in seconds in the worker pool, scoring 0 or the error score."""
    registry = load_plugins(["math"])
    cfg = RewardConfig(num_workers=2, timeout_s=5.0, error_score=-1.0)
    items = [item(text) for text in ADVERSARIAL.values()] + [item(GOOD)]
    with RewardRunner(registry, cfg) as runner:
        start = time.perf_counter()
        out = runner.score(items)
        elapsed = time.perf_counter() - start
    assert elapsed < 30.0  # 17 hostile samples on 2 workers; in practice about a second
    for name, d in zip(ADVERSARIAL, out.details[:-1], strict=True):
        accuracy = d["math_accuracy"]
        assert accuracy in (0.0, -1.0), (name, d)
        if accuracy == 0.0:
            assert d["math_accuracy/status"] in ("refused", "no_answer", "wrong", "timeout"), (name, d)
    assert out.scores[-1] == pytest.approx(1.2)  # the pool still works after all that
    assert out.metrics["reward/math_accuracy/mean"] <= 1 / len(items) + 1e-9


def test_the_kernel_timeout_backs_up_the_inner_budget():
    """With the inner budget off, the kernel's per-sample timeout stops a runaway check."""
    registry = load_plugins(["math"])
    cfg = RewardConfig(
        num_workers=1,
        timeout_s=1.0,
        error_score=-1.0,
        options={"math_accuracy": {"time_limit_s": 0, "max_nesting": 40}},
    )
    with RewardRunner(registry, cfg) as runner:
        out = runner.score([item("\\boxed{" + "{" * 20 + "3" + "}" * 20 + "}"), item(GOOD)])
    assert out.details[0]["timeout"] is True
    assert out.details[0]["math_accuracy"] == -1.0
    assert out.scores[1] == pytest.approx(1.2)
    assert out.metrics["reward/timeouts"] == 1.0


def test_example_data_is_not_solved_by_echoing_the_question():
    """math-verify compares values, so an echoed "1 + 2 + ... + 10" or "6/8" would equal its answer;
    the example problems are worded so that repeating the question earns nothing."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "data" / "math_tiny.jsonl"
    if not path.exists():
        pytest.skip("examples/data/math_tiny.jsonl not present")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(rows) >= 20
    for row in rows:
        assert not math_equal(row["problem"], row["answer"]), row
        assert not check_answer(row["problem"], row["answer"], require_anchor=False).correct, row
        assert not math_equal(f"<answer>{row['problem']}</answer>", row["answer"]), row
        assert math_equal(f"<think>...</think><answer>{row['answer']}</answer>", row["answer"]), row
    # the trap itself
    assert math_equal("<answer>1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10</answer>", "55")
    assert check_answer("Compute 1 + 2 + 3 + 4 + 5 + 6 + 7 + 8 + 9 + 10.", "55", require_anchor=False).correct
