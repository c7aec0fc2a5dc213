"""Whether the checkpoints ``trainer.resume=auto`` would continue are this run's.

Two runs that share a run directory (the same ``trainer.experiment_name``, as verl's example scripts for GRPO,
RLOO and REINFORCE++ do) share its checkpoints: without this check a second run of another algorithm resumed the
first one's checkpoint and said nothing. A checkpoint belongs to another run when one of :data:`IDENTITY_KEYS`
(the model, the algorithm, the data) differs; every other key (``total_steps``, the save/test/log frequencies,
the loggers, learning rates, batch sizes, ...) may change on resume.

What a checkpoint was made with is its ``trainer_state.json``'s ``run`` record (:func:`run_identity`, written by
every save), else the run directory's ``config.yaml`` (written by every start, so it speaks for checkpoints made
before the record existed).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from plugrl.checkpoint import list_checkpoints
from plugrl.config import Config, dump_config

log = logging.getLogger("plugrl.resume")

# the keys that make a checkpoint another run's: the model, the algorithm, the data
IDENTITY_KEYS = (
    "model.path",
    "model.tokenizer_path",
    "actor.lora.r",
    "critic.model.path",
    "algorithm.adv_estimator",
    "actor.loss_mode",
    "data.train_files",
    "data.dataset",
    "data.dataset_options",
    "environment",
)
RECORD_KEY = "run"  # where trainer_state.json keeps run_identity()
SHOWN_CHARS = 80  # of each value in the message


def run_identity(cfg: Config) -> dict[str, Any]:
    """``{key: value}`` of :data:`IDENTITY_KEYS` as the run's ``config.yaml`` holds them (resolved, redacted)."""
    return _identity(yaml.safe_load(dump_config(cfg)))


def _identity(tree: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in IDENTITY_KEYS:
        node: Any = tree
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            out[key] = node
    return out


def differences(made_with: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``key was X, now Y`` for each identity key both name with different values, options by their own dotted
    key (``data.dataset_options.size was 10, now 99``); a key a record lacks (an older plugrl's) is not compared."""
    return [
        line
        for key in IDENTITY_KEYS
        if key in made_with and key in now
        for line in _diff(key, made_with[key], now[key])
    ]


def _diff(key: str, old: Any, new: Any) -> list[str]:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        return [line for k in sorted({*old, *new}, key=str) for line in _diff(f"{key}.{k}", old.get(k), new.get(k))]
    return [] if old == new else [f"{key} was {_shown(old)}, now {_shown(new)}"]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def _record(ckpt: Path) -> dict[str, Any] | None:
    """A checkpoint's ``run`` record, or None (none written, or its trainer_state.json is unreadable: such a
    checkpoint fails its manifest check, and resuming skips it)."""
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    record = state.get(RECORD_KEY) if isinstance(state, dict) else None
    return record if isinstance(record, dict) else None


def _saved_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        return _identity(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        log.warning("could not read %s to check that its checkpoints are this run's (%s); resuming them", path, e)
        return None


def resume_problem(cfg: Config) -> str | None:
    """Why ``trainer.resume=auto`` must not continue the checkpoints in the run directory (they were made with
    another model, algorithm or data), as one message naming the differing keys and the ways out; None when
    they are this run's, when there are none, or when ``trainer.resume`` is not ``auto`` (``disable`` starts
    afresh; a checkpoint named by path is resumed as asked, its differences logged: :func:`warn_named`).
    Reads small files only; call it on the rank that writes the run directory, before any model loads."""
    if cfg.trainer.resume != "auto":
        return None
    run_dir = Path(cfg.trainer.run_dir)
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        return None
    now = run_identity(cfg)
    records = [(ckpt, record) for ckpt in reversed(ckpts) if (record := _record(ckpt)) is not None]
    if not records:  # checkpoints of an older plugrl: the run directory's config.yaml speaks for them
        saved = _saved_config(run_dir)
        records = [(ckpts[-1], saved)] if saved is not None else []
    for ckpt, made_with in records:
        found = differences(made_with, now)
        if found:
            return _refusal(cfg, run_dir, ckpt, found)
    return None


def _refusal(cfg: Config, run_dir: Path, ckpt: Path, found: list[str]) -> str:
    elsewhere = (
        "trainer.default_local_dir=<another folder>"
        if cfg.trainer.default_local_dir
        else f"a new trainer.experiment_name (now {cfg.trainer.experiment_name!r})"
    )
    return (
        f"trainer.resume=auto would continue {ckpt}, but that checkpoint was made by another run: "
        f"{'; '.join(found)}. Give this run a directory of its own ({elsewhere}), or start it afresh in {run_dir} "
        "with trainer.resume=disable"
    )


def warn_named(cfg: Config, ckpt: Path) -> None:
    """``trainer.resume=<path>``: log the identity keys on which the named checkpoint differs from this run."""
    made_with = _record(ckpt) or _saved_config(ckpt.parent.parent) or {}
    found = differences(made_with, run_identity(cfg))
    if found:
        log.warning("resuming %s as trainer.resume names it, though it was made by another run: %s", ckpt, found)
