"""OPO: on-policy RL with the length-weighted optimal reward baseline (Hao et al. 2025, arXiv 2505.23585)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult
from plugrl.specs import advantage_estimator

from ..common import advantage_metrics, group_index, outcome_to_tokens, zero_std_group_frac

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def opo_outcome_advantage(scores: torch.Tensor, lengths: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """OPO advantage, one value per sequence (as verl's ``compute_opo_outcome_advantage``).

    Shapes: ``scores`` [B] sequence rewards, ``lengths`` [B] response lengths (tokens),
    ``group_ids`` [B]; returns [B] float32, without gradient.

    Formula, for sample i of a group g of n >= 2 samples::

        b_g = sum_{j in g} len_j * r_j / sum_{j in g} len_j
        A_i = r_i - b_g

    (the variance-minimising baseline when the squared gradient norm of a response grows with
    its length). A group of one uses ``b = 0``, so ``A_i = r_i`` (as verl). A group whose
    responses are all empty gets ``b = 0`` (verl divides 0 by 0) unless its rewards agree. A group
    whose rewards all agree gets exactly 0.
    """
    with torch.no_grad():
        s = scores.detach().float()
        length = torch.as_tensor(lengths, device=s.device).float()
        if s.dim() != 1 or length.shape != s.shape:
            raise ValueError(
                f"scores and lengths must both have shape [B], got {tuple(s.shape)}, {tuple(length.shape)}"
            )
        inverse, num_groups = group_index(group_ids)
        inverse = inverse.to(s.device)
        zeros = s.new_zeros(num_groups)
        weighted = zeros.index_add(0, inverse, length * s)
        total_len = zeros.index_add(0, inverse, length)
        size = zeros.index_add(0, inverse, torch.ones_like(s))
        hi = zeros.scatter_reduce(0, inverse, s, reduce="amax", include_self=False)
        lo = zeros.scatter_reduce(0, inverse, s, reduce="amin", include_self=False)
        baseline = torch.where(total_len > 0, weighted / total_len.clamp_min(1e-8), zeros)
        baseline = torch.where(hi == lo, hi, baseline)  # agreeing rewards: exactly their value, no rounding
        baseline = torch.where(size > 1, baseline, zeros)
        return s - baseline[inverse]


@advantage_estimator("opo")
def opo(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """OPO: :func:`opo_outcome_advantage` with lengths from the response mask, on every response token.

    ``returns`` are the advantages (as verl). Reads no ``algorithm`` key. OPO's paper also trains
    strictly on-policy (one PPO epoch, one mini-batch: ``data.train_batch_size`` equal to
    ``actor.ppo_mini_batch_size``), which the run config sets. Metrics: ``adv/mean``, ``adv/max``,
    ``adv/min``, ``adv/std_groups_zero_frac``.
    """
    with torch.no_grad():
        scores = batch.scores
        lengths = (batch.response_mask != 0).sum(-1)
        seq_adv = opo_outcome_advantage(scores, lengths, batch.group_ids)
        advantages = outcome_to_tokens(seq_adv, batch.response_mask)
        metrics = advantage_metrics(advantages, batch.response_mask)
        metrics["adv/std_groups_zero_frac"] = zero_std_group_frac(scores, batch.group_ids)
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)
