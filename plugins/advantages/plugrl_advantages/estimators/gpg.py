"""GPG: group policy gradient (Chu et al. 2025, arXiv 2504.02546)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult, group_mean_std
from plugrl.specs import advantage_estimator

from ..common import Reduce, advantage_metrics, distributed_sum, outcome_to_tokens, zero_std_group_frac

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def gpg_outcome_advantage(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    f_norm: float = 1.0,
    reduce: Reduce | None = None,
) -> tuple[torch.Tensor, float]:
    """GPG advantage, one value per sequence (as verl's ``compute_gpg_outcome_advantage``).

    Shapes: ``scores`` [B] sequence rewards, ``group_ids`` [B]; returns ``(advantages [B] float32,
    alpha)``, without gradient.

    Formula, for sample i of group g::

        alpha = B / max(M, 1)        # B = samples in the batch, M = samples whose score is non-zero
        A_i   = alpha * (r_i - mean_g) / f_norm

    A group of one uses ``mean = 0`` (``A_i = alpha * r_i``), as verl; a group whose rewards all
    agree gets exactly 0. ``alpha`` re-weights the batch so the gradient is not diluted by
    samples that carry none; verl counts non-zero *scores* for M (the paper's "valid samples").
    B and M are counted over this rank's batch when ``reduce`` is None, over all ranks with a
    summing :data:`~plugrl_advantages.common.Reduce` (one call, with ``[B, M]``), as verl's global
    batch. ``f_norm`` is verl's default 1.
    """
    with torch.no_grad():
        s = scores.detach().float()
        counts = torch.tensor([float(s.numel()), float(torch.count_nonzero(s).item())], dtype=torch.float64)
        if reduce is not None:
            counts = reduce(counts)
        total, nonzero = counts.tolist()
        alpha = total / max(nonzero, 1.0)
        mean, _, size = group_mean_std(s, group_ids)
        mean = torch.where(size > 1, mean, torch.zeros_like(mean))
        return alpha * (s - mean) / f_norm, alpha


@advantage_estimator("gpg")
def gpg(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """GPG: :func:`gpg_outcome_advantage` of the sequence scores, on every response token.

    ``alpha`` counts samples over all ranks under torch.distributed (an all-reduce, called on
    every rank). ``returns`` are the advantages (as verl). Reads no ``algorithm`` key. The GPG
    paper pairs it with the plain policy-gradient loss ``-A * log pi`` (verl's ``loss_mode: gpg``);
    the kernel's clipped surrogate has the same gradient when the update is on-policy (one PPO
    epoch, one mini-batch: ratio 1, nothing clipped). Metrics: ``adv/mean``, ``adv/max``, ``adv/min``,
    ``adv/std_groups_zero_frac``, ``adv/gpg_alpha``.
    """
    with torch.no_grad():
        scores = batch.scores
        seq_adv, alpha = gpg_outcome_advantage(scores, batch.group_ids, reduce=distributed_sum())
        advantages = outcome_to_tokens(seq_adv, batch.response_mask)
        metrics = advantage_metrics(advantages, batch.response_mask)
        metrics["adv/std_groups_zero_frac"] = zero_std_group_frac(scores, batch.group_ids)
        metrics["adv/gpg_alpha"] = float(alpha)
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)
