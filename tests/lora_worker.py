"""Run by tests/test_lora.py under torchrun (1 or 2 ranks) or alone: a LoRA policy (FSDP2 under torchrun) takes
one update on a fixed global batch, each rank its contiguous share (tests/dp_worker.py's batch), then saves a
checkpoint, loads it into a fresh policy and takes one more update on both. Rank 0 writes what the test checks:
trainable and optimizer parameter names, log-probs with and without adapters, the merged weights the engine
would get, the adapter, and both second updates' adapters. A 3rd argument "offload" sets
actor.fsdp_config.param_offload."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from dp_worker import global_batch
from plugrl import checkpoint
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ModelConfig
from plugrl.dist import exit_worker, init_distributed
from plugrl_lora import adapters as lora

R, ALPHA = 4, 8.0


def make_policy(model: str, device, offload: bool) -> PolicyModel:
    actor = ActorConfig(
        optim={"lr": 1e-2, "eps": 1e-6},  # a big step: lora_B leaves zero at once
        ppo_max_token_len_per_gpu=24,  # several micro-batches per rank
        lora={"r": R, "alpha": ALPHA},
        fsdp_config={"param_offload": offload},
    )
    return PolicyModel(model, ModelConfig(path=model, dtype="float32"), actor, device)


def main(model: str, out: str, mode: str = "") -> None:
    from transformers import AutoTokenizer

    info = init_distributed("cpu")
    torch.manual_seed(0)  # as the trainer's seed_everything: the adapters' init follows the seed
    offload = mode == "offload"
    batch = global_batch()
    share = len(batch) // info.world_size
    local = batch.select(list(range(info.rank * share, (info.rank + 1) * share)))
    policy = make_policy(model, info.device, offload)
    names = {id(p): n for n, p in policy.model.named_parameters()}
    result = {
        "world": info.world_size,
        "trainable": sorted(n for n, p in policy.model.named_parameters() if p.requires_grad),
        "optimized": sorted(names[id(p)] for g in policy.optimizer.param_groups for p in g["params"]),
        "sharded": type(policy.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight).__name__,
        "before": policy.compute_logprobs(batch, 1.0, 64),
    }
    policy.update(local, num_mini_batches=1, temperature=1.0, norm_length=16)
    result["after"] = policy.compute_logprobs(batch, 1.0, 64)
    result["ref"] = policy.compute_logprobs(batch, 1.0, 64, adapters=False)
    result["merged"] = {n: t.cpu() for n, t in policy.named_full_parameters()}
    result["adapter"] = lora.adapter_state(policy.model, info.device)

    run_dir = Path(out).with_suffix(".run")
    tokenizer = AutoTokenizer.from_pretrained(model)
    ckpt = checkpoint.save_checkpoint(run_dir, 1, policy, tokenizer, {"data": {}}, keep=2, rank=info.rank)
    resumed = make_policy(model, info.device, offload)
    checkpoint.load_checkpoint(ckpt, resumed, info.rank)
    result["resumed_after"] = resumed.compute_logprobs(batch, 1.0, 64)
    for key, p in (("second", policy), ("resumed_second", resumed)):
        p.update(local, num_mini_batches=1, temperature=1.0, norm_length=16)
        result[key] = lora.adapter_state(p.model, info.device)
    result["ckpt"] = str(ckpt)
    if info.rank == 0:
        torch.save(result, out)
    exit_worker()


if __name__ == "__main__":
    main(*sys.argv[1:])
