"""PPO with a critic (GAE, examples/ppo_gae.yaml) for one step on one GPU: policy and value model both train."""

from __future__ import annotations

from gpu_checks import check_first_step, check_resolved_dtype, expected_dtype
from gpu_runs import PPO_GAE_HF, metrics


def test_ppo_with_critic_one_step_on_one_gpu(plugrl_train, gpu_model):
    run = plugrl_train(PPO_GAE_HF, steps=1, probe=True)
    check_resolved_dtype(run.run_dir)
    check_first_step(run.run_dir, gpu_model, extra_metrics=("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"))
    (step1,) = metrics(run.run_dir)
    assert step1["critic/optimizer_steps"] == 1 and step1["critic/skipped_updates"] == 0, step1
    ckpt = run.run_dir / "checkpoints" / "step_000001"
    assert (ckpt / "critic" / "config.json").is_file() and (ckpt / "critic_optimizer.pt").stat().st_size > 0

    (rank0,) = run.probes
    kinds = {m["kind"]: m for m in rank0["models"]}
    assert set(kinds) == {"actor", "critic"}, list(kinds)
    for model in kinds.values():
        assert model["trainable"] and model["param_devices"] == ["cuda"], model
        assert model["master_dtypes"] == ["float32"] and model["optimizer_state_devices"] == ["cuda"], model
        assert model["forward"] and all(f["output_dtype"] == expected_dtype() for f in model["forward"]), model
