"""Tests for the countdown plugin (plugins/datasets_countdown)."""

from __future__ import annotations

import importlib.util
import json
import os
from fractions import Fraction
from itertools import islice
from pathlib import Path
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


def _nested(depth: int, leaf, wrap):
    for _ in range(depth):
        leaf = wrap(leaf)
    return leaf


DEEP = 100_000
DEEP_GROUND_TRUTHS = {
    "JSON list text": "[" * DEEP + "]" * DEEP,
    "JSON object text": '{"target": ' * DEEP + "1" + "}" * DEEP,
    "nested lists": _nested(DEEP, [], lambda x: [x]),
    "nested target dicts": _nested(DEEP, 1, lambda x: {"target": x}),
    "numbers nested": {"target": 3, "numbers": _nested(DEEP, [], lambda x: [x])},
}


@pytest.mark.parametrize("name", list(DEEP_GROUND_TRUTHS))
def test_reward_a_ground_truth_nested_100k_deep_is_a_value_error(name):
    """The documented outcome of a ground truth the reward cannot read, a ValueError naming it (the kernel scores
    reward.error_score), never RecursionError (JSON text that deep overflowed json.loads, and a Python object
    that deep overflowed the repr in the message). The multi-turn environment's start() reads it the same way."""
    from plugrl_envs_countdown import CountdownRetry

    ground_truth = DEEP_GROUND_TRUTHS[name]
    with pytest.raises(ValueError, match="countdown ground_truth") as info:
        countdown_reward("<answer>1 + 2</answer>", ground_truth)
    assert len(str(info.value)) < 500, str(info.value)[:600]
    with pytest.raises(ValueError, match="countdown ground_truth"):
        CountdownRetry().start({"ground_truth": ground_truth})


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


def test_dataset_is_lazy():
    """A billion-row dataset gives its first row at once: nothing is built up front (a list of 10**9 rows would
    not fit in memory). No timing: speed is measured by benchmarks, not unit tests."""
    first = next(iter(countdown_dataset("train", size=10**9)))
    assert first["extra_info"]["index"] == 0
    assert len(rows(size=10_000)) == 10_000


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


# --------------------------------------------------------------------------- TinyZero-style data (issue 18 point 7)


def test_reward_reads_tinyzero_columns_without_ground_truth():
    # the kernel passes a row's other columns as keywords: TinyZero's `target` and `nums`
    right, wrong = "<answer> (3 + 5) * 2 </answer>", "<answer> 3 + 5 + 2 </answer>"
    assert countdown_reward(right, None, target=16, nums=[3, 5, 2])["score"] == 1.0
    assert countdown_reward(wrong, None, target=16, nums=[3, 5, 2]) == {
        "score": 0.1,
        "formatted": True,
        "correct": False,
    }
    assert countdown_reward("no tags", None, target=16, nums=[3, 5, 2])["score"] == 0.0
    assert countdown_reward(right, None, target=16, numbers=[3, 5, 2])["correct"]  # `numbers` as the column name
    assert countdown_reward(right, target=16, nums=[3, 5, 2])["correct"]  # ground_truth defaults to None
    # `data.answer_field: target` makes the target alone the ground truth: `nums` completes it
    assert countdown_reward(right, 16, nums=[3, 5, 2])["correct"]
    assert countdown_reward(right, "16", nums=[3, 5, 2])["correct"]
    # a ground truth wins over the columns
    assert not countdown_reward(right, {"target": 17, "numbers": [3, 5, 2]}, target=16, nums=[3, 5, 2])["correct"]


def test_reward_without_problem_names_the_columns():
    with pytest.raises(ValueError, match=r"no 'nums' column.*TinyZero's 'target' and 'nums' columns"):
        countdown_reward("<answer>1</answer>", None, target=16)
    with pytest.raises(ValueError, match=r"no 'target' and 'nums' column.*'reward_model.ground_truth'"):
        countdown_reward("<answer>1</answer>", None)
    with pytest.raises(ValueError, match=r"must hold 'target' and 'numbers'.*'target' and 'nums' columns"):
        countdown_reward("<answer>1</answer>", 16)  # a bare target without nums


