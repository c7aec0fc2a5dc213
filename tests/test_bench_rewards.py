"""bench/rewards.py, without its vLLM server: the response generator, and pool vs inline scoring agreeing."""

from __future__ import annotations

import pytest

from bench_scripts import load
from fixture_paths import PUBLIC_DATA

GSM8K = PUBLIC_DATA / "gsm8k" / "example_model_solutions.jsonl"  # the data folder beside the repository

pytestmark = pytest.mark.skipif(not GSM8K.is_file(), reason=f"needs {GSM8K}")


@pytest.fixture(scope="module")
def bench():
    return load("rewards")


def test_responses_are_distinct_deterministic_and_varied(bench):
    rs = bench.make_responses(600, seed=0)
    texts = [r.text for r in rs]
    assert len(texts) == 600 and len(set(texts)) == 600
    assert texts == [r.text for r in bench.make_responses(600, seed=0)]
    assert texts != [r.text for r in bench.make_responses(600, seed=1)]
    styles = {r.style for r in rs}
    assert {"boxed", "think_answer", "multi_boxed", "truncated", "long"} <= styles
    assert any("\\frac" in t for t in texts) and any("<answer>" in t for t in texts)
    assert any(len(t) > 10_000 for t in texts) and sum(len(t) > 10_000 for t in texts) < 60  # a small share
    assert all(r.problem.gold for r in rs)


def test_pool_and_one_process_give_the_same_scores(bench):
    from plugrl.plugins import load_plugins

    items = bench.reward_items(bench.make_responses(50, seed=3), "math")
    registry = load_plugins(["math"])
    inline = bench.math_mode(registry, items, 0, batch=25, timeout_s=10.0)
    pool = bench.math_mode(registry, items, 2, batch=25, timeout_s=10.0)
    assert len(inline["scores"]) == len(pool["scores"]) == 50
    assert inline["errors"] == pool["errors"] == 0 and pool["pool_restarts"] == 0
    assert bench.compare(inline, pool)["differ"] == []
    assert {"correct", "wrong"} <= set(inline["statuses"])
