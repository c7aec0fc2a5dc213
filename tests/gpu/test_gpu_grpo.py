"""The first GPU run: one GRPO step of SmolLM2-135M-Instruct in one process (HF rollout engine), then a resume."""

from __future__ import annotations

from gpu_checks import check_first_step, check_resolved_dtype, check_resumed_to_step_2, expected_dtype
from gpu_runs import GRPO_HF


def test_one_grpo_step_on_one_gpu_then_resume(plugrl_train, gpu_model):
    first = plugrl_train(GRPO_HF, steps=1, probe=True)
    # model.dtype=auto became bf16 (Ampere on) and the run's config.yaml records what ran
    check_resolved_dtype(first.run_dir)
    step1 = check_first_step(first.run_dir, gpu_model)

    # one process, no process group: the policy is a plain module on the GPU, fp32 master weights and AdamW
    # state there too, the forward computing in bf16 by autocast (the weights stay fp32)
    (rank0,) = first.probes
    assert rank0["exit_code"] == 0 and rank0["world_size"] == 1
    (policy,) = rank0["models"]
    assert policy["kind"] == "actor" and policy["trainable"]
    assert not policy["fsdp2"] and policy["param_types"] == ["Tensor"], policy
    assert policy["master_dtypes"] == ["float32"] and policy["param_devices"] == ["cuda"], policy
    assert policy["optimizer_state_devices"] == ["cuda"] and policy["optimizer_state_dtypes"] == ["float32"], policy
    assert policy["forward"], "the policy never ran a forward"
    for seen in policy["forward"]:
        assert seen["weight_device"] == "cuda" and seen["weight_dtype"] == "float32", seen
        assert seen["output_dtype"] == expected_dtype(), seen

    # the same command with total_steps=2 resumes from step 1's checkpoint and trains step 2
    second = plugrl_train(GRPO_HF, steps=2)
    check_resumed_to_step_2(second.run_dir, second.log, step1)
