"""Helpers shared by the estimators: dtypes, token broadcasting, metrics, group indexing, whitening across ranks."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from plugrl.algorithms import group_mean_std, masked_mean
from plugrl.dist import is_distributed


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a float tensor of at least float32 precision (bf16/fp16/int/bool -> float32; float64 kept)."""
    if x.is_floating_point() and x.dtype.itemsize >= 4:
        return x
    return x.float()


def outcome_to_tokens(seq_values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast one value per sequence over its response tokens.

    ``seq_values`` [B], ``response_mask`` [B, T] -> [B, T] float32: ``seq_values[:, None] * mask``,
    so padding gets 0.
    """
    return seq_values.float().unsqueeze(-1) * response_mask.float()


def advantage_metrics(advantages: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """``adv/mean``, ``adv/max``, ``adv/min`` over response tokens (0 when there are none)."""
    with torch.no_grad():
        valid = response_mask.bool()
        if not bool(valid.any()):
            return {"adv/mean": 0.0, "adv/max": 0.0, "adv/min": 0.0}
        picked = advantages.float()[valid]
        return {
            "adv/mean": masked_mean(advantages, response_mask).item(),
            "adv/max": picked.max().item(),
            "adv/min": picked.min().item(),
        }


def zero_std_group_frac(scores: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups of two or more samples whose scores all agree (no group-relative signal).

    Single-sample groups are counted in the denominator but never as agreeing (GRPO gives
    them std 1, not 0). An empty batch gives 0.0.
    """
    with torch.no_grad():
        ids = torch.as_tensor(group_ids)
        if ids.numel() == 0:
            return 0.0
        _, std, size = group_mean_std(scores, ids)
        flat = (std == 0) & (size > 1)
        return torch.unique(ids[flat]).numel() / torch.unique(ids).numel()


# --------------------------------------------------------------------------- group indexing


def group_index(group_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``(inverse [B] int64, number of groups)``: sample b belongs to group ``inverse[b]`` in ``0..G-1``."""
    ids = torch.as_tensor(group_ids)
    if ids.dim() != 1:
        raise ValueError(f"group_ids must have shape [B], got {tuple(ids.shape)}")
    _, inverse = torch.unique(ids, return_inverse=True)
    return inverse, int(inverse.max().item()) + 1 if inverse.numel() else 0


# --------------------------------------------------------------------------- whitening across ranks

Reduce = Callable[[torch.Tensor], torch.Tensor]
"""Sums a 1-D float64 tensor of partial statistics over the ranks (element-wise); returns the totals."""


def identity_reduce(stats: torch.Tensor) -> torch.Tensor:
    """The :data:`Reduce` of a single process: the local statistics are the totals."""
    return stats


def distributed_sum() -> Reduce | None:
    """A :data:`Reduce` that all-reduces (SUM) over the default process group, or None when alone.

    Every rank must call the returned function the same number of times, in the same order (it
    is a collective). Under nccl the statistics travel through the current CUDA device.
    """
    if not is_distributed():
        return None

    def reduce(stats: torch.Tensor) -> torch.Tensor:
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = torch.device("cpu")
        buf = stats.detach().to(device=device, dtype=torch.float64).clone()
        dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        return buf.to(stats.device)

    return reduce


def global_masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, *, reduce: Reduce | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """``masked_whiten`` whose mean and variance span every rank's batch (``reduce``), not only this one.

    Shapes: ``x`` [B, T], ``mask`` [B, T] (1 on response tokens); returns [B, T] float32, 0 on padding.

    Formula, with ``N = sum(mask)``, ``S = sum(x * mask)`` and ``Q = sum((x - mu)^2 * mask)``, each
    summed over ranks by ``reduce`` (two calls: ``[S, N]``, then ``[Q]``)::

        mu  = S / N
        var = Q / (N - 1)                       # unbiased, as verl's masked_whiten
        out = (x - mu) / sqrt(var + eps) * mask

    With ``reduce=None`` (identity) this is ``plugrl.algorithms.masked_whiten(x, mask) * mask``.
    Statistics are accumulated in float64. Raises ValueError when all ranks together hold fewer
    than two response tokens (raised on every rank, after both reductions, so no rank is left
    waiting in a collective).
    """
    reduce = identity_reduce if reduce is None else reduce
    x = x.float()
    m = mask.to(torch.float64)
    x64 = x.to(torch.float64)
    keep = m != 0
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    local = torch.stack([torch.where(keep, x64 * m, zero).sum(), m.sum()])
    total, count = reduce(local).tolist()
    mean = total / count if count > 0 else 0.0
    centered = x64 - mean
    sq = reduce(torch.where(keep, centered * centered * m, zero).sum().reshape(1)).item()
    if count < 2:
        raise ValueError(
            f"whitening needs at least two response tokens over all ranks, got {count:g} "
            "(empty or one-token responses only?)"
        )
    var = sq / (count - 1)
    return torch.where(keep, centered * (var + eps) ** -0.5 * m, zero).float()
