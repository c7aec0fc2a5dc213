"""`plugrl train` (the same arguments, through plugrl.cli.main) that also reports, per process, what ran where.

Run alone or under torchrun; each rank writes ``$PLUGRL_GPU_PROBE_DIR/rank_<RANK>.json`` after training:

- for every model the trainer built (policy, critic, reference: each ``plugrl.actor.PackedModel``): whether it is
  an FSDP2 module, its parameter types (``DTensor`` when sharded), the dtype and device type of its master
  parameters (the local shards) and of its optimizer state, and, from a forward hook on its first
  ``nn.Linear``, the dtype and device of that layer's weight *during* forward and of its output. Under FSDP2's
  ``MixedPrecisionPolicy`` the weight is the gathered bf16 copy; under autocast it stays fp32 and only the
  output is bf16; with CPU offload the master shards are on the host and the gathered copy on the GPU;
- the process's peak CUDA memory (``torch.cuda.max_memory_allocated``), which a test outside cannot read;
- in an off-policy run, the CUDA device current in each thread that generated (``generation_devices``: [thread
  name, device index]), so a test sees the rollout thread of ``trainer.off_policy_steps`` generate on its rank's GPU.

The hook and the attribute reads use only public torch/nn API, not plugrl internals beyond the
``PackedModel`` class, ``.model`` and ``.optimizer``.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

MAX_FORWARD_RECORDS = 8


def _describe(packed) -> dict:
    import torch
    from torch.distributed.tensor import DTensor

    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # older torch
        FSDPModule = ()  # noqa: N806

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    params = list(packed.model.parameters())
    state = []
    if packed.optimizer is not None:
        state = [v for s in packed.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    return {
        "kind": packed.metric_prefix,
        "trainable": packed.optimizer is not None,
        "fsdp2": isinstance(packed.model, FSDPModule) if FSDPModule else False,
        "param_types": sorted({"DTensor" if isinstance(p, DTensor) else "Tensor" for p in params}),
        "master_dtypes": sorted({str(p.dtype).removeprefix("torch.") for p in params}),
        "param_devices": sorted({local(p).device.type for p in params}),
        "optimizer_state_devices": sorted({local(v).device.type for v in state}),
        "optimizer_state_dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in state}),
        "forward": packed._probe_forward,
    }


def _hook_first_linear(packed) -> None:
    import torch

    packed._probe_forward = []
    linear = next((m for m in packed.model.modules() if isinstance(m, torch.nn.Linear)), None)
    if linear is None:
        return

    def record(module, inputs, output):
        entry = {
            "weight_dtype": str(module.weight.dtype).removeprefix("torch."),
            "weight_device": module.weight.device.type,
            "output_dtype": str(output.dtype).removeprefix("torch."),
            "grad_enabled": torch.is_grad_enabled(),
        }
        if entry not in packed._probe_forward and len(packed._probe_forward) < MAX_FORWARD_RECORDS:
            packed._probe_forward.append(entry)

    linear.register_forward_hook(record)


def _record_generation_devices() -> set[tuple[str, int]]:
    """Wrap the trainer's generation in an off-policy run (what plugrl-off-policy's RolloutsAhead runs, on the
    calling thread or the rollout thread) to note the CUDA device current in the thread that runs it."""
    import threading

    import torch

    import plugrl_off_policy

    seen: set[tuple[str, int]] = set()
    original = plugrl_off_policy.RolloutsAhead.__init__

    @functools.wraps(original)
    def init(self, generate, *args, **kwargs):
        def noted(step):
            if torch.cuda.is_available():
                seen.add((threading.current_thread().name, torch.cuda.current_device()))
            return generate(step)

        original(self, noted, *args, **kwargs)

    plugrl_off_policy.RolloutsAhead.__init__ = init
    return seen


def main(argv: list[str]) -> int:
    import torch

    from plugrl import actor, cli

    built = []
    original = actor.PackedModel.__init__

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _hook_first_linear(self)
        built.append(self)

    actor.PackedModel.__init__ = init
    generation_devices = _record_generation_devices()
    code = cli.main(argv)
    report = {
        "rank": int(os.environ.get("RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "exit_code": code,
        "cuda": torch.cuda.is_available(),
        "models": [_describe(m) for m in built],
    }
    if torch.cuda.is_available():
        report["generation_devices"] = sorted(generation_devices)
        report["device_name"] = torch.cuda.get_device_name()
        report["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        report["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    out = os.environ.get("PLUGRL_GPU_PROBE_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"rank_{report['rank']}.json").write_text(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":  # vLLM may spawn processes: keep the guard
    sys.exit(main(sys.argv[1:]))
