"""The policy losses beside the kernel's ``vanilla`` (``actor.loss_mode``): ``gspo``, ``luspo``, ``cispo``, ``sapo``.

Each is a :class:`plugrl.specs.PolicyLossSpec` made by :func:`plugrl.policy_loss`, registered under this plugin's
name like its estimators (``plugins: [advantages]``, or found by ``actor.loss_mode`` when ``plugins`` is not set).
``gspo`` is verl's; ``luspo``, ``cispo`` and ``sapo`` train TRL's ``loss_type`` of those names (``--trl-config``
picks them), and verl's ``cispo`` and ``sapo`` loss modes. ``gspo`` and ``sapo`` always aggregate
seq-mean-token-mean, as their papers do (``agg_mode`` of their records: a run that sets another
``actor.loss_agg_mode`` is refused at start). Each takes ``rollout_is_weights`` (``algorithm.rollout_correction``).

The math is in the pure functions ``*_policy_loss`` below (shapes and formulas in their docstrings), built on the
kernel's :func:`plugrl.algorithms.agg_loss` and the conventions of its :func:`plugrl.algorithms.policy_loss`.
"""

from __future__ import annotations

from typing import Any

import torch

from plugrl.algorithms import agg_loss, masked_mean, metric_value
from plugrl.specs import policy_loss

from .common import at_least_float32 as _f32

# --------------------------------------------------------------------------- the math


