"""plugrl plugin: a discriminative reward model as a reward.

Registers the batch reward ``reward_model``: any Hugging Face ``AutoModelForSequenceClassification`` with one
output scores each (prompt, response), rendered with the reward model's own chat template, many samples per
forward pass (``max_tokens_per_batch``), in its own dtype and on its own device. Its options,
``reward.options.reward_model`` (:class:`Options`), are validated by the kernel at start-up; the model's
config (one output, a trained classification head) is checked by :func:`plugrl_check_config`, before any model
loads; the weights load at :func:`plugrl_run_start` and stay loaded, once per process, until
:func:`plugrl_run_end`.

Routing: the reward is registered for the data source ``reward_model``; ``reward.default: reward_model`` makes
it score every data source that no other reward claims; ``reward.extra: [reward_model]`` scores every sample
with it besides its routed rule reward (summed with ``reward.weights``, as TRL's ``reward_funcs`` mix a model
and functions). :func:`reward_model_spec` makes the reward model's record for other data sources. It scores the
text alone, so rows scored only by it need no ground truth.

It is a batch reward (the kernel's TRL-style form): the kernel calls it once per batch, in the trainer's
process, with no time limit. ``process: separate`` moves the model to a child process of its own. It is also a
collective batch reward (``plugrl_collective``): the kernel calls it on every rank in every scoring round, with
that rank's items or none. With ``shard: true`` under torchrun the model is sharded with FSDP2 over the ranks and
each call is a collective (:class:`ShardedScorer`); otherwise a call with no items returns at once.
"""

from __future__ import annotations

import logging
from typing import Any

from plugrl.hookspecs import hookimpl
from plugrl.options import reward_options
from plugrl.specs import RewardSpec, reward

from .options import WHERE, Options, parse
from .scoring import (
    LocalScorer,
    RewardModelError,
    RunningStats,
    SeparateScorer,
    ShardedScorer,
    check_model_config,
    normalize,
    release,
    render,
    reset_stats,
    running_stats,
    scorer,
    shard_numel,
    sharded,
    token_batches,
)

log = logging.getLogger("plugrl.reward_model")

__all__ = [
    "LocalScorer",
    "Options",
    "RewardModelError",
    "RunningStats",
    "SeparateScorer",
    "ShardedScorer",
    "normalize",
    "plugrl_check_config",
    "plugrl_run_end",
    "plugrl_run_start",
    "release",
    "render",
    "reward_model",
    "reward_model_spec",
    "running_stats",
    "scorer",
    "shard_numel",
    "sharded",
    "token_batches",
]

_warned_empty = False


@reward("reward_model", options=Options)
def reward_model(prompts: list[Any], completions: list[Any], **columns: Any) -> list[dict[str, Any]]:
    """Score each completion with the reward model: ``score`` (normalised and clipped as configured), ``raw``
    (the model's output) and ``truncated`` (the text was cut to ``max_length``), one dict per completion.

    ``prompts``: each sample's prompt as in the data (text, or chat messages); ``completions``: the responses
    (for chat prompts ``[{"role": "assistant", "content": ...}]``); ``columns``: the data's columns and, over
    them, the reward's options. Called on every rank in every scoring round, possibly with none: sharded
    (``shard: true`` under torchrun) every call is a collective, even with no items; otherwise no items, no work.
    """
    global _warned_empty
    if not prompts and not columns.get("shard"):
        return []  # nothing to score, and no sharded model whose collectives the other ranks wait in
    opts = Options.model_validate({k: columns[k] for k in Options.model_fields if k in columns})
    if not prompts and not sharded(opts):
        return []
    if not _warned_empty and any(p == "" for p in prompts):
        _warned_empty = True
        log.warning(
            "reward_model: some rows have an empty prompt (data.template builds theirs): the reward model sees the "
            "row's prompt, not the template's, so it scores those responses without their question"
        )
    raw, truncated = scorer(opts).score(prompts, completions, opts)
    scores = normalize(raw, opts)
    return [{"score": s, "raw": r, "truncated": t} for s, r, t in zip(scores, raw, truncated, strict=True)]


reward_model.plugrl_batch = True  # type: ignore[attr-defined]  # once per batch, in the trainer's process
# every rank, every round, with its items or none: a sharded model's forward passes are collectives
reward_model.plugrl_collective = True  # type: ignore[attr-defined]
reward_model.plugrl_ground_truth_optional = True  # type: ignore[attr-defined]  # it scores the text alone


def reward_model_spec(*data_sources: str, name: str = "reward_model", weight: float = 1.0) -> RewardSpec:
    """The reward model's record for ``data_sources`` (exact names or globs): a plugin that lists it beside a rule
    reward for the same data source gets both scores, summed with ``reward.weights``. Keep ``name``
    ``reward_model`` to share ``reward.options.reward_model`` (and the loaded model)."""
    if not data_sources:
        raise TypeError("reward_model_spec needs at least one data_source name or glob")
    return RewardSpec(name=name, fn=reward_model, data_sources=tuple(data_sources), weight=weight, options=Options)


@hookimpl
def plugrl_check_config(config: Any) -> list[str] | None:
    """The model at ``reward.options.reward_model.path`` is a sequence classifier with one output (its config
    alone is read: no weights load)."""
    raw = reward_options(config, "reward_model")
    if raw is None:
        return None
    try:
        opts = parse(raw)
    except ValueError:
        return None  # the kernel reports it, under the option's key
    return check_model_config(opts) or None


@hookimpl
def plugrl_run_start(config: Any) -> None:
    """Load the reward model now: a model that does not load stops the run before any training."""
    raw = reward_options(config, "reward_model")
    if raw is None:
        return
    reset_stats()
    opts = parse(raw)
    try:
        scorer(opts)
    except RewardModelError:
        raise
    except Exception as e:  # transformers' own errors: say which option they come from
        raise RewardModelError(
            f"{WHERE}.path={opts.path!r}: the reward model did not load ({type(e).__name__}: {e})"
        ) from e


@hookimpl
def plugrl_run_end() -> None:
    """Unload the reward model(s) and forget the running statistics. Never raises."""
    try:
        release()
        reset_stats()
    except Exception as e:  # a run end must not raise
        log.warning("reward_model: unloading the reward model failed: %s", e)
