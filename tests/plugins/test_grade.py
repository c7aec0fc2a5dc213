"""Tests for the rubric-reward-model grade reward (plugins/rewards_grade)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plugrl_grade
from plugrl.specs import RewardSpec, specs_of
from plugrl_grade import MAX_NUMBER_CHARS, grade_reward, grade_to_score, parse_total_score
from reward_fixtures import best_time


def reward(text, gt=0.7):
    return grade_reward(text, gt)["score"]


def reference(text: str, ground_truth) -> float:
    """The reference RRM reward, step by step as its snippet describes (the oracle for the property test)."""
    tail = text.split("Total Score")[-1]
    for token in (":", "[", "points", "point", "*", "|", "'"):
        tail = tail.replace(token, "")
    tail = tail.split("/")[0].strip()
    try:
        score = min(10.0, float(tail)) / 10.0
        return (1.0 - abs(score - float(ground_truth))) ** 2
    except Exception:
        return 0.0


# --------------------------------------------------------------------------- realistic grader outputs

GRADER = """## Evaluation

**Correctness (4 points):** The final answer matches the reference. 4/4
**Reasoning (3 points):** One step is skipped. 2/3
**Clarity (3 points):** Clear. 3/3

**Total Score: 9/10**"""


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("**Total Score: 7/10**", 7.0),
        ("Total Score: 7/10", 7.0),
        ("Total Score: 8 points", 8.0),
        ("Total Score: 8 point", 8.0),
        ("Total Score: [8/10]", 8.0),
        ("Total Score: [8 points/10 points]", 8.0),
        ("| Criterion | Score |\n|---|---|\n| Accuracy | 4/5 |\n| Total Score | 6/10 |", 6.0),
        ("Total Score: 9.5/10", 9.5),
        ("Total Score: 12/10", 12.0),
        ("Total Score: '7'/10", 7.0),
        ('Total Score: "7"/10', 7.0),  # double quotes too (the reference drops only single quotes)
        ("Total Score: -3/10", -3.0),
        ("Total Score:7", 7.0),
        ("Total Score: 7 / 10", 7.0),
        ("8/10", 8.0),  # no marker: the whole text is read, as in the reference
        (GRADER, 9.0),
    ],
)
def test_parse_total_score(text, value):
    assert parse_total_score(text) == value


def test_last_total_score_wins():
    text = "Draft: Total Score: 3/10\nOn reflection the proof is complete.\nTotal Score: 8/10"
    assert parse_total_score(text) == 8.0
    assert parse_total_score("Total Score: 8/10 ... Total Score: 3/10") == 3.0
    # a trailing mention with no number makes the whole grading unreadable (the last marker counts)
    assert parse_total_score("Total Score: 8/10. I have given the Total Score above.") is None


@pytest.mark.parametrize(
    "text",
    [
        "",
        "The response is good.",
        "Total Score:",
        "Total Score: N/A",
        "Total Score: [8 points]",  # ']' is not removed, as in the reference
        "Total Score: (8/10)",  # '(' is not removed either
        "Total Score: 7 out of 10",
        "total score: 7/10",  # case-sensitive: the whole text is read, and fails
        "Total Score: seven/10",
        "Total Score: nan/10",
        "Total Score: NaN",
        "Total Score: inf/10",
        "Total Score: -infinity",
        "Total Score: 1e400",  # overflows to inf
        "Total Score: " + "1" * (MAX_NUMBER_CHARS + 1),
    ],
)
def test_unreadable(text):
    assert parse_total_score(text) is None
    assert grade_reward(text, 0.7) == {"score": 0.0, "grade": None}


def test_points_removed_before_point():
    # removing "point" first would leave "8 s"
    assert parse_total_score("Total Score: 8 points") == 8.0
    assert parse_total_score("Total Score: 8 pointspoint") == 8.0


def test_non_string_completion():
    assert parse_total_score(None) is None  # type: ignore[arg-type]
    assert parse_total_score(7) is None  # type: ignore[arg-type]


# --------------------------------------------------------------------------- rewards, by hand (truth 0.7)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("**Total Score: 7/10**", 1.0),  # exact
        ("Total Score: 8/10", 0.81),  # (1 - 0.1)^2
        ("| Total Score | 6/10 |", 0.81),  # (1 - 0.1)^2
        ("Total Score: 9.5/10", 0.5625),  # (1 - 0.25)^2
        ("Total Score: 12/10", 0.49),  # capped at 1.0: (1 - 0.3)^2
        ("Total Score: 10/10", 0.49),
        ("Total Score: 0/10", 0.09),  # (1 - 0.7)^2
        ("Total Score: -3/10", 0.0),  # grade -0.3: (1 - 1.0)^2
        ("Total Score: [8 points]", 0.0),  # unreadable
        ("no grade at all", 0.0),
    ],
)
def test_rewards_truth_07(text, expected):
    assert reward(text) == pytest.approx(expected, abs=1e-12)


def test_reward_fields():
    assert grade_reward("Total Score: 9.5/10", 0.7) == {"score": pytest.approx(0.5625), "grade": 0.95}
    assert grade_reward("Total Score: 12/10", "0.7")["grade"] == 1.0


def test_negative_grades_keep_reference_semantics():
    # min(10, -3) / 10 = -0.3, as the reference computes; with truth 0 that is 0.3 away
    assert grade_to_score(-3.0) == pytest.approx(-0.3)
    assert reward("Total Score: -3/10", 0.0) == pytest.approx(0.49)
    assert reward("Total Score: -3/10", 0.0) == pytest.approx(reference("Total Score: -3/10", 0.0))


def test_very_negative_grades_are_floored_not_rewarded():
    text = "Total Score: -1000000/10"
    assert reference(text, 0.7) > 1e9  # the reference's square rewards a wildly wrong grade
    assert reward(text) == 0.0
    assert reward("Total Score: -20/10", 0.0) == 0.0  # |d| = 2 > 1


def test_nan_inf_score_zero_unlike_reference():
    assert reference("Total Score: nan/10", 0.7) == pytest.approx(0.49)  # min(10, nan) is 10
    assert reference("Total Score: inf/10", 0.7) == pytest.approx(0.49)
    assert reward("Total Score: nan/10") == 0.0
    assert reward("Total Score: inf/10") == 0.0


def test_ground_truth_forms_and_errors():
    assert reward("Total Score: 7/10", "0.7") == 1.0
    assert reward("Total Score: 7/10", 0.7) == 1.0
    assert reward("Total Score: 7/10", 1) == pytest.approx(0.49)
    for bad in ("seven", None, float("nan"), "inf", [0.7]):
        with pytest.raises(ValueError, match="ground_truth"):
            grade_reward("Total Score: 7/10", bad)


def test_reward_in_unit_interval_for_unit_truths():
    for text in ("Total Score: -5", "Total Score: 1e9", "Total Score: -1e300", "Total Score: 3"):
        for gt in (0.0, 0.3, 1.0):
            assert 0.0 <= reward(text, gt) <= 1.0


# --------------------------------------------------------------------------- agreement with the reference

_PIECES = ["Total Score", ":", " ", "[", "]", "points", "point", "*", "|", "'", '"', "/", "10", "7", "-", ".", "5", "x"]
_PIECES += ["\n", "nan", "inf", "e9"]


def _deviates(text: str, gt: float) -> bool:
    """Inputs where this implementation differs from the reference on purpose (see the README)."""
    tail = text.split("Total Score")[-1]
    for token in (":", "[", "points", "point", "*", "|", "'"):
        tail = tail.replace(token, "")
    tail = tail.split("/")[0].strip()
    try:
        value = float(tail)
    except ValueError:
        return '"' in text
    return not math.isfinite(value) or len(tail) > MAX_NUMBER_CHARS or abs(min(10.0, value) / 10.0 - gt) > 1


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), st.sampled_from([0.0, 0.3, 0.7, 1.0]))
def test_matches_reference_on_generated_gradings(text, gt):
    if not _deviates(text, gt):
        assert reward(text, gt) == pytest.approx(reference(text, gt), abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.sampled_from([0.0, 0.5, 1.0]))
def test_random_text_never_raises(text, gt):
    out = grade_reward(text, gt)
    assert 0.0 <= out["score"] <= 1.0
    if not _deviates(text, gt):
        assert out["score"] == pytest.approx(reference(text, gt), abs=1e-12)


# --------------------------------------------------------------------------- hostile inputs


def test_huge_inputs_are_fast():
    mb = 1_000_000
    cases = [
        ("Total Score" * (mb // 11), None),
        ("x" * mb + "Total Score: 7/10", 7.0),
        ("Total Score: 7/10" + " " * mb, 7.0),
        ("Total Score: " + "7" * mb, None),
        ("Total Score: " + "*" * mb + "7", 7.0),  # the removals shrink it back to a number
        ("Total Score: " + "points" * (mb // 6) + "/10", None),
        ("Total Score: 7" + "/" * mb, 7.0),
    ]
    for text, value in cases:
        assert parse_total_score(text) == value

    def run():
        for text, _ in cases:
            grade_reward(text, 0.7)

    assert best_time(run) < 0.5


# --------------------------------------------------------------------------- registration


def test_module_exposes_spec():
    specs = [s for name in dir(plugrl_grade) for s in specs_of(getattr(plugrl_grade, name))]
    assert len(specs) == 1
    (spec,) = specs
    assert isinstance(spec, RewardSpec)
    assert (spec.name, spec.data_sources, spec.weight) == ("grade_reward", ("grade",), 1.0)


def test_loads_as_plugin():
    from plugrl.plugins import load_plugins
    from plugrl.rewards.routing import rewards_for

    registry = load_plugins(["grade"])
    assert [s.name for s in rewards_for(registry, "grade")] == ["grade_reward"]
