"""Tests for the countdown plugin (plugins/datasets_countdown)."""

from __future__ import annotations

import json
import os
import time
from fractions import Fraction
from itertools import islice
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import plugrl_countdown
from plugrl.specs import DatasetSpec, RewardSpec, TemplateSpec, specs_of
from plugrl_countdown import countdown_dataset, countdown_r1_template, countdown_reward, countdown_template
from plugrl_countdown.arith import MAX_DEPTH, MAX_LENGTH, MAX_TOKENS, ArithError, analyze, evaluate
from reward_fixtures import best_time

FAST = 0.01  # seconds: every rejection must be this quick


# --------------------------------------------------------------------------- evaluator


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("7", 7),
        ("1 + 2", 3),
        ("2 + 3 * 4", 14),
        ("(2 + 3) * 4", 20),
        ("10 - 4 - 3", 3),  # left-associative
        ("10 - (4 - 3)", 9),
        ("100 / 10 / 5", 2),  # left-associative
        ("100 / (10 / 5)", 50),
        ("8 / 3", Fraction(8, 3)),
        ("1 / 3 * 3", 1),  # exact, no float rounding
        ("-3", -3),
        ("-3 + 5", 2),
        ("2 * -3", -6),
        ("--4", 4),
        ("-(2 + 3) * 2", -10),
        ("5 - -2", 7),
        ("1.5 + 2.25", Fraction(15, 4)),
        ("0.1 + 0.2", Fraction(3, 10)),
        ("0.5 * 4", 2),
        ("((((1))))", 1),
        ("(44 + 19) - 35 + 1", 29),
        (" 3\t*\n( 4 + 5 ) ", 27),
        ("007", 7),
    ],
)
def test_evaluate_vectors(expr, expected):
    assert evaluate(expr) == expected


def test_analyze_reports_literals_in_order():
    ev = analyze("(3 + 1.5) * -2 / 9")
    assert ev.numbers == (3, Fraction(3, 2), 2, 9)
    assert ev.value == -1


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("1 +", "end of expression"),
        ("(1 + 2", "unclosed"),
        ("1 + 2)", "unexpected '\\)'"),
        ("()", "unexpected '\\)'"),
        ("2 (3)", "unexpected '\\('"),
        ("1 2", "unexpected '2'"),
        ("* 3", "unexpected '\\*'"),
        ("+3", "unexpected '\\+'"),
        ("1.", "malformed number"),
        (".5", "malformed number"),
        ("1.2.3", "malformed number"),
        ("1e5", "unexpected character 'e'"),
        ("3 x 4", "unexpected character 'x'"),
        ("3 × 4", "unexpected character"),
        ("١ + 2", "unexpected character"),  # non-ASCII digit
        ("1 / 0", "division by zero"),
        ("5 / (3 - 3)", "division by zero"),
        ("2 = 2", "unexpected character '='"),
    ],
)
def test_evaluate_rejects_malformed(expr, message):
    with pytest.raises(ArithError, match=message):
        evaluate(expr)


def _rejects_fast(expr: str, message: str | None = None) -> None:
    with pytest.raises(ArithError, match=message):
        evaluate(expr)

    def run():
        try:
            evaluate(expr)
        except ArithError:
            pass

    assert best_time(run) < FAST


def test_rejects_code_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [
        f"__import__('os').system('touch {marker}')",
        f"open('{marker}', 'w').write('x')",
        f"exec(\"open('{marker}','w')\")",
        "().__class__.__bases__[0].__subclasses__()",
        "lambda: 1",
        "[1, 2]",
        "1 if 1 else 2",
    ]
    for payload in payloads:
        assert len(payload) <= MAX_LENGTH
        _rejects_fast(payload)
    assert not marker.exists()
    assert not os.path.exists(marker)


@pytest.mark.parametrize("expr", ["9**9**9", "2 ** 100", "(1+2)**3"])
def test_rejects_double_star_exponent(expr):
    _rejects_fast(expr, r"exponentiation '\*\*'")


@pytest.mark.parametrize("expr", ["9^9^9", "2 ^ 3"])
def test_rejects_caret_exponent(expr):
    _rejects_fast(expr, r"exponentiation '\^'")


def test_rejects_long_input():
    _rejects_fast("1" * (MAX_LENGTH + 1), "too long")
    _rejects_fast("1+" * 500_000 + "1", "too long")  # ~1 MB
    _rejects_fast("(" * 10_000 + "1" + ")" * 10_000, "too long")
    assert evaluate("1" * MAX_LENGTH) == int("1" * MAX_LENGTH)  # exactly at the limit is fine


