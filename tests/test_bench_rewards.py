"""bench/rewards.py, without its vLLM server: the response generator (on the public data beside the repository, and
on the repository's fixture without it), pool vs inline scoring agreeing, and a smoke run of the scorer parts at
tiny sizes: the policy's generation (the HF engine and a tiny random model standing in for vLLM and SmolLM2), the
reward model (a tiny random one), the judge against the stand-in OpenAI-compatible server of
tests/stand_in_openai.py, and the ratio lines."""

from __future__ import annotations

import argparse

import pytest

from bench_scripts import load
from fixture_paths import GSM8K_FIXTURE, PUBLIC_DATA
from stand_in_openai import StandInOpenAI

GSM8K = PUBLIC_DATA / "gsm8k" / "example_model_solutions.jsonl"  # the data folder beside the repository
needs_public_data = pytest.mark.skipif(not GSM8K.is_file(), reason=f"needs {GSM8K}")


@pytest.fixture(scope="module")
def bench():
    return load("rewards")


@needs_public_data
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


@needs_public_data
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


def test_without_the_public_data_the_fixture_stands_in(bench, monkeypatch, tmp_path):
    """The data folder beside the repository is optional: the GSM8K questions then come from tests/fixtures."""
    monkeypatch.setattr(bench, "GSM8K_SOLUTIONS", tmp_path / "absent.jsonl")
    assert bench.GSM8K_FIXTURE == GSM8K_FIXTURE / "test.jsonl"
    rs = bench.make_responses(80, seed=0)
    texts = [r.text for r in rs]
    assert len(set(texts)) == 80 and texts == [r.text for r in bench.make_responses(80, seed=0)]
    gsm = [r for r in rs if r.problem.origin.startswith("gsm8k")]
    assert gsm and all(r.problem.origin.endswith("(fixture)") and r.problem.gold for r in gsm)


# =========================================================================== the scorer parts, tiny


def tiny_args(**more) -> argparse.Namespace:
    values = dict(
        gen_prompts=2,
        gen_n=2,
        gen_max_tokens=4,
        gen_steps=2,
        rm_tokens=[64, 4096],
        rm_samples=8,
        judge_batch=4,
        judge_samples=[1, 3],
        judge_concurrency=[2],
        judge_max_tokens=4,
        request_timeout=30.0,
        wait_idle=0.0,
    )
    return argparse.Namespace(**{**values, **more})


def test_scorer_parts_smoke(bench, tiny_model, tmp_path):
    """Generation, reward model and judge at tiny sizes through the bench's own functions, then the table and the
    'scoring takes Z% of a step's generation time' lines. The HF engine and a tiny random model stand in for the
    vLLM engine and SmolLM2-135M-Instruct of the real run; the judge's server is a stand-in (no vLLM here)."""
    args = tiny_args()
    lines: list[str] = []
    gen, rollouts = bench.run_generation(args, lines.append, engine="hf", model=str(tiny_model))
    assert gen["engine"] == "hf" and gen["config"] == "examples/countdown_grpo.yaml"
    assert gen["samples"] == 2 * 2 * 2 and len(rollouts) == 3 * 2 * 2  # 2 measured steps after 1 warm-up
    assert {r.step for r in rollouts} == {0, 1, 2} and gen["samples_per_s"] > 0 and gen["tokens_per_s"] > 0
    assert all(0 < s["completion_tokens"] <= 2 * 2 * 4 for s in gen["steps"])

    rm = bench.run_reward_model(args, rollouts, lines.append, base=str(tiny_model))
    assert [r["max_tokens_per_batch"] for r in rm["runs"]] == [64, 4096]
    assert all(r["samples"] == 8 and r["errors"] == 0 and r["samples_per_s"] > 0 for r in rm["runs"])
    assert rm["runs"][0]["mean_raw"] == pytest.approx(rm["runs"][1]["mean_raw"], abs=1e-4)  # batching changes no score

    with StandInOpenAI("Score: 7", models=["judge"]) as server:  # every chat request: n times "Score: 7"
        judge = bench.run_judge(args, rollouts, lines.append, server.base_url, "judge")
    assert [(r["samples"], r["concurrency"]) for r in judge["runs"]] == [(1, 2), (3, 2)]
    assert all(r["failures"] == 0 and r["judged"] == 4 and r["mean_score"] == pytest.approx(0.7) for r in judge["runs"])
    assert len(server.requests) == 4 + 4 + 4  # warm-up (the warm-up step's rollouts), then one step each
    assert [r.get("n", 1) for r in server.bodies()[-4:]] == [3] * 4
    assert "Question: " in server.bodies()[-1]["messages"][-1]["content"]

    table = bench.table(None, None, gen, rm, judge)
    text = "\n".join(table)
    assert "## the policy's generation: hf engine" in text and "## reward model:" in text and "## judge:" in text
    beside = [line for line in table if "of a step's generation time" in line]
    assert len(beside) == 3  # the reward model's best, and the judge's best at samples 1 and 3
    assert beside[0].startswith("reward model (max_tokens_per_batch ")
    assert "scoring at " in beside[0] and f"vs generating at {gen['samples_per_s']:.1f}" in beside[0]
    rows = bench.beside_generation(gen, rm, judge)
    assert rows[0]["share_of_generation_pct"] == pytest.approx(100 * gen["samples_per_s"] / rm["samples_per_s"])


def test_scoring_beside_generation_arithmetic(bench):
    gen = {"samples_per_s": 4.0}
    rm = {"best": {"max_tokens_per_batch": 8192, "samples_per_s": 16.0}, "samples_per_s": 16.0}
    judge = {"best": {"1": {"concurrency": 4, "samples_per_s": 2.0}}}
    rows = bench.beside_generation(gen, rm, judge)
    assert [round(r["share_of_generation_pct"]) for r in rows] == [25, 200]
    assert bench.ratio_line(rows[1]) == (
        "judge (samples 1, concurrency 4): scoring at 2.0 samples/s vs generating at 4.0: scoring takes 200% of a "
        "step's generation time (ratio 0.50x; the policy's own rollouts)"
    )
    assert bench.beside_generation(None, rm, judge) == []


def test_flags_select_each_part(bench, monkeypatch):
    called: list[str] = []

    def generation(*args, **kw):
        called.append("generation")
        return None, []

    monkeypatch.setattr(bench, "run_math", lambda *a: called.append("math"))
    monkeypatch.setattr(bench, "run_generation", generation)
    monkeypatch.setattr(bench, "run_reward_model", lambda *a, **k: called.append("reward_model"))
    assert bench.main(["--reward-model", "--no-math", "--no-tinyv", "--json", ""]) == 0
    assert called == ["generation", "reward_model"]
    called.clear()
    assert bench.main(["--no-tinyv", "--json", ""]) == 0
    assert called == ["math"]
