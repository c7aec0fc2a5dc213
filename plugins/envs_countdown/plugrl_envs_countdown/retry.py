"""The ``countdown_retry`` environment: answer, hear what was wrong, try again.

Each policy turn is one attempt. The reply's last ``<answer> ... </answer>`` is judged by the countdown
plugin's own rules (:func:`plugrl_countdown.scoring.check_equation`: every given number used exactly once,
value within 1e-5 of the target, evaluated by its safe parser, never by ``eval``). A correct attempt ends
the episode with reward ``reward_decay ** (attempt - 1)``; a wrong one gets a feedback message and another
turn, until ``max_attempts`` (or the run's ``rollout.max_turns``) is reached, which ends it with reward 0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from plugrl.rollout.environment import Environment, EnvStart, EnvStep, Turn
from plugrl.specs import environment
from plugrl_countdown.arith import ArithError, analyze
from plugrl_countdown.scoring import check_equation, extract_answer, strip_result

from .prompt import sample_problem

TRY_AGAIN = "Try again."
NO_ANSWER = "No <answer> </answer> tags found. Write your equation as <answer> expression </answer>. " + TRY_AGAIN
EMPTY_ANSWER = "Your <answer> </answer> is empty. Put the equation between the tags. " + TRY_AGAIN
BINARY_WRONG = "That is not correct. " + TRY_AGAIN
MAX_SHOWN = 60  # characters of the model's expression echoed in feedback (feedback tokens count against the budget)
_ECHOABLE = frozenset("0123456789.+-*/()= ")  # an invalid answer is echoed only when made of these characters
_TIMES = {1: "once", 2: "twice", 3: "three times"}
MAX_LISTED = 4  # numbers named in one clause of feedback


class CountdownRetryOptions(BaseModel):
    """``environment_options`` of ``countdown_retry``."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: int = Field(3, ge=1, description="Answers the model may give; set rollout.max_turns to match.")
    feedback: Literal["value", "binary"] = Field(
        "value",
        description="After a wrong answer: 'value' says what the expression evaluates to (or which rule it "
        "breaks); 'binary' only says that it is wrong.",
    )
    reward_decay: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="A solve at attempt k earns reward_decay ** (k - 1); 1.0: every solve earns 1.",
    )
    format_score: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Reward of an episode whose last answer is wrong but written in <answer> </answer> tags (the "
        "countdown reward's format credit, 0.1 there); 0.0: only solves earn.",
    )


@dataclass(frozen=True)
class Verdict:
    """How one reply fares: ``reason`` is ``correct``, ``no_answer``, ``invalid`` (no valid expression),
    ``numbers`` (the given numbers not used exactly once) or ``value`` (wrong value); ``feedback`` is the
    value-feedback message ("" when correct)."""

    correct: bool
    reason: str
    feedback: str = ""


def judge(reply: str, target: int | float, numbers: Sequence[int | float]) -> Verdict:
    """Judge ``reply`` (a whole assistant turn) against the problem, with the countdown reward's rules."""
    answer = extract_answer(reply)
    if answer is None:
        return Verdict(False, "no_answer", NO_ANSWER)
    if check_equation(answer, target, list(numbers)):
        return Verdict(True, "correct")
    expr = " ".join(strip_result(answer.strip()).split())
    if not expr:
        return Verdict(False, "invalid", EMPTY_ANSWER)
    try:
        ev = analyze(expr)
    except ArithError as e:
        what = f"{_clip(expr)} is" if set(expr) <= _ECHOABLE else "Your answer is"
        return Verdict(False, "invalid", f"{what} not a valid expression: {e}. {TRY_AGAIN}")
    broken = _number_problems(ev.numbers, numbers)
    if broken:  # what is wrong names the numbers to use: no rule repeated (feedback tokens count against the budget)
        return Verdict(False, "numbers", f"{_clip(expr)} {broken}. {TRY_AGAIN}")
    return Verdict(False, "value", f"{_clip(expr)} = {_fmt(ev.value)}, not {target}. {TRY_AGAIN}")


