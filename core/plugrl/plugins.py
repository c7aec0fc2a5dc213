"""Plugin discovery and loading: entry points in group ``plugrl`` or ``module:object``.

Only what the run config names is imported. Each plugin is registered with a
pluggy PluginManager; functions it decorated with ``@plugrl.reward`` and friends
are served through the same hooks by a small collector, so both styles meet in
one registry, where clashes between plugins are errors naming both.
"""

from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import importlib_metadata
import pluggy

from plugrl import hookspecs
from plugrl.config import ConfigError
from plugrl.hookspecs import PROJECT, hookimpl
from plugrl.specs import (
    ClassifierSpec,
    DatasetSpec,
    EstimatorSpec,
    Registry,
    RewardSpec,
    Spec,
    TemplateSpec,
    specs_of,
    with_plugin,
)

GROUP = "plugrl"

# Plugins that live in this repository: name -> (distribution, source folder)
FIRST_PARTY = {
    "advantages": ("plugrl-advantages", "plugins/advantages"),
    "countdown": ("plugrl-datasets-countdown", "plugins/datasets_countdown"),
    "gsm8k": ("plugrl-rewards-gsm8k", "plugins/rewards_gsm8k"),
    "math": ("plugrl-rewards-math", "plugins/rewards_math"),
    "grade": ("plugrl-rewards-grade", "plugins/rewards_grade"),
    "tinyv": ("plugrl-rewards-tinyv", "plugins/rewards_tinyv"),
}

HOOK_OF = {
    RewardSpec: "plugrl_rewards",
    DatasetSpec: "plugrl_datasets",
    TemplateSpec: "plugrl_templates",
    EstimatorSpec: "plugrl_advantage_estimators",
    ClassifierSpec: "plugrl_solution_classifiers",
}


class PluginError(RuntimeError):
    """A plugin could not be found, imported or registered; the message says how to fix it."""


class _Collector:
    """Serves a plugin's decorated functions through the hooks."""

    def __init__(self, specs: list[Spec]):
        self._specs = specs

    def _of(self, kind: type) -> list[Any]:
        return [s for s in self._specs if isinstance(s, kind)]

    @hookimpl
    def plugrl_rewards(self) -> list[RewardSpec]:
        return self._of(RewardSpec)

    @hookimpl
    def plugrl_datasets(self) -> list[DatasetSpec]:
        return self._of(DatasetSpec)

    @hookimpl
    def plugrl_templates(self) -> list[TemplateSpec]:
        return self._of(TemplateSpec)

    @hookimpl
    def plugrl_advantage_estimators(self) -> list[EstimatorSpec]:
        return self._of(EstimatorSpec)

    @hookimpl
    def plugrl_solution_classifiers(self) -> list[ClassifierSpec]:
        return self._of(ClassifierSpec)


@dataclass(frozen=True)
class InstalledPlugin:
    name: str
    value: str  # "module" or "module:object"
    distribution: str
    version: str


def installed_plugins() -> list[InstalledPlugin]:
    """Every entry point in group ``plugrl`` of the installed distributions (nothing is imported)."""
    found = []
    for ep in importlib_metadata.entry_points(group=GROUP):
        dist = ep.dist
        found.append(InstalledPlugin(ep.name, ep.value, dist.name if dist else "?", dist.version if dist else "?"))
    return sorted(found, key=lambda p: p.name)


def _install_hint(name: str) -> str:
    if name in FIRST_PARTY:
        dist, folder = FIRST_PARTY[name]
        return f"install it with `pip install {dist}` (or `pip install -e {folder}` in a plugrl checkout)"
    return (
        f'install the package that declares it: an entry point `{name} = "your_module"` '
        f"under [project.entry-points.{GROUP}] in its pyproject.toml; or name a local plugin as `module:object`"
    )