def test_rejects_deep_nesting():
    _rejects_fast("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "nesting deeper")
    _rejects_fast("(" * 200, "nesting deeper")
    _rejects_fast("-" * 40 + "1", "nesting deeper")
    assert evaluate("(" * 30 + "1" + ")" * 30) == 1


def test_rejects_too_many_tokens():
    assert evaluate("+".join(["1"] * 32)) == 32  # 63 tokens
    _rejects_fast("+".join(["1"] * 33), "too many tokens")  # 65 tokens
    assert MAX_TOKENS == 64


def test_arith_error_is_value_error():
    assert issubclass(ArithError, ValueError)
    with pytest.raises(ValueError):
        evaluate("1/0")


_ARITH_CHARS = "0123456789.+-*/()^ =x"


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(max_size=300), st.text(alphabet=_ARITH_CHARS, max_size=300)))
def test_random_strings_only_raise_arith_error(text):
    def run():
        try:
            return evaluate(text)
        except ArithError:  # anything else propagates and fails the test
            return None

    value = run()
    assert value is None or isinstance(value, Fraction)
    assert best_time(run) < FAST


# --------------------------------------------------------------------------- reward

GT = {"target": 9, "numbers": [1, 2, 3]}


def score(completion, ground_truth=GT, **kw):
    return countdown_reward(completion, ground_truth, **kw)


def test_reward_no_tags():
    assert score("(1 + 2) * 3") == {"score": 0.0, "formatted": False, "correct": False}
    assert score("<answer> (1 + 2) * 3")["score"] == 0.0  # unclosed
    assert score("")["score"] == 0.0


def test_reward_correct():
    assert score("<think>hmm</think>\n<answer> (1 + 2) * 3 </answer>") == {
        "score": 1.0,
        "formatted": True,
        "correct": True,
    }
    assert score("<answer>3 * (2 + 1)</answer>")["score"] == 1.0
    assert score("<answer>\n(1 + 2)\n* 3\n</answer>")["score"] == 1.0  # multi-line answer


def test_reward_wrong_value():
    assert score("<answer> 1 + 2 + 3 </answer>") == {"score": 0.1, "formatted": True, "correct": False}


def test_reward_number_reused_or_missing_or_extra():
    assert score("<answer> 3 * 3 </answer>")["score"] == 0.1  # 3 reused, 1 and 2 missing
    assert score("<answer> (1 + 2) * 3 * 1 </answer>")["score"] == 0.1  # 1 reused, value still 9
    assert score("<answer> (1 + 2) * 3 </answer>", {"target": 9, "numbers": [1, 2, 3, 4]})["score"] == 0.1
    assert score("<answer> 4 + 5 </answer>")["score"] == 0.1  # numbers not given


def test_reward_invalid_equation_is_format_score(tmp_path):
    marker = tmp_path / "pwned"
    assert score("<answer> the answer is 9 </answer>")["score"] == 0.1
    assert score("<answer></answer>")["score"] == 0.1
    assert score("<answer> (1 + 2) ** 3 </answer>")["score"] == 0.1
    assert score("<answer> 3 / (2 - 2) + 1 </answer>")["score"] == 0.1
    assert score(f"<answer>__import__('os').system('touch {marker}')</answer>")["score"] == 0.1
    assert not marker.exists()


def test_reward_last_answer_wins():
    assert score("<answer> (1 + 2) * 3 </answer> wait, no: <answer> 1 + 2 + 3 </answer>")["score"] == 0.1
    assert score("<answer> 1 + 2 + 3 </answer> wait, no: <answer> (1 + 2) * 3 </answer>")["score"] == 1.0
    # the example in the prompt must not count if the model answers after it
    assert score("e.g. <answer> (1 + 2) / 3 </answer> ... <answer>3*(1+2)</answer>")["score"] == 1.0


def test_reward_equals_suffix():
    assert score("<answer> (1 + 2) * 3 = 9 </answer>")["score"] == 1.0
    assert score("<answer>(1+2)*3=9.0</answer>")["score"] == 1.0
    assert score("<answer> (1 + 2) * 3 = 10 </answer>")["score"] == 1.0  # only the left-hand side is scored
    assert score("<answer> 1 + 2 + 3 = 9 </answer>")["score"] == 0.1
    assert score("<answer> 9 = (1 + 2) * 3 </answer>")["score"] == 0.1  # only a trailing '= number' is dropped


