"""LoRA (examples/countdown_grpo_lora.yaml) for one step on one GPU: only the adapters train, on the GPU, and the
checkpoint holds them in PEFT format."""

from __future__ import annotations

import json

from gpu_checks import check_resolved_dtype, expected_dtype
from gpu_runs import LORA_HF, PROMPTS_PER_STEP, ROLLOUT_N, check_step_metrics, metrics


def test_lora_adapters_train_on_one_gpu(plugrl_train, gpu_model):
    import torch
    from safetensors.torch import load_file

    run = plugrl_train(LORA_HF, steps=1, probe=True)
    check_resolved_dtype(run.run_dir)
    (step1,) = metrics(run.run_dir)
    check_step_metrics(step1)
    assert (
        len((run.run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()) == PROMPTS_PER_STEP * ROLLOUT_N
    )

    # the checkpoint holds the adapters (PEFT format), not the 135M base weights
    ckpt = run.run_dir / "checkpoints" / "step_000001"
    assert (ckpt / "manifest.json").is_file(), f"no complete checkpoint in {ckpt}"
    assert not (ckpt / "policy" / "model.safetensors").exists(), "a LoRA checkpoint saved the full weights"
    adapter = ckpt / "policy_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 16 and config["lora_alpha"] == 32, config
    weights = load_file(adapter / "adapter_model.safetensors")
    assert weights and all(torch.isfinite(w).all() for w in weights.values())
    # PEFT starts every lora_B at zero: a non-zero one is the step's update
    b = {k: w for k, w in weights.items() if "lora_B" in k}
    assert b and any(w.abs().max() > 0 for w in b.values()), "no lora_B moved off zero in the first step"

    # the adapters train on the GPU in fp32 with their AdamW state there; the forward computes in bf16
    (rank0,) = run.probes
    (policy,) = rank0["models"]
    assert policy["trainable"] and policy["param_devices"] == ["cuda"], policy
    assert policy["optimizer_state_devices"] == ["cuda"] and policy["optimizer_state_dtypes"] == ["float32"], policy
    assert policy["forward"] and all(f["output_dtype"] == expected_dtype() for f in policy["forward"]), policy
