"""One step off the policy on one GPU (trainer.off_policy_steps=1, HF engine): step 2 trains on samples generated
while step 1 trained, weighted by the rollout correction from the engine's log-probs."""

from __future__ import annotations

import math

from gpu_checks import check_resolved_dtype
from gpu_runs import OFF_POLICY_HF, check_step_metrics, metrics

CORRECTION = ("rollout_corr/kl", "rollout_corr/logp_abs_diff_mean", "rollout_corr/rollout_is_mean")


def test_off_policy_steps_with_the_rollout_correction_on_one_gpu(plugrl_train, gpu_model):
    run = plugrl_train(OFF_POLICY_HF, steps=2)
    check_resolved_dtype(run.run_dir)
    logged = metrics(run.run_dir)
    assert [m["step"] for m in logged] == [1, 2], logged
    for record in logged:
        check_step_metrics(record, CORRECTION)
    # step 1's samples came from the weights it trains (lag 0), step 2's from the weights before step 1's update
    assert [m["rollout/policy_lag"] for m in logged] == [0, 1], logged
    # at lag 0 the engine's log-probs (bf16 generation with a KV cache) match the trainer's recomputed ones up to
    # bf16 rounding; a wrong temperature or an off-by-one token alignment would be nats apart
    step1 = logged[0]
    assert step1["rollout_corr/logp_abs_diff_mean"] < 0.2, step1
    assert step1["rollout_corr/kl"] < 0.05, step1
    # truncate mode caps every importance weight at its threshold (2 by default)
    for record in logged:
        assert 0 < record["rollout_corr/rollout_is_max"] <= 2.0 + 1e-6, record
        assert math.isfinite(record["rollout_corr/raw_is_max"]), record
