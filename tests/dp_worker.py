"""Run by tests/test_fsdp.py under torchrun (or alone): one policy update on a fixed global batch,
each rank taking its contiguous share; rank 0 saves the updated full weights. With a 4th argument, that rank's
second forward raises an out-of-memory error (a fake: there is no GPU memory to exhaust here). For a tiny Qwen-VL
or Gemma 3 (tests/tiny_models.py) the batch has image prompts (:func:`vlm_global_batch`)."""

from __future__ import annotations

import os
import sys

import torch

from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, ModelConfig
from plugrl.dist import exit_worker, init_distributed


def global_batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    seqs, plens, groups = [], [], []
    for prompt_id in range(4):  # 4 prompts x 2 responses of different lengths
        prompt = torch.randint(5, 1000, (3 + prompt_id,), generator=g).tolist()
        for k in range(2):
            seqs.append(prompt + torch.randint(5, 1000, (2 + prompt_id + 3 * k,), generator=g).tolist())
            plens.append(len(prompt))
            groups.append(prompt_id)
    batch = TrainBatch.from_sequences(seqs, plens, group_ids=groups)
    batch.advantages = torch.randn(batch.response_mask.shape, generator=g) * batch.response_mask
    return batch


def vlm_global_batch(model: str) -> TrainBatch:
    """4 sequences of a tiny VLM's batch: two responses to a one-image prompt, one to a two-image prompt, one to a
    text prompt; with 2 ranks the second holds the two-image and the text prompt."""
    from pathlib import Path

    from transformers import AutoConfig

    from plugrl_vision import VisionProcessor
    from tiny_models import gemma3_batch, qwen_vl_batch

    if AutoConfig.from_pretrained(model).model_type == "gemma3":
        batch = gemma3_batch(VisionProcessor.load(model))[3]
    else:
        batch = qwen_vl_batch(Path(model))
    return batch.select([0, 1, 2, 4])


def main(model: str, out: str, mini_batches: int, oom_rank: int | None = None) -> None:
    info = init_distributed("cpu")
    from transformers import AutoConfig

    batch = vlm_global_batch(model) if hasattr(AutoConfig.from_pretrained(model), "vision_config") else global_batch()
    share = len(batch) // info.world_size
    local = batch.select(list(range(info.rank * share, (info.rank + 1) * share)))
    if info.world_size == 1 and mini_batches > 1:
        # a mini-batch of 2 ranks holds the m-th chunk of each rank's share: order one process's batch alike
        half, chunk = len(batch) // 2, len(batch) // 2 // mini_batches
        order = [r * half + m * chunk + i for m in range(mini_batches) for r in range(2) for i in range(chunk)]
        local = batch.select(order)
    # eps 1e-6, not 1e-8: Adam's first step is lr * g / (|g| + eps), so an element whose true gradient is ~0
    # (float noise of 1e-9 on one side, 3e-9 on the other) would move by a different part of lr on each side
    actor = ActorConfig(
        optim={"lr": 1e-3, "eps": 1e-6},
        ppo_max_token_len_per_gpu=24,  # several micro-batches per rank
        # a VLM's vision encoder trains too (it then gets a blank image in micro-batches without images)
        freeze_vision_tower=os.environ.get("PLUGRL_TEST_TRAIN_VISION_TOWER") != "1",
    )
    # float32: the ranks and one process are compared exactly (`auto` is bf16 on CPUs with bf16 kernels)
    policy = PolicyModel(model, ModelConfig(path=model, dtype="float32"), actor, info.device)
    grads = []  # the full gradient at each optimizer step (Adam hides scale errors in the weights)

    def capture(*_):
        grads.append(
            {
                n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
                for n, p in policy.model.named_parameters()
                if p.grad is not None  # a VLM's frozen vision encoder has none
            }
        )

    policy.optimizer.register_step_pre_hook(capture)
    if info.rank == oom_rank:
        from test_actor import _OOMAbove

        _OOMAbove(policy.model, at_calls=(2,))
    initial = {n: w.clone() for n, w in policy.named_full_parameters()}
    policy.update(local, num_mini_batches=mini_batches, temperature=1.0, norm_length=16)
    weights = dict(policy.named_full_parameters())
    if info.rank == 0:
        torch.save({"initial": initial, "weights": weights, "grads": grads}, out)
    exit_worker()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
