"""GRPO: the group-normalised outcome advantage (DeepSeekMath), and Dr. GRPO without the std."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult, group_mean_std
from plugrl.specs import advantage_estimator

from ..common import advantage_metrics, at_least_float32, outcome_to_tokens, zero_std_group_frac

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def grpo_outcome_advantage(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """GRPO's group-normalised outcome advantage, one value per sequence (as verl's grpo estimator).

    Shapes: ``scores`` [B] sequence rewards, ``group_ids`` [B] (samples of one prompt share an id);
    returns [B] float32, without gradient.

    Formula, for sample i in group g: ``A_i = (r_i - mean_g) / (std_g + epsilon)`` with the
    unbiased std (``torch.std``); with ``norm_by_std=False`` (Dr. GRPO) ``A_i = r_i - mean_g``.
    A group of one sample uses ``mean_g = 0`` and ``std_g = 1`` (verl's convention), so its
    advantage is ``r_i / (1 + epsilon)`` (or ``r_i``). A group whose rewards all agree gets
    exactly 0.
    """
    with torch.no_grad():
        s = at_least_float32(scores).detach()
        mean, std, size = group_mean_std(s, group_ids)
        single = size == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        centered = s - mean
        if not norm_by_std:
            return centered
        std = torch.where(single, torch.ones_like(std), std)
        return centered / (std + epsilon)


@advantage_estimator("grpo")
def grpo(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """GRPO advantage, as verl's ``compute_grpo_outcome_advantage``: :func:`grpo_outcome_advantage`.

    For sample i of group g (the samples of one prompt), with sequence score ``r_i``:
    ``A_i = (r_i - mean_g) / (std_g + config.epsilon)`` (unbiased std), or ``r_i - mean_g``
    when ``config.norm_adv_by_std_in_grpo`` is false (Dr. GRPO). Single-sample groups use
    mean 0 and std 1. ``A_i`` is put on every response token ([B, T], 0 on padding);
    ``returns`` are the advantages too (as verl; no critic reads them).

    Metrics: ``adv/mean``, ``adv/max``, ``adv/min`` over response tokens and
    ``adv/std_groups_zero_frac``, the fraction of groups whose rewards all agree.
    """
    with torch.no_grad():
        scores = batch.scores
        seq_adv = grpo_outcome_advantage(
            scores,
            batch.group_ids,
            epsilon=config.epsilon,
            norm_by_std=config.norm_adv_by_std_in_grpo,
        )
        advantages = outcome_to_tokens(seq_adv, batch.response_mask)
        metrics = advantage_metrics(advantages, batch.response_mask)
        metrics["adv/std_groups_zero_frac"] = zero_std_group_frac(scores, batch.group_ids)
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)
