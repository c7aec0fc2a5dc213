"""Run by tests/test_tp.py: log-probs, entropy, the policy loss, gradients and one update of a policy,
either in one process (tp_size=1, called in-process) or under torchrun with tensor parallelism over
TP_SIZE ranks (default: all), each data-parallel group taking its contiguous share of the batch;
with --critic-ref also a critic's values and update and a frozen reference's log-probs (measure_critic_ref);
rank 0 saves what it measured."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from dp_worker import global_batch
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, CriticConfig, ModelConfig
from plugrl.critic import ValueModel
from plugrl.dist import exit_worker, init_distributed
from tiny_models import qwen_vl_batch

TEMPERATURE = 0.7


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def measure(model: str, tp_size: int, device: torch.device, dp_rank: int = 0, dp_size: int = 1) -> dict:
    if (Path(model) / "preprocessor_config.json").is_file():  # a tiny Qwen-VL: image prompts and a text one
        batch = qwen_vl_batch(Path(model))
    else:
        batch = global_batch()  # 4 prompts x 2 responses, shared prompts packed once
    g = torch.Generator().manual_seed(1)  # old and reference log-probs off the current ones: ratios clip
    noise = torch.randn(batch.response_mask.shape, generator=g) * 0.3
    share = len(batch) // dp_size
    rows = list(range(dp_rank * share, (dp_rank + 1) * share))
    batch, noise = batch.select(rows), noise[rows]
    actor = ActorConfig(
        tp_size=tp_size,
        optim={"lr": 1e-3},
        ppo_max_token_len_per_gpu=24,  # several micro-batches
        entropy_coeff=0.01,  # the entropy's gradient is part of the loss
        use_kl_loss=True,
    )
    policy = PolicyModel(model, ModelConfig(path=model, dtype="float32"), actor, device)
    logprobs = policy.compute_logprobs(batch, TEMPERATURE, token_budget=24)
    with torch.no_grad():
        _, entropy = policy._forward(batch, list(range(len(batch))), TEMPERATURE, with_entropy=True)
    batch.old_logprobs = (logprobs + noise) * batch.response_mask
    batch.ref_logprobs = (logprobs - noise) * batch.response_mask
    grads = capture_grads(policy)
    metrics = policy.update(batch, num_mini_batches=1, temperature=TEMPERATURE, norm_length=16)
    return {
        "logprobs": logprobs,
        "entropy": entropy * batch.response_mask,
        "metrics": metrics,
        "grads": grads[0],
        "weights": dict(policy.named_full_parameters()),
    }


def capture_grads(model) -> list[dict[str, torch.Tensor]]:
    """Full gradients of ``model`` (a PackedModel) at each optimizer step, in order."""
    grads = []
    step = model.optimizer.step

    def capture_then_step(*args, **kwargs):
        grads.append({n: full(p.grad) for n, p in model.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    model.optimizer.step = capture_then_step
    return grads


def measure_critic_ref(model: str, tp_size: int, device: torch.device) -> dict:
    """A critic (the trunk with a replicated scalar head): its values, one clipped value-regression update
    (its metrics and gradients); and a frozen reference policy's log-probs, as the trainer builds them."""
    batch = global_batch()
    g = torch.Generator().manual_seed(2)
    # the value head is not in the checkpoint: every process initialises it alike (the trainer seeds all ranks)
    torch.manual_seed(0)
    critic = ValueModel(
        model,
        ModelConfig(path=model, dtype="float32"),
        CriticConfig(optim={"lr": 1e-3}, ppo_max_token_len_per_gpu=24, cliprange_value=0.05),
        device,
        tp_size=tp_size,
    )
    # no dropout anywhere (build_model sets classifier_dropout=0): masks would differ per rank and run
    assert all(m.p == 0.0 for m in critic.model.modules() if isinstance(m, torch.nn.Dropout))
    values = critic.compute_values(batch)
    mask = batch.response_mask
    batch.old_values = (values + torch.randn(mask.shape, generator=g) * 0.1) * mask  # some clip (0.05)
    batch.returns = (values + torch.randn(mask.shape, generator=g)) * mask
    grads = capture_grads(critic)
    metrics = critic.update(batch, num_mini_batches=1, epochs=1, norm_length=16)
    ref = PolicyModel(
        model, ModelConfig(path=model, dtype="float32"), ActorConfig(tp_size=tp_size), device, trainable=False
    )
    return {
        "values": values,
        "critic_metrics": metrics,
        "critic_grads": grads[0],
        "ref_logprobs": ref.compute_logprobs(batch, TEMPERATURE, token_budget=24),
    }


def main(out: str, models: list[str]) -> None:
    critic_ref = "--critic-ref" in models
    models = [m for m in models if m != "--critic-ref"]
    info = init_distributed("cpu", tp_size=int(os.environ.get("TP_SIZE", os.environ.get("WORLD_SIZE", "1"))))
    results = {m: measure(m, info.tp_size, info.device, info.dp_rank, info.dp_size) for m in models}
    if critic_ref:  # on the first model: the critic's head and the reference do not depend on the architecture
        results["critic_ref"] = measure_critic_ref(models[0], info.tp_size, info.device)
    if info.rank == 0:
        torch.save(results, out)
    exit_worker()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
