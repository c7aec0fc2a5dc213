"""plugrl-rewards-verl (issue 38, point 3): verl's default rewards by data_source, each scoring as verl 0.9.1's own
function. Every vector here is scored twice, by the plugin and by verl's ``default_compute_score`` route for the
data source, and the scores must be equal.

verl's reward code is the real one: the verl 0.9.1 wheel, installed without its dependencies (``make setup``), its
``verl/utils/reward_score`` files imported from where pip put them. The ``verl`` package itself is not imported (its
``__init__`` needs ray): its package modules are stood in for by empty packages over the installed folders, so the
files import each other as in verl. Test vectors are written here: right, wrong, malformed, boxed, edge cases.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import math
import sys
import types
from pathlib import Path

import pytest

from plugrl.plugins import load_plugins
from plugrl.rewards.routing import rewards_for
from plugrl_verl import DATA_SOURCES
from plugrl_verl.code import code_score, stdout_matches
from plugrl_verl.geo3k import geo3k_score
from plugrl_verl.gsm8k import gsm8k_score
from plugrl_verl.hendrycks import math_score
from plugrl_verl.minerva import dapo_score
from plugrl_verl.prime_math import prime_math_score
from plugrl_verl.safe_eval import arithmetic, sympy_expr
from plugrl_verl.search_r1 import search_r1_score


def _verl_root() -> Path:
    try:
        return Path(importlib.metadata.distribution("verl").locate_file("verl"))
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("verl 0.9.1 is not installed (make setup installs it without its dependencies)")


@pytest.fixture(scope="module")
def verl():
    """verl's reward_score package, imported from the installed wheel's files without verl's own __init__s."""
    root = _verl_root()
    saved = {k: v for k, v in sys.modules.items() if k == "verl" or k.startswith("verl.")}
    for name, folder in (("verl", root), ("verl.utils", root / "utils"), ("verl.utils.reward_score", None)):
        package = types.ModuleType(name)
        package.__path__ = [str(folder or root / "utils" / "reward_score")]
        sys.modules[name] = package
    module = types.SimpleNamespace(
        **{
            name: importlib.import_module(f"verl.utils.reward_score.{name}")
            for name in ("gsm8k", "math_reward", "math_dapo", "prime_math", "prime_code", "search_r1_like_qa_em")
        }
    )
    try:
        module.geo3k = importlib.import_module("verl.utils.reward_score.geo3k")
    except ImportError as e:  # mathruler: make setup installs it
        module.geo3k = None
        module.geo3k_missing = str(e)
    yield module
    for name in [k for k in sys.modules if k == "verl" or k.startswith("verl.")]:
        del sys.modules[name]
    sys.modules.update(saved)


def verl_score(result) -> float:
    """A verl scorer's result as default_compute_score returns it: a dict's score, a number, or a tuple's first."""
    if isinstance(result, dict):
        return result["score"]
    if isinstance(result, (int, float, bool)):
        return float(result)
    return float(result[0])


def test_every_route_of_default_compute_score_has_its_reward():
    registry = load_plugins(["verl_default"])
    routes = {
        "openai/gsm8k": "verl_gsm8k",
        "lighteval/MATH": "verl_math",
        "DigitalLearningGmbH/MATH-lighteval": "verl_math",
        "HuggingFaceH4/MATH-500": "verl_math",
        "math_dapo": "verl_math_dapo",
        "math": "verl_math_dapo",
        "math_dapo_reasoning": "verl_math_dapo",
        "aime2024": "verl_math_dapo",  # verl: data_source.startswith("aime")
        "aime": "verl_math_dapo",
        "numina_olympiads": "verl_prime_math",
        "numina_cn_k12": "verl_prime_math",
        "codecontests": "verl_code",
        "taco": "verl_code",
        "hiyouga/geometry3k": "verl_geo3k",
        "searchR1_nq": "verl_search_r1",
        "searchR1_bamboogle": "verl_search_r1",
    }
    for source, name in routes.items():
        assert [r.name for r in rewards_for(registry, source)] == [name], source
    assert rewards_for(registry, "polaris") == []  # verl raises NotImplementedError; plugrl: reward.default
    assert sum(len(v) for v in DATA_SOURCES.values()) == 1 + 3 + 4 + 6 + 4 + 1 + 7


