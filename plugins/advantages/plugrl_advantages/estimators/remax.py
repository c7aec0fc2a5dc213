"""ReMax: REINFORCE with the greedy rollout's reward as baseline (Li et al. 2023, arXiv 2310.10505)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult
from plugrl.specs import advantage_estimator

from ..common import advantage_metrics

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def remax_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, baseline_scores: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax advantage (as verl's ``compute_remax_outcome_advantage``).

    Shapes: ``token_level_rewards`` [B, T], ``response_mask`` [B, T], ``baseline_scores`` [B] (for
    each sample, the score of a greedy rollout of its prompt); returns
    ``(advantages [B, T], returns [B, T])``, float32, 0 on padding, without gradient.

    Formula, with ``b_i`` the baseline of sample i::

        G_i,t = sum_{t' >= t} r_i,t' * m_i,t'     # undiscounted return-to-go
        A_i,t = (G_i,t - b_i) * m_i,t

    With the outcome reward on the last response token (the kernel's layout, no KL in the
    reward) ``G_i,t`` is the sequence score ``r_i`` on every token, so ``A_i = r_i - b_i``.
    Not whitened.
    """
    with torch.no_grad():
        mask = response_mask.float()
        keep = response_mask != 0
        rewards = torch.where(keep, token_level_rewards.detach().float(), 0.0)
        baseline = torch.as_tensor(baseline_scores, dtype=torch.float32, device=rewards.device).detach()
        if baseline.shape != rewards.shape[:1]:
            raise ValueError(
                f"baseline_scores must have shape [B] = {tuple(rewards.shape[:1])}, got {tuple(baseline.shape)}"
            )
        returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
        advantages = (returns - baseline.unsqueeze(-1)) * mask
    return advantages, returns


@advantage_estimator("remax", needs_greedy_baseline=True)
def remax(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """ReMax: :func:`remax_advantage` with the baseline from ``batch.baseline_scores``.

    Registered with ``needs_greedy_baseline``: the kernel's trainer generates one greedy
    (temperature 0) response per prompt, scores it and passes the scores, repeated over the
    prompt's n samples, as ``batch.baseline_scores`` ([B]). A ValueError names the field when it
    is None (a caller other than the trainer, or a kernel without the greedy-baseline hook).
    ``returns`` are the undiscounted returns-to-go. Reads no ``algorithm`` key.
    Metrics: ``adv/mean``, ``adv/max``, ``adv/min`` and ``adv/remax_baseline_mean``.
    """
    baseline = batch.baseline_scores
    if baseline is None:
        raise ValueError(
            "adv_estimator 'remax' needs batch.baseline_scores: a [B] tensor holding, for each sample, the "
            "score of a greedy (temperature 0) rollout of its prompt. The plugrl trainer supplies it (remax "
            "is registered with needs_greedy_baseline); this batch's baseline_scores is None, so its caller "
            "did not generate the greedy baseline."
        )
    advantages, returns = remax_advantage(batch.token_level_rewards, batch.response_mask, baseline)
    metrics = advantage_metrics(advantages, batch.response_mask)
    baseline_t = torch.as_tensor(baseline, dtype=torch.float32)
    metrics["adv/remax_baseline_mean"] = baseline_t.mean().item() if baseline_t.numel() else 0.0
    return AdvantageResult(advantages=advantages, returns=returns, metrics=metrics)
