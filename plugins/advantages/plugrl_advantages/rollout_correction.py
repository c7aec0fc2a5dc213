"""Rollout correction: importance sampling between the engine that sampled and the trainer that recomputes.

The engine (vLLM, or the HF engine) samples each response token with a log-probability ``log mu`` that differs
a little from the trainer's recomputed old log-probability ``log pi_old`` of the same token (other kernels, bf16),
and more once the rollouts lag the policy. The PPO ratio ``pi / pi_old`` corrects nothing of that gap: the
samples come from ``mu``. These pure functions compute the importance weight ``w = pi_old / mu`` per token, and
what the actor does with it (``algorithm.rollout_correction``, docs/algorithms.md "Rollout correction"):

- ``truncate`` (truncated importance sampling, TIS): the per-token policy-gradient loss is multiplied by
  ``min(w, cap)``; the loss mask is unchanged.
- ``mask`` (masked importance sampling, MIS; rejection sampling): tokens, or whole sequences at the sequence
  levels, whose ``w`` lies outside ``[low, high]`` leave the loss mask, so they are out of the loss's normaliser
  as well (verl: rejected tokens are not in the denominator); the kept ones are weighted by ``w``.
- ``monitor``: weights 1, nothing masked; the diagnostics alone.

This module implements the kernel's seam :mod:`plugrl.rollout_correction` (it is the entry point of group
``plugrl.rollout_correction``): the actor calls :func:`rollout_correction` and :func:`check_loss_takes_weights`
each update, the start of a run :func:`takes_weights` and :func:`check_loss_takes_weights`.

Shapes: B sequences, T response tokens (padded); masks are 1.0 on the response tokens the policy wrote.
Weights never carry gradient. Semantics follow verl's ``verl/trainer/ppo/rollout_corr_helper.py`` (0.9.1) and
TRL's ``GRPOTrainer`` (``vllm_importance_sampling_*``, 1.16); where they differ docs/algorithms.md says so.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from plugrl.algorithms import masked_mean, masked_sum
from plugrl.config import ConfigError
from plugrl.rollout_correction import WEIGHTS_KEYWORD

MODES = ("off", "monitor", "truncate", "mask")
LEVELS = ("token", "sequence", "geometric")
# the log-weight is clamped to [-20, 20] before exp (verl's SAFETY_BOUND): exp(20) ~ 4.9e8, no overflow
SAFETY_BOUND = 20.0


@dataclass
class RolloutCorrection:
    """What :func:`rollout_correction` returns.

    weights: [B, T] float32, detached: the factor of each token's policy-gradient loss (0 off the mask).
    mask: [B, T] the loss mask after rejection, in the dtype of the ``response_mask`` given (unchanged unless
        ``mode`` is ``mask``); every aggregation normalises by it.
    metrics: ``rollout_corr/...`` diagnostics as Python floats (:func:`correction_metrics`).
    """

    weights: torch.Tensor
    mask: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def _float_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.to(like.dtype).expand_as(like)


def log_importance_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, response_mask: torch.Tensor, level: str
) -> torch.Tensor:
    """Per-token log importance weight ``log w`` of the trainer's policy against the engine's sampler.

    Shapes: ``old_logprobs`` [B, T] (the trainer's recomputed ``log pi_old``), ``rollout_logprobs`` [B, T]
    (the engine's ``log mu`` of the same tokens), ``response_mask`` [B, T]; returns [B, T] float32 (at least),
    0 where the mask is 0.

    With ``d_t = log pi_old_t - log mu_t`` on the masked tokens (0 elsewhere, so padding never leaks in):

    - ``"token"``: ``log w_t = d_t``;
    - ``"sequence"``: ``log w_t = sum_s d_s`` for every token of the sequence (``w`` = the product of the
      token ratios: the sequence's likelihood ratio);
    - ``"geometric"``: ``log w_t = sum_s d_s / n`` with ``n`` the sequence's masked tokens (``w`` = the
      geometric mean of the token ratios, length-normalised; verl's "Geo" ratio ``seq_mean_k1``).

    Clamped to ``[-20, 20]`` (verl's safety bound). Raises ValueError for another ``level`` or mismatched shapes.
    """
    if level not in LEVELS:
        raise ValueError(f"unknown rollout-correction level {level!r}; valid levels: {', '.join(LEVELS)}")
    if old_logprobs.shape != rollout_logprobs.shape or old_logprobs.shape != response_mask.shape:
        raise ValueError(
            f"old_logprobs {tuple(old_logprobs.shape)}, rollout_logprobs {tuple(rollout_logprobs.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one [B, T] shape"
        )
    dtype = torch.promote_types(old_logprobs.dtype, torch.float32)  # bf16 -> float32; float64 kept
    old, roll = old_logprobs.to(dtype), rollout_logprobs.to(old_logprobs.device, dtype)
    mask = _float_mask(response_mask, old)
    d = torch.where(mask != 0, old - roll, torch.zeros((), dtype=old.dtype, device=old.device))
    if level == "token":
        log_w = d
    else:
        total = masked_sum(d, mask, dim=-1)  # [B]
        if level == "geometric":
            total = total / mask.sum(-1).clamp_min(1.0)
        log_w = total.unsqueeze(-1).expand_as(d)
    return torch.clamp(log_w, -SAFETY_BOUND, SAFETY_BOUND) * (mask != 0)


def importance_weights(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, response_mask: torch.Tensor, level: str
) -> torch.Tensor:
    """[B, T] the raw importance weight ``w = exp(log w)`` of :func:`log_importance_weights`, detached, 0 off the
    mask (before any truncation or rejection)."""
    with torch.no_grad():
        log_w = log_importance_weights(old_logprobs, rollout_logprobs, response_mask, level)
        return torch.exp(log_w) * (_float_mask(response_mask, log_w) != 0)


def truncate_weights(weights: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling (TIS): ``min(w, cap)`` elementwise; shapes kept. ``cap`` must be > 1."""
    if not cap > 1.0:
        raise ValueError(f"the truncation cap must be above 1 (a weight of 1 is the on-policy case), got {cap}")
    return weights.clamp(max=cap)


def reject(
    weights: torch.Tensor, response_mask: torch.Tensor, low: float, high: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked importance sampling (rejection): ``(weights * keep, response_mask * keep)`` with
    ``keep = low <= w <= high`` (``high`` None: no upper bound) on the masked tokens.

    Shapes: ``weights`` [B, T], ``response_mask`` [B, T]; both results [B, T], the mask in ``response_mask``'s
    dtype. At the sequence levels every token of a sequence has the sequence's weight, so a sequence is kept or
    rejected whole. Needs ``0 <= low < 1`` and ``high > 1`` (or None): on-policy tokens (``w = 1``) are kept.
    """
    if not 0.0 <= low < 1.0:
        raise ValueError(f"the rejection bound low must be in [0, 1), got {low}")
    if high is not None and not high > 1.0:
        raise ValueError(f"the rejection bound high must be above 1, got {high}")
    keep = (weights >= low) & (_float_mask(response_mask, weights) != 0)
    if high is not None:
        keep = keep & (weights <= high)
    return weights * keep, response_mask * keep.to(response_mask.dtype)


def _masked_extreme(x: torch.Tensor, mask: torch.Tensor, largest: bool) -> float:
    """max (or min) of ``x`` where ``mask`` is non-zero; 0.0 for an empty mask (no data-dependent shapes)."""
    fill = torch.full((), float("-inf") if largest else float("inf"), dtype=x.dtype, device=x.device)
    masked = torch.where(mask != 0, x, fill)
    value = float(masked.amax() if largest else masked.amin())
    return value if math.isfinite(value) else 0.0


def _share(flags: torch.Tensor, mask: torch.Tensor, level: str) -> float:
    """The share of response tokens (``token`` level) or of non-empty sequences (sequence levels) where ``flags``."""
    if level == "token":
        return float(masked_mean(flags.float(), mask))
    rows = (mask != 0).any(-1)
    per_row = (flags & (mask != 0)).any(-1)
    return float((per_row & rows).float().sum() / rows.float().sum().clamp_min(1.0))


def correction_metrics(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    raw_weights: torch.Tensor,
    weights: torch.Tensor,
    new_mask: torch.Tensor,
    *,
    level: str,
    upper: float | None = None,
    lower: float | None = None,
) -> dict[str, float]:
    """The diagnostics of one correction, as Python floats (all [B, T] inputs; means over ``response_mask``).

    The gap between the two log-prob sets (verl's names; TRL logs the absolute difference):

    - ``rollout_corr/kl``: ``mean(log mu - log pi_old)``, the direct estimate of ``KL(mu || pi_old)`` from
      the engine's samples (verl's ``kl``; the negative of ``mean(log pi_old - log mu)``);
    - ``rollout_corr/k3_kl``: ``mean(exp(d) - d - 1)`` (computed as ``expm1(d) - d``),
      ``d = clamp(log pi_old - log mu, -20, 20)`` (k3; verl's ``k3_kl``);
    - ``rollout_corr/logp_abs_diff_mean``, ``_max``: ``|log pi_old - log mu|`` (TRL's
      ``sampling/sampling_logp_difference/mean``, ``/max``);
    - ``rollout_corr/raw_is_max``, ``raw_is_min``: the weight ``w`` before truncation or rejection.

    What the correction did:

    - ``rollout_corr/rollout_is_mean``: the mean applied weight over the response tokens (a rejected token
      counts 0; verl's ``rollout_is_mean``); ``rollout_is_max``, ``rollout_is_min``: over the tokens still in
      the loss;
    - ``rollout_corr/rollout_is_ratio_fraction_high`` / ``_low``: the share with ``w > upper`` / ``w < lower``
      (truncated or rejected), of tokens at the ``token`` level and of non-empty sequences at the sequence
      levels; only when the bound is given;
    - ``rollout_corr/rollout_rs_masked_fraction``: the share of response tokens left out of the loss;
      ``rollout_rs_seq_masked_fraction``: the share of non-empty sequences with a token left out.
    """
    with torch.no_grad():
        old = old_logprobs.float()
        roll = rollout_logprobs.to(old.device).float()
        mask = _float_mask(response_mask, old)
        diff = torch.where(mask != 0, old - roll, torch.zeros((), device=old.device))
        d = diff.clamp(-SAFETY_BOUND, SAFETY_BOUND)
        kept = _float_mask(new_mask, old)
        m: dict[str, float] = {
            "rollout_corr/kl": float(masked_mean(-diff, mask)),
            "rollout_corr/k3_kl": float(masked_mean(torch.expm1(d) - d, mask)),
            "rollout_corr/logp_abs_diff_mean": float(masked_mean(diff.abs(), mask)),
            "rollout_corr/logp_abs_diff_max": _masked_extreme(diff.abs(), mask, largest=True),
            "rollout_corr/raw_is_max": _masked_extreme(raw_weights, mask, largest=True),
            "rollout_corr/raw_is_min": _masked_extreme(raw_weights, mask, largest=False),
            "rollout_corr/rollout_is_mean": float(masked_mean(weights, mask)),
            "rollout_corr/rollout_is_max": _masked_extreme(weights, kept, largest=True),
            "rollout_corr/rollout_is_min": _masked_extreme(weights, kept, largest=False),
            "rollout_corr/rollout_rs_masked_fraction": float(masked_mean(mask - kept, mask)),
        }
        dropped = (mask != 0) & (kept == 0)
        m["rollout_corr/rollout_rs_seq_masked_fraction"] = _share(dropped, mask, "sequence")
        if upper is not None:
            m["rollout_corr/rollout_is_ratio_fraction_high"] = _share(raw_weights > upper, mask, level)
        if lower is not None:
            m["rollout_corr/rollout_is_ratio_fraction_low"] = _share(raw_weights < lower, mask, level)
    return m


def rollout_correction(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    mode: str,
    level: str = "token",
    cap: float = 2.0,
    low: float = 0.0,
    high: float | None = 2.0,
) -> RolloutCorrection:
    """The weights, loss mask and diagnostics of one batch (the whole step's batch, before it is split into
    mini-batches, so a sequence's weight sees all its tokens).

    Shapes: ``old_logprobs``, ``rollout_logprobs``, ``response_mask`` [B, T] (the engine's log-probs 0 on
    padding); returns :class:`RolloutCorrection` with [B, T] tensors on ``old_logprobs``'s device. With ``w``
    the raw weight of :func:`importance_weights` at ``level``:

    - ``mode="truncate"``: ``weights = min(w, cap)``, ``mask = response_mask``;
    - ``mode="mask"``: ``keep = low <= w <= high``; ``weights = w * keep``, ``mask = response_mask * keep``;
    - ``mode="monitor"``: ``weights = response_mask`` (1 on every response token), ``mask = response_mask``.

    The actor multiplies each token's policy-gradient loss by ``weights`` and aggregates over ``mask``, so under
    ``mask`` a rejected token leaves the token count of ``token-mean`` and the per-sequence count of
    ``seq-mean-token-mean`` (a sequence rejected whole adds 0 to the sum; the sequence count B stays, as in
    verl). Raises ValueError for ``mode="off"`` (nothing to compute) or any other unknown mode.
    """
    if mode not in MODES or mode == "off":
        raise ValueError(f"rollout_correction mode {mode!r}: expected one of monitor, truncate, mask")
    with torch.no_grad():
        raw = importance_weights(old_logprobs, rollout_logprobs, response_mask, level)
        upper = lower = None
        if mode == "truncate":
            weights, mask = truncate_weights(raw, cap), response_mask
            upper = cap
        elif mode == "mask":
            weights, mask = reject(raw, response_mask, low, high)
            upper, lower = high, low if low > 0 else None
        else:  # monitor
            weights, mask = _float_mask(response_mask, raw).clone(), response_mask
        metrics = correction_metrics(
            old_logprobs, rollout_logprobs, response_mask, raw, weights, mask, level=level, upper=upper, lower=lower
        )
    return RolloutCorrection(weights.detach(), mask, metrics)


def takes_weights(fn: Callable[..., Any]) -> bool:
    """Whether the policy loss ``fn`` takes the importance weights by the keyword ``rollout_is_weights`` (a named
    parameter: a loss that only has ``**kwargs`` would take them and might drop them silently)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    p = params.get(WEIGHTS_KEYWORD)
    return p is not None and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def check_loss_takes_weights(
    fn: Callable[..., Any], loss_mode: str, plugin: str = "", takers: Sequence[str] = ()
) -> None:
    """A :class:`ConfigError` unless the policy loss ``fn`` (``actor.loss_mode``) :func:`takes_weights`; the message
    names ``takers``, the registered losses that do (the kernel's ``vanilla`` among them)."""
    if takes_weights(fn):
        return
    owner = f" (plugin {plugin!r})" if plugin and plugin != "plugrl" else ""
    names = list(takers) or ["vanilla"]
    either = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    raise ConfigError(
        f"algorithm.rollout_correction.mode weights the policy-gradient loss, but actor.loss_mode {loss_mode!r}"
        f"{owner} takes no `{WEIGHTS_KEYWORD}` keyword: it would train without the correction. Add a keyword "
        f"parameter `{WEIGHTS_KEYWORD}=None` ([B, T], multiply the per-token loss by it before aggregating) to "
        f"the loss, use actor.loss_mode {either}, or set algorithm.rollout_correction.mode=monitor (or off)"
    )
