"""plugrl plugin: NovaSky's skyrl-gym environments, trained unchanged (``environment: skyrl_gym:<id>``).

Registers the environment family ``skyrl_gym``: ``environment: skyrl_gym:gsm8k`` makes each episode's
environment with ``skyrl_gym.make("gsm8k", env_config=..., extras=...)`` from skyrl-gym's own registry, as
SkyRL's generator does: ``environment_options`` are its ``env_config``, and the sample's row (every column
but the prompt and ``env_class``) its ``extras``. ``init`` gives the first messages, ``step(reply)`` the
observations, the reward and done; the episode's score is the sum of its step rewards, so the data source
needs no reward function. See :mod:`plugrl_envs_skyrl_gym.episode` for the mapping and the README for what
differs from SkyRL.

The hook ``plugrl_run_start`` (:mod:`plugrl_envs_skyrl_gym.startup`) hands the run's ``rollout.max_turns``
to the environments and checks the first row of each data file and the servers ``env_config`` names.
skyrl-gym is imported when an environment loads, not with this module, so that its absence is reported as
a start-up error with the install command.
"""

from __future__ import annotations

from typing import Any

import plugrl
from plugrl.specs import EnvironmentSpec

from .episode import SkyRLEpisode, episode_class, extras, prompt_messages
from .library import env_creator, import_skyrl_gym, make_env_config, registered_ids
from .startup import FAMILY, LOADED, prepare_run

__all__ = [
    "SkyRLEpisode",
    "episode_class",
    "extras",
    "plugrl_run_start",
    "prompt_messages",
    "registered_ids",
    "skyrl_gym",
]


@plugrl.environment_family(FAMILY)
def skyrl_gym(env_id: str, **env_config: Any) -> EnvironmentSpec:
    """The environment ``skyrl_gym:<env_id>``, once per run at start-up: ``env_id`` must be registered with
    skyrl-gym (built in, or by ``skyrl_gym.register`` in a module of ``plugins``); ``env_config`` is
    ``environment_options``, checked against the config dataclass the environment declares, if any."""
    gym = import_skyrl_gym()
    if not env_id:
        raise ValueError(f"name a skyrl-gym environment as 'skyrl_gym:<id>'; registered: {', '.join(registered_ids())}")
    creator = env_creator(env_id)  # an unknown id or an entry point that does not import stops here
    config = make_env_config(env_id, creator, env_config)
    cls = episode_class(env_id, gym.make, config, module=__name__)
    name = f"{FAMILY}:{env_id}"
    LOADED[name] = cls
    return EnvironmentSpec(name=name, factory=cls)


@plugrl.hookimpl
def plugrl_run_start(config: Any, run_dir: Any) -> None:
    """Before the first episode: ``rollout.max_turns`` into every episode's ``extras`` (as SkyRL's generator
    puts its own), and the data and servers of each skyrl_gym environment checked."""
    prepare_run(config)
