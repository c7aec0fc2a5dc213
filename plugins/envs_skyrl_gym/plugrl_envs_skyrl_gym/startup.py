"""What the plugin does when a run starts (hook ``plugrl_run_start``), before the first episode:

- tell each loaded environment class the run's ``rollout.max_turns`` (SkyRL's generator puts its
  ``max_turns`` in every environment's ``extras``) and ``data.prompt_key``;
- make the environment for the first row of each local data file, so that data without the fields the
  environment reads stops the run here, with the row and the field named, instead of failing every episode;
- check that the servers its ``env_config`` names (``search_url``) answer, so that a search environment
  without its retrieval server stops here instead of answering every search with a connection error.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from plugrl_envs_skyrl_gym.episode import SkyRLEpisode

FAMILY = "skyrl_gym"
# environment name ("skyrl_gym:gsm8k") -> the class the family's load made for it, in this process's newest
# run: the kernel registers that class; the run-start hook, which gets only the config, finds it here
LOADED: dict[str, type[SkyRLEpisode]] = {}
CONNECT_TIMEOUT_S = 5.0


def named_environments(config: Any) -> list[str]:
    """The skyrl_gym environments ``environment`` names (one name, or the values of its routes)."""
    env = getattr(config, "environment", None)
    names = [env] if isinstance(env, str) else list((env or {}).values())
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n.startswith(FAMILY + ":")]


def prepare_run(config: Any) -> None:
    """Everything above, for each skyrl_gym environment the config names. Raises an error that names the
    environment, the row or the server, and the fix."""
    for name in named_environments(config):
        cls = LOADED.get(name)
        if cls is None:  # it failed to load, and the kernel has said why
            continue
        cls.max_turns = config.rollout.max_turns
        cls.prompt_key = config.data.prompt_key
        check_servers(name, cls.env_config)
        if isinstance(config.environment, str):  # every row plays it (with routes, only some rows would)
            check_first_rows(name, cls, config.data)


def check_servers(name: str, env_config: Any) -> None:
    """A ConnectionError when a URL among ``env_config``'s values (``search_url``) has nothing listening."""
    for key, value in dict(env_config or {}).items():
        if not (isinstance(value, str) and value.startswith(("http://", "https://"))):
            continue
        parts = urlsplit(value)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname or "localhost", port), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as e:
            raise ConnectionError(
                f"environment {name!r}: nothing answers at {value} (environment_options.{key}: {e}); start the "
                f"server it needs before training (SkyRL's docs for this environment say how), or set "
                f"environment_options.{key} to one that runs"
            ) from None


def check_first_rows(name: str, cls: type[SkyRLEpisode], data: Any) -> None:
    """Start and close an episode on the first valid row of each local data file (``data.train_files`` and
    ``data.val_files``); a ValueError naming the environment and the row when the environment refuses it.
    Rows from hub datasets and ``data.dataset`` are checked by their episodes' own start instead."""
    from plugrl.data import DataError, load_samples

    probe = data.model_copy(update={"max_samples": 1, "skip_invalid": False})
    files = [(f, data.split) for f in data.train_files] + [(f, data.val_split) for f in data.val_files]
    for path, split in files:
        if str(path).startswith("hub:") or not Path(path).exists():
            continue
        try:
            samples, _ = load_samples(probe, None, split, files=[path], ground_truth_optional=lambda _: True)
        except DataError:
            continue  # a row plugrl cannot read: the kernel reports it when it loads the data
        episode = cls()
        try:
            episode.start(samples[0])
        except Exception as e:
            raise ValueError(f"environment {name!r} refuses the data: {e}") from None
        finally:
            episode.close()