def _import_plugin(name: str) -> tuple[Any, str]:
    """Import the object behind plugin ``name``; returns (object, where it came from)."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # a broken plugin must name itself, whatever it raised (SyntaxError, ...)
            raise PluginError(f"plugin {name!r}: cannot import module {module_name!r} ({type(e).__name__}: {e})") from e
        try:
            obj: Any = module
            for part in filter(None, attr.split(".")):  # "module:" is the module itself
                obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"plugin {name!r}: module {module_name!r} has no attribute {attr!r}") from None
        return obj, name
    matches = [ep for ep in importlib_metadata.entry_points(group=GROUP) if ep.name == name]
    if not matches:
        names = ", ".join(p.name for p in installed_plugins()) or "none"
        raise PluginError(f"plugin {name!r} is not installed; {_install_hint(name)}. Installed plugins: {names}")
    if len(matches) > 1:
        dists = ", ".join(sorted(ep.dist.name if ep.dist else ep.value for ep in matches))
        raise PluginError(f"plugin {name!r} is declared by more than one installed package ({dists}); uninstall one")
    ep = matches[0]
    try:
        obj = ep.load()
    except Exception as e:  # a broken plugin must name itself, whatever it raised
        raise PluginError(f"plugin {name!r} ({ep.value}) failed to import: {type(e).__name__}: {e}") from e
    dist = ep.dist.name if ep.dist else "?"
    return obj, f"{dist} ({ep.value})"


def _decorated_specs(obj: Any) -> list[Spec]:
    """Specs marked on ``obj`` itself and, for modules and classes, on its attributes or held by them
    (``accuracy = trl_reward(fn, ...)`` at module level registers that record)."""
    found: list[Spec] = list(specs_of(obj))
    if isinstance(obj, ModuleType) or isinstance(obj, type):
        seen: set[int] = set()
        for value in vars(obj).values():
            if id(value) not in seen:
                seen.add(id(value))
                found.extend([value] if isinstance(value, tuple(HOOK_OF)) else specs_of(value))
    return found


def make_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def _collect(pm: pluggy.PluginManager) -> list[Spec]:
    """Call every hook implementation separately, so each record knows its plugin."""
    records: list[Spec] = []
    for kind, hook_name in HOOK_OF.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            plugin_name = impl.plugin_name.split("#", 1)[0]
            try:
                result = impl.function()
            except Exception as e:
                raise PluginError(f"plugin {plugin_name!r}: hook {hook_name} raised {type(e).__name__}: {e}") from e
            if result is not None and (isinstance(result, (str, bytes, dict)) or not isinstance(result, Iterable)):
                raise PluginError(
                    f"plugin {plugin_name!r}: hook {hook_name} must return a list of {kind.__name__} records, "
                    f"got {type(result).__name__}"
                )
            for spec in result or []:
                if not isinstance(spec, kind):
                    raise PluginError(
                        f"plugin {plugin_name!r}: hook {hook_name} must return {kind.__name__} records, "
                        f"got {type(spec).__name__}"
                    )
                records.append(with_plugin(spec, plugin_name))
    return records


def build_registry(records: Iterable[Spec], sources: dict[str, str]) -> Registry:
    """Put records into a Registry; a name claimed by two plugins is an error naming both."""
    reg = Registry(plugins=dict(sources))
    by_name: dict[tuple[str, str], Spec] = {}
    reward_owner: dict[str, str] = {}
    for spec in records:
        if isinstance(spec, RewardSpec):
            for pattern in spec.data_sources:
                owner = reward_owner.setdefault(pattern, spec.plugin)
                if owner != spec.plugin:
                    raise PluginError(
                        f"data_source {pattern!r} is claimed by two plugins: {owner!r} and {spec.plugin!r}; "
                        "load only one of them in `plugins:`"
                    )
            clash = next(
                (r for r in reg.rewards if r.name == spec.name and set(r.data_sources) & set(spec.data_sources)),
                None,
            )
            if clash:
                raise PluginError(f"plugin {spec.plugin!r} registers reward {spec.name!r} twice for one data_source")
            reg.rewards.append(spec)
            continue
        kind, table = {
            DatasetSpec: ("dataset", reg.datasets),
            TemplateSpec: ("template", reg.templates),
            EstimatorSpec: ("advantage estimator", reg.estimators),
            ClassifierSpec: ("solution classifier", reg.classifiers),
        }[type(spec)]
        prev = by_name.get((kind, spec.name))
        if prev is not None and prev.plugin != spec.plugin:
            raise PluginError(
                f"{kind} {spec.name!r} is registered by two plugins: {prev.plugin!r} and {spec.plugin!r}; "
                "load only one of them in `plugins:`"
            )
        by_name[(kind, spec.name)] = spec
        table[spec.name] = spec
    return reg


def load_plugins(names: Iterable[str]) -> Registry:
    """Import the named plugins and return what they register."""
    pm = make_plugin_manager()
    sources: dict[str, str] = {}
    for name in names:
        if name in sources:
            continue
        obj, source = _import_plugin(name)
        sources[name] = source
        try:
            if not isinstance(obj, (ModuleType, type)) and callable(obj) and specs_of(obj):
                pass  # a single decorated function: nothing for pluggy to scan
            else:
                pm.register(obj, name=name)
        except (ValueError, pluggy.PluginValidationError) as e:  # pluggy: registered twice, or a wrong signature
            raise PluginError(f"plugin {name!r}: {e}") from e
        specs = _decorated_specs(obj)
        if specs:
            pm.register(_Collector(specs), name=f"{name}#decorated")
    try:
        pm.check_pending()  # hookimpls named like plugrl_* but matching no spec
    except pluggy.PluginValidationError as e:
        raise PluginError(f"{e}; see `plugrl plugins --help` for the hooks a plugin can implement") from e
    registry = build_registry(_collect(pm), sources)
    registry.hooks = pm.hook
    return registry


def rewards_for(registry: Registry, data_source: str) -> list[RewardSpec]:
    """The reward functions for ``data_source``: exact-name matches, else glob matches.

    Globs from two plugins matching the same name is an error naming both.
    """
    exact = [r for r in registry.rewards if data_source in r.data_sources]
    if exact:
        return exact
    globbed = [r for r in registry.rewards if any(fnmatch.fnmatchcase(data_source, p) for p in r.data_sources)]
    owners = sorted({r.plugin for r in globbed})
    if len(owners) > 1:
        raise PluginError(
            f"data_source {data_source!r} matches reward patterns of several plugins: {', '.join(owners)}; "
            "give it an exact name in one plugin or load only one of them"
        )
    return globbed


def describe(registry: Registry) -> dict[str, dict[str, list[str]]]:
    """What each plugin registers, for `plugrl plugins`."""
    out: dict[str, dict[str, list[str]]] = {p: {} for p in registry.plugins}
    for r in registry.rewards:
        out.setdefault(r.plugin, {}).setdefault("rewards", []).append(f"{r.name} -> {', '.join(r.data_sources)}")
    for label, table in (
        ("datasets", registry.datasets),
        ("templates", registry.templates),
        ("estimators", registry.estimators),
        ("classifiers", registry.classifiers),
    ):
        for name, spec in table.items():
            out.setdefault(spec.plugin, {}).setdefault(label, []).append(name)
    return out


# how many positional arguments each kind of plugin function is called with
_CALLED_WITH = {
    "reward": (1, 2, "fn(completion, ground_truth, **context)"),
    "dataset": (1, 1, "fn(split, **options)"),
    "template": (1, 1, "fn(sample)"),
    "estimator": (2, 2, "fn(batch, config)"),
    "classifier": (2, 2, "fn(prompt, responses, **options)"),
}


def check_registry(registry: Registry) -> list[str]:
    """Problems with the registered functions' signatures (empty when all is well), for `plugrl plugins --check`."""
    import inspect

    problems = []
    entries = [("reward", r.name, r.fn, r.plugin) for r in registry.rewards]
    for kind, table in (
        ("dataset", registry.datasets),
        ("template", registry.templates),
        ("estimator", registry.estimators),
        ("classifier", registry.classifiers),
    ):
        entries += [(kind, name, spec.fn, spec.plugin) for name, spec in table.items()]
    for kind, name, fn, plugin in entries:
        low, high, form = _CALLED_WITH[kind]
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            continue  # builtins and C callables: nothing to check
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            continue
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        required = [p for p in positional if p.default is p.empty]
        if len(positional) < low or len(required) > high:
            problems.append(
                f"{plugin}: {kind} {name!r} is called as {form}, but its signature is {name}{inspect.signature(fn)}"
            )
    return problems


