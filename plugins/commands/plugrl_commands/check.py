"""``plugrl train --check``: the whole start-up of a training run but the models, and what became of every key.

It resolves the config (a plugrl file, or what an installed config reader claims: a TRL file, overrides only on
verl's defaults), loads the plugins, reads, checks and routes the data, and checks the run directory, exactly as
``plugrl train`` does before it loads a model (:func:`plugrl.startup.check_run`,
:func:`plugrl.startup.load_run_data`); then prints, for every key the user set, its fate: acted on (as which
plugrl key), accepted and not acted on (and what plugrl does instead), or refused (and why). Exit 0 when
``plugrl train`` with the same arguments would start training, 2 otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from plugrl.config import Config, ConfigError, ignored_keys
from plugrl.data import PromptBatcher
from plugrl.dist import launched_world_size
from plugrl.episodes import dapo_settings
from plugrl.readers import Fate, start_notes
from plugrl.resume_check import resume_problem
from plugrl.startup import check_run, load_run_data, output_dir_problem
from plugrl.tracking import logger_problem

WIDTH = 56  # the key=value column


def _shown(fate: Fate) -> str:
    from plugrl.config import is_secret_key

    value = "***" if is_secret_key(fate.key) else repr(fate.value) if isinstance(fate.value, str) else str(fate.value)
    room = max(12, WIDTH - len(fate.key) - 1)  # the key whole, the value cut to what is left
    return f"{fate.key}={value if len(value) <= room else value[: room - 3] + '...'}"


def fate_lines(fates: Iterable[Fate], not_acted: dict[str, str] | None = None) -> list[str]:
    """One line per key as typed: ``key=value   -> plugrl key`` / ``not acted on: why`` / ``refused: why``.
    ``not_acted``: keys that map to a plugrl key plugrl accepts only for compatibility, with what it does instead."""
    not_acted = not_acted or {}
    lines = []
    for f in fates:
        if f.kind == "refused":
            outcome = "REFUSED: unknown key" if f.unknown else f"REFUSED: {f.why}"
        elif f.kind == "not acted" or f.key in not_acted:
            outcome = f"not acted on: {f.why or not_acted.get(f.key, '')}"
        elif f.target:
            outcome = f"-> {f.target}" if f.target != f.key else "acted on"
        else:
            outcome = f"acted on ({f.why})" if f.why else "acted on"
        lines.append(f"  {_shown(f):<{WIDTH}}  {outcome}")
    return lines


def _compat_only(cfg: Config) -> dict[str, str]:
    """Typed keys that became plugrl keys plugrl accepts but does not act on (``use_remove_padding``, ...)."""
    out = {}
    for text in ignored_keys(cfg):
        key, _, why = text.partition(" (")
        out[key] = why.removesuffix(")")
    return out


def check_training(cfg: Config) -> list[str]:
    """Everything ``plugrl train`` checks before it loads a model; the report's lines. Raises what the run
    would raise (:class:`ConfigError`, :class:`plugrl.data.DataError`, :class:`plugrl.plugins.PluginError`,
    :class:`plugrl.rewards.RewardError`)."""
    problem = logger_problem(cfg.trainer.logger)
    if problem:
        raise ConfigError(problem)
    run = check_run(cfg, training=True, warn_ignored=False)
    data = load_run_data(cfg, run.registry)
    problem = output_dir_problem(cfg.trainer.run_dir) or resume_problem(cfg)
    if problem:
        raise ConfigError(problem)
    dp = max(1, launched_world_size() // cfg.actor.tp_size)
    gen = cfg.data.gen_batch_size if dapo_settings(cfg)[0] else None
    batcher = PromptBatcher.from_config(data.prompts, cfg.data, world_size=dp, batch_size=gen)
    steps = cfg.trainer.total_steps or batcher.batches_per_epoch * cfg.trainer.total_epochs
    sources = sorted({p.sample.data_source for p in data.prompts})
    lines = [
        f"plugins: {', '.join(cfg.plugins) or 'none'}",
        f"estimator: {run.estimator.name} ({run.estimator.plugin}); policy loss: {run.policy_loss.name}",
        f"data: {len(data.prompts)} training prompts ({', '.join(sources)}), {len(data.val_prompts)} validation",
        f"steps: {steps} of {cfg.data.train_batch_size} prompts x {cfg.rollout.n} samples",
        f"run directory: {cfg.trainer.run_dir} (trainer.resume: {cfg.trainer.resume})",
    ]
    return lines + start_notes(cfg)  # a verl script's: the verl defaults plugrl does not take


def report(cfg: Config | None, error: Exception | None) -> tuple[list[str], int]:
    """The ``--check`` report: the keys' fates, then the run's summary (or the error that stops it); the exit code."""
    fates = getattr(cfg, "_key_fates", None) if cfg is not None else getattr(error, "fates", [])
    lines = [f"keys set ({len(fates or [])}):", *fate_lines(fates or [], _compat_only(cfg) if cfg else None)]
    if error is None and cfg is not None:
        from plugrl.checkpoint import CheckpointError
        from plugrl.data import DataError
        from plugrl.plugins import PluginError
        from plugrl.rewards import RewardError

        try:
            lines += check_training(cfg)
        except (ConfigError, DataError, PluginError, RewardError, CheckpointError) as e:
            error = e  # what stops the run stops the check
    if error is not None:  # on one line: `invalid config in X:\n  a\n  b` -> `invalid config in X: a; b`
        head, *rest = str(error).splitlines() or [""]
        rest = [line.strip() for line in rest if line.strip()]
        lines.append(f"check: FAILED: {head} {'; '.join(rest)}" if rest else f"check: FAILED: {head}")
        return lines, 2
    lines.append("check: ok (plugrl train with these arguments starts training)")
    return lines, 0


def check_command(args: Any) -> int:
    """``plugrl train --check`` (the entry point of group ``plugrl.train_check``, which the kernel's ``plugrl train``
    calls with its parsed arguments): the config resolved as ``plugrl train`` resolves it, then :func:`report` on
    stdout; 0 or 2. The keys' fates are the reader's when a config reader claims the arguments (a TRL file's keys
    as typed, then the plugrl overrides')."""
    from plugrl.cli import reader_of, train_arguments
    from plugrl.config import load_config
    from plugrl.data import DataError
    from plugrl.plugins import PluginError

    cfg, error, train_args, reader = None, None, None, None
    try:
        train_args = train_arguments(args)
        reader = reader_of(train_args)
        cfg = reader.load(train_args) if reader else load_config(train_args.config, list(train_args.overrides))
    except (ConfigError, DataError, PluginError) as e:
        error = e
    if reader is not None:
        built = getattr(cfg, "_key_fates", []) if cfg is not None else getattr(error, "fates", [])
        try:
            fates = reader.check_fates(train_args, built or [])
        except ConfigError:  # arguments the load refused already: the error says why
            fates = list(built or [])
        if cfg is not None:
            cfg._key_fates = fates
        else:
            error.fates = fates
    lines, code = report(cfg, error)
    print("\n".join(lines))
    return code
