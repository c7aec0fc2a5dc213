"""Reward routing: which reward functions score a ``data_source`` (:func:`rewards_for`: exact names, casefold
names, the most specific glob, ``reward.default``, then ``reward.extra``), whether a data source's rows need a
ground truth (:func:`ground_truth_optional`), and the checks of the routes: ``reward.default`` and ``reward.extra``
name registered rewards (:func:`check_route_options`, run by :func:`plugrl.plugins.check_options`), every data
source of the data has a reward (:func:`check_routes`, at start).
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Iterable
from typing import Any

from plugrl.plugin_errors import PluginError
from plugrl.plugin_options import did_you_mean
from plugrl.rewards.outcomes import RewardError
from plugrl.rollout.routing import scored_by_environment
from plugrl.specs import Registry, RewardSpec


def rewards_for(registry: Registry, data_source: str) -> list[RewardSpec]:
    """The reward functions for ``data_source``, the first of these that matches: exact names; the exact names of
    rewards registered with ``casefold``, after ``strip().lower()``; the most specific glob (the most literal
    characters: ``*_tinyv`` before ``*``; two plugins' equally specific globs are an error naming both);
    ``reward.default``. Then, for every data source, those ``reward.extra`` names (TRL's ``reward_funcs`` score
    every sample: a reward model beside a rule reward)."""
    routed = _routed_rewards(registry, data_source)
    extra = [r for r in registry.rewards if r.name in registry.extra_rewards and r not in routed]
    return routed + extra


def _routed_rewards(registry: Registry, data_source: str) -> list[RewardSpec]:
    exact = [r for r in registry.rewards if data_source in r.data_sources]
    if exact:
        return exact
    folded = data_source.strip().lower()
    loose = [r for r in registry.rewards if r.casefold and folded in (p.lower() for p in r.data_sources)]
    if loose:
        return loose
    matched = [
        (literal_chars(p), r)
        for r in registry.rewards
        for p in r.data_sources
        if is_glob(p) and fnmatch.fnmatchcase(data_source, p)
    ]
    if matched:
        best = max(n for n, _ in matched)
        globbed = list({id(r): r for n, r in matched if n == best}.values())
        owners = sorted({r.plugin for r in globbed})
        if len(owners) > 1:
            raise PluginError(
                f"data_source {data_source!r} matches reward patterns of several plugins: {', '.join(owners)}; "
                "give it an exact name in one plugin or load only one of them"
            )
        return globbed
    return [r for r in registry.rewards if r.name == registry.default_reward]


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def literal_chars(pattern: str) -> int:
    """How specific a glob is: its characters that are not wildcards (``*_tinyv``: 6, ``*``: 0)."""
    return sum(c not in "*?[]" for c in pattern)


def has_reward(registry: Registry, data_source: str) -> bool:
    """Some reward function is registered for ``data_source``; an ambiguous route counts (scoring or
    :func:`plugrl.rewards.check_routes` names the plugins that clash)."""
    try:
        return bool(rewards_for(registry, data_source))
    except PluginError:
        return True


def scores_without_ground_truth(fn: Any) -> bool:
    """The reward function ``fn`` declares it scores without a ground truth: it takes the completion alone, or
    defaults its second parameter (``fn(completion, ground_truth=None, **row)``, which reads other columns).
    Batch rewards (TRL's style) get the ground truth as a column and need it, unless ``fn`` has the attribute
    ``plugrl_ground_truth_optional = True`` (a reward model scores the text alone)."""
    declared = getattr(fn, "plugrl_ground_truth_optional", None)  # said outright, e.g. by a batch reward
    if declared is not None:
        return bool(declared)
    if getattr(fn, "plugrl_batch", False):
        return False
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 1 or (len(positional) >= 2 and positional[1].default is not inspect.Parameter.empty)


def ground_truth_optional(config: Any, registry: Registry, data_source: str) -> bool:
    """The rows of ``data_source`` need no ground truth: only its environment scores it (no reward function
    either), or every reward function routed to it scores without one (:func:`scores_without_ground_truth`)."""
    if not has_reward(registry, data_source):
        return scored_by_environment(config, registry, data_source)
    try:
        specs = rewards_for(registry, data_source)
    except PluginError:  # an ambiguous route: start-up reports it
        return False
    return bool(specs) and all(scores_without_ground_truth(spec.fn) for spec in specs)


def check_route_options(config: Any, registry: Registry, problems: list[str]) -> None:
    """``reward.default`` and ``reward.extra`` name registered rewards; the registry routes by them
    (``default_reward``, and ``extra_rewards`` after the kernel's own extras). What is wrong is added to
    ``problems``."""
    rewards = {r.name: r for r in registry.rewards}
    reward_cfg = config.reward
    default = getattr(reward_cfg, "default", None)
    if default is not None and default not in rewards:
        problems.append(
            f"reward.default names no registered reward: {default!r}{did_you_mean(default, rewards)}; "
            f"registered: {', '.join(sorted(rewards)) or 'none'}"
        )
    registry.default_reward = default if default in rewards else None
    extra = list(getattr(reward_cfg, "extra", None) or [])
    for name in extra:
        if name not in rewards:
            problems.append(
                f"reward.extra names no registered reward: {name!r}{did_you_mean(name, rewards)}; "
                f"registered: {', '.join(sorted(rewards)) or 'none'}"
            )
    # and the kernel's own extras, registered before (reward.reward_funcs: TRL's functions score every sample)
    registry.extra_rewards = tuple(dict.fromkeys(n for n in [*extra, *registry.extra_rewards] if n in rewards))


def check_routes(registry: Registry, data_sources: Iterable[str]) -> dict[str, list[RewardSpec]]:
    """The reward functions for each data source; raises :class:`RewardError` listing every one without any.
    Called before any generation, with every data source of the training and validation data."""
    routes: dict[str, list[RewardSpec]] = {}
    missing: list[str] = []
    ambiguous: list[str] = []
    for ds in sorted(set(data_sources)):
        try:
            specs = rewards_for(registry, ds)
        except PluginError as e:
            ambiguous.append(str(e))
            continue
        if specs:
            routes[ds] = specs
        else:
            missing.append(ds)
    if missing or ambiguous:
        lines = []
        if missing:
            lines.append("no reward function for data_source " + ", ".join(repr(d) for d in missing) + ".")
        lines += ambiguous
        lines.append("Registered rewards (name, plugin: data_source patterns):")
        lines += [f"  {r.name} ({r.plugin or '?'}): {', '.join(r.data_sources)}" for r in registry.rewards] or [
            "  none: no loaded plugin registers a reward"
        ]
        lines.append(
            "Add the plugin that scores these data sources to `plugins:` in the run config; or set reward.default "
            "to a registered reward that scores every data source no pattern matches (verl's fallback, e.g. "
            "reward.default=verl_prime_math with the verl_default plugin); or register a function for them with "
            "@plugrl.reward('<data_source>'); or bring verl's own with custom_reward_function.path=FILE."
        )
        raise RewardError("\n".join(lines))
    return routes