# ------------------------------------------------------------------------------------------------- GSM8K

GSM8K = [
    ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
    ("#### 1,000", "1000"),
    ("#### $18", "18"),  # verl's pattern stops at the $: no answer
    ("#### 18.", "18"),  # "18." is not "18" to verl
    ("#### -3", "-3"),
    ("The answer is 72", "72"),  # no ####
    ("#### 71\nwait, #### 72", "72"),  # the last one
    ("x" * 400 + "#### 72", "72"),
    ("#### 72" + "y" * 300, "72"),  # outside the last 300 characters
    ("", "72"),
]


@pytest.mark.parametrize(("completion", "truth"), GSM8K)
@pytest.mark.parametrize("method", ["strict", "flexible"])
def test_gsm8k_equals_verl(verl, completion, truth, method):
    want = verl.gsm8k.compute_score(completion, truth, method=method)
    assert gsm8k_score(completion, truth, method) == float(want)


# ------------------------------------------------------------------------------------------------- MATH

MATH = [
    ("So the answer is $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac12}", "\\frac{1}{2}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{1/2}", "\\frac{1}{2}"),
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{5 \\text{ cm}}", "5"),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}"),
    ("\\boxed 7$ more", "7"),  # verl reads "\boxed " up to a $
    ("\\fbox{7}", "7"),  # found, but never unwrapped: 0
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)"),
    ("\\boxed{3} then \\boxed{4}", "4"),
    ("\\boxed{\\frac", "x"),  # unclosed
    ("\\boxed{\\sqrt}", "\\sqrt"),  # normalising raises: the raw texts are compared
    ("no box, 7", "7"),
    ("\\boxed{.5}", "0.5"),
]


@pytest.mark.parametrize(("completion", "truth"), MATH)
def test_math_equals_verl(verl, completion, truth):
    assert math_score(completion, truth) == verl.math_reward.compute_score(completion, truth)


# ------------------------------------------------------------------------------------------------- DAPO

DAPO = [
    ("Reasoning...\nAnswer: 42", "42"),
    ("Answer: $42$", "42"),
    ("answer : 1,000", "1000"),
    ("Answer: 12 dollars", "12"),
    ("Answer: \\frac12", "\\frac{1}{2}"),
    ("Answer: x = 3", "3"),
    ("Answer: 41", "42"),
    ("The result is \\boxed{42}", "42"),  # no Answer line: the box, compared as written
    ("The result is \\boxed{ 42 }", "42"),
    ("no answer at all", "42"),
    ("Answer: \\text{(B)}", "(B)"),
    ("x" * 400 + "\nAnswer: 42", "42"),
]


@pytest.mark.parametrize(("completion", "truth"), DAPO)
@pytest.mark.parametrize("strict", [False, True])
def test_math_dapo_equals_verl(verl, completion, truth, strict):
    want = verl.math_dapo.compute_score(completion, truth, strict_box_verify=strict)
    got = dapo_score(completion, truth, strict)
    assert got == want  # score, acc and pred alike


# ------------------------------------------------------------------------------------------------- Prime Math

