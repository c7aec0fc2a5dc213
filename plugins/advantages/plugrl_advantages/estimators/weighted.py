"""Creativity-weighted GRPO: GRPO's advantage combined with a bonus for rarely used solution strategies.

From the creativity-weighted GRPO fork of verl (``grpo_weighted_add`` / ``grpo_weighted_mul``): a
solution classifier (an LLM) groups the responses to each prompt by overarching method; a response
whose method few of its siblings share gets a larger weight, ``1 / freq^p``, which is added to or
multiplied with its GRPO advantage. The fork hard-codes ``p = 0.7``; here it is
``algorithm.weight_power``.

Both estimators get the strategy groups themselves, through their step context
(:func:`plugrl_advantages.classify.solution_groups`): the solution classifier named by ``algorithm.classifier``
(not set: ``openai``, from the classifier_openai plugin) is asked about each prompt's responses. Their options
(:class:`WeightedOptions`) declare the classifier keys, so this plugin settles and checks them at start. When the
classifier fails for a prompt each of its responses gets its own group, and ``algorithm.classifier: off`` does so
for every prompt, so every weight there is 1: ``grpo_weighted_mul`` is then plain GRPO, ``grpo_weighted_add``
GRPO + 1.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ConfigDict, Field, field_validator

from plugrl.algorithms import AdvantageBatch, AdvantageResult
from plugrl.specs import advantage_estimator

from ..classify import SolutionGroupsOptions, solution_groups
from ..common import advantage_metrics, group_index, outcome_to_tokens, zero_std_group_frac
from .grpo import grpo_outcome_advantage

if TYPE_CHECKING:
    from plugrl.config import AlgorithmConfig

DEFAULT_WEIGHT_POWER = 0.7


def creativity_weights(
    strategy_ids: torch.Tensor, prompt_group_ids: torch.Tensor, power: float = DEFAULT_WEIGHT_POWER
) -> torch.Tensor:
    """The creativity weight of every response: rarer strategies among its prompt's responses weigh more.

    Shapes: ``strategy_ids`` [B] (any integers; responses with equal ids within one prompt share a
    strategy), ``prompt_group_ids`` [B] (the responses to one prompt share an id); returns [B] float32.

    Formula, for response i of prompt g with strategy s_i::

        freq_i = #{j in g : s_j = s_i}      # counted within the prompt only (i itself included)
        w_i    = 1 / freq_i^power

    so a strategy used by a single response weighs 1 and one shared by ``k`` responses ``k^-power``.
    Strategy ids are only compared within a prompt: the same id under two prompts is two strategies.
    Raises ValueError for mismatched shapes or a ``power`` that is not a finite number > 0.
    """
    if isinstance(power, bool) or not isinstance(power, (int, float)) or not math.isfinite(power) or power <= 0:
        raise ValueError(f"the creativity weight power must be a finite number > 0, got {power!r}")
    strategies = torch.as_tensor(strategy_ids)
    prompts = torch.as_tensor(prompt_group_ids, device=strategies.device)
    if strategies.dim() != 1 or strategies.shape != prompts.shape:
        raise ValueError(
            f"strategy_ids and prompt_group_ids must both have shape [B], got {tuple(strategies.shape)} "
            f"and {tuple(prompts.shape)}"
        )
    if strategies.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=strategies.device)
    pairs = torch.stack([prompts.long(), strategies.long()], dim=1)  # (prompt, strategy) per response
    _, inverse, counts = torch.unique(pairs, dim=0, return_inverse=True, return_counts=True)
    freq = counts[inverse].to(torch.float64)
    return freq.pow(-float(power)).float()


def strategies_per_prompt(strategy_ids: torch.Tensor, prompt_group_ids: torch.Tensor) -> float:
    """The mean number of distinct strategies among each prompt's responses (0.0 for an empty batch)."""
    strategies = torch.as_tensor(strategy_ids)
    prompts = torch.as_tensor(prompt_group_ids, device=strategies.device)
    if strategies.numel() == 0:
        return 0.0
    pairs = torch.unique(torch.stack([prompts.long(), strategies.long()], dim=1), dim=0)
    _, num_prompts = group_index(prompts)
    return pairs.shape[0] / num_prompts


class WeightedOptions(SolutionGroupsOptions):
    """The ``algorithm`` keys of both creativity-weighted estimators, declared once: the kernel validates
    them at start-up (``options=`` of the registration) and sets them on ``config``. Besides ``weight_power``, the
    classifier's keys (:class:`plugrl_advantages.classify.SolutionGroupsOptions`)."""

    model_config = ConfigDict(extra="forbid")

    weight_power: float = Field(
        DEFAULT_WEIGHT_POWER, description="The exponent p of the creativity weight 1 / freq^p (> 0)."
    )

    @field_validator("weight_power", mode="before")
    @classmethod
    def _positive(cls, value: Any) -> float:
        try:
            power = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            power = math.nan
        if not math.isfinite(power) or power <= 0:
            raise ValueError(
                f"algorithm.weight_power must be a number > 0 (the exponent p of the creativity weight "
                f"1 / freq^p; default {DEFAULT_WEIGHT_POWER}), got {value!r}"
            )
        return power


