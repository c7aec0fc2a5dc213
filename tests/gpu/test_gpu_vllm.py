"""vLLM on one GPU, two steps each (skipped when vllm does not import): the engine sleeps while the policy trains,
takes the new weights, wakes its KV cache and generates with them; with LoRA through both syncs."""

from __future__ import annotations

import pytest
from gpu_checks import check_resolved_dtype
from gpu_runs import GRPO_VLLM, LORA_VLLM_ADAPTER, LORA_VLLM_MERGED, PROMPTS_PER_STEP, ROLLOUT_N, check_step_metrics
from gpu_runs import metrics as run_metrics

# bf16 generation with a KV cache against the trainer's bf16 forward: ~0.005 apart on average (the H200's HF-engine
# run); weights the engine dropped or never took would be nats away
SYNCED = 0.2


def check_two_vllm_steps(run, sleep_level: int) -> None:
    check_resolved_dtype(run.run_dir)
    logged = run_metrics(run.run_dir)
    assert [m["step"] for m in logged] == [1, 2], logged
    for record in logged:
        check_step_metrics(record, ("perf/rollout_tokens_per_s", "rollout_corr/logp_abs_diff_mean"))
        assert record["perf/rollout_tokens_per_s"] > 0 and record["response_length/mean"] > 0
    rollouts = (run.run_dir / "rollouts" / "step_000002.jsonl").read_text().splitlines()
    assert len(rollouts) == PROMPTS_PER_STEP * ROLLOUT_N
    # on a GPU the engine sleeps while the policy trains (rollout.free_cache_engine, on by default), at the level
    # the sync needs
    assert "vLLM sleep mode on" in run.log and f"level {sleep_level}" in run.log, "sleep mode or its level is off"
    # step 2 generated after step 1's weight sync and the KV cache's wake: with the trained weights
    assert logged[0]["timing/sync_weights"] > 0
    step2 = logged[1]
    assert step2["rollout_corr/logp_abs_diff_mean"] < SYNCED, step2


def test_two_grpo_steps_with_vllm_sleeping_at_level_2(plugrl_train, vllm_installed):
    check_two_vllm_steps(plugrl_train(GRPO_VLLM, steps=2), sleep_level=2)


@pytest.mark.parametrize(
    ("scenario", "level"), [(LORA_VLLM_MERGED, 2), (LORA_VLLM_ADAPTER, 1)], ids=["merged", "adapter"]
)
def test_lora_syncs_to_vllm(plugrl_train, vllm_installed, scenario, level):
    run = plugrl_train(scenario, steps=2)
    check_two_vllm_steps(run, sleep_level=level)