def gspo_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    num_seqs: float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    agg_mode: str = "seq-mean-token-mean",
    **_: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: PPO clipping on the sequence-level importance ratio (Zheng et al. 2025), as verl's ``gspo`` mode.

    Shapes as :func:`plugrl.algorithms.policy_loss`. With ``L_i`` the response length of sequence i::

        log s_i   = sum_t (logprob - old_logprob) / L_i              (detached)
        log s_i,t = logprob_t - sg(logprob_t) + sg(log s_i)         (value s_i, gradient of one token)
        loss      = seq-mean-token-mean( max(-A s_i,t, -A clamp(s_i,t, 1 - clip_low, 1 + clip_high)) )

    ``rollout_is_weights`` [B, T] (rollout correction, detached), when given, multiplies each token's term
    before the aggregation.

    The log-ratio is clamped at 10 as verl does. The paper's clip ranges are small (3e-4, 4e-4).
    Metrics as :func:`plugrl.algorithms.policy_loss` (``actor/pg_clipfrac`` counts clipped tokens). ``agg_mode``
    ``seq-mean-token-sum`` weighs each sequence by its length: LUSPO (TRL's ``loss_type: luspo``), whose
    gradient is ``s_i * A_i * sum_t grad logprob_t`` per sequence.
    """
    logprob, old_logprob, advantages = _f32(logprob), _f32(old_logprob), _f32(advantages)
    mask = response_mask.to(logprob.dtype)
    lengths = mask.sum(-1).clamp(min=1.0)
    seq_log_ratio = torch.where(mask > 0, logprob - old_logprob, torch.zeros_like(logprob)).sum(-1) / lengths
    log_ratio = logprob - logprob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    losses = torch.maximum(pg_losses1, pg_losses2)
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights.detach()
    loss = agg_loss(losses, response_mask, agg_mode, num_seqs=num_seqs)
    with torch.no_grad():
        clipfrac = masked_mean((pg_losses2 > pg_losses1).float(), response_mask)
        ppo_kl = masked_mean(-(logprob - old_logprob), response_mask)
    return loss, {
        "actor/pg_clipfrac": metric_value(clipfrac),
        "actor/pg_clipfrac_lower": 0.0,
        "actor/ppo_kl": metric_value(ppo_kl),
        "actor/pg_loss": metric_value(loss),
    }


def cispo_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    agg_mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_length: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, Chen et al. 2025): REINFORCE on the log-probability, weighted by the clipped importance
    ratio with its gradient stopped, as verl's ``cispo`` loss. Shapes and aggregation as
    :func:`plugrl.algorithms.policy_loss`::

        ratio = exp(clamp(logprob - old_logprob, -20, 20))
        loss  = -sg(clamp(ratio, 1 - clip_low, 1 + clip_high)) * A * logprob

    Every token keeps its gradient (none is clipped away, unlike PPO's clip). ``clip_low >= 1`` leaves the ratio
    without a lower bound, as the paper and TRL's ``loss_type: cispo`` (whose ``epsilon_high`` is ``1 + clip_high``).
    ``rollout_is_weights`` (detached) multiplies each token's loss when given. ``actor/pg_clipfrac``: the share of
    tokens whose ratio was clipped.
    """
    logprob, old_logprob, advantages = _f32(logprob), _f32(old_logprob), _f32(advantages)
    log_ratio = torch.clamp(logprob - old_logprob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, min=1.0 - clip_low, max=1.0 + clip_high).detach()
    losses = -clipped * advantages * logprob
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights.detach()
    loss = agg_loss(losses, response_mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length)
    with torch.no_grad():
        clipfrac = masked_mean((ratio != clipped).float(), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return loss, {
        "actor/pg_clipfrac": metric_value(clipfrac),
        "actor/pg_clipfrac_lower": 0.0,
        "actor/ppo_kl": metric_value(ppo_kl),
        "actor/pg_loss": metric_value(loss),
    }


def sapo_policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_pos: float,
    tau_neg: float,
    num_seqs: float | torch.Tensor | None = None,
    rollout_is_weights: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (Soft Adaptive Policy Optimization, Gao et al. 2025): a smooth gate of the token ratio instead of a hard
    clip, as verl's ``sapo`` loss and TRL's ``loss_type: sapo``. Shapes as :func:`plugrl.algorithms.policy_loss`::

        ratio = exp(clamp(logprob - old_logprob, -20, 20))
        tau   = tau_pos if A > 0 else tau_neg
        loss  = seq-mean-token-mean( -sigmoid(tau * (ratio - 1)) * 4 / tau * A )

    At ``ratio = 1`` the gate's value is ``2 / tau`` and its slope 1, so on-policy its gradient is the policy
    gradient's. ``rollout_is_weights`` (detached) multiplies each token's term when given. Always aggregated
    seq-mean-token-mean, as the paper, verl and TRL do.
    """
    logprob, old_logprob, advantages = _f32(logprob), _f32(old_logprob), _f32(advantages)
    log_ratio = torch.clamp(logprob - old_logprob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(advantages, tau_pos), torch.full_like(advantages, tau_neg))
    losses = -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * advantages
    if rollout_is_weights is not None:
        losses = losses * rollout_is_weights.detach()
    loss = agg_loss(losses, response_mask, "seq-mean-token-mean", num_seqs=num_seqs)
    with torch.no_grad():
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return loss, {
        "actor/pg_clipfrac": 0.0,
        "actor/pg_clipfrac_lower": 0.0,
        "actor/ppo_kl": metric_value(ppo_kl),
        "actor/pg_loss": metric_value(loss),
    }


# --------------------------------------------------------------------------- the registrations


@policy_loss("gspo", agg_mode="seq-mean-token-mean")
def gspo(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    *,
    rollout_is_weights: torch.Tensor | None = None,
    **norm: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence-level ratio (GSPO), always seq-mean-token-mean: :func:`gspo_policy_loss`.
    ``rollout_is_weights`` [B, T] (``algorithm.rollout_correction``) multiplies each token's term when given."""
    return gspo_policy_loss(
        logprob,
        old_logprob,
        advantages,
        response_mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        num_seqs=norm.get("num_seqs"),
        rollout_is_weights=rollout_is_weights,
    )


@policy_loss("luspo")
def luspo(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    *,
    rollout_is_weights: torch.Tensor | None = None,
    **norm: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """LUSPO (length-unbiased GSPO, TRL's ``loss_type: luspo`` with ``importance_sampling_level: sequence``): GSPO's
    sequence-level ratio and clip, each sequence's tokens summed, then the mean over sequences
    (:func:`gspo_policy_loss` with ``seq-mean-token-sum``)."""
    return gspo_policy_loss(
        logprob,
        old_logprob,
        advantages,
        response_mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        num_seqs=norm.get("num_seqs"),
        rollout_is_weights=rollout_is_weights,
        agg_mode="seq-mean-token-sum",
    )


@policy_loss("cispo")
def cispo(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    *,
    rollout_is_weights: torch.Tensor | None = None,
    **norm: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: the clipped importance ratio, detached, weighs each token's log-probability
    (:func:`cispo_policy_loss`; clip ``[1 - clip_low, 1 + clip_high]``, aggregated by
    ``loss_agg_mode``), as verl's ``cispo`` and TRL's ``loss_type: cispo``."""
    return cispo_policy_loss(
        logprob,
        old_logprob,
        advantages,
        response_mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        agg_mode=config.loss_agg_mode,
        rollout_is_weights=rollout_is_weights,
        **norm,
    )


@policy_loss("sapo", agg_mode="seq-mean-token-mean")
def sapo(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    *,
    rollout_is_weights: torch.Tensor | None = None,
    **norm: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: a soft gate of the token ratio with temperatures ``actor.tau_pos`` / ``actor.tau_neg``
    (:func:`sapo_policy_loss`), always seq-mean-token-mean, as verl's ``sapo`` and TRL's
    ``loss_type: sapo``."""
    return sapo_policy_loss(
        logprob,
        old_logprob,
        advantages,
        response_mask,
        tau_pos=config.tau_pos,
        tau_neg=config.tau_neg,
        num_seqs=norm.get("num_seqs"),
        rollout_is_weights=rollout_is_weights,
    )
