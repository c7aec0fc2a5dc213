"""REINFORCE++ and REINFORCE++ with baseline (Hu et al. 2025, arXiv 2501.03262): global advantage normalisation.

Both whiten the advantages over the whole batch. verl computes advantages on its driver, over
the global batch; here each rank computes its own samples' advantages (the kernel keeps whole
groups per rank), so the wrappers pass :func:`plugrl_advantages.common.distributed_sum` as the
``reduce`` of the whitening: under torch.distributed with more than one rank the mean and
variance are all-reduced and span every rank's tokens, exactly as verl's; alone, it is the
plain batch whitening.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult, group_mean_std
from plugrl.specs import advantage_estimator

from ..common import (
    Reduce,
    advantage_metrics,
    distributed_sum,
    global_masked_whiten,
    outcome_to_tokens,
    zero_std_group_frac,
)

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def discounted_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Token-level discounted return-to-go (as the loop in verl's REINFORCE++ estimator).

    Shapes: ``token_level_rewards`` [B, T], ``response_mask`` [B, T]; returns [B, T] float32, 0 where
    the mask is 0.

    Formula, backwards over t, with ``G_T = 0``::

        G_t = r_t + gamma * m_{t+1} * G_{t+1}

    so a return accumulates the rewards of the contiguous response tokens from t on and stops at
    the first masked-out token (verl's "reset after EOS"; a masked hole inside a response cuts it too).
    """
    rewards = token_level_rewards.float()
    keep = response_mask != 0
    out = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        # a masked-out position neither keeps a return nor passes one back (so NaN padding cannot leak)
        running = torch.where(keep[:, t], rewards[:, t] + gamma * running, 0.0)
        out[:, t] = running
    return out


def reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    *,
    reduce: Reduce | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ advantage (as verl's ``compute_reinforce_plus_plus_outcome_advantage``).

    Shapes: ``token_level_rewards`` [B, T], ``response_mask`` [B, T]; returns
    ``(advantages [B, T], returns [B, T])``, float32, 0 on padding, without gradient.

    Formula::

        G = discounted_returns(rewards, mask, gamma)       # G_t = r_t + gamma * m_{t+1} * G_{t+1}
        A = (G - mean(G)) / sqrt(var(G) + 1e-8)             # over all response tokens, unbiased var
        returns = G

    The mean and variance are over this rank's batch when ``reduce`` is None (identity); pass a
    :data:`~plugrl_advantages.common.Reduce` that sums over ranks (``distributed_sum()``) for the
    global batch, as verl. Needs at least two response tokens in total.
    """
    with torch.no_grad():
        returns = discounted_returns(token_level_rewards.detach(), response_mask, gamma)
        advantages = global_masked_whiten(returns, response_mask, reduce=reduce)
    return advantages, returns


def reinforce_plus_plus_baseline_advantage(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    reduce: Reduce | None = None,
) -> torch.Tensor:
    """REINFORCE++ with baseline (as verl's ``compute_reinforce_plus_plus_baseline_outcome_advantage``).

    Shapes: ``scores`` [B] sequence rewards, ``response_mask`` [B, T], ``group_ids`` [B]; returns
    advantages [B, T] float32, 0 on padding, without gradient.

    Formula, for sample i of group g::

        a_i    = r_i - mean_g                  # a group of one uses mean 0 (a_i = r_i), as verl
        A_i,t  = a_i * m_i,t                   # broadcast over the response tokens
        A      = (A - mean(A)) / sqrt(var(A) + 1e-8)   # whitened over all response tokens

    The token-level whitening weighs each sequence by its length. After it a group whose rewards
    agree no longer has advantage 0 but ``-mean(A) / std(A)`` (as verl). ``reduce`` as in
    :func:`reinforce_plus_plus_advantage`.
    """
    with torch.no_grad():
        s = scores.detach().float()
        mean, _, size = group_mean_std(s, group_ids)
        centered = s - torch.where(size > 1, mean, torch.zeros_like(mean))
        return global_masked_whiten(outcome_to_tokens(centered, response_mask), response_mask, reduce=reduce)


@advantage_estimator("reinforce_plus_plus")
def reinforce_plus_plus(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """REINFORCE++: :func:`reinforce_plus_plus_advantage` with ``gamma = config.gamma``.

    Whitening spans all ranks under torch.distributed (an all-reduce, called on every rank).
    ``returns`` are the discounted returns. Metrics: ``adv/mean``, ``adv/max``, ``adv/min``.
    """
    advantages, returns = reinforce_plus_plus_advantage(
        batch.token_level_rewards, batch.response_mask, config.gamma, reduce=distributed_sum()
    )
    return AdvantageResult(
        advantages=advantages, returns=returns, metrics=advantage_metrics(advantages, batch.response_mask)
    )


@advantage_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """REINFORCE++ with baseline: :func:`reinforce_plus_plus_baseline_advantage` of the sequence scores.

    Whitening spans all ranks under torch.distributed. ``returns`` are the advantages (as verl).
    Reads no ``algorithm`` key. Metrics: ``adv/mean``, ``adv/max``, ``adv/min``,
    ``adv/std_groups_zero_frac``.
    """
    scores = batch.scores
    advantages = reinforce_plus_plus_baseline_advantage(
        scores, batch.response_mask, batch.group_ids, reduce=distributed_sum()
    )
    metrics = advantage_metrics(advantages, batch.response_mask)
    metrics["adv/std_groups_zero_frac"] = zero_std_group_frac(scores, batch.group_ids)
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)
