"""bench/async.py at the tiny shape: the tiny random Llama instead of SmolLM2, vLLM in each run's process, one
round of k = 0 and k = 1, colocated and with a rollout server, and 4-step reward curves; the table, the JSON and
the plot come out, and the numbers say what the runs did (k = 1's steps after the first trained on rollouts one
step old)."""

from __future__ import annotations

import json

import pytest

from bench_scripts import load


@pytest.mark.slow
def test_quick_run_measures_both_ks_and_writes_json_and_plot(tiny_model, tmp_path, capsys):
    bench = load("async")
    out, plot = tmp_path / "async.json", tmp_path / "curves.png"
    overrides = [
        f"model.path={tiny_model}",
        "model.dtype=float32",
        "rollout.n=4",
        "data.train_batch_size=2",
        "data.max_response_length=16",
        "rollout.cpu_kv_cache_gb=0.25",
    ]
    argv = ["--quick", "--parts", "1,2", "--modes", "colocate,server", "--out", str(out), "--plot", str(plot)]
    assert bench.main([*argv, "--overrides", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "| variant | tokens/s |" in printed and "vs colocate k=0" in printed and "largest gap" in printed
    result = json.loads(out.read_text())
    table = {row["variant"]: row for row in result["throughput"]["table"]}
    assert list(table) == ["colocate k=0", "colocate k=1", "server k=0", "server k=1"]
    assert [row["policy_lag_mean"] for row in table.values()] == [0.0, 1.0, 0.0, 1.0]
    assert table["colocate k=0"]["ratio_vs_first"] == 1.0 and all(r["tokens_per_s"] > 0 for r in table.values())
    assert all(0 < r["cpu_cores_busy"] for r in table.values())
    assert table["colocate k=1"]["phases_mean_s"]["old_logprob"] > 0  # k = 1's correction needs the old log-probs
    assert set(result["curves"]["curves"]) == {"0", "1"} and all(
        len(c) == 4 for c in result["curves"]["curves"].values()
    )
    assert plot.stat().st_size > 10_000
