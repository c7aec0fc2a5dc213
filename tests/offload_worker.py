"""Run by tests/test_offload.py under torchrun: one policy update on dp_worker's fixed global batch with
FSDP2 CPU offload and/or gradient checkpointing on or off; rank 0 saves the updated full weights and
every rank's memory measurements.

Measured per rank (all on the host, since the "device" is the CPU here):
- bytes of sharded parameters, gradients and AdamW state by the device they live on
  (``torch.Tensor.device``), after the update;
- the peak bytes of activations held for backward during the update (live storages of the non-parameter
  tensors autograd saves, through ``saved_tensors_hooks``), which gradient checkpointing lowers: with it
  a decoder layer saves nothing in forward (it keeps only its input, not counted here, and recomputes);
- peak RSS of the process (``ru_maxrss``) before and after the update.
"""

from __future__ import annotations

import resource
import sys
import weakref

import torch

from dp_worker import global_batch
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ModelConfig
from plugrl.dist import exit_worker, gather_objects, init_distributed


def _bytes_by_device(tensors) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        out[local.device.type] = out.get(local.device.type, 0) + local.numel() * local.element_size()
    return out


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def main(model: str, out: str, param_offload: bool, checkpointing: bool) -> None:
    info = init_distributed("cpu")
    batch = global_batch()
    share = len(batch) // info.world_size
    local = batch.select(list(range(info.rank * share, (info.rank + 1) * share)))
    actor = ActorConfig(
        optim={"lr": 1e-3},
        ppo_max_token_len_per_gpu=24,
        fsdp_config={"param_offload": param_offload, "optimizer_offload": param_offload},
    )
    model_cfg = ModelConfig(path=model, enable_gradient_checkpointing=checkpointing)
    policy = PolicyModel(model, model_cfg, actor, info.device)

    grad_bytes: dict[str, int] = {}
    step = policy.optimizer.step

    def measure_then_step(*args, **kwargs):  # gradients exist between backward and zero_grad only
        grad_bytes.update(_bytes_by_device(p.grad for p in policy.model.parameters() if p.grad is not None))
        return step(*args, **kwargs)

    policy.optimizer.step = measure_then_step
    live: dict[int, list[int]] = {}  # storage pointer -> [bytes, saved tensors using it]
    totals = {"now": 0, "peak": 0}

    def release(ptr: int) -> None:
        entry = live[ptr]
        entry[1] -= 1
        if not entry[1]:
            totals["now"] -= entry[0]
            del live[ptr]

    def pack(t: torch.Tensor):
        base = t if t._base is None else t._base
        if base.is_leaf and base.requires_grad:  # a parameter or a view of one (the head's W^T): not an activation
            return t
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in live:
            live[ptr][1] += 1
        else:
            live[ptr] = [storage.nbytes(), 1]
            totals["now"] += storage.nbytes()
            totals["peak"] = max(totals["peak"], totals["now"])
        weakref.finalize(t, release, ptr)  # autograd drops the saved tensor after its backward
        return t

    rss_before = _peak_rss_mib()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        policy.update(local, num_mini_batches=1, temperature=1.0, norm_length=16)
    rss_after = _peak_rss_mib()
    params = [p for p in policy.model.parameters()]
    state = [v for s in policy.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    report = {
        "rank": info.rank,
        "param_bytes": _bytes_by_device(params),
        "grad_bytes": grad_bytes,
        "optimizer_state_bytes": _bytes_by_device(state),
        "activation_bytes_peak": totals["peak"],
        "peak_rss_mib_before_update": round(rss_before, 1),
        "peak_rss_mib_after_update": round(rss_after, 1),
    }
    reports = gather_objects(report)
    weights = dict(policy.named_full_parameters())
    if info.rank == 0:
        torch.save({"weights": weights, "reports": reports}, out)
    exit_worker()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1")
