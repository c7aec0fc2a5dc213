"""bench/lora.py's pure parts: the ladder's sizes and parameter counts, the walk-up rule, the tables and ratios; and
its RSS watchdog on real child processes (a python child allocating past a small budget is killed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench_scripts import load


@pytest.fixture(scope="module")
def bench():
    return load("lora")


# --- the ladder -------------------------------------------------------------------------------------------------


def test_parameter_count_by_hand_and_against_the_real_model(bench, smollm2_path):
    # SmolLM2-135M: hidden 576, intermediate 1536, 30 layers, 9 heads (3 KV) of 64, vocabulary 49,152, tied:
    # embeddings 49,152 x 576 = 28,311,552; a layer: q and o 576 x 576 = 331,776 each, k and v 576 x 192 = 110,592
    # each, gate, up, down 576 x 1536 = 884,736 each, two norms 576 each -> 3,540,096; 30 layers 106,202,880;
    # the final norm 576: 134,515,008
    assert bench.LADDER["0.135"] == (576, 1536, 30, 9, 3)
    assert bench.llama_parameters(*bench.LADDER["0.135"]) == 134_515_008
    assert bench.llama_parameters(*bench.LADDER["0.135"], tied=False) == 134_515_008 + 28_311_552
    # the real checkpoint's tensors (tied embeddings stored once)
    assert bench.C.model_parameters(smollm2_path) == 134_515_008


def test_ladder_configs_build_the_counted_models_near_their_names(bench):
    import json

    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from plugrl.models import resolve_model_path

    source = json.loads((Path(resolve_model_path(bench.MODEL)) / "config.json").read_text())
    sizes = list(bench.LADDER)
    counts = [bench.llama_parameters(*bench.LADDER[s]) for s in sizes]
    assert counts == sorted(counts) and len(sizes) == 8
    for size, count in zip(sizes, counts, strict=True):
        assert abs(count / (float(size) * 1e9) - 1) < 0.05, (size, count)  # each within 5% of its name
    for size in ("0.36", "4.0"):  # built on the meta device (no memory): transformers counts the same
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(LlamaConfig.from_dict({**source, **bench.ladder_config(size)}))
        assert model.model.embed_tokens.weight is model.lm_head.weight
        assert sum(p.numel() for p in model.parameters()) == bench.llama_parameters(*bench.LADDER[size])
    assert bench.llama_parameters(*bench.LADDER["0.36"]) == 361_821_120  # SmolLM2-360M's shape
    assert bench._ladder_names("4.0B,0.135, 1.0") == ["0.135", "1.0", "4.0"]
    with pytest.raises(Exception, match="ladder sizes are"):
        bench._ladder_names("0.135,7.0")


def _fake(size: str, ok: bool, peak: float = 1000.0) -> dict:
    return {"size": size, "completed": ok, "oom": not ok, "returncode": 0 if ok else -9, "peak_rss_mib": peak}


def test_walk_up_stops_at_the_first_failure_and_picks_the_size_below(bench):
    tried = []
    outcome = {"0.135": True, "0.36": True, "0.6": False, "1.0": True}

    def attempt(size):
        tried.append(size)
        return _fake(size, outcome[size])

    results = bench.walk_ladder(["0.135", "0.36", "0.6", "1.0"], attempt)
    assert tried == ["0.135", "0.36", "0.6"]  # nothing above the first failure runs
    assert bench.largest_completed(results)["size"] == "0.36"
    # a success after a failure (given by hand) does not count; the smallest failing leaves none
    assert bench.largest_completed([_fake("0.135", True), _fake("0.36", False), _fake("0.6", True)])["size"] == "0.135"
    assert bench.largest_completed([_fake("0.135", False), _fake("0.36", True)]) is None
    everything = bench.walk_ladder(list(outcome)[:2], lambda s: _fake(s, True))
    assert bench.largest_completed(everything)["size"] == "0.36"


# --- tables and ratios --------------------------------------------------------------------------------------------


def test_ratio_formatting(bench):
    assert bench.fmt_ratio(bench.ratio(3.0, 2.0)) == "1.50x"
    assert bench.fmt_ratio(bench.ratio(1.0, 0.0)) == "-" and bench.fmt_ratio(bench.ratio(None, 2.0)) == "-"
    assert bench.fmt_params(134_515_008) == "134.5M" and bench.fmt_params(4_033_000_000) == "4.03B"
    assert bench.fmt_s(0.0041) == "0.004" and bench.fmt_s(12.34) == "12.3"


def test_ladder_table_names_each_outcome_and_the_ratio_of_the_largest(bench):
    sizes = ["0.135", "0.36", "0.6", "1.0"]
    results = {
        "full": [_fake("0.135", True, 2900.0), {**_fake("0.36", False, 4100.0)}],
        "lora": [_fake(s, True, 1000.0 + i) for i, s in enumerate(sizes)],
    }
    for rs in results.values():
        for r in rs:
            r.update(parameters=bench.llama_parameters(*bench.LADDER[r["size"]]), wall_s=12.0)
    lines = bench.ladder_table(sizes, results, 4.0, "AMD EPYC (2 cores)", "setting")
    text = "\n".join(lines)
    assert "within 4 GiB; CPU: AMD EPYC (2 cores)" in text
    row = next(line for line in lines if line.startswith("| 0.36B"))
    assert "| 361.8M | out of memory (killed at 4,100 MiB) | ok, 1,001 MiB, 12.0 s |" in row
    assert "| 1.0B |" in text and "| not run | ok, 1,003 MiB" in text
    assert "largest within 4 GiB, full fine-tuning: 0.135B (134.5M), peak RSS 2,900 MiB" in text
    assert "LoRA r=16: 1.0B (976.8M), peak RSS 1,003 MiB (the top of the ladder: a larger one may fit too)" in text
    # 976,847,040 / 134,515,008 = 7.26
    assert "largest LoRA / largest full: 7.26x (target >= 3x: yes)" in text
    results["full"][1].update(oom=False, returncode=-9)  # SIGKILL from elsewhere
    assert "killed by the system (SIGKILL) at 4,100 MiB" in "\n".join(bench.ladder_table(sizes, results, 4.0, "c", "s"))
    results["lora"][1:] = [_fake("0.36", False, 4096.5)]
    results["lora"][1].update(parameters=1, wall_s=1.0)
    text = "\n".join(bench.ladder_table(sizes, results, 4.0, "cpu", "s"))
    assert "largest LoRA / largest full: 1.00x (target >= 3x: NO)" in text


def test_train_and_sync_tables_ratios_and_targets(bench):
    full = {
        "trainable_params": 134_515_008,
        "step_s": 4.0,
        "update_s": 3.0,
        "logprobs_s": 1.0,
        "best_step_s": 3.5,
        "best_update_s": 2.5,
        "best_logprobs_s": 0.9,
        "peak_rss_mib": 4000.0,
        "model_rss_mib": 1100.0,
        "other_cores": 0.1,
    }
    lora = {**full, "trainable_params": 4_884_480, "step_s": 3.0, "update_s": 2.0, "peak_rss_mib": 1800.0}
    lora["best_step_s"] = 1.75
    text = "\n".join(bench.train_table({"full": full, "lora": lora}, "cpu", "s"))
    assert "| LoRA r=16 | 4.9M | 3.000 (1.750) | 2.000 (2.500) | 1.000 (0.900) | 1,800 | 1,100 | 700 | 0.10 |" in text
    # (1,800 - 1,100) / (4,000 - 1,100) = 0.24
    assert (
        "LoRA / full: step time 0.75x (best 0.50x), update 0.67x, peak RSS 0.45x, peak above the first log-probs pass "
        "0.24x" in text
    )
    assert "LoRA's peak RSS <= 50% of full's: yes (45%)" in text
    lora["peak_rss_mib"] = 3000.0
    assert "50% of full's: NO (75%)" in "\n".join(bench.train_table({"full": full, "lora": lora}, "cpu", "s"))
    failed = bench.train_table({"full": full, "lora": {"failed": "exit 1"}}, "cpu", "s")
    assert "| LoRA r=16 | failed: exit 1 |" in "\n".join(failed) and not any("target" in x for x in failed)

    rounds = [
        {"mode": m, "sync_s": s, "generate_s": g, "new_tokens": 200, "other_cores": 0.0}
        for m, s, g in (("merged", 1.4, 7.0), ("merged", 1.6, 9.0), ("merged", 1.5, 8.0), ("adapter", 0.004, 9.0))
    ]
    modes = {m: bench.summarize_sync([r for r in rounds if r["mode"] == m]) for m in ("merged", "adapter")}
    merged = modes["merged"]
    assert merged["total_s"] == pytest.approx(9.5) and merged["sync_s"] == pytest.approx(1.5)
    assert merged["best_total_s"] == pytest.approx(8.4) and merged["generate_ms_per_token"] == pytest.approx(40.0)
    text = "\n".join(bench.sync_table(modes, "cpu", "s"))
    assert (
        "| merged | LoRA-enabled | 1.500 | 8.000 | 9.500 | 8.400 | 200 | 40.0 (35.0) | 1.00x (1.00x) | 0.00 |" in text
    )
    assert (
        "adapter / merged (same engine), medians: sync 0.00x, generate 1.12x, sync + generate 0.95x; best rounds: "
        "generate 1.29x, sync + generate 1.07x" in text
    )
    assert (
        "faster per step (sync + generate, against lora_sync=merged as measured): by medians adapter (9.004 s adapter "
        "vs 9.500 s merged, 0.95x); by best rounds merged (9.004 s adapter vs 8.400 s merged, 1.07x)" in text
    )
    modes["merged_plain"] = bench.summarize_sync([{**r, "generate_s": 6.0} for r in rounds if r["mode"] == "merged"])
    text = "\n".join(bench.sync_table(modes, "cpu", "s"))
    assert "| merged | without LoRA (lora_sync=merged) | 1.500 | 6.000 | 7.500 | 7.400 |" in text
    assert (
        "what lora_sync=merged runs), medians: sync + generate 1.20x, generate 1.50x; best rounds: sync + gen" in text
    )
    assert "by medians merged (9.004 s adapter vs 7.500 s merged, 1.20x)" in text


# --- the watchdog, on real children ------------------------------------------------------------------------------


def test_watchdog_kills_a_child_that_passes_its_budget(bench, tmp_path):
    hog = "import time; block = b'1' * (300 << 20); time.sleep(30)"  # 300 MiB, every page written
    w = bench.run_watched([sys.executable, "-c", hog], tmp_path / "hog.log", budget_bytes=100 << 20, interval_s=0.05)
    assert w.oom and not w.timed_out and w.returncode == -9
    assert w.wall_s < 10  # killed, not waited for
    assert w.peak_rss_mib > 100 and not bench.completed(w, 100 << 20)

    fits = "import time; block = b'1' * (50 << 20); time.sleep(0.5); print('RESULT {\"held\": 50}')"
    w = bench.run_watched([sys.executable, "-c", fits], tmp_path / "fits.log", budget_bytes=300 << 20)
    assert w.returncode == 0 and not w.oom and w.result == {"held": 50}
    # its own peak (VmHWM read while it held the block), not wait4's ru_maxrss, which starts from this process's
    assert 50 <= w.peak_rss_mib < 300 and bench.completed(w, 300 << 20)
    # finished, but its peak passed the budget between two reads: not completed
    assert not bench.completed(w, 40 << 20)

    w = bench.run_watched([sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "t.log", timeout_s=0.5)
    assert w.timed_out and not w.oom and not bench.completed(w, None)