def test_templates_read_tinyzero_columns():
    tz = SimpleNamespace(ground_truth=None, row={"target": 24, "nums": [4, 6, 1], "messages": []})
    with_gt = SimpleNamespace(ground_truth={"target": 24, "numbers": [4, 6, 1]})
    assert countdown_template(tz) == countdown_template(with_gt)
    assert countdown_r1_template(tz) == countdown_r1_template(with_gt)
    assert countdown_template({"target": 24, "nums": [4, 6, 1]}) == countdown_template(with_gt)  # a row mapping
    with pytest.raises(ValueError, match="no 'target' and 'nums' column"):
        countdown_template(SimpleNamespace(ground_truth=None, row={}))


def _tinyzero_rows():
    path = Path(__file__).resolve().parents[1] / "fixtures" / "countdown_tinyzero" / "tinyzero_rows.py"
    spec = importlib.util.spec_from_file_location("tinyzero_rows", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TZ = _tinyzero_rows()
OPENING = "Let me solve this step by step.\n<think>"


def _start(smollm2_path, data: dict):
    """The run's start-up as `plugrl train` does it: the plugins and checks, the tokenizer, the prompts."""
    from plugrl.config import build_config
    from plugrl.startup import check_run, load_prompts, load_tokenizer

    cfg = build_config({"plugins": ["countdown"], "model": {"path": str(smollm2_path)}, "data": data})
    registry = check_run(cfg, training=False).registry
    prompts, _ = load_prompts(cfg, registry, load_tokenizer(cfg))
    return registry, prompts


def _scores(registry, prompts, answers):
    from plugrl.config import RewardConfig
    from plugrl.rewards import RewardItem, RewardRunner

    items = [
        RewardItem(p.sample, p.text, f"...</think>\n<answer> {a} </answer>")
        for p, a in zip(prompts, answers, strict=True)
    ]
    with RewardRunner(registry, RewardConfig(num_workers=1)) as runner:  # the pool, as a run scores
        out = runner.score(items)
    return out.scores, out.details


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.parquet"])
def test_tinyzero_rows_load_and_score(tmp_path, smollm2_path, name):
    """The single-file trainer's data: `messages`, `target`, `nums`; no data_source, no ground truth. Naming the
    file, its prompt column and the data source is all it takes; with the chat template off and the script's
    assistant opening as the prefill, the prompt is the script's hand-written ChatML."""
    path = TZ.write(tmp_path)[name]
    data = {
        "train_files": str(path),
        "prompt_key": "messages",
        "data_source": "countdown",
        "apply_chat_template": False,
        "prefill": OPENING,
    }
    registry, prompts = _start(smollm2_path, data)
    assert len(prompts) == len(TZ.PROBLEMS)
    for p, (nums, target) in zip(prompts, TZ.PROBLEMS, strict=True):
        assert p.sample.ground_truth is None and p.sample.data_source == "countdown"
        assert (p.sample.row["target"], p.sample.row["nums"]) == (target, nums)
        assert p.text == (
            f"<|im_start|>system\n{TZ.SYSTEM}<|im_end|>\n<|im_start|>user\n{TZ.user_text(nums, target)}<|im_end|>\n"
            f"<|im_start|>assistant\n{OPENING}"
        )
    scores, details = _scores(registry, prompts, TZ.SOLUTIONS)
    assert scores == [1.0] * len(TZ.PROBLEMS), details
    scores, _ = _scores(registry, prompts, ["1 + 2"] * len(TZ.PROBLEMS))
    assert scores == [0.1] * len(TZ.PROBLEMS)
    # the problem is each row's own: row 0's answer is wrong for row 1
    scores, _ = _scores(registry, prompts[:2], [TZ.SOLUTIONS[1], TZ.SOLUTIONS[0]])
    assert scores == [0.1, 0.1]


def test_tinyzero_rows_with_answer_field(tmp_path, smollm2_path):
    """`data.answer_field: target`, as the script's own `answer = ex["target"]`: the same scores."""
    path = TZ.write(tmp_path)["rows.jsonl"]
    data = {"train_files": str(path), "prompt_key": "messages", "data_source": "countdown", "answer_field": "target"}
    registry, prompts = _start(smollm2_path, data)
    assert [p.sample.ground_truth for p in prompts] == [t for _, t in TZ.PROBLEMS]
    assert _scores(registry, prompts, TZ.SOLUTIONS)[0] == [1.0] * len(TZ.PROBLEMS)


def test_tinyzero_row_without_nums_is_an_error_score(tmp_path, smollm2_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "Make 16."}], "target": 16}) + "\n")
    registry, prompts = _start(
        smollm2_path, {"train_files": str(path), "prompt_key": "messages", "data_source": "countdown"}
    )
    scores, details = _scores(registry, prompts, ["(3 + 5) * 2"])
    assert details[0]["error"] and "no 'nums' column" in details[0]["countdown_reward/error"]


