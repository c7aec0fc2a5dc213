"""Environment routing: which registered environment plays a sample's episodes (``environment``: one name, or
routes ``{pattern: name}`` by ``data_source``), what that tells every run's data and rewards (the environment
writes the prompt, or scores the episodes), and the start-up check of ``environment_options``.

The rest of a multi-turn run's environments (``family:id`` environments loaded, the options and tools checked,
the options each is made with) is the package's behind :mod:`plugrl.rollout.episode_kit`: the loader's options
check (:func:`plugrl.plugins.check_options`) reaches it through :func:`check_environment_options`.
"""

from __future__ import annotations

import fnmatch
from typing import Any

from plugrl.rollout.episode_kit import run_kit
from plugrl.specs import EnvironmentSpec, Registry


def environment_for(config: Any, registry: Registry, data_source: str) -> EnvironmentSpec | None:
    """The environment of a sample's episodes: ``environment`` when it is one name; with routes
    (``{pattern: name}``) the route named exactly ``data_source``, else the first glob that matches
    (in the order written); None (a single-turn episode) when none does or no environment is set."""
    env = config.environment
    if not env:
        return None
    if isinstance(env, str):
        return registry.environments[env]
    name = env.get(data_source)
    if name is None:
        name = next((n for pattern, n in env.items() if fnmatch.fnmatchcase(data_source, pattern)), None)
    return None if name is None else registry.environments[name]


def scored_by_environment(config: Any, registry: Registry, data_source: str) -> bool:
    """The environment of ``data_source``'s episodes scores every one it does not fail on (its class has
    ``reward()``): the data source needs no reward function."""
    spec = environment_for(config, registry, data_source)
    return spec is not None and spec.scores_episodes


def prompt_from_environment(config: Any, registry: Registry, data_source: str) -> bool:
    """The environment of ``data_source``'s episodes writes their prompt (a TRL ``environment_factory`` class, whose
    ``reset()`` returns it): a row of that data source may have no prompt."""
    spec = environment_for(config, registry, data_source)
    return spec is not None and spec.writes_prompt


def check_environment_options(config: Any, registry: Registry, problems: list[str]) -> None:
    """``environment_options`` without an environment; then, for a multi-turn config, the package's checks of
    ``environment``, ``environment_options``, the tools named and ``rollout.tool_parser``
    (:class:`plugrl.rollout.episode_kit.EpisodeKit`'s ``check_environments``, which loads ``family:id``
    environments into ``registry``). What is wrong is added to ``problems``."""
    if config.environment_options and not config.environment:
        problems.append("environment_options is set but no environment is: set environment, or remove the options")
    kit = run_kit(config)
    if kit is not None:
        kit.check_environments(config, registry, problems)
