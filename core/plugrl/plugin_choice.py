"""The plugins a run needs when its config names none (``plugins`` not set): chosen from the installed ones.

A verl script names no plugins: verl scores by ``data_source`` and finds its estimators by name. So when
``plugins`` is not set, every installed plugin is imported (each alone: a broken one is skipped and named), and
the run loads those that provide what it names (estimator, policy loss, template, dataset, environments, tools,
the rewards of ``reward.default`` / ``reward.extra``) and, for every data source of the data, the plugin whose
reward routes it best (an exact name, then a case-folded one, then the most specific glob). Several plugins at
the same precedence: the first of ``plugin_preference`` among them, else an error naming them. A name no
installed plugin provides is an error naming this checkout's packages that are not installed. The choice is
logged, and kept in ``cfg.plugins`` (the run's config.yaml).
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from plugrl.plugin_errors import PluginError, first_party
from plugrl.plugins import in_every_run, installed_plugins, load_plugins
from plugrl.rewards.routing import is_glob, literal_chars
from plugrl.specs import Registry

log = logging.getLogger("plugrl.plugins")


@dataclass
class Installed:
    """Every installed plugin's registry, alone; and the ones that could not be loaded, with why."""

    registries: dict[str, Registry] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)


def load_installed() -> Installed:
    """Import each installed plugin on its own (entry-point group ``plugrl``)."""
    out = Installed()
    for plugin in installed_plugins():
        try:
            out.registries[plugin.name] = load_plugins([plugin.name])
        except Exception as e:  # one broken plugin must not stop a run that does not need it
            out.broken[plugin.name] = f"{type(e).__name__}: {e}".splitlines()[0]
    return out


def _route_rank(registry: Registry, data_source: str) -> int | None:
    """How well a plugin's rewards route ``data_source`` (higher is better: 10**6 exact, 10**5 case-folded, else
    a matching glob's :func:`~plugrl.rewards.routing.literal_chars`), or None when none does (``reward.default``
    aside)."""
    ranks = []
    folded = data_source.strip().lower()
    for r in registry.rewards:
        if in_every_run(r.plugin):
            continue
        for pattern in r.data_sources:
            if pattern == data_source:
                ranks.append(10**6)
            elif r.casefold and pattern.lower() == folded:
                ranks.append(10**5)
            elif is_glob(pattern) and fnmatch.fnmatchcase(data_source, pattern):
                ranks.append(literal_chars(pattern))
    return max(ranks) if ranks else None


@dataclass
class Needs:
    """What a run names, by kind: ``{kind: {name: the config key that names it}}``; and its data sources."""

    names: dict[str, dict[str, str]] = field(default_factory=dict)
    data_sources: set[str] = field(default_factory=set)

    def add(self, kind: str, name: str | None, key: str) -> None:
        if name:
            self.names.setdefault(kind, {}).setdefault(name, key)


# kind -> the registry's records of that kind, by name
_KINDS: dict[str, Callable[[Registry], Mapping[str, Any]]] = {
    "advantage estimator": lambda r: r.estimators,
    "policy loss": lambda r: r.policy_losses,
    "rollout engine": lambda r: r.engines,
    "template": lambda r: r.templates,
    "dataset": lambda r: r.datasets,
    "environment": lambda r: r.environments,
    "tool": lambda r: r.tools,
    "reward": lambda r: {s.name: s for s in r.rewards},
}


def _providers(installed: Installed, kind: str, name: str) -> list[str]:
    """The installed plugins that register ``name`` (the kernel's own records, in every registry, are no plugin's)."""
    return [
        p
        for p, reg in installed.registries.items()
        if name in _KINDS[kind](reg) and not in_every_run(getattr(_KINDS[kind](reg)[name], "plugin", p))
    ]


def _builtin(kind: str, name: str) -> bool:
    """Whether the kernel itself registers ``name`` (a registry of no plugin holds only the kernel's records)."""
    return name in _KINDS[kind](load_plugins([]))


def _owners(installed: Installed, data_source: str) -> list[str]:
    ranked = {p: _route_rank(reg, data_source) for p, reg in installed.registries.items()}
    ranked = {p: n for p, n in ranked.items() if n is not None}
    best = max(ranked.values(), default=None)
    return [p for p, n in ranked.items() if n == best]


def _pick(owners: list[str], what: str, preference: list[str]) -> str:
    if len(owners) == 1:
        return owners[0]
    preferred = [p for p in preference if p in owners]
    if preferred:
        return preferred[0]
    raise PluginError(
        f"{what} is provided by several installed plugins ({', '.join(sorted(owners))}): name the one to use in "
        f"plugins: (e.g. plugins=[{sorted(owners)[0]}]) or in plugin_preference"
    )


def _not_installed_hint(installed: Installed) -> str:
    names = {p for p in installed.registries} | set(installed.broken)
    missing = sorted((dist, folder) for name, (dist, folder) in first_party().items() if name not in names)
    if not missing:
        return "install the package that provides it (its entry point in group 'plugrl'), or name a local module "
    packages = ", ".join(f"{dist} (pip install -e {folder})" for dist, folder in missing)
    return f"plugrl's plugins not installed here: {packages}; install the one that provides it, or name a local module "


def choose_plugins(installed: Installed, needs: Needs, preference: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The plugins that provide what ``needs`` names, in the order of the installed ones; and for each, what it
    was chosen for. Raises :class:`PluginError` naming every name nobody provides, or an ambiguous one."""
    chosen: dict[str, list[str]] = {}
    unprovided: list[str] = []
    for kind, names in needs.names.items():
        for name, key in names.items():
            owners = _providers(installed, kind, name)
            if kind in ("policy loss", "tool", "rollout engine") and not owners and _builtin(kind, name):
                continue  # the kernel's own (its policy losses, the sandboxed python tool, the vllm and hf engines)
            if not owners:
                unprovided.append(f"{kind} {name!r} ({key})")
                continue
            chosen.setdefault(_pick(owners, f"{kind} {name!r} ({key})", preference), []).append(name)
    for ds in sorted(needs.data_sources):
        owners = _owners(installed, ds)
        if owners:
            chosen.setdefault(_pick(owners, f"data_source {ds!r}", preference), []).append(ds)
    if unprovided:
        broken = "".join(f"; plugin {p!r} could not be loaded ({why})" for p, why in installed.broken.items())
        raise PluginError(
            f"plugins is not set, and no installed plugin provides {', '.join(unprovided)}{broken}. "
            f'{_not_installed_hint(installed)}in plugins: ["module:"]'
        )
    order = list(installed.registries)
    return sorted(chosen, key=order.index), chosen


def describe_choice(chosen: Mapping[str, list[str]]) -> str:
    """``advantages (grpo), gsm8k (openai/gsm8k)``: the start-up line's list."""
    return ", ".join(f"{p} ({', '.join(what)})" for p, what in chosen.items()) or "none"
