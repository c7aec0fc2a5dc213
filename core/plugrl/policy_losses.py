"""The kernel's own policy loss, ``vanilla`` (``actor.loss_mode``'s default), registered like any plugin's.

It is a :class:`plugrl.specs.PolicyLossSpec` made by :func:`plugrl.policy_loss`; the plugin loader adds it to every
registry under the plugin name ``plugrl``, so a plugin that registers another name extends the choice with no kernel
edit (plugrl-advantages registers the sequence-level and clip-free variants), and one that registers ``vanilla``
again is a clash naming both. The math is in :mod:`plugrl.algorithms` (pure functions, formulas in their
docstrings). :func:`check_agg_mode`: a loss whose record fixes its aggregation refuses an ``actor.loss_agg_mode``
it would ignore.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from plugrl import algorithms
from plugrl.config import ConfigError
from plugrl.specs import PolicyLossSpec, policy_loss

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


KERNEL_LOSSES = (vanilla,)


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


def check_agg_mode(actor: Any, spec: PolicyLossSpec) -> None:
    """A :class:`ConfigError` when the loss ``spec`` always aggregates one way (``spec.agg_mode``, its paper's) and
    ``actor.loss_agg_mode`` is set to another, which it would ignore; the default, unset, is not read."""
    fixed = spec.agg_mode
    if fixed and "loss_agg_mode" in actor.model_fields_set and actor.loss_agg_mode != fixed:
        mean = "sequence mean" if fixed.startswith("seq-mean") else "token mean"
        raise ConfigError(
            f"actor.loss_mode {actor.loss_mode} always aggregates {fixed} (its paper's {mean}), so "
            f"actor.loss_agg_mode={actor.loss_agg_mode} would be ignored; remove it or set it to {fixed}"
        )
