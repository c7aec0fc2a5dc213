"""One GRPO step with the vLLM rollout engine on one GPU (skipped when vllm does not import)."""

from __future__ import annotations

import pytest
from gpu_checks import check_resolved_dtype
from gpu_runs import GRPO_VLLM, PROMPTS_PER_STEP, ROLLOUT_N, check_step_metrics, metrics


def test_one_grpo_step_with_vllm(plugrl_train):
    try:
        import vllm  # noqa: F401
    except Exception as e:  # ImportError, or a vLLM built for another torch / CUDA
        pytest.skip(f"vllm does not import ({type(e).__name__}: {e}); `pip install -e .[vllm]` for these tests")
    run = plugrl_train(GRPO_VLLM, steps=1)
    check_resolved_dtype(run.run_dir)
    (step1,) = metrics(run.run_dir)
    assert step1["step"] == 1
    check_step_metrics(step1, ("perf/rollout_tokens_per_s",))
    assert step1["perf/rollout_tokens_per_s"] > 0 and step1["response_length/mean"] > 0
    rollouts = (run.run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()
    assert len(rollouts) == PROMPTS_PER_STEP * ROLLOUT_N
    # on a GPU the engine sleeps while the policy trains (rollout.free_cache_engine, on by default)
    assert "vLLM sleep mode on" in run.log, "vLLM's sleep mode is off on this GPU"
