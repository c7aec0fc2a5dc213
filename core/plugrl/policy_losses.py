"""The kernel's own policy losses, registered like any plugin's (``actor.loss_mode``).

Each is a :class:`plugrl.specs.PolicyLossSpec` made by :func:`plugrl.policy_loss`; the plugin loader
adds them to every registry under the plugin name ``plugrl``, so a plugin that registers another
name extends the choice with no kernel edit, and one that registers ``vanilla`` or ``gspo`` again is a
clash naming both. The math is in :mod:`plugrl.algorithms` (pure functions, formulas in their docstrings).

``vanilla`` and ``gspo`` are verl's; ``luspo``, ``cispo`` and ``sapo`` train TRL's ``loss_type`` of those names
(``--trl-config`` picks them), and verl's ``cispo`` and ``sapo`` loss modes.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from plugrl import algorithms
from plugrl.config import ConfigError
from plugrl.specs import policy_loss

BUILTIN = "plugrl"  # the plugin name of the kernel's registrations


@policy_loss("vanilla")
def vanilla(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any,
    *,
    rollout_is_weights: torch.Tensor | None = None,
    **norm: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level ratio, clipped asymmetrically with dual clip (PPO, GRPO, DAPO): :func:`algorithms.policy_loss`.
    ``rollout_is_weights`` [B, T] (``algorithm.rollout_correction``) multiplies each token's loss when given."""
    return algorithms.policy_loss(
        logprob,
        old_logprob,
        advantages,
        response_mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        clip_c=math.inf if config.clip_ratio_c is None else config.clip_ratio_c,  # null: no dual clip
        agg_mode=config.loss_agg_mode,
        rollout_is_weights=rollout_is_weights,
        **norm,
    )


@policy_loss("gspo")
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
    """Sequence-level ratio (GSPO), always seq-mean-token-mean: :func:`algorithms.gspo_policy_loss`.
    ``rollout_is_weights`` [B, T] (``algorithm.rollout_correction``) multiplies each token's term when given."""
    return algorithms.gspo_policy_loss(
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
    (:func:`algorithms.gspo_policy_loss` with ``seq-mean-token-sum``)."""
    return algorithms.gspo_policy_loss(
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
    (:func:`algorithms.cispo_policy_loss`; clip ``[1 - clip_low, 1 + clip_high]``, aggregated by
    ``loss_agg_mode``), as verl's ``cispo`` and TRL's ``loss_type: cispo``."""
    return algorithms.cispo_policy_loss(
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


@policy_loss("sapo")
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
    (:func:`algorithms.sapo_policy_loss`), always seq-mean-token-mean, as verl's ``sapo`` and TRL's
    ``loss_type: sapo``."""
    return algorithms.sapo_policy_loss(
        logprob,
        old_logprob,
        advantages,
        response_mask,
        tau_pos=config.tau_pos,
        tau_neg=config.tau_neg,
        num_seqs=norm.get("num_seqs"),
        rollout_is_weights=rollout_is_weights,
    )


KERNEL_LOSSES = (vanilla, gspo, luspo, cispo, sapo)


def builtin_loss(name: str) -> Any:
    """The function of the kernel's policy loss ``name``; a :class:`ConfigError` for any other name."""
    from plugrl.specs import specs_of

    for fn in KERNEL_LOSSES:
        if specs_of(fn)[0].name == name:
            return fn
    names = ", ".join(specs_of(fn)[0].name for fn in KERNEL_LOSSES)
    raise ConfigError(
        f"actor.loss_mode {name!r} is not one of the kernel's policy losses ({names}); a plugin's loss is "
        "looked up in the registry of the plugins named in `plugins:`"
    )
