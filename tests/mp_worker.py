"""Run by tests/test_fsdp.py: the policy in bf16, under torchrun (FSDP2's mixed precision) or alone (autocast).

Records what the test checks: which ranks read the model files, the dtypes the forward computes in and the
master weights, gradients and optimizer states are kept in, the log-probs before and after one update, and
the weights the engine would receive. Rank 0 (or the lone process) saves them to the path given.
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from dp_worker import global_batch
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ModelConfig
from plugrl.dist import exit_worker, gather_objects, init_distributed


def main(model: str, out: str) -> None:
    info = init_distributed("cpu")
    reads = []
    load = AutoModelForCausalLM.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        reads.append(info.rank)
        return load(cls, *args, **kwargs)

    AutoModelForCausalLM.from_pretrained = classmethod(counted)
    actor = ActorConfig(optim={"lr": 1e-3, "eps": 1e-6}, ppo_max_token_len_per_gpu=24)
    policy = PolicyModel(model, ModelConfig(path=model, dtype="bfloat16"), actor, info.device)
    forward_dtypes = set()
    proj = policy.model.model.layers[0].self_attn.q_proj
    proj.register_forward_hook(lambda m, args, output: forward_dtypes.add((m.weight.dtype, output.dtype)))
    grad_dtypes = set()
    policy.optimizer.register_step_pre_hook(
        lambda *_: grad_dtypes.update(p.grad.dtype for p in policy.model.parameters() if p.grad is not None)
    )
    batch = global_batch()
    share = len(batch) // info.world_size
    local = batch.select(list(range(info.rank * share, (info.rank + 1) * share)))
    before = policy.compute_logprobs(local, 1.0, 24)
    local.advantages = batch.advantages[info.rank * share : (info.rank + 1) * share]
    policy.update(local, num_mini_batches=1, temperature=1.0, norm_length=16)
    after = policy.compute_logprobs(local, 1.0, 24)
    bf16 = dict(policy.named_full_parameters(torch.bfloat16))
    full = dict(policy.named_full_parameters())
    record = {
        "reads": sorted(r for part in gather_objects(reads) for r in part),
        "mixed_precision": policy.mixed_precision,
        "forward_dtypes": sorted(str(d) for pair in forward_dtypes for d in pair),
        "grad_dtypes": sorted(str(d) for d in grad_dtypes),
        "master_dtypes": sorted({str(p.dtype) for p in policy.model.parameters()}),
        "optim_dtypes": sorted(
            {str(v.dtype) for s in policy.optimizer.state.values() for v in s.values() if v.dim() > 0}
        ),
        "before": torch.cat(gather_objects(before)),
        "after": torch.cat(gather_objects(after)),
        "bf16": bf16,
        "full": full,
    }
    if info.rank == 0:
        torch.save(record, out)
    exit_worker()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
