"""The ``server`` rollout engine: the trainer's engine when ``rollout.mode`` is ``server``. This module is in the
entry-point group ``plugrl.extensions``, so every run has the engine, as it has the kernel's ``vllm`` and ``hf``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plugrl.specs import rollout_engine


@rollout_engine("server")
def server_engine(*, run_config: Any, rank: int, world_size: int, device: str, log_dir: Path, **_: Any) -> Any:
    """The rollout servers of the run (``rollout.server_urls``, or ``rollout.servers`` started here by rank 0), as
    this rank's engine (:func:`plugrl_rollout_servers.remote.connect`)."""
    from plugrl_rollout_servers.remote import connect

    return connect(run_config, rank=rank, world_size=world_size, device=device, log_dir=log_dir)