def test_reward_ground_truth_as_json_string():
    gt = json.dumps({"target": 24, "numbers": [4, 6, 1]})
    assert score("<answer> 4 * 6 * 1 </answer>", gt)["score"] == 1.0
    assert score("<answer> 4 * 6 + 1 </answer>", gt)["score"] == 0.1
    assert score("no answer", gt)["score"] == 0.0


def test_reward_division_and_fractions():
    gt = {"target": 24, "numbers": [1, 3, 4, 6]}
    assert score("<answer> 6 / (1 - 3 / 4) </answer>", gt)["score"] == 1.0
    assert score("<answer> 6 / (1 - 3 / 4) </answer>", {"target": 24.000001, "numbers": [1, 3, 4, 6]})["correct"]


def test_reward_custom_scores():
    assert score("<answer> 1 + 2 + 3 </answer>", format_score=0.0)["score"] == 0.0
    assert score("<answer> 1 + 2 + 3 </answer>", format_score=0.25)["score"] == 0.25
    assert score("<answer> (1 + 2) * 3 </answer>", correct_score=2.0)["score"] == 2.0
    assert score("nothing", format_score=0.5)["score"] == 0.0
    # extra context the kernel may pass is ignored
    assert score("<answer> (1 + 2) * 3 </answer>", data_source="countdown", extra_info={})["score"] == 1.0


def test_reward_hostile_completions_are_fast():
    def run():
        assert score("<answer>" * 200_000)["score"] == 0.0  # 1.6 MB of unclosed tags
        assert score("<answer>" + "(" * 1_000_000 + "</answer>")["score"] == 0.1
        assert score("<answer>9**9**9**9**9</answer>")["score"] == 0.1

    assert best_time(run) < 0.5


def test_reward_ground_truth_numpy_like_and_floats():
    class Int:  # stands in for numpy.int64, which verl's parquet loader yields
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    assert score("<answer>(1+2)*3</answer>", {"target": Int(9), "numbers": (Int(1), Int(2), Int(3))})["correct"]
    assert score("<answer>(1+2)*3</answer>", {"target": 9.0, "numbers": [1.0, 2.0, 3.0]})["correct"]


def test_reward_bad_ground_truth_raises():
    with pytest.raises(ValueError, match="target"):
        score("<answer>1</answer>", {"numbers": [1]})
    with pytest.raises(ValueError, match="JSON"):
        score("<answer>1</answer>", "{not json")
    with pytest.raises(ValueError, match="non-numeric"):
        score("<answer>1</answer>", {"target": float("nan"), "numbers": [1]})


# --------------------------------------------------------------------------- dataset


def rows(split="train", **kw):
    return list(countdown_dataset(split, **kw))


def test_dataset_row_schema():
    for i, row in enumerate(rows(size=50)):
        assert set(row) == {"prompt", "data_source", "ground_truth", "extra_info", "nums", "target"}
        assert row["data_source"] == "countdown"
        assert row["extra_info"] == {"split": "train", "index": i}
        gt = row["ground_truth"]
        assert gt == {"target": row["target"], "numbers": row["nums"]}
        assert 3 <= len(gt["numbers"]) <= 4
        assert all(isinstance(n, int) and 1 <= n <= 99 for n in gt["numbers"])
        assert isinstance(gt["target"], int) and 1 <= gt["target"] <= 100
        (msg,) = row["prompt"]
        assert msg["role"] == "user"
        assert f"Using the numbers {gt['numbers']}, create an equation that equals {gt['target']}." in msg["content"]
        assert "<answer>" in msg["content"] and "</answer>" in msg["content"]
        json.dumps(row)  # plain data only


def test_dataset_deterministic():
    assert rows(seed=3, size=200) == rows(seed=3, size=200)
    assert rows(seed=3, size=50) == rows(seed=3, size=200)[:50]  # row i does not depend on size


def test_dataset_splits_and_seeds_differ():
    train, test = rows("train", size=200), rows("test", size=200)

    def key(r):
        return (r["target"], tuple(r["nums"]))

    assert len({key(r) for r in train} & {key(r) for r in test}) < 5
    assert [key(r) for r in rows("train", seed=1, size=200)] != [key(r) for r in train]


