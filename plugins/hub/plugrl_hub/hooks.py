"""``trainer.push_to_hub`` on the kernel's hooks; an extension (entry point ``hub`` in group ``plugrl.extensions``),
so its hooks run in every run, and act only when ``trainer.push_to_hub`` is true in a training run:

- :func:`plugrl_check_config` (before any model loads): no Hugging Face token is a problem naming the key;
- :func:`plugrl_run_start` (every rank): rank 0 creates (or finds) the repo of ``trainer.hub_model_id``, as TRL does
  when its run starts, so no write access or a wrong name stops the run before any training; every rank gets the
  problem, so all stop together;
- :func:`plugrl_final_checkpoint` (rank 0, once the last step's checkpoint is written): uploads it; a failed upload
  ends the run with :class:`~plugrl_hub.upload.HubError`, the checkpoint kept (the same command again only uploads);
- :func:`plugrl_run_end`: forgets the run's repo.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch.distributed as dist

from plugrl import hookimpl
from plugrl.config import ConfigError
from plugrl.dist import broadcast_object

from .upload import prepare_repo, push_checkpoint, token_problem

log = logging.getLogger("plugrl.hub")

_REPOS: dict[str, str] = {}  # run directory -> the repo rank 0 created at its start, for its final checkpoint


def _pushes(config: Any) -> bool:
    return bool(getattr(getattr(config, "trainer", None), "push_to_hub", False))


@hookimpl
def plugrl_check_config(config: Any, training: bool) -> list[str] | None:
    """No token: a problem now, before any model loads (``plugrl eval`` uploads nothing: not checked)."""
    problem = token_problem(config.trainer) if training and _pushes(config) else None
    return [problem] if problem else None


@hookimpl
def plugrl_run_start(config: Any, run_dir: Path | None) -> None:
    """Rank 0 creates the repo; a problem stops every rank (a :class:`ConfigError` naming the key and the fix)."""
    if run_dir is None or not _pushes(config):  # plugrl eval (no run directory) uploads nothing
        return
    main = not dist.is_initialized() or dist.get_rank() == 0
    problem, repo = prepare_repo(config.trainer) if main else (None, None)
    problem = broadcast_object(problem)
    if problem:
        raise ConfigError(problem)
    if repo is not None:
        _REPOS[str(run_dir)] = repo


@hookimpl
def plugrl_final_checkpoint(config: Any, run_dir: Path, checkpoint: Path | None, steps: int) -> None:
    """The last step's checkpoint to the repo; a run stopped early uploads nothing (said in the log)."""
    repo = _REPOS.get(str(run_dir))
    if repo is None or not _pushes(config):
        return
    if checkpoint is None:
        log.warning("not uploaded to %s: the run did not reach its last step (%d)", repo, steps)
        return
    push_checkpoint(checkpoint, repo, f"plugrl: {config.trainer.experiment_name}, step {steps}")


@hookimpl
def plugrl_run_end(run_dir: Path | None) -> None:
    _REPOS.pop(str(run_dir), None)
