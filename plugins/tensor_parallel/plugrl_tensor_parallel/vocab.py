"""Log-probs and entropy from vocabulary-sharded logits, the LM head's output under tensor parallelism.

Each rank of the TP group holds logits [N, V / tp] for its contiguous vocabulary shard (rank t: ids
[t * V / tp, (t + 1) * V / tp)); nothing gathers them. The forwards all-reduce three [N] vectors (max, sum of exps,
the target logit or the sum of p * z); their results are the same on every rank of the group, as is everything
computed from them after, so each rank receives the full upstream gradient and the backwards are local:
d log p(y) / dz_v = [v = y] - p_v and dH / dz_v = -p_v (z_v - E_p[z]). (The gradient of the hidden states is
completed by the LM head's own all-reduce.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


def _max_and_sumexp(x: torch.Tensor, group: ProcessGroup) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(shifted logits z - max z [N, Vl], global max [N], global sum of exp(shifted) [N])."""
    m = x.max(dim=-1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shifted = x - m.unsqueeze(-1)
    sumexp = shifted.exp().sum(dim=-1)
    dist.all_reduce(sumexp, group=group)
    return shifted, m, sumexp


class _VocabParallelLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, group):
        x = logits.float()
        shifted, _, sumexp = _max_and_sumexp(x, group)
        width = x.shape[-1]
        local = labels.long() - dist.get_rank(group) * width
        owned = (local >= 0) & (local < width)
        local = local.clamp(0, width - 1)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
        picked = torch.where(owned, picked, torch.zeros_like(picked))  # not * owned: -inf * 0 is NaN
        dist.all_reduce(picked, group=group)
        ctx.save_for_backward(shifted, sumexp, local, owned)
        ctx.dtype = logits.dtype
        return picked - sumexp.log()

    @staticmethod
    def backward(ctx, grad):
        shifted, sumexp, local, owned = ctx.saved_tensors
        out = shifted.exp().div_(sumexp.unsqueeze(-1)).mul_(-grad.unsqueeze(-1))
        out.scatter_add_(-1, local.unsqueeze(-1), (grad * owned).unsqueeze(-1))
        return out.to(ctx.dtype), None, None


class _VocabParallelEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, group):
        x = logits.float()
        shifted, _, sumexp = _max_and_sumexp(x, group)
        e = shifted.exp()
        # exp(-inf) * -inf is NaN: a -inf logit contributes 0
        weighted = torch.where(e > 0, e * shifted, torch.zeros_like(e)).sum(dim=-1)
        dist.all_reduce(weighted, group=group)
        mean_shifted = weighted / sumexp  # E_p[z] - max z
        ctx.save_for_backward(shifted, sumexp, mean_shifted)
        ctx.dtype = logits.dtype
        return sumexp.log() - mean_shifted

    @staticmethod
    def backward(ctx, grad):
        shifted, sumexp, mean_shifted = ctx.saved_tensors
        p = shifted.exp().div_(sumexp.unsqueeze(-1))
        centred = torch.where(p > 0, shifted - mean_shifted.unsqueeze(-1), torch.zeros_like(p))
        return (-p * centred * grad.unsqueeze(-1)).to(ctx.dtype), None


def vocab_parallel_logprobs(logits: torch.Tensor, labels: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """log p(label) under softmax over the full vocabulary, from this rank's vocabulary shard: ``logits``
    [N, V / tp] (this rank's contiguous shard, any float dtype), ``labels`` [N] global token ids; returns [N]
    float32, equal on every rank of ``group``. ``z_y - max - log sum_v exp(z_v - max)``, the max and the sum
    all-reduced, ``z_y`` from the rank that owns ``y``. Differentiable.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} does not match logits shape {tuple(logits.shape)} "
            "without its last (vocabulary) dimension"
        )
    return _VocabParallelLogprob.apply(logits, labels, group)


def vocab_parallel_entropy(logits: torch.Tensor, group: ProcessGroup) -> torch.Tensor:
    """Entropy of softmax over the full vocabulary, from this rank's vocabulary shard: ``logits`` [N, V / tp];
    returns [N] float32, equal on every rank of ``group``. ``H = logsumexp(z) - sum_v p_v z_v`` on ``z - max``
    (all-reduced max, sum of exps and sum of ``exp * z``); ``-inf`` logits contribute 0. Differentiable.
    """
    return _VocabParallelEntropy.apply(logits, group)


class VocabParallel:
    """:mod:`plugrl.algorithms`' ``logprobs_from_logits`` / ``logprobs_and_entropy`` for logits whose
    vocabulary is sharded over the TP ``group`` (same signatures, same results)."""

    def __init__(self, group: ProcessGroup) -> None:
        self.group = group

    def logprobs_from_logits(
        self, logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor:
        if temperature != 1.0:
            logits = logits / temperature
        return vocab_parallel_logprobs(logits, labels, self.group)

    def logprobs_and_entropy(
        self, logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if temperature != 1.0:
            logits = logits / temperature
        logp = vocab_parallel_logprobs(logits, labels, self.group)
        if entropy_grad:
            return logp, vocab_parallel_entropy(logits, self.group)
        with torch.no_grad():
            return logp, vocab_parallel_entropy(logits.detach(), self.group)
