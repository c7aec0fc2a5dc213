"""GAE: PPO's advantage with a learned value baseline (Schulman et al. 2015)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from plugrl.algorithms import AdvantageBatch, AdvantageResult, gae_advantages
from plugrl.specs import advantage_estimator

from ..common import advantage_metrics, distributed_sum, global_masked_whiten

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig


@advantage_estimator("gae", needs_critic=True)
def gae(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """Generalized advantage estimation over response tokens, as verl's ``compute_gae_advantage_return``.

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