PRIME = [
    ("The answer is \\boxed{12}", "12"),
    ("The answer is \\boxed{12.0}", "12"),
    ("so x = 3", "3"),
    ("The final answer is 1/2", "\\frac{1}{2}"),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}"),  # unreduced fractions are not simplified
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{x^2+2x+1}", "(x+1)^2"),
    ("\\boxed{(1, 2)}", "(1,2)"),
    ("\\boxed{[1, 2)}", "(1,2)"),
    ("\\boxed{50\\%}", "0.5"),  # math_equal: x100 counts
    ("\\boxed{2\\pi}", "6.2832"),
    ("\\boxed{\\frac{\\pi}{2}}", "\\frac{\\pi}{2}"),
    ("\\boxed{1,000,000}", "1000000"),
    ("\\boxed{3 million}", "3000000"),
    ("\\boxed{101_2}", "5"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("[1, 2]", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ("The answer is \\boxed{13}", "12"),
    ("I do not know", "12"),
    ("", "0"),
    ("\\boxed{\\text{Monday}}", "Monday"),
    ("\\boxed{5 cm}", "5"),
    ("Step 1: ... Step 2: the answer is \\boxed{7}", "7"),
    ("\\boxed{x=\\frac{3}{2}}", "1.5"),
    ("answer: 3.14159", "\\pi"),
]


@pytest.mark.parametrize(("completion", "truth"), PRIME)
def test_prime_math_equals_verl(verl, completion, truth):
    want = verl.prime_math.compute_score(completion, truth)
    got = prime_math_score(completion, truth)
    assert got["score"] == float(want[0]) and got["pred"] == want[2]


def test_prime_math_never_executes_the_answer(tmp_path):
    """verl evals an answer holding \\pi (and a matrix written as a list); here such a text is read as arithmetic
    or not at all, so code in it never runs."""
    marker = tmp_path / "ran"
    hostile = f"\\boxed{{__import__('pathlib').Path({str(marker)!r}).touch() or \\pi}}"
    assert prime_math_score(hostile, "\\pi")["score"] == 0.0
    assert prime_math_score(f"[__import__('pathlib').Path({str(marker)!r}).touch()]", "\\begin{pmatrix}1\\end{pmatrix}")
    assert not marker.exists()
    with pytest.raises(ValueError):
        sympy_expr("__import__('os').getcwd()")
    with pytest.raises(ValueError):
        arithmetic("(1).__class__")
    with pytest.raises(ValueError, match="too large"):
        sympy_expr("9**9**9**9")
    assert arithmetic("2*3.5") == 7.0 and arithmetic("[[1, 2], [3, 4]]") == [[1, 2], [3, 4]]


# ------------------------------------------------------------------------------------------------- Geometry3K

GEO3K = [
    ("<think>angle sum</think> The answer is \\boxed{30}", "30"),
    ("The answer is \\boxed{30}", "30"),  # right, without the format
    ("<think>x</think> \\boxed{31}", "30"),
    ("<think>x</think> no box", "30"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
    ("<think>a</think>\\boxed{2\\sqrt{3}}", "\\sqrt{12}"),
    ("\\boxed{60^\\circ}", "60"),
]


@pytest.mark.parametrize(("completion", "truth"), GEO3K)
def test_geo3k_equals_verl(verl, completion, truth):
    if verl.geo3k is None:
        pytest.skip(f"verl's geo3k needs mathruler: {verl.geo3k_missing}")
    assert geo3k_score(completion, truth) == pytest.approx(verl.geo3k.compute_score(completion, truth))


# ------------------------------------------------------------------------------------------------- Search-R1

SEARCH = [
    ("<answer>Paris</answer>", {"target": ["Paris"]}),
    ("<answer>The Eiffel Tower!</answer>", {"target": ["eiffel tower"]}),
    ("<answer>Lyon</answer>", {"target": ["Paris", "France"]}),
    ("Paris", {"target": ["Paris"]}),  # no answer tags
    ("<answer>x</answer><answer> paris </answer>", {"target": "Paris"}),
    ("<answer>Paris</answer>" * 11, {"target": ["Paris"]}),  # too many tags: a quarter
]


@pytest.mark.parametrize(("completion", "truth"), SEARCH)
def test_search_r1_equals_verl(verl, completion, truth):
    assert search_r1_score(completion, truth) == float(verl.search_r1_like_qa_em.compute_score(completion, truth))


# ------------------------------------------------------------------------------------------------- code

ADD = {"inputs": ["1 2\n", "10 20\n", "-1 1\n"], "outputs": ["3\n", "30\n", "0\n"]}
FLOAT = {"inputs": ["1 3\n"], "outputs": ["0.333333\n"]}
CALL = {"fn_name": "add", "inputs": ["1\n2", "[1, 2]\n[3]"], "outputs": ["3", "[1, 2, 3]"]}
CODE = [
    ("```python\na, b = map(int, input().split())\nprint(a + b)\n```", ADD),
    ("a, b = map(int, input().split())\nprint(a + b)", ADD),  # no fence: the whole completion
    ("```python\na, b = map(int, input().split())\nprint(a - b if a < 0 else a + b)\n```", ADD),  # 2 of 3
    ("```python\nprint(sum(map(int, input().split())))\nraise SystemExit(0)\n```", ADD),
    ("```python\nimport sys\nprint(int(sys.stdin.readline().split()[0]) + 1/0)\n```", ADD),  # runtime error
    ("```python\nprint(  sqrt(4) )\n```", {"inputs": [""], "outputs": ["2.0"]}),  # verl's prelude: from math import *
    ("```python\na, b = map(int, input().split())\nprint(a / b)\n```", FLOAT),  # allclose
    ("```python\ndef add(a, b):\n    return a + b\n```", CALL),
    ("```python\nclass Solution:\n    def add(self, a, b):\n        return a + b\n```", CALL),
    ("```python\ndef add(a, b):\n    return (a,)\n```", CALL),
    ("```python\nwhile True: pass\n```", {"inputs": ["1\n"], "outputs": ["1\n"]}),  # timeout
    ("```python\nprint(\n```", ADD),  # does not compile
]


@pytest.mark.slow  # up to a few sandboxed processes per vector, and verl's own subprocesses (a timeout: 10 s each)
@pytest.mark.parametrize(("completion", "tests"), CODE)
def test_code_equals_verl(verl, completion, tests):
    want = verl_score(verl.prime_code.compute_score(completion, json.loads(json.dumps(tests)), continuous=True))
    got = code_score(completion, json.dumps(tests))["score"]
    assert math.isclose(got, want), (got, want)


def test_code_runs_in_the_sandbox_not_here(tmp_path):
    """A program that writes outside its working directory is refused by the sandbox (and fails its test)."""
    target = tmp_path / "escaped"
    source = f"```python\nopen({str(target)!r}, 'w').write('x')\nprint(3)\n```"
    assert code_score(source, {"inputs": ["1 2\n"], "outputs": ["3\n"]})["score"] == 0.0
    assert not target.exists()


@pytest.mark.parametrize(
    ("stdout", "expected", "match"),
    [
        ("3\n", "3", True),
        ("  3  \n", "3\n", True),
        ("1\n\n2\n", "1\n2", True),
        ("0.3333333\n", "0.333333", True),
        ("0.34\n", "0.333333", False),
        ("1 2\n", "1  2", False),
        ("4\n", "3", False),
    ],
)
def test_stdout_comparison(stdout, expected, match):
    assert stdout_matches(stdout, expected) is match


# ------------------------------------------------------------------------------------------------- the fallback


def test_seed_003_fallback_is_reward_default(tmp_path):
    """TinyV's fork scores every data source without _tinyv with Prime Math: reward.default names verl_prime_math."""
    from plugrl.config import build_config
    from plugrl.plugins import check_config
    from plugrl.rewards import RewardError, check_routes

    registry = load_plugins(["tinyv", "verl_default"])
    with pytest.raises(RewardError) as e:
        check_routes(registry, {"polaris", "polaris_tinyv"})
    assert "no reward function for data_source 'polaris'" in str(e.value) and "reward.default" in str(e.value)
    cfg = build_config(
        {
            "model": {"path": "m"},
            "data": {"train_files": ["x.parquet"]},
            "plugins": ["tinyv", "verl_default"],
            "reward": {"default": "verl_prime_math", "options": {"tinyv": {"model": "rubric-model"}}},
        }
    )
    check_config(cfg, registry)
    routes = check_routes(registry, {"polaris", "polaris_tinyv", "aime_tinyv", "openai/gsm8k"})
    assert {k: [r.name for r in v] for k, v in routes.items()} == {
        "polaris": ["verl_prime_math"],
        "polaris_tinyv": ["tinyv"],
        "aime_tinyv": ["tinyv"],  # '*_tinyv*' is more specific than 'aime*'
        "openai/gsm8k": ["verl_gsm8k"],
    }
