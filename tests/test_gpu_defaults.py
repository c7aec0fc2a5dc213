"""What plugrl chooses when it finds a GPU, checked without one: the CUDA answers of torch are substituted.

The process group's backends, the dtype ``auto`` resolves to, the host-heap setting, and the process group
made for a single rank under torchrun (so FSDP2's offload and mixed precision reach a one-GPU run). The vLLM
engine's GPU arguments are tested in test_vllm_engine.py, device placement in test_device_discipline.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from plugrl import dist as pdist
from plugrl import hostmem, precision
from plugrl.config import Config, TrainerConfig


def test_gpus_get_nccl_for_cuda_tensors_and_gloo_for_offloaded_host_ones():
    assert pdist.backend_for("cuda") == "cpu:gloo,cuda:nccl"
    assert pdist.backend_for("cpu") == "gloo"


def test_model_dtype_defaults_to_auto_and_auto_is_bf16_on_an_ampere_gpu(monkeypatch):
    assert Config.model_fields["model"].annotation.model_fields["dtype"].default == "auto"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert precision.resolve_dtype("auto", "cuda") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)  # a V100
    assert precision.resolve_dtype("auto", "cuda") == "float32"


def test_the_host_heap_is_kept_on_cpu_runs_only_unless_set():
    assert TrainerConfig().keep_freed_host_memory is None
    assert hostmem.wanted(None, "cpu") and not hostmem.wanted(None, "cuda")
    assert hostmem.wanted(True, "cuda") and not hostmem.wanted(False, "cpu")


def test_torchrun_with_one_rank_makes_a_process_group_with_the_configured_timeout(monkeypatch):
    """One GPU under torchrun still gets FSDP2 (CPU offload needs it), so the group is made for one rank too;
    trainer.dist_timeout_s reaches it and the gloo group ranks wait in for rank 0's checkpoint writes."""
    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(kw))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    info = pdist.init_distributed("cpu", timeout_s=120)
    assert calls == [{"backend": "gloo", "timeout": timedelta(seconds=120)}]
    assert info.world_size == 1 and info.device == torch.device("cpu")
    assert TrainerConfig().dist_timeout_s == 1800
    monkeypatch.delenv("WORLD_SIZE")
    calls.clear()
    pdist.init_distributed("cpu")
    assert calls == []  # a plain `plugrl train`: no process group


@pytest.mark.parametrize("bad", [0, -5])
def test_a_non_positive_timeout_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="dist_timeout_s"):
        TrainerConfig(dist_timeout_s=bad)