def test_dataset_options():
    got = rows(size=300, min_numbers=2, max_numbers=2, max_number=10, max_target=20, ops="+")
    for r in got:
        assert len(r["nums"]) == 2 and all(1 <= n <= 10 for n in r["nums"])
        assert r["target"] == sum(r["nums"]) <= 20
    assert rows(size=0) == []
    assert rows(size=5, unknown_option=1) == rows(size=5)  # extra options are ignored


@pytest.mark.parametrize(
    "kw",
    [
        {"size": -1},
        {"min_numbers": 1},
        {"min_numbers": 4, "max_numbers": 3},
        {"max_number": 0},
        {"max_target": 0},
        {"ops": ""},
        {"ops": "+%"},
    ],
)
def test_dataset_bad_options(kw):
    with pytest.raises(ValueError):
        countdown_dataset("train", **kw)


def test_dataset_is_fast():
    start = time.perf_counter()
    first = next(iter(countdown_dataset("train", size=10**9)))  # lazy: nothing is built up front
    assert first["extra_info"]["index"] == 0
    assert len(rows(size=10_000)) == 10_000
    assert time.perf_counter() - start < 1.0


def _reachable(nums: tuple[Fraction, ...]) -> dict[Fraction, str]:
    """Every value of an expression using each of ``nums`` exactly once, with one expression for it."""
    if len(nums) == 1:
        return {nums[0]: str(nums[0])}
    out: dict[Fraction, str] = {}
    n = len(nums)
    for mask in range(1, 2**n - 1):
        left = tuple(nums[i] for i in range(n) if mask >> i & 1)
        right = tuple(nums[i] for i in range(n) if not mask >> i & 1)
        for a, ea in _reachable(left).items():
            for b, eb in _reachable(right).items():
                out.setdefault(a + b, f"({ea} + {eb})")
                out.setdefault(a - b, f"({ea} - {eb})")
                out.setdefault(a * b, f"({ea} * {eb})")
                if b != 0:
                    out.setdefault(a / b, f"({ea} / {eb})")
    return out


def test_dataset_targets_are_reachable():
    sample = list(islice(countdown_dataset("train", seed=7), 150)) + list(islice(countdown_dataset("test"), 50))
    for row in sample:
        gt = row["ground_truth"]
        assert 3 <= len(gt["numbers"]) <= 4
        found = _reachable(tuple(Fraction(n) for n in gt["numbers"]))
        assert Fraction(gt["target"]) in found, row
        # and the reward accepts the brute-force solution
        answer = f"<answer>{found[Fraction(gt['target'])]}</answer>"
        assert countdown_reward(answer, gt)["correct"], answer


def test_brute_force_sanity():
    assert Fraction(24) in _reachable((Fraction(1), Fraction(3), Fraction(4), Fraction(6)))
    assert Fraction(1000) not in _reachable((Fraction(1), Fraction(2), Fraction(3)))


# --------------------------------------------------------------------------- templates and registration


def test_templates():
    gt = {"target": 24, "numbers": [4, 6, 1]}
    sample = SimpleNamespace(prompt=None, data_source="countdown", ground_truth=gt, extra_info={})
    msgs = countdown_template(sample)
    assert msgs == [row_msg for row_msg in msgs if row_msg["role"] == "user"] and len(msgs) == 1
    assert "Using the numbers [4, 6, 1], create an equation that equals 24." in msgs[0]["content"]
    text = countdown_r1_template(sample)
    assert text.startswith("A conversation between User and Assistant.")
    assert "\nUser: " + msgs[0]["content"] + "\n" in text
    assert text.endswith("Assistant: Let me solve this step by step.\n<think>")
    # ground truth JSON-encoded works too, and matches the dataset's own prompt
    row = rows(size=1)[0]
    as_json = SimpleNamespace(ground_truth=json.dumps(row["ground_truth"]))
    assert countdown_template(as_json) == row["prompt"]


def test_module_exposes_specs():
    found = {}
    for name in dir(plugrl_countdown):
        for spec in specs_of(getattr(plugrl_countdown, name)):
            found[(type(spec), spec.name)] = spec
    assert set(found) == {
        (DatasetSpec, "countdown"),
        (TemplateSpec, "countdown"),
        (TemplateSpec, "countdown_r1"),
        (RewardSpec, "countdown_reward"),
    }
    assert found[(RewardSpec, "countdown_reward")].data_sources == ("countdown",)
