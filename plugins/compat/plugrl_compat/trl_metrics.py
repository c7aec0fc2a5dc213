"""``trainer.metric_aliases: trl``: TRL's GRPOTrainer names for plugrl's metrics, logged beside them.

:data:`NAMES` is the entry point ``trl`` of the kernel's group ``plugrl.metric_aliases`` (:mod:`plugrl.tracking`):
``metrics.jsonl`` gets :func:`trl_aliases` of each step's metrics, wandb and TensorBoard get them under TRL's
``train/`` prefix, as transformers' callbacks write TRL's logs; so dashboards built on TRL runs work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# plugrl's metric -> TRL's names of the same quantity
TRL_METRIC_ALIASES: dict[str, tuple[str, ...]] = {
    "reward/mean": ("reward",),
    "reward/std": ("reward_std",),
    "response_length/mean": ("completion_length", "completions/mean_length"),  # TRL's older and current names
    "response_length/max": ("completions/max_length",),
    "response_length/clip_ratio": ("completions/clipped_ratio",),
    "response_length/min": ("completions/min_length",),
    "response_length/terminated_mean": ("completions/mean_terminated_length",),
    "response_length/terminated_max": ("completions/max_terminated_length",),
    "response_length/terminated_min": ("completions/min_terminated_length",),
    "adv/std_groups_zero_frac": ("frac_reward_zero_std",),
    "env/tool_calls": ("tools/call_frequency",),  # tool calls per completion
    "rollout_corr/logp_abs_diff_mean": ("sampling/sampling_logp_difference/mean",),
    "rollout_corr/logp_abs_diff_max": ("sampling/sampling_logp_difference/max",),
    "rollout_corr/rollout_is_mean": ("sampling/importance_sampling_ratio/mean",),
    "rollout_corr/rollout_is_min": ("sampling/importance_sampling_ratio/min",),
    "rollout_corr/rollout_is_max": ("sampling/importance_sampling_ratio/max",),
    "actor/kl_loss": ("kl",),
    "actor/entropy": ("entropy",),
    "actor/pg_clipfrac": ("clip_ratio/region_mean",),
    "actor/lr": ("learning_rate",),
    "actor/grad_norm": ("grad_norm",),
    "timing/step": ("step_time",),
}
TRL_WANDB_PREFIX = "train/"
# reward/<function>/mean holds the plugrl-wide values too: these are not reward functions
_NOT_REWARD_FUNCTIONS = frozenset({"mean", "std", "overlong_penalty_mean", "time_s", "unscored"})


def trl_aliases(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """TRL's names of the metrics in ``metrics`` (:data:`TRL_METRIC_ALIASES`, ``rewards/<func>/mean`` and ``/std``
    for each reward function's ``reward/<func>/mean`` and ``/std``, and TRL's ``tools/failure_frequency``, failed
    calls per call), with the same values; names plugrl logs itself are left alone."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        for alias in TRL_METRIC_ALIASES.get(key, ()):
            out[alias] = value
        parts = key.split("/")
        is_function = len(parts) == 3 and parts[0] == "reward" and parts[1] not in _NOT_REWARD_FUNCTIONS
        if is_function and parts[2] in ("mean", "std"):
            out[f"rewards/{parts[1]}/{parts[2]}"] = value
    calls, errors = metrics.get("env/tool_calls"), metrics.get("env/tool_errors")
    if calls and errors is not None:  # both per episode: their ratio is TRL's failures per call
        out["tools/failure_frequency"] = errors / calls
    return {k: v for k, v in out.items() if k not in metrics}


@dataclass(frozen=True)
class MetricNames:
    """What an entry of the group ``plugrl.metric_aliases`` gives the tracker: ``aliases(metrics)`` (other names
    with the same values) and ``logger_prefix`` (put before each in the loggers of installed packages)."""

    aliases: Callable[[Mapping[str, Any]], dict[str, Any]]
    logger_prefix: str = ""


NAMES = MetricNames(trl_aliases, TRL_WANDB_PREFIX)
