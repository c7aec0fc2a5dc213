"""Hook specifications: the contract between the kernel and its plugins.

A plugin is a module (or any object) named by an entry point in group ``plugrl``
or by ``module:object`` in the run config's ``plugins`` list. It contributes by
implementing any of the hooks below with ``@plugrl.hookimpl``, or, more simply,
by decorating functions with ``@plugrl.reward``, ``@plugrl.dataset``,
``@plugrl.template``, ``@plugrl.advantage_estimator``, ``@plugrl.environment``, ``@plugrl.tool`` and the
others of :mod:`plugrl.specs`; the loader turns those
decorated functions into implementations of the same hooks.

The hooks that register things (``plugrl_rewards`` to ``plugrl_tools``)
are called once, by :func:`plugrl.plugins.load_plugins`, right after the plugins
named in the config are imported and before any model or data is loaded.
Implementations must be cheap and side-effect free: return records, do no work.
Names must be unique across plugins; a clash is an error that names both plugins.
``plugrl_configure`` follows at once (each plugin settles its own keys, and may ask for
more plugins), then ``plugrl_check_config``, still before any model loads; the
lifecycle hooks ``plugrl_run_start`` / ``plugrl_run_end`` bracket the run itself,
``plugrl_samples`` hands on each step's samples and ``plugrl_final_checkpoint`` its last checkpoint. The modules
of the entry-point group ``plugrl.extensions`` (packages of plugrl's own, such as plugrl-hub and plugrl-compat)
implement hooks too: theirs are called in
every run, after the named plugins'.

Order: the kernel calls every hook through one path (:func:`plugrl.plugins.call_hook`),
plugin by plugin in the order of ``plugins:`` in the run config (within a plugin, its
``@hookimpl`` functions before its decorated ones), never through pluggy's relay,
whose order is the reverse. An implementation that raises is reported with its
plugin's name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from plugrl.specs import (
    DatasetSpec,
    EngineSpec,
    EnvironmentSpec,
    EstimatorSpec,
    PolicyLossSpec,
    Registry,
    RewardSpec,
    TemplateSpec,
)

if TYPE_CHECKING:
    from plugrl.config import Config
    from plugrl.specs import ToolSpec

PROJECT = "plugrl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def plugrl_rewards() -> list[RewardSpec]:
    """Return the reward functions this plugin provides.

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.specs.RewardSpec`. Each names the
    ``data_sources`` it scores (exact names such as ``openai/gsm8k`` or
    ``fnmatch`` globs such as ``*_tinyv``). A sample is routed to the functions
    whose pattern matches its ``data_source``, exact names before globs; several
    functions for one source are combined as a weighted sum (``weight``).

    The kernel calls ``spec.fn(completion, ground_truth, **context)`` for each
    sample, in a worker process for plain functions and concurrently on an event
    loop for ``async def`` ones. It must return a float, or a dict with
    ``score`` plus extra fields to log. It must not rely on global state set in
    the trainer process.

    A batch reward (``fn.plugrl_batch = True``, or :func:`plugrl.rewards.trl_reward`) is
    called as ``fn(prompts, completions, **columns)`` once per scoring round with every
    sample of the round routed to it, in the trainer's process, and returns one score
    (or ``None``: does not apply) per completion. A collective one (also
    ``fn.plugrl_collective = True``, or ``trl_reward(fn, collective=True)``), whose calls run
    collectives across the ranks (a model sharded with FSDP2), is called on every rank in
    every scoring round, with this rank's items, possibly none (empty lists): it must run
    the same collectives on every rank, whatever its share, and must not raise on one rank
    alone (the others would wait until the process group's timeout). Under one process it
    is called in every round too, possibly with none.
    """


@hookspec
def plugrl_datasets() -> list[DatasetSpec]:
    """Return the datasets this plugin provides.

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.specs.DatasetSpec`. The kernel calls
    ``spec.fn(split, **data.dataset_options)`` when ``data.dataset`` names it,
    once per rank, and expects a finite iterable of rows (mappings) in the
    sample schema: ``prompt`` (text or chat messages), ``data_source``,
    ``ground_truth`` (or verl's ``reward_model.ground_truth``), ``extra_info``.
    Generators must be deterministic for a given ``seed`` option.
    """


@hookspec
def plugrl_templates() -> list[TemplateSpec]:
    """Return the prompt templates this plugin provides.

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.specs.TemplateSpec`. When ``data.template``
    names one, the kernel calls ``spec.fn(sample)`` for every sample before
    tokenising and expects raw prompt text or a list of chat messages.
    """


@hookspec
def plugrl_advantage_estimators() -> list[EstimatorSpec]:
    """Return the advantage estimators this plugin provides.

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.specs.EstimatorSpec`. The trainer calls
    ``spec.fn(batch, config)`` once per step on each rank, with the step context, an
    :class:`plugrl.algorithms.AdvantageBatch` holding that rank's samples
    (whole groups: every sample of a prompt lives on one rank), the inputs the estimator
    declared (``needs_critic``, ``needs_greedy_baseline``) and the run's services
    (``batch.context``), and the ``algorithm`` config section. It must return an
    :class:`plugrl.algorithms.AdvantageResult` whose ``advantages`` has the
    shape of ``batch.response_mask`` ([B, T]).
    """


@hookspec
def plugrl_policy_losses() -> list[PolicyLossSpec]:
    """Return the policy losses this plugin provides.

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.specs.PolicyLossSpec`. When ``actor.loss_mode``
    names one, the actor calls ``spec.fn(logprob, old_logprob, advantages, response_mask,
    config, num_tokens=, num_seqs=, norm_length=)`` for every micro-batch of every update
    and backpropagates the loss it returns. The kernel registers ``vanilla``
    itself (plugin ``plugrl``); registering that name again is a clash.
    """


@hookspec
def plugrl_rollout_engines() -> list[EngineSpec]:
    """Return the rollout engines this plugin provides (an SGLang engine, a pool of remote servers, ...).

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.specs.EngineSpec`. When ``rollout.name`` names one, the trainer and
    ``plugrl eval`` call ``spec.factory(**kwargs)`` once per process (the keywords: :class:`plugrl.specs.EngineSpec`)
    and drive the engine it returns through :class:`plugrl.rollout.types.RolloutEngine`: it must return exactly the
    tokens it sampled, take the policy's new weights after every update before the next generation, and free its
    device memory in ``sleep`` when the trainer shares the device. The kernel registers ``vllm`` (vLLM in the
    training process) and ``hf`` (transformers' generate); registering one of those names again is a clash.
    """


@hookspec
def plugrl_environments() -> list[EnvironmentSpec]:
    """Return the environments this plugin provides, for multi-turn episodes.

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.specs.EnvironmentSpec`. When the config's ``environment`` names
    one (for every sample, or for the samples whose ``data_source`` a route matches), the trainer, and
    ``plugrl eval``, call ``spec.factory(**environment_options)`` once per episode, on the rank that
    generates it, and drive the object it returns: ``start(sample)`` before the first policy turn,
    ``step(turn)`` after each, and, if its class has one, ``reward()`` once the episode has ended without
    a reward from ``step`` (the contract and its types: :mod:`plugrl.rollout.environment`). All may be
    ``async def``; many episodes run at once, so per-episode state belongs on that object, never in
    globals. They must not block for long (a slow one holds up the whole turn of every episode) and must
    not touch the trainer's state. One that raises ends its episode only.

    A spec with ``load`` set (``@plugrl.environment_family("lib")``) is a family: the config names its
    members ``lib:<id>``, and the kernel calls ``load(id, **environment_options)`` once per run at start-up
    and trains the spec it returns, whose ``dataset`` (if any) is the run's data when the config names none.
    ``load`` may import a library and read files; what it raises is a start-up error naming the environment.
    """


@hookspec
def plugrl_tools() -> list[ToolSpec]:
    """Return the tools this plugin provides: plain functions the policy may call in multi-turn episodes.

    Called by: the plugin loader, once per run.
    Returns: a list of :class:`plugrl.rollout.tools.ToolSpec` (``@plugrl.tool`` makes one from a
    function's signature and docstring). The tools named in ``rollout.tools``, and those an
    environment's ``start`` asks for, are shown to the model through the chat template
    (``apply_chat_template(tools=...)``). The kernel parses the calls in each reply
    (``rollout.tool_parser``) and runs them in worker processes, concurrently, each within its time
    limit; so a tool must be a module-level function (picklable) whose arguments and result are plain
    data. Whatever goes wrong (a malformed call, an unknown tool, bad arguments, an exception, a
    timeout) is returned to the model as the tool's answer and counted in ``env/tool_errors``; it never
    stops the run. A tool receives model output: it must not execute it outside a sandbox
    (:mod:`plugrl_tools.sandbox`).
    """


@hookspec
def plugrl_configure(config: Config, registry: Registry, training: bool) -> dict[str, str] | None:
    """Settle this plugin's part of the run config, and name the plugins the run needs beside the loaded ones.

    Called by: :func:`plugrl.plugins.configure_plugins`, which ``plugrl train`` (``training`` True) and ``plugrl
    eval`` (False) call right after the plugins load, before any check; then again, on every plugin, after it
    loaded the plugins named, until none is missing: asked twice, it must answer the same. ``config`` is the
    :class:`plugrl.config.Config` with the plugin-owned keys as written (not validated yet); the hook may settle
    the keys of this plugin's options there (a default that depends on other keys; a key this run will not read,
    removed). ``registry``: what the loaded plugins registered (:class:`plugrl.specs.Registry`).
    Returns: ``{plugin: why this run needs it}`` (an entry-point name or ``module:object``), or None. The kernel
    appends the plugins not loaded yet to ``config.plugins`` (so the run's config.yaml names them) and loads them;
    one that is not installed stops the run with a :class:`plugrl.plugins.PluginError` naming it, the package to
    install and the reason given. Must not raise, start anything or contact a server.
    """


@hookspec
def plugrl_check_config(config: Config, registry: Registry, training: bool) -> list[str] | None:
    """Check this plugin's part of the run config (e.g. its ``reward.options.<name>``) and report problems.

    Called by: :func:`plugrl.plugins.check_config`, which the trainer (and ``plugrl eval``) call on
    every rank right after the plugins are loaded, before any tokenizer, model or data is loaded,
    so a typo costs seconds, not a model load. ``config`` is the validated :class:`plugrl.config.Config`
    (``model.path`` as written: a ``local:`` name is not resolved yet), whose plugin-owned keys the
    kernel has already validated against the options the plugins' functions declared. ``registry``: what
    the loaded plugins registered (:class:`plugrl.specs.Registry`), for checks against another plugin's
    records (``registry.plugin_records``); a check may write back the values it validated. ``training``: True for
    ``plugrl train``, False for ``plugrl eval`` (which trains, saves and uploads nothing).
    Returns: a list of problems, each one sentence that names the config key (e.g.
    ``reward.options.tinyv.model``), what is wrong with it and how to fix it; an empty list or
    None when all is well (also when the config does not use this plugin's options). Must not
    raise for a bad config (an exception is reported as a bug of the plugin), start anything or
    contact a server: :func:`plugrl_run_start` does that. The kernel collects the problems of every
    plugin and stops the run with one :class:`plugrl.config.ConfigError` listing them all.
    """


@hookspec
def plugrl_run_start(config: Config, run_dir: Path | None) -> None:
    """Start what the plugin needs for this run (e.g. launch a local verifier server).

    Called by: the trainer on every rank, after the run directory exists and before
    the first step (``plugrl eval`` calls it too, with ``run_dir=None``), plugin by
    plugin in ``plugins:`` order (:class:`plugrl.plugins.PluginRun`).
    ``config`` is the resolved :class:`plugrl.config.Config`. Raise to stop the run
    with a clear message before any training: the plugins started before this one are
    ended (:func:`plugrl_run_end`), this one and those after it are not. The models are
    loaded by now: check the config in :func:`plugrl_check_config` instead, which runs
    before they load.
    """


@hookspec
def plugrl_step_metrics(step: int) -> dict[str, float] | None:
    """Metrics the plugin counted during training step ``step`` (1-based), to log with the kernel's.

    Called by: the trainer on every rank at the end of each training step, after the update.
    Returns: ``{name: number}`` under the plugin's own names (e.g. ``verifier/failures``: what
    happened since the previous call, not a running total), or None. The kernel averages each
    name over ranks like its own metrics and logs it to the console, ``metrics.jsonl``, wandb and
    TensorBoard. A name the kernel or another plugin also reports is an error. Must not raise.
    """


@hookspec
def plugrl_samples(config: Config, run_dir: Path, step: int, rows: list[dict[str, Any]], validation: bool) -> None:
    """Hand on a step's samples (write them in another project's layout, send them elsewhere).

    Called by: the trainer on rank 0 only, with the samples of every rank: after each training step's update
    (``validation`` False, ``step`` 1-based) and after each validation (``validation`` True; step 0: before
    training). ``rows``: one mapping per sample, as ``rollouts/step_N.jsonl`` and ``validation/step_N.jsonl`` hold
    them (``prompt``, ``completion``, ``data_source``, ``ground_truth``, ``reward``, ``details``, ...); read them,
    do not change them. A run with any implementation gathers each step's samples even when
    ``trainer.save_rollouts`` is off. Must not raise: one that does stops the run, reported as a bug of the plugin.
    """


@hookspec
def plugrl_final_checkpoint(config: Config, run_dir: Path, checkpoint: Path | None, steps: int) -> None:
    """Hand on the run's final checkpoint (upload it, copy it, register it).

    Called by: the trainer on rank 0 only, once its steps are done and the rollout engine is closed, before
    :func:`plugrl_run_end`; not when the run ends with an error. ``checkpoint``: the last step's
    (``RUN_DIR/checkpoints/step_N``, ``policy/`` or ``policy_adapter/`` in it), or None when the run did not reach
    its last step (stopped by a signal) or saved none there; ``steps``: that last step's number. A complete run
    started again trains nothing and calls it again, so a hand-over that failed is retried by the same command.
    Raise :class:`plugrl.plugins.PluginError` (or a subclass) with a message for the user when the hand-over fails:
    the run ends with that message as it is (``plugrl: error: ...``, exit 2), its checkpoint kept on disk; anything
    else it raises is reported as a bug of the plugin. (Not :func:`plugrl_run_end`: that one runs on every rank, is
    told neither the checkpoint nor whether the last step was reached, and must not raise.)
    """


@hookspec
def plugrl_run_end(config: Config, run_dir: Path | None, error: BaseException | None) -> None:
    """Stop what :func:`plugrl_run_start` started.

    Called by: the trainer on every rank when the run ends: normally (``error`` is
    None), on an exception (``error`` is it), or on Ctrl-C; for every plugin whose
    ``plugrl_run_start`` succeeded (or that has none), in ``plugins:`` order, each one
    also when another raised. Must not raise: one that does is reported with the
    plugin's name (an error after a clean run, a log line when the run failed anyway).
    """