def check_algorithm(algorithm: Any, registry: Registry) -> EstimatorSpec:
    """The estimator named by ``algorithm.adv_estimator``, after checking that the run can use it; call it
    before any model loads. Raises :class:`PluginError` naming the key and the fix when the estimator is not
    registered, or groups responses by strategy and ``algorithm.classifier`` names no registered classifier.

    An estimator that needs a critic (``needs_critic``) gets one built from the ``critic`` section, so that
    combination cannot be missing anything.
    """
    name = getattr(algorithm, "adv_estimator", None)
    estimator = registry.estimators.get(name) if isinstance(name, str) else None
    if estimator is None:
        known = ", ".join(sorted(registry.estimators)) or "none (add the `advantages` plugin to `plugins:`)"
        raise PluginError(f"algorithm.adv_estimator {name!r} is not registered; registered: {known}")
    classifier = getattr(algorithm, "classifier", None)
    if estimator.needs_solution_groups and classifier not in registry.classifiers:
        known = ", ".join(sorted(registry.classifiers)) or "none (load a plugin that registers one)"
        raise PluginError(
            f"algorithm.adv_estimator {name!r} groups responses by strategy and needs algorithm.classifier; "
            f"got {classifier!r}, registered classifiers: {known}"
        )
    return estimator


def _hook_results(registry: Registry, hook_name: str, should: str, **kwargs: Any) -> Iterator[tuple[str, Any]]:
    """(plugin name, result) of each implementation of ``hook_name``, in ``plugins:`` order, each called with
    the subset of ``kwargs`` it declares; an implementation that raises is a :class:`PluginError` naming it
    and saying what it ``should`` do instead."""
    if registry.hooks is None:  # a Registry built by hand (tests, tools) has no plugins to ask
        return
    for impl in getattr(registry.hooks, hook_name).get_hookimpls():
        plugin_name = impl.plugin_name.split("#", 1)[0]
        try:
            result = impl.function(*[kwargs[arg] for arg in impl.argnames])
        except Exception as e:
            raise PluginError(
                f"plugin {plugin_name!r}: hook {hook_name} raised {type(e).__name__}: {e} "
                f"({should}, not raise; report this to the plugin's authors)"
            ) from e
        yield plugin_name, result


