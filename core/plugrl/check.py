"""``plugrl train --check``: the whole start-up of a training run but the models, and what became of every key.

It resolves the config (a plugrl file, a TRL file, or overrides only on verl's defaults), loads the plugins,
reads, checks and routes the data, and checks the run directory, exactly as ``plugrl train`` does before it loads
a model (:func:`plugrl.startup.check_run`, :func:`plugrl.startup.load_run_data`); then prints, for every key the
user set, its fate: acted on (as which plugrl key), accepted and not acted on (and what plugrl does instead), or
refused (and why). Exit 0 when ``plugrl train`` with the same arguments would start training, 2 otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable

from plugrl import hub
from plugrl.config import Config, ConfigError, ignored_keys, verl_differences
from plugrl.data import PromptBatcher
from plugrl.dist import launched_world_size
from plugrl.resume_check import resume_problem
from plugrl.startup import check_run, load_run_data, output_dir_problem
from plugrl.tracking import logger_problem
from plugrl.verl_keys import Fate, fate_of

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
    problem = hub.token_problem(cfg.trainer) or logger_problem(cfg.trainer.logger)
    if problem:
        raise ConfigError(problem)
    run = check_run(cfg, training=True, warn_ignored=False)
    data = load_run_data(cfg, run.registry)
    problem = output_dir_problem(cfg.trainer.run_dir) or resume_problem(cfg)
    if problem:
        raise ConfigError(problem)
    dp = max(1, launched_world_size() // cfg.actor.tp_size)
    gen = cfg.data.gen_batch_size if cfg.algorithm.filter_groups.enable else None
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
    differences = verl_differences(cfg)
    if differences:
        lines.append(differences)
    return lines


def report(cfg: Config | None, error: Exception | None) -> tuple[list[str], int]:
    """The ``--check`` report: the keys' fates, then the run's summary (or the error that stops it); the exit code."""
    fates = getattr(cfg, "_key_fates", None) if cfg is not None else getattr(error, "fates", [])
    lines = [f"keys set ({len(fates or [])}):", *fate_lines(fates or [], _compat_only(cfg) if cfg else None)]
    if error is None and cfg is not None:
        from plugrl.checkpoint import CheckpointError
        from plugrl.data import DataError
        from plugrl.hub import HubError
        from plugrl.plugins import PluginError
        from plugrl.rewards import RewardError

        try:
            lines += check_training(cfg)
        except (ConfigError, DataError, PluginError, RewardError, HubError, CheckpointError) as e:
            error = e  # what stops the run stops the check
    if error is not None:  # on one line: `invalid config in X:\n  a\n  b` -> `invalid config in X: a; b`
        head, *rest = str(error).splitlines() or [""]
        rest = [line.strip() for line in rest if line.strip()]
        lines.append(f"check: FAILED: {head} {'; '.join(rest)}" if rest else f"check: FAILED: {head}")
        return lines, 2
    lines.append("check: ok (plugrl train with these arguments starts training)")
    return lines, 0


def _described(value: object) -> str:
    text = "null" if value is None else repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def verl_key_table(verl_keys: dict[str, object]) -> str:
    """Every key of verl's trainer config (``verl_keys``: dotted key -> verl's default) with its fate here, as a
    markdown table (docs/coming_from_verl.md; tests/test_verl_keys.py compares it with verl's installed file)."""
    from plugrl.config import is_plugrl_key
    from plugrl.verl_keys import rule_of

    rows = ["| verl key | verl's default | in plugrl |", "| --- | --- | --- |"]
    for key, default in verl_keys.items():
        fate = fate_of(key, default, is_plugrl_key)
        rule = rule_of(key) if fate is not None and fate.target is None else None
        if fate is None:
            cell = "refused: unknown"
        elif rule is not None and rule.accepts is not None:
            allowed = ", ".join(f"`{_described(a)}`" for a in rule.accepts)
            cell = f"at {allowed}: what plugrl does; other values refused: {rule.why}"
        elif fate.kind == "not acted":
            cell = f"accepted, not acted on: {fate.why}"
        elif fate.target == key:
            cell = "acted on, as in verl"
        else:
            cell = f"acted on as `{fate.target}`"
        cells = [f"`{key}`", f"`{_described(default)}`", cell]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def verl_config_keys() -> dict[str, object]:
    """Every leaf key of the installed verl wheel's trainer config (verl 0.9.1's ``_generated_ppo_trainer.yaml``)
    with its default; hydra's ``_target_`` class paths left out. Needs verl installed (``make setup`` installs it
    without its dependencies; nothing of it is imported)."""
    import importlib.metadata
    from pathlib import Path

    import yaml

    path = Path(importlib.metadata.distribution("verl").locate_file("verl/trainer/config/_generated_ppo_trainer.yaml"))

    def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in tree.items():
            if key == "_target_":
                continue
            if isinstance(value, dict) and value:
                out.update(leaves(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    return leaves(yaml.safe_load(path.read_text()))


def write_verl_key_table(path: str) -> None:
    """Replace the table between ``<!-- verl-keys:begin -->`` and ``<!-- verl-keys:end -->`` in ``path``."""
    from pathlib import Path

    begin, end = "<!-- verl-keys:begin -->\n", "<!-- verl-keys:end -->"
    text = Path(path).read_text()
    head, rest = text.split(begin, 1)
    Path(path).write_text(head + begin + verl_key_table(verl_config_keys()) + end + rest.split(end, 1)[1])


if __name__ == "__main__":  # `python -m plugrl.check docs/coming_from_verl.md`: the key table, from verl's file
    import sys

    write_verl_key_table(sys.argv[1])