def weight_power(config: Any) -> float:
    """``algorithm.weight_power`` (default 0.7), validated by :class:`WeightedOptions` (the kernel has done so
    at start-up; a config built by hand is checked here)."""
    extra = getattr(config, "model_extra", None) or {}
    given = {"weight_power": extra["weight_power"]} if "weight_power" in extra else {}
    return WeightedOptions.model_validate(given).weight_power


def _strategies(strategies: Any, batch: AdvantageBatch, name: str) -> torch.Tensor:
    groups = torch.as_tensor(strategies)
    if groups.shape != batch.group_ids.shape:
        raise ValueError(
            f"{name}: the strategy ids have shape {tuple(groups.shape)}, the batch has {tuple(batch.group_ids.shape)}"
        )
    return groups


def grpo_weighted_advantage(
    batch: AdvantageBatch, config: AlgorithmConfig, mode: str, strategies: torch.Tensor
) -> AdvantageResult:
    """GRPO advantage combined with :func:`creativity_weights`: ``A_i + w_i`` (mode "add") or ``A_i * w_i`` ("mul").

    ``A_i`` is :func:`plugrl_advantages.estimators.grpo.grpo_outcome_advantage` of the sequence scores
    (reads ``config.epsilon`` and ``config.norm_adv_by_std_in_grpo``, as ``grpo``); ``w_i`` uses the
    strategy ids ``strategies`` ([B], equal within a prompt: the same strategy) and ``p = algorithm.weight_power``.
    The combined value is put on every response token ([B, T], 0 on padding); ``returns`` are the advantages
    (as verl). A pure function: the estimators get ``strategies`` from the classifier first.

    Metrics: ``adv/mean``, ``adv/max``, ``adv/min``, ``adv/std_groups_zero_frac`` (as ``grpo``) and
    ``creativity/grpo_adv_mean`` (mean GRPO advantage over responses), ``creativity/weight_mean``,
    ``creativity/weight_min``, ``creativity/weight_max``, ``creativity/groups_mean`` (distinct
    strategies per prompt).
    """
    if mode not in ("add", "mul"):
        raise ValueError(f"mode must be 'add' or 'mul', got {mode!r}")
    name = f"grpo_weighted_{mode}"
    power = weight_power(config)
    strategies = _strategies(strategies, batch, name)
    with torch.no_grad():
        scores = batch.scores
        grpo_adv = grpo_outcome_advantage(
            scores, batch.group_ids, epsilon=config.epsilon, norm_by_std=config.norm_adv_by_std_in_grpo
        )
        weights = creativity_weights(strategies, batch.group_ids, power).to(grpo_adv.device)
        combined = grpo_adv + weights if mode == "add" else grpo_adv * weights
        advantages = outcome_to_tokens(combined, batch.response_mask)
        metrics = advantage_metrics(advantages, batch.response_mask)
        metrics["adv/std_groups_zero_frac"] = zero_std_group_frac(scores, batch.group_ids)
        empty = weights.numel() == 0
        metrics["creativity/grpo_adv_mean"] = 0.0 if empty else grpo_adv.mean().item()
        metrics["creativity/weight_mean"] = 0.0 if empty else weights.mean().item()
        metrics["creativity/weight_min"] = 0.0 if empty else weights.min().item()
        metrics["creativity/weight_max"] = 0.0 if empty else weights.max().item()
        metrics["creativity/groups_mean"] = strategies_per_prompt(strategies, batch.group_ids)
    return AdvantageResult(advantages=advantages, returns=advantages, metrics=metrics)


def _weighted(batch: AdvantageBatch, config: AlgorithmConfig, mode: str) -> AdvantageResult:
    """The registered estimators: the strategy groups from the classifier (through the step context), then the math;
    the classifier's metrics join the estimator's."""
    weight_power(config)  # a bad power is named before any classifier is asked
    strategies, classifier_metrics = solution_groups(batch, config)
    result = grpo_weighted_advantage(batch, config, mode, strategies)
    result.metrics.update(classifier_metrics)
    return result


@advantage_estimator("grpo_weighted_add", options=WeightedOptions)
def grpo_weighted_add(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """Creativity-weighted GRPO, additive: ``A_i = grpo_i + 1 / freq_i^p`` on every response token.

    The strategy groups come from the solution classifier ``algorithm.classifier``
    (:func:`plugrl_advantages.classify.solution_groups`); the math is :func:`grpo_weighted_advantage` (config
    keys ``epsilon``, ``norm_adv_by_std_in_grpo``, ``weight_power``; metrics ``adv/*``, ``creativity/*`` and the
    classifier's ``classifier/*``, ``timing/classify``).
    """
    return _weighted(batch, config, "add")


@advantage_estimator("grpo_weighted_mul", options=WeightedOptions)
def grpo_weighted_mul(batch: AdvantageBatch, config: AlgorithmConfig) -> AdvantageResult:
    """Creativity-weighted GRPO, multiplicative: ``A_i = grpo_i / freq_i^p`` on every response token.

    As :func:`grpo_weighted_add`, with the weight multiplied instead of added.
    """
    return _weighted(batch, config, "mul")
