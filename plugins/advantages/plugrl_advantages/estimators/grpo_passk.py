"""GRPO for pass@k: only each group's best response is pushed (Tang et al. 2025, arXiv 2503.19595)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult, group_mean_std
from plugrl.specs import advantage_estimator

from ..common import advantage_metrics, group_index, outcome_to_tokens, zero_std_group_frac

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def grpo_passk_outcome_advantage(
    scores: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """Pass@k advantage, one value per sequence (as verl's ``compute_grpo_passk_outcome_advantage``).

    Shapes: ``scores`` [B] sequence rewards, ``group_ids`` [B]; returns [B] float32, without gradient.

    Formula, for a group g (n >= 2 samples) with highest reward ``r_max`` (sample i*) and
    second-highest ``r_2nd`` (the runner-up's value; equal to ``r_max`` on a tie)::

        A_i* = (r_max - r_2nd) / (std_g + epsilon)     # std_g unbiased, as torch.std
        A_i  = 0                                       # every other sample of g

    With ``norm_by_std=False`` ``A_i* = r_max - r_2nd``. On a tie for the maximum the advantage is
    0 whichever sample holds it. Raises ValueError for a group of one sample (as verl: pass@k
    needs ``rollout.n >= 2``).
    """
    with torch.no_grad():
        s = scores.detach().float()
        _, std, size = group_mean_std(s, group_ids)
        if bool((size < 2).any()):
            lonely = torch.as_tensor(group_ids)[size.cpu() < 2].unique().tolist()
            raise ValueError(
                f"grpo_passk needs at least 2 samples per group (rollout.n >= 2); groups with one sample: {lonely}"
            )
        inverse, num_groups = group_index(group_ids)
        inverse = inverse.to(s.device)
        neg_inf = s.new_full((num_groups,), float("-inf"))
        r_max = neg_inf.scatter_reduce(0, inverse, s, reduce="amax")
        # the best sample: the first index holding its group's maximum
        positions = torch.arange(s.numel(), device=s.device)
        beyond = positions.new_full((num_groups,), s.numel())
        candidates = torch.where(s == r_max[inverse], positions, s.numel())
        is_best = positions == beyond.scatter_reduce(0, inverse, candidates, reduce="amin")[inverse]
        r_2nd = neg_inf.scatter_reduce(0, inverse, torch.where(is_best, float("-inf"), s), reduce="amax")
        gap = (r_max - r_2nd)[inverse]
        if norm_by_std:
            gap = gap / (std + epsilon)
        return torch.where(is_best, gap, torch.zeros_like(s))


@advantage_estimator("grpo_passk")
def grpo_passk(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """GRPO pass@k: :func:`grpo_passk_outcome_advantage` of the sequence scores, on every response token.

    Reads ``config.epsilon`` and ``config.norm_adv_by_std_in_grpo``. ``returns`` are the
    advantages (as verl). Metrics: ``adv/mean``, ``adv/max``, ``adv/min``, ``adv/std_groups_zero_frac``.
    """
    with torch.no_grad():
        scores = batch.scores
        seq_adv = grpo_passk_outcome_advantage(
            scores, batch.group_ids, epsilon=config.epsilon, norm_by_std=config.norm_adv_by_std_in_grpo
        )
        advantages = outcome_to_tokens(seq_adv, batch.response_mask)
        metrics = advantage_metrics(advantages, batch.response_mask)
        metrics["adv/std_groups_zero_frac"] = zero_std_group_frac(scores, batch.group_ids)
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)