def _number_problems(used: Iterable[Fraction], given: Sequence[int | float]) -> str:
    """What is wrong with the numbers an expression uses ("uses 7, which is not given, and does not use 5"),
    or "" when it uses each given number exactly once."""
    have = Counter(Fraction(n) for n in given)
    count = Counter(used)
    foreign = [n for n in count if n not in have]  # in the order the expression uses them
    clauses = []
    if foreign:
        shown = _and([_fmt(n) for n in foreign[:MAX_LISTED]] + (["others"] if len(foreign) > MAX_LISTED else []))
        clauses.append(f"uses {shown}, which {'is' if len(foreign) == 1 else 'are'} not given")
    for n, m in have.items():  # in the order they are given
        if count[n] > m or 0 < count[n] < m:
            clauses.append(f"uses {_fmt(n)} {_times(count[n])}" + ("" if m == 1 else f" (given {_times(m)})"))
    unused = [_fmt(n) for n in have if count[n] == 0]
    if unused:
        clauses.append(f"does not use {_and(unused, 'or')}")
    if len(clauses) <= 1:
        return "".join(clauses)
    last = ", and " if foreign or len(clauses) > 2 else " and "  # "uses 7, which is not given, and does not ..."
    return ", ".join(clauses[:-1]) + last + clauses[-1]


def _and(items: list[str], word: str = "and") -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def _times(k: int) -> str:
    return _TIMES.get(k, f"{k} times")


def _fmt(x: Fraction) -> str:
    """A number as the model should read it: ``7``, ``2.5``, ``0.333333``."""
    if x.denominator == 1 and abs(x.numerator) < 10**15:
        return str(x.numerator)
    try:
        return format(float(x), ".6g")
    except OverflowError:
        return "a very large number"


def _clip(expr: str) -> str:
    return expr if len(expr) <= MAX_SHOWN else expr[: MAX_SHOWN - 3] + "..."


@environment("countdown_retry", options=CountdownRetryOptions)
class CountdownRetry(Environment):
    """One countdown episode with up to ``max_attempts`` answers (its state: the attempts so far).

    ``info`` of every step holds ``attempts``, ``solved`` (1.0 / 0.0) and ``solved_by_turn<j>`` for
    ``j = 1..max_attempts`` (1.0 when solved at attempt j or before), plus ``solved_turn`` once solved;
    the kernel merges the steps' info, so an episode that a token limit cuts keeps its latest values.
    """

    def __init__(self, **options: Any):
        self.options = CountdownRetryOptions(**options)
        self.attempts = 0
        self.problem: tuple[int | float, list[int | float]] | None = None

    def start(self, sample: Any) -> EnvStart:
        self.attempts = 0
        self.problem = sample_problem(sample)  # a malformed ground truth fails here, ending only this episode
        return EnvStart()  # the sample's prompt, as data.template renders it

    def step(self, turn: Turn) -> EnvStep:
        if self.problem is None:  # driven without start(): read the problem from the turn's sample
            self.problem = sample_problem(turn.sample)
        self.attempts += 1
        k, opts = self.attempts, self.options
        target, numbers = self.problem
        verdict = judge(turn.reply, target, numbers)
        if verdict.correct:
            info = {"solved": 1.0, "solved_turn": k, "attempts": k, **self._by_turn(k)}
            return EnvStep(done=True, reward=float(opts.reward_decay ** (k - 1)), info=info)
        info = {"solved": 0.0, "attempts": k, **self._by_turn(None)}
        if k >= opts.max_attempts or turn.last:
            return EnvStep(done=True, reward=opts.format_score if verdict.reason != "no_answer" else 0.0, info=info)
        text = verdict.feedback if opts.feedback == "value" else BINARY_WRONG
        return EnvStep(messages=[{"role": "user", "content": text}], info=info)

    def _by_turn(self, solved_at: int | None) -> dict[str, float]:
        return {
            f"solved_by_turn{j}": float(solved_at is not None and solved_at <= j)
            for j in range(1, self.options.max_attempts + 1)
        }
