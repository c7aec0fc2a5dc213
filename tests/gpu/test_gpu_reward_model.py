"""The countdown rule plus a reward model (plugins/rewards_model) in the trainer's process on one GPU: the model
loads on the trainer's GPU in bf16 and scores every sample beside the rule."""

from __future__ import annotations

import math

from gpu_checks import check_first_step, check_resolved_dtype, expected_dtype
from gpu_runs import REWARD_MODEL_HF, metrics


def test_reward_model_scores_on_the_gpu(plugrl_train, gpu_model, tmp_path_factory):
    from tiny_models import make_reward_model

    # SmolLM2-135M with a random one-output score head: its scores mean nothing, where and how it runs does
    rm = make_reward_model(tmp_path_factory.mktemp("rm") / "smollm2_rm", gpu_model)
    run = plugrl_train(REWARD_MODEL_HF, steps=1, reward_model=rm)
    check_resolved_dtype(run.run_dir)
    check_first_step(run.run_dir, gpu_model, extra_metrics=("reward/reward_model/mean", "reward/reward_model/raw"))
    (step1,) = metrics(run.run_dir)
    assert step1["reward/errors"] == 0 and step1["reward/timeouts"] == 0, step1
    # running normalisation: the scores of the first batch have mean 0 (std 1), clipped to [-3, 3]
    assert abs(step1["reward/reward_model/mean"]) < 1e-3, step1
    assert math.isfinite(step1["reward/reward_model/raw"]), step1
    # auto device and dtype: the trainer's GPU, in bf16 from Ampere on
    loaded = [line for line in run.log.splitlines() if "reward model" in line and "loaded (" in line]
    assert loaded, "the reward model plugin never said it loaded"
    assert "cuda" in loaded[0] and expected_dtype() in loaded[0], loaded[0]
