"""The kernel's own policy losses, registered like any plugin's (``actor.loss_mode``).

Each is a :class:`plugrl.specs.PolicyLossSpec` made by :func:`plugrl.policy_loss`; the plugin loader
adds them to every registry under the plugin name ``plugrl``, so a plugin that registers another
name extends the choice with no kernel edit, and one that registers ``vanilla`` or ``gspo`` again is a
clash naming both. The math is in :mod:`plugrl.algorithms` (pure functions, formulas in their docstrings).
"""

from __future__ import annotations

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
        clip_c=config.clip_ratio_c,
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


def builtin_loss(name: str) -> Any:
    """The function of the kernel's policy loss ``name``; a :class:`ConfigError` for any other name."""
    from plugrl.specs import specs_of

    for fn in (vanilla, gspo):
        if specs_of(fn)[0].name == name:
            return fn
    raise ConfigError(
        f"actor.loss_mode {name!r} is not one of the kernel's policy losses (vanilla, gspo); a plugin's loss is "
        "looked up in the registry of the plugins named in `plugins:`"
    )
