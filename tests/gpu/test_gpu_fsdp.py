"""FSDP2 on GPUs under torchrun (min(2, GPUs) processes; one rank still shards: plugrl makes a process group
whenever torchrun starts it): bf16 by FSDP2's MixedPrecisionPolicy, without and with CPU offload; one step,
checkpoint, resume to step 2."""

from __future__ import annotations

import pytest
from gpu_checks import check_first_step, check_resolved_dtype, check_resumed_to_step_2, expected_dtype
from gpu_runs import FSDP_HF, FSDP_OFFLOAD_HF


@pytest.mark.parametrize("scenario", [FSDP_HF, FSDP_OFFLOAD_HF], ids=["no-offload", "param-offload"])
def test_fsdp2_step_checkpoint_and_resume_under_torchrun(plugrl_train, gpu_model, scenario):
    import torch

    nproc = min(2, torch.cuda.device_count())
    offload = scenario is FSDP_OFFLOAD_HF
    first = plugrl_train(scenario, steps=1, nproc=nproc, probe=True)
    assert "offload is ignored" not in first.log, "FSDP2 did not apply: the offload setting was ignored"
    check_resolved_dtype(first.run_dir)
    step1 = check_first_step(first.run_dir, gpu_model, world_size=nproc)

    assert [p["rank"] for p in first.probes] == list(range(nproc)), "a rank wrote no probe report"
    shards = "cpu" if offload else "cuda"
    for rank in first.probes:
        assert rank["exit_code"] == 0 and rank["world_size"] == nproc, rank
        (policy,) = rank["models"]
        # an FSDP2 module whose parameters are DTensor shards: fp32 masters, in host memory with CPU offload
        assert policy["fsdp2"] and policy["param_types"] == ["DTensor"], policy
        assert policy["master_dtypes"] == ["float32"] and policy["param_devices"] == [shards], policy
        assert policy["optimizer_state_devices"] == [shards] and policy["optimizer_state_dtypes"] == ["float32"]
        # MixedPrecisionPolicy: during forward a layer's weight is the gathered bf16 copy on the GPU (autocast
        # would leave it fp32), with offload too
        assert policy["forward"], f"rank {rank['rank']}: the policy never ran a forward"
        for seen in policy["forward"]:
            assert seen["weight_device"] == "cuda", seen
            assert seen["weight_dtype"] == seen["output_dtype"] == expected_dtype(), seen

    second = plugrl_train(scenario, steps=2, nproc=nproc)
    check_resumed_to_step_2(second.run_dir, second.log, step1)