def test_rows_of_other_data_sources_still_need_a_ground_truth(tmp_path, smollm2_path):
    from plugrl.config import ConfigError
    from plugrl.data import DataError

    path = TZ.write(tmp_path)["rows.jsonl"]
    data = {"train_files": str(path), "prompt_key": "messages", "data_source": "openai/gsm8k"}
    with pytest.raises((DataError, ConfigError), match=r"rows.jsonl line 1: no ground truth"):
        _start(smollm2_path, data)


def test_tinyzero_verl_parquet_loads_and_scores(tmp_path, smollm2_path):
    """TinyZero's verl preprocessing: `reward_model.ground_truth` = {target, numbers}, and the whole prompt, its
    ChatML included, in one user message. `data.raw_template: '{prompt}'` takes that text as it is (what
    TinyZero's dataset does: no chat template), instead of wrapping it in the chat template again."""
    path = TZ.write(tmp_path)["verl.parquet"]
    registry, prompts = _start(smollm2_path, {"train_files": str(path), "raw_template": "{prompt}"})
    for p, (nums, target) in zip(prompts, TZ.PROBLEMS, strict=True):
        assert p.sample.ground_truth == {"target": target, "numbers": nums}
        assert p.text == p.sample.row["prompt"][0]["content"]
        assert p.text.startswith("<|im_start|>system\n") and p.text.endswith("<|im_start|>assistant\n" + OPENING)
    assert _scores(registry, prompts, TZ.SOLUTIONS)[0] == [1.0] * len(TZ.PROBLEMS)
    assert _scores(registry, prompts, ["1 + 2"] * len(TZ.PROBLEMS))[0] == [0.1] * len(TZ.PROBLEMS)


@pytest.mark.slow
def test_two_training_steps_on_tinyzero_rows(tmp_path, tiny_model):
    """`plugrl train` on the single-file trainer's rows as they are, chat template off: two steps, every
    completion scored by the countdown reward from the row's `target` and `nums`, none an error."""
    from tiny_runs import train_two_steps

    path = TZ.write(tmp_path)["rows.jsonl"]
    overrides = [
        "plugins=[countdown,advantages]",
        f"data.train_files={path}",
        "data.prompt_key=messages",
        "data.data_source=countdown",
        "data.apply_chat_template=false",
        "data.prefill=<think>",
    ]
    metrics, rows = train_two_steps(tmp_path, tiny_model, "tinyzero", overrides)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["reward/errors"] == 0.0 for m in metrics)
    assert len(rows) == 4  # 2 prompts x 2 samples
    for row in rows:
        assert row["prompt"].startswith(f"<|im_start|>system\n{TZ.SYSTEM}<|im_end|>\n<|im_start|>user\n Using")
        assert row["prompt"].endswith("<|im_end|>\n<|im_start|>assistant\n<think>")
        assert row["details"]["countdown_reward"] in (0.0, 0.1, 1.0) and not row["details"]["error"]
