"""GAE: PPO's advantage with a learned value baseline (Schulman et al. 2015)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult, masked_whiten
from plugrl.specs import advantage_estimator

from ..common import advantage_metrics, at_least_float32, distributed_sum, global_masked_whiten

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


def gae_advantages(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2015), whitened, as verl's ``compute_gae_advantage_return``.

    Shapes: all [B, T]. Backwards over response tokens t (padding carries the last value through)::

        delta_t = r_t + gamma * V_{t+1} - V_t          (V_T = 0)
        A_t     = delta_t + gamma * lam * A_{t+1}
        returns = A + V
        advantages = whiten(A) over response tokens (this batch; ``whiten=False`` leaves A raw)

    Returns (advantages, returns), both 0 on padding.
    """
    rewards = at_least_float32(token_level_rewards)
    values = at_least_float32(values)
    mask = at_least_float32(response_mask)
    T = rewards.shape[1]
    next_value = torch.zeros_like(rewards[:, 0])
    last_gae = torch.zeros_like(rewards[:, 0])
    out = torch.zeros_like(rewards)
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        gae = delta + gamma * lam * last_gae
        # on padding keep the carried values, so the last real token sees V_T = 0
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        last_gae = gae * mask[:, t] + (1 - mask[:, t]) * last_gae
        out[:, t] = last_gae
    returns = (out + values) * mask
    advantages = masked_whiten(out, mask) * mask if whiten else out * mask
    return advantages, returns


@advantage_estimator("gae", needs_critic=True)
def gae(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """Generalized advantage estimation over response tokens, as verl's ``compute_gae_advantage_return``.

    :func:`gae_advantages` unwhitened, then whitened over every rank's response tokens.

    With values ``V`` from the critic ([B, T], the state before each response token) and
    per-token rewards ``r`` (the score on the last token, minus a KL penalty when
    ``algorithm.use_kl_in_reward``)::

        delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1}
        returns = A + V (the critic's targets),   advantages = whiten(A)

    ``algorithm.gamma`` and ``algorithm.lam`` (both 1.0 by default, as verl).
    Registered with ``needs_critic``: the kernel builds and trains the value model.
    """
    if batch.values is None:
        raise ValueError("the gae estimator needs critic values: the kernel supplies them when it has a critic")
    with torch.no_grad():
        raw, returns = gae_advantages(
            batch.token_level_rewards, batch.values, batch.response_mask, config.gamma, config.lam, whiten=False
        )
        # whitened over every rank's tokens, as verl whitens its whole batch
        advantages = global_masked_whiten(raw, batch.response_mask, reduce=distributed_sum())
        metrics = advantage_metrics(advantages, batch.response_mask)
    return AdvantageResult(advantages=advantages, returns=returns, metrics=metrics)