def check_config(config: Any, registry: Registry) -> None:
    """Ask every loaded plugin to check its part of ``config`` (hook ``plugrl_check_config``); call it right
    after :func:`load_plugins`, before any model loads.

    Raises :class:`plugrl.config.ConfigError` listing every plugin's problems at once, each after the name of
    the plugin that found it, and :class:`PluginError` when a plugin's check itself is broken (it raised, or
    returned something other than a list of messages).
    """
    problems: list[str] = []
    hook_name = "plugrl_check_config"
    for plugin_name, result in _hook_results(
        registry, hook_name, "it must return the problems as a list of messages", config=config
    ):
        if result is None:
            continue
        if isinstance(result, (str, bytes, dict)) or not isinstance(result, Iterable):
            raise PluginError(
                f"plugin {plugin_name!r}: hook {hook_name} must return a list of messages or None, "
                f"got {type(result).__name__}"
            )
        for problem in result:
            if not isinstance(problem, str):
                raise PluginError(
                    f"plugin {plugin_name!r}: hook {hook_name} must return messages (str), got {type(problem).__name__}"
                )
            problems.append(f"plugin {plugin_name!r}: {problem}")
    if problems:
        raise ConfigError(
            "invalid config (found by the plugins' checks, before any model was loaded):\n"
            + "\n".join(f"  {problem}" for problem in problems)
        )


def plugin_step_metrics(registry: Registry, step: int, taken: dict[str, float]) -> dict[str, float]:
    """The plugins' ``plugrl_step_metrics`` for ``step``, merged. Raises :class:`PluginError` naming the
    plugin when one returns something that is not ``{name: number}`` or reuses a name in ``taken`` (the
    kernel's metrics of the step) or another plugin's."""
    out: dict[str, float] = {}
    for plugin_name, got in _hook_results(
        registry, "plugrl_step_metrics", "it must return {name: number} or None", step=step
    ):
        if got is None:
            continue
        if not isinstance(got, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in got.items()
        ):
            raise PluginError(
                f"plugin {plugin_name!r}: plugrl_step_metrics must return {{name: number}} or None, got {got!r}"
            )
        for name, value in got.items():
            if name in taken or name in out:
                raise PluginError(
                    f"plugin {plugin_name!r}: plugrl_step_metrics reports {name!r}, a metric the kernel or another "
                    "plugin already logs; rename it (e.g. with the plugin's name as prefix)"
                )
            out[name] = float(value)
    return out
