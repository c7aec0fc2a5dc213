"""A multi-turn run's environments at start: ``family:id`` environments loaded, the checks of ``environment``,
``environment_options``, the tools named and ``rollout.tool_parser``, and the options each environment is made with.

A ``family:id`` environment (``environment: verifiers:wordle``) is loaded here, at start, through its family's
``load(id, **options)`` (:func:`load_environment_families`). The kernel's options check
(:func:`plugrl.plugins.check_options`) runs :func:`check_environments` for a multi-turn config (the entry point's
``check_environments``); which environment plays a sample's episodes is the kernel's
(:func:`plugrl.rollout.routing.environment_for`), and the player and the first-prompt check ask
:func:`environment_options` what it is made with.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from plugrl.plugin_errors import first_party, install_hint
from plugrl.plugin_options import checked, did_you_mean
from plugrl.rollout.tools import PARSERS
from plugrl.specs import EnvironmentSpec, Registry

log = logging.getLogger("plugrl.plugins")  # the loader's: loading an environment family is part of loading plugins


def environment_options(config: Any, spec: EnvironmentSpec) -> dict[str, Any]:
    """The (validated) keyword options ``spec.factory`` is called with (none for a family's environment: its
    ``load`` took them)."""
    if spec.family:
        return {}
    if isinstance(config.environment, dict):
        return dict(config.environment_options.get(spec.name, {}))
    return dict(config.environment_options)


def load_environment_families(config: Any, registry: Registry, problems: list[str]) -> set[str]:
    """Load every ``family:id`` environment the config names (``environment: verifiers:wordle``) through its
    family's ``load(id, **options)`` and register what it returns under that name; the data it brings
    becomes the run's data when the config names none. What goes wrong is added to ``problems``; returns the
    names it found a problem with."""
    env = config.environment
    failed: set[str] = set()
    names = [env] if isinstance(env, str) else list(dict.fromkeys((env or {}).values()))
    for name in names:
        family = registry.environments.get(name)
        if family is not None and family.load is not None:
            problems.append(
                f"environment {name!r} is a family of environments (plugin {family.plugin!r}): name one of them "
                f"as '{name}:<id>'"
            )
            failed.add(name)
        if name in registry.environments or ":" not in name:
            continue
        prefix, _, env_id = name.partition(":")
        family = registry.environments.get(prefix)
        if family is None or family.load is None:
            if prefix in first_party():
                problems.append(
                    f"environment {name!r}: the family {prefix!r} is not loaded; add plugin {prefix!r} to `plugins` "
                    f"({install_hint(prefix)})"
                )
                failed.add(name)
            continue  # otherwise: named as an unknown environment below
        where = "environment_options" + (f".{name}" if isinstance(env, dict) else "")
        raw = config.environment_options if isinstance(env, str) else config.environment_options.get(name, {})
        failed.add(name)  # until it loads
        options = dict(raw) if family.options is None else checked(family.options, raw, where, problems)
        if options is None:
            continue
        try:
            loaded = family.load(env_id, **options)
        except Exception as e:  # the library's own message (an unknown id, a missing package) says what is wrong
            problems.append(f"environment {name!r} (plugin {family.plugin!r}) failed to load: {type(e).__name__}: {e}")
            continue
        if not isinstance(loaded, EnvironmentSpec):
            if not callable(loaded):
                problems.append(
                    f"environment {name!r}: plugin {family.plugin!r} loaded {type(loaded).__name__}, "
                    "neither an EnvironmentSpec nor an environment class"
                )
                continue
            loaded = EnvironmentSpec(name=name, factory=loaded)
        spec = replace(loaded, name=name, plugin=family.plugin, family=prefix, options=None)
        registry.environments[name] = spec
        failed.discard(name)
        if spec.dataset is not None:
            registry.datasets[name] = replace(spec.dataset, name=name, plugin=family.plugin)
            data = config.data
            if isinstance(env, str) and not data.dataset and not data.train_files:
                data.dataset = name
                log.info("data: the rows of environment %r's dataset (no data.train_files or data.dataset set)", name)
    return failed


def check_environments(config: Any, registry: Registry, problems: list[str]) -> None:
    """A multi-turn config's environments and tools: ``environment`` names registered environments (a family's after
    loading them), ``environment_options`` fit their declared options (validated values written back),
    ``rollout.tools`` and the environments' tool options name registered tools, and ``rollout.tool_parser`` a known
    parser. ``environment_options`` without an environment the kernel reports itself."""
    failed = load_environment_families(config, registry, problems)
    envs = registry.environments
    known = ", ".join(sorted(envs)) or "none (load a plugin that registers one)"
    env = config.environment
    routes = {"environment": env} if isinstance(env, str) else {f"environment.{p}": n for p, n in (env or {}).items()}
    for key, name in routes.items():
        if name not in envs and name not in failed:
            problems.append(
                f"{key} names no registered environment: {name!r}{did_you_mean(name, envs)}; registered: {known}"
            )
    _check_environment_option_values(config, envs, problems)
    named = [("rollout.tools", name) for name in config.rollout.tools]
    for spec in {envs[n].name: envs[n] for n in routes.values() if n in envs}.values():
        prefix = "environment_options." + (f"{spec.name}." if isinstance(env, dict) else "")
        values = environment_options(config, spec)
        named += [(prefix + key, name) for key in spec.tool_options for name in _as_list(values.get(key))]
    for key, name in named:
        if name not in registry.tools:
            have = ", ".join(sorted(registry.tools)) or "none (load a plugin that registers tools)"
            extension = (
                "; the tool 'python' is in the package plugrl-tools, which is not installed: pip install plugrl-tools "
                "(in a plugrl checkout: pip install -e plugins/tools)"
                if name == "python"
                else ""
            )
            problems.append(
                f"{key} names no registered tool: {name!r}{did_you_mean(name, registry.tools)}; registered: {have}"
                f"{extension}"
            )
    if config.rollout.tool_parser not in PARSERS:
        problems.append(
            f"rollout.tool_parser {config.rollout.tool_parser!r} is not a known tool-call format; known: "
            f"{', '.join(sorted(PARSERS))}"
        )


def _check_environment_option_values(config: Any, envs: dict[str, EnvironmentSpec], problems: list[str]) -> None:
    """``environment_options`` against the options the environment(s) declared; validated values written back."""
    env, options = config.environment, config.environment_options
    if isinstance(env, str) and env in envs:
        spec = envs[env]
        if spec.family:
            pass  # the family's load took (and checked) the options
        elif spec.options is not None:
            checked_options = checked(spec.options, options, "environment_options", problems)
            if checked_options is not None:
                config.environment_options = checked_options
        elif options:
            problems.append(f"environment_options is set, but the environment {env!r} declares no options; remove it")
    elif isinstance(env, dict) and env:
        used = set(env.values())
        for name, raw in options.items():
            if name not in used:
                problems.append(
                    f"environment_options.{name}: with routes, environment_options holds options per routed "
                    f"environment ({', '.join(sorted(used))}); {name!r} is none of them"
                )
            elif name in envs and envs[name].options is not None and not envs[name].family:
                checked_options = checked(envs[name].options, raw, f"environment_options.{name}", problems)
                if checked_options is not None:
                    options[name] = checked_options


def _as_list(value: Any) -> list[str]:
    """The tool names in an option's value (a name or a list of them); anything else the options model
    has already refused."""
    values = list(value) if isinstance(value, (list, tuple, set)) else [value]
    return [v for v in values if isinstance(v, str)]
