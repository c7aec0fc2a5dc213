"""RLOO: REINFORCE with a leave-one-out baseline (Ahmadian et al. 2024, arXiv 2402.14740)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult, group_mean_std
from plugrl.specs import advantage_estimator

from ..common import advantage_metrics, outcome_to_tokens, zero_std_group_frac

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def rloo_outcome_advantage(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantage, one value per sequence (as verl's ``compute_rloo_outcome_advantage``).

    Shapes: ``scores`` [B] sequence rewards, ``group_ids`` [B] (samples of one prompt share an id);
    returns [B] float32, without gradient.

    Formula, for sample i of a group g of n >= 2 samples::

        A_i = r_i - (sum_{j in g, j != i} r_j) / (n - 1)      # r_i minus the mean of the others
            = n / (n - 1) * (r_i - mean_g)                    # verl's form, computed this way

    A group of one sample keeps its reward, ``A_i = r_i`` (verl leaves it unchanged; it has no
    other sample to compare with). A group whose rewards all agree gets exactly 0.
    """
    with torch.no_grad():
        s = scores.detach().float()
        mean, _, size = group_mean_std(s, group_ids)
        n = size.to(s.dtype)
        loo = (s - mean) * n / (n - 1).clamp_min(1)
        return torch.where(size > 1, loo, s)


@advantage_estimator("rloo")
def rloo(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """RLOO: :func:`rloo_outcome_advantage` of the sequence scores, put on every response token.

    ``returns`` are the advantages (as verl; no critic reads them). Reads no ``algorithm`` key.
    Metrics: ``adv/mean``, ``adv/max``, ``adv/min``, ``adv/std_groups_zero_frac``.
    """
    with torch.no_grad():
        scores = batch.scores
        advantages = outcome_to_tokens(rloo_outcome_advantage(scores, batch.group_ids), batch.response_mask)
        metrics = advantage_metrics(advantages, batch.response_mask)
        metrics["adv/std_groups_zero_frac"] = zero_std_group_frac(scores, batch.group_ids)
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)
