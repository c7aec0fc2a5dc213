"""Plugin discovery and loading: entry points in group ``plugrl`` or ``module:object``.

Only what the run config names is imported. Each plugin is registered with a
pluggy PluginManager; functions it decorated with ``@plugrl.reward`` and friends
are served through the same hooks by a small collector, so both styles meet in
one registry, where clashes between plugins are errors naming both.

Here: loading (discovery, import, the registry, :func:`call_hook`, :class:`PluginRun`) and the start-up checks of
the plugins' part of the config. Beside it: :mod:`plugrl.plugin_errors` (:class:`PluginError`, install hints),
:mod:`plugrl.plugin_options` (validating declared options), :mod:`plugrl.rewards.routing` (which rewards score a
``data_source``) and :mod:`plugrl.rollout.routing` (which environment plays its episodes).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import logging
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

import plugrl
from plugrl import api, hookspecs
from plugrl.config import ConfigError
from plugrl.hookspecs import PROJECT, hookimpl
from plugrl.plugin_errors import GROUP, PluginError, first_party, install_hint
from plugrl.plugin_options import checked as _checked
from plugrl.plugin_options import did_you_mean as _did_you_mean
from plugrl.rewards.routing import check_route_options
from plugrl.rollout.routing import check_environment_options
from plugrl.specs import (
    DatasetSpec,
    EngineSpec,
    EnvironmentSpec,
    EstimatorSpec,
    PolicyLossSpec,
    Registry,
    RewardSpec,
    Spec,
    TemplateSpec,
    ToolSpec,
    specs_of,
    with_plugin,
)

# packages of plugrl's own whose records every run has, like the kernel's (the rollout servers' engine)
EXTENSIONS_GROUP = "plugrl.extensions"
log = logging.getLogger("plugrl.plugins")

HOOK_OF = {
    RewardSpec: "plugrl_rewards",
    DatasetSpec: "plugrl_datasets",
    TemplateSpec: "plugrl_templates",
    EstimatorSpec: "plugrl_advantage_estimators",
    PolicyLossSpec: "plugrl_policy_losses",
    EngineSpec: "plugrl_rollout_engines",
    EnvironmentSpec: "plugrl_environments",
    ToolSpec: "plugrl_tools",
}
KIND_OF = {
    DatasetSpec: "dataset",
    TemplateSpec: "template",
    EstimatorSpec: "advantage estimator",
    PolicyLossSpec: "policy loss",
    EngineSpec: "rollout engine",
    EnvironmentSpec: "environment",
    ToolSpec: "tool",
}


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
    def plugrl_policy_losses(self) -> list[PolicyLossSpec]:
        return self._of(PolicyLossSpec)

    @hookimpl
    def plugrl_rollout_engines(self) -> list[EngineSpec]:
        return self._of(EngineSpec)

    @hookimpl
    def plugrl_environments(self) -> list[EnvironmentSpec]:
        return self._of(EnvironmentSpec)

    @hookimpl
    def plugrl_tools(self) -> list[ToolSpec]:
        return self._of(ToolSpec)


@dataclass(frozen=True)
class InstalledPlugin:
    name: str
    value: str  # "module" or "module:object"
    distribution: str
    version: str


def installed_plugins() -> list[InstalledPlugin]:
    """Every entry point in group ``plugrl`` of the installed distributions (nothing is imported)."""
    found = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        dist = ep.dist
        found.append(InstalledPlugin(ep.name, ep.value, dist.name if dist else "?", dist.version if dist else "?"))
    return sorted(found, key=lambda p: p.name)


def _import_plugin(name: str) -> tuple[Any, str]:
    """Import the object behind plugin ``name``; returns (object, where it came from).

    An installed plugin's plugrl range is checked before it is imported (:func:`_check_distribution_range`), a
    module's ``PLUGRL_REQUIRES`` once it is (:func:`_check_module_range`): a plugin made for another kernel is
    refused with one line naming both versions."""
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # a broken plugin must name itself, whatever it raised (SyntaxError, ...)
            raise PluginError(
                f"plugin {name!r}: cannot import module {module_name!r} ({type(e).__name__}: {e})"
                f"{api.import_hint(e, plugrl.__version__)}"
            ) from e
        _check_module_range(f"plugin {name!r}", module)
        try:
            obj: Any = module
            for part in filter(None, attr.split(".")):  # "module:" is the module itself
                obj = getattr(obj, part)
        except AttributeError:
            raise PluginError(f"plugin {name!r}: module {module_name!r} has no attribute {attr!r}") from None
        return obj, name
    matches = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == name]
    if not matches:
        names = ", ".join(p.name for p in installed_plugins()) or "none"
        raise PluginError(f"plugin {name!r} is not installed; {install_hint(name)}. Installed plugins: {names}")
    if len(matches) > 1:
        dists = ", ".join(sorted(ep.dist.name if ep.dist else ep.value for ep in matches))
        raise PluginError(f"plugin {name!r} is declared by more than one installed package ({dists}); uninstall one")
    ep = matches[0]
    declared = _check_distribution_range(name, ep)
    shadowed = _shadowed(name, ep)  # before its import: the code that would run is not the installed plugin's
    if shadowed:
        raise PluginError(shadowed)
    try:
        obj = ep.load()
    except Exception as e:  # a broken plugin must name itself, whatever it raised
        raise PluginError(
            f"plugin {name!r} ({ep.value}) failed to import: {type(e).__name__}: {e}"
            f"{api.import_hint(e, plugrl.__version__)}"
        ) from e
    module = importlib.import_module(ep.module)  # imported by ep.load(): its PLUGRL_REQUIRES, if any
    _check_module_range(_who(name, ep), module, installed=ep.dist is not None, declared=declared)
    dist = ep.dist.name if ep.dist else "?"
    return obj, f"{dist} ({ep.value})"


def _shadowed(name: str, ep: importlib.metadata.EntryPoint) -> str | None:
    """Why ``import <the entry point's module>`` would not run its distribution's code, naming what it would import
    and the folder that shadows it: a namespace package (a folder without ``__init__.py`` of the module's name
    earlier on ``sys.path``, such as the project folder of an editable install in the working directory), or a
    file outside the distribution (a stray ``my_rewards.py``). None when it would, or when it cannot be told (no
    distribution, no record of its files)."""
    if ep.dist is None:
        return None
    try:
        spec = importlib.util.find_spec(ep.module)
    except Exception:  # the import itself fails: ep.load() reports it
        return None
    home = _distribution_home(ep.dist)
    if spec is None or home is None:
        return None
    where, owns = home
    installed = f"the package {ep.dist.name} {ep.dist.version} installed ({where})"
    if spec.origin is None and spec.submodule_search_locations is not None:  # a namespace package: no code at all
        folders = list(dict.fromkeys(str(f) for f in spec.submodule_search_locations))
        return (
            f"plugin {name!r}: `import {ep.module}` finds the folder {' and '.join(folders)}, which has no "
            f"__init__.py (a namespace package: no code, nothing registered), not {installed}: "
            f"{_path_entry(Path(folders[0]).parent)} comes first on sys.path and shadows it. Run plugrl from another "
            "directory, or rename that folder"
        )
    if spec.origin and spec.has_location and not owns(Path(spec.origin)):
        origin = Path(spec.origin)
        module_root = origin.parent if origin.name == "__init__.py" else origin
        return (
            f"plugin {name!r}: `import {ep.module}` finds {origin}, not {installed}: {module_root} in "
            f"{_path_entry(module_root.parent)} comes first on sys.path and shadows it. Run plugrl from another "
            f"directory, or rename or remove {module_root}"
        )
    return None


def _distribution_home(dist: importlib.metadata.Distribution) -> tuple[str, Any] | None:
    """(where ``dist`` keeps its code, in words; whether a file is part of it), or None when that is unknown: an
    editable install's project folder (its PEP 610 ``direct_url.json``), else the files its record lists."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    url = direct.get("url", "") if isinstance(direct, dict) else ""
    if isinstance(direct, dict) and (direct.get("dir_info") or {}).get("editable") and url.startswith("file:"):
        project = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)).resolve()
        return f"editable, from {project}", lambda path: path.resolve().is_relative_to(project)
    files = {Path(str(dist.locate_file(f))).resolve() for f in dist.files or () if f.suffix in (".py", ".pyc", ".so")}
    if not files:
        return None
    return f"in {Path(str(dist.locate_file(''))).resolve()}", lambda path: path.resolve() in files


def _path_entry(folder: Path) -> str:
    """A ``sys.path`` folder as the message names it: the working directory says so."""
    return f"the working directory ({folder})" if folder.resolve() == Path.cwd().resolve() else str(folder)


def _who(name: str, ep: importlib.metadata.EntryPoint) -> str:
    return f"plugin {name!r} (dist {ep.dist.name} {ep.dist.version})" if ep.dist else f"plugin {name!r}"


_WARNED_NO_RANGE: set[str] = set()


def _check_distribution_range(name: str, ep: importlib.metadata.EntryPoint) -> str | None:
    """Refuse an installed plugin whose distribution's ``plugrl`` requirement leaves out this kernel, before it
    is imported. Returns the range it declares (None: none, or no distribution)."""
    if ep.dist is None:
        return None
    declared = api.required_range(ep.dist.requires)
    if declared:
        if name in first_party():
            fix = f"reinstall it from this checkout (pip install -e {first_party()[name][1]}), or install a release"
        else:
            fix = f"upgrade the plugin (pip install -U {ep.dist.name}) to a release"
        problem = api.range_problem(declared, plugrl.__version__, who=_who(name, ep), fix_plugin=fix)
        if problem:
            raise PluginError(problem)
    return declared or None


def _check_module_range(who: str, module: Any, *, installed: bool = False, declared: str | None = None) -> None:
    """A plugin module's own ``PLUGRL_REQUIRES`` (``">=0.2,<0.3"``): the range of a local ``module:`` plugin,
    which has no distribution. An installed plugin that declares a range nowhere is warned about, once."""
    requires = getattr(module, "PLUGRL_REQUIRES", None) if isinstance(module, ModuleType) else None
    if requires is not None:
        if not isinstance(requires, str):
            raise PluginError(
                f"{who}: PLUGRL_REQUIRES must be a version range as a string, such as "
                f"{api.suggested_range(plugrl.__version__)!r}; got {type(requires).__name__}"
            )
        problem = api.range_problem(requires, plugrl.__version__, who=who, fix_plugin="get a release of the plugin")
        if problem:
            raise PluginError(problem)
    elif installed and declared is None and who not in _WARNED_NO_RANGE:
        _WARNED_NO_RANGE.add(who)
        log.warning(
            '%s declares no plugrl version range: add "plugrl%s" to the dependencies in its pyproject.toml, so '
            "that a plugrl it was not made for refuses it at start with a clear message (this is %s)",
            who,
            api.suggested_range(plugrl.__version__),
            api.kernel(plugrl.__version__),
        )


def _decorated_specs(obj: Any) -> list[Spec]:
    """Specs marked on ``obj`` itself and, for modules and classes, on its attributes or held by them
    (``accuracy = trl_reward(fn, ...)`` at module level registers that record). A module's are those ``dir``
    names: a package that imports its parts on first use (``__getattr__``, ``__dir__``) has them loaded."""
    found: list[Spec] = list(specs_of(obj))
    if isinstance(obj, ModuleType) or isinstance(obj, type):
        seen: set[int] = set()
        names = list(vars(obj))  # in the order they are defined, then a module's loaded on first use
        names += [n for n in dir(obj) if n not in vars(obj)] if isinstance(obj, ModuleType) else []
        for value in (getattr(obj, name) for name in names):
            if id(value) not in seen:
                seen.add(id(value))
                found.extend([value] if isinstance(value, tuple(HOOK_OF)) else specs_of(value))
    return found


def make_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    return pm


def hook_names() -> list[str]:
    """Every hook a plugin may implement, in the order of :mod:`plugrl.hookspecs`."""
    return [n for n in vars(hookspecs) if n.startswith("plugrl_") and callable(getattr(hookspecs, n))]


def hook_form(hook_name: str) -> str:
    """``plugrl_check_config(config) -> list[str] | None``: a hook's arguments and return form, as specified."""
    spec = getattr(hookspecs, hook_name)
    returns = spec.__annotations__.get("return")
    return f"{hook_name}({', '.join(inspect.signature(spec).parameters)})" + (f" -> {returns}" if returns else "")


def _check_hookimpls(pm: pluggy.PluginManager, obj: Any, name: str) -> None:
    """Each ``@plugrl.hookimpl`` of plugin ``name`` implements a hook of this kernel and takes only arguments
    that hook passes; else one line naming the plugin, the hook, its current form and the kernel."""
    kernel = api.kernel(plugrl.__version__)
    for attr in dir(obj):
        try:
            opts = pm.parse_hookimpl_opts(obj, attr)
        except Exception:  # an attribute that cannot even be read is not a hook implementation
            continue
        if not opts:
            continue
        hook = opts.get("specname") or attr
        impl = getattr(obj, attr)
        if hook not in hook_names():
            close = difflib.get_close_matches(hook, hook_names(), n=1, cutoff=0.6)
            guess = f"; did you mean {hook_form(close[0])}?" if close else ""
            raise PluginError(
                f"plugin {name!r}: {hook} is not a hook of {kernel}{guess} Rename the function to one of "
                f"{', '.join(hook_names())} (their arguments: `plugrl plugins --help`)"
            )
        try:
            params = inspect.signature(impl).parameters.values()
        except (TypeError, ValueError):
            continue  # pluggy checks what inspect cannot read
        passed = inspect.signature(getattr(hookspecs, hook)).parameters
        # what pluggy passes by name: the positional parameters without a default (a class's `self` aside)
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if positional[:1] and positional[0].name == "self" and "." in getattr(impl, "__qualname__", ""):
            positional = positional[1:]
        required = [p.name for p in positional if p.default is p.empty]
        unknown = [a for a in required if a not in passed]
        if unknown:
            raise PluginError(
                f"plugin {name!r}: hook {hook}({', '.join(required)}) takes {', '.join(unknown)}, which {kernel} "
                f"does not pass; the hook is {hook_form(hook)}: take any of its arguments, by those names"
            )


def _collect(registry: Registry) -> list[Spec]:
    """Call every registering hook of every plugin separately, in ``plugins:`` order, so each record
    knows its plugin."""
    records: list[Spec] = []
    for kind, hook_name in HOOK_OF.items():
        should = f"it must return a list of {kind.__name__} records"
        for plugin_name, result in call_hook(registry, hook_name, should):
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
        kind = KIND_OF[type(spec)]
        table = {
            DatasetSpec: reg.datasets,
            TemplateSpec: reg.templates,
            EstimatorSpec: reg.estimators,
            PolicyLossSpec: reg.policy_losses,
            EngineSpec: reg.engines,
            EnvironmentSpec: reg.environments,
            ToolSpec: reg.tools,
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
    """Import the named plugins and return what they register, after the kernel's own records (plugin ``plugrl``):
    its policy losses and rollout engines, and those of the installed extensions (:func:`extensions`, each labelled
    with its package: the sandboxed ``python`` tool of plugrl-tools, the ``server`` engine of
    plugrl-rollout-servers). The extensions'
    hook implementations (plugrl-hub's) are called in every run too, after the named plugins', under the
    extension's entry-point name."""
    from plugrl import policy_losses
    from plugrl.rollout import engines

    pm = make_plugin_manager()
    sources: dict[str, str] = {}
    others: list[Any] = []  # records of kinds a plugin defines (Registry.plugin_records)
    for name in names:
        if name in sources:
            continue
        obj, source = _import_plugin(name)
        sources[name] = source
        specs = _decorated_specs(obj)  # first: a package that loads its parts on first use has them (and its hooks)
        try:
            if not isinstance(obj, (ModuleType, type)) and callable(obj) and specs_of(obj):
                pass  # a single decorated function: nothing for pluggy to scan
            else:
                _check_hookimpls(pm, obj, name)
                pm.register(obj, name=name)
        except (ValueError, pluggy.PluginValidationError) as e:  # pluggy: registered twice, or a wrong signature
            raise PluginError(f"plugin {name!r}: {_one_line(e)}") from e
        others += [_owned_by(s, name) for s in specs if not isinstance(s, tuple(HOOK_OF))]
        specs = [s for s in specs if isinstance(s, tuple(HOOK_OF))]
        if specs:
            pm.register(_Collector(specs), name=f"{name}#decorated")
    for name, module in extensions().items():  # an extension's hooks join every run, after the named plugins'
        if name not in sources and any(pm.parse_hookimpl_opts(module, a) for a in dir(module)):
            _check_hookimpls(pm, module, name)
            pm.register(module, name=name)
    try:
        pm.check_pending()  # hookimpls named like plugrl_* but matching no spec (_check_hookimpls found none)
    except pluggy.PluginValidationError as e:
        raise PluginError(
            f"{_one_line(e)}; the hooks of {api.kernel(plugrl.__version__)}: {', '.join(hook_names())} "
            "(their arguments: `plugrl plugins --help`)"
        ) from e
    found = Registry(plugins=sources, hooks=pm.hook)
    records = _collect(found)
    _warn_idle(pm, sources, [*records, *others])
    _warn_old_forms(records)
    builtin = [with_plugin(s, policy_losses.BUILTIN) for m in (policy_losses, engines) for s in _decorated_specs(m)]
    labels = extension_packages()  # an extension's records are its package's, in every run like the kernel's
    builtin += [with_plugin(s, labels[n]) for n, m in extensions().items() for s in _decorated_specs(m)]
    registry = build_registry(builtin + records, sources)
    registry.hooks = pm.hook
    registry.plugin_records = others
    return registry


def _owned_by(record: Any, plugin: str) -> Any:
    """A record of a kind a plugin defines, with its ``plugin`` field (when it has one) set to ``plugin``."""
    if is_dataclass(record) and "plugin" in {f.name for f in fields(record)}:
        return replace(record, plugin=plugin)
    return record


@cache
def extensions() -> dict[str, ModuleType]:
    """The modules of the entry-point group ``plugrl.extensions`` by entry-point name, imported once per process:
    their decorated records (labelled with the package: :func:`extension_packages`) join the kernel's own in every
    run, and their hooks are called in
    every run. One that fails to import is named in a warning and left out, so that a broken package cannot stop a
    run that does not use it."""
    found = {}
    for ep in sorted(importlib.metadata.entry_points(group=EXTENSIONS_GROUP), key=lambda e: e.name):
        try:
            found[ep.name] = importlib.import_module(ep.value.partition(":")[0])
        except Exception as e:
            log.warning("extension %r (%s) failed to import: %s: %s", ep.name, ep.value, type(e).__name__, e)
    return found


@cache
def extension_packages() -> dict[str, str]:
    """The distribution of each extension by entry-point name (``tools`` -> ``plugrl-tools``): the plugin its
    records name, in every run."""
    found = importlib.metadata.entry_points(group=EXTENSIONS_GROUP)
    return {ep.name: ep.dist.name if ep.dist else ep.name for ep in found}


def in_every_run(plugin: str) -> bool:
    """Whether records labelled ``plugin`` are in every run's registry: the kernel's own and the extensions'."""
    from plugrl.policy_losses import BUILTIN

    return plugin == BUILTIN or plugin in extension_packages().values()


def _one_line(error: BaseException) -> str:
    return "; ".join(line.strip() for line in str(error).splitlines() if line.strip())


def _warn_old_forms(records: list[Spec]) -> None:
    """A :class:`plugrl.PluginAPIWarning`, at load, for each estimator whose code reads a form the plugin API
    replaced (``batch.extras``): it still runs this release, and the warning names the new form."""
    for spec in records:
        if not isinstance(spec, EstimatorSpec):
            continue
        for form in api.ESTIMATOR_OLD_FORMS:
            if api.reads_attribute(spec.fn, form.attribute):
                where = f"plugin {spec.plugin!r}: advantage estimator {spec.name!r}"
                warnings.warn(api.old_form_message(form, plugrl.__version__, where), api.PluginAPIWarning, 2)


def _warn_idle(pm: pluggy.PluginManager, sources: dict[str, str], records: list[Any]) -> None:
    """Warn about plugins that register nothing and implement no hook: named in `plugins:`, they do nothing
    (a module whose functions lack the decorators, or the wrong ``module:object``)."""
    registering = {getattr(s, "plugin", None) for s in records}
    for name, source in sources.items():
        plugin = pm.get_plugin(name)
        hooked = plugin is not None and any(
            caller.name not in HOOK_OF.values() for caller in pm.get_hookcallers(plugin) or []
        )
        if name not in registering and not hooked:
            log.warning(
                "plugin %r (%s) registers nothing and implements no hook: it has no effect on this run. Decorate "
                "its functions (@plugrl.reward, ...), implement a hook with @plugrl.hookimpl, or remove it from "
                "`plugins:`",
                name,
                source,
            )


# how many positional arguments each kind of plugin function is called with
_CALLED_WITH = {
    "reward": (1, 2, "fn(completion, ground_truth, **context)"),
    "dataset": (1, 1, "fn(split, **options)"),
    "template": (1, 1, "fn(sample)"),
    "estimator": (2, 2, "fn(batch, config)"),
    "policy loss": (5, 5, "fn(logprob, old_logprob, advantages, response_mask, config, **norm)"),
    "environment": (0, 0, "factory(**environment_options)"),
    "environment family": (1, 1, "load(env_id, **environment_options)"),
}


def check_registry(registry: Registry, *, uncallable_only: bool = False) -> list[str]:
    """Problems with the registered functions' signatures (empty when all is well): `plugrl plugins --check`, the
    test kit and (``uncallable_only``) every run's start.

    ``uncallable_only``: only functions that cannot take the positional arguments the kernel passes (every call
    would raise a TypeError), leaving out those that require more parameters, which options may fill."""
    problems = []
    entries = [("reward", r.name, r.fn, r.plugin) for r in registry.rewards]
    for kind, table in registry.named():
        entries += [
            ("environment family" if getattr(spec, "load", None) else kind, name, spec.fn, spec.plugin)
            for name, spec in table.items()
            if kind in _CALLED_WITH  # a tool's arguments are its own (its schema says them)
        ]
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
        if len(positional) < low or (len(required) > high and not uncallable_only):
            problems.append(
                f"{plugin}: {kind} {name!r} is called as {form}, but its signature is {name}{inspect.signature(fn)}"
            )
    return problems


def check_algorithm(algorithm: Any, registry: Registry) -> EstimatorSpec:
    """The estimator named by ``algorithm.adv_estimator``, after checking that it is registered; call it before any
    model loads. Raises :class:`PluginError` naming the key and the registered estimators when it is not.

    The inputs it declared are the kernel's to provide: a critic (``needs_critic``) is built from the ``critic``
    section, a greedy baseline (``needs_greedy_baseline``) generated by the rollout engine, so no combination can
    be missing anything. What else it needs, its plugin checks (``plugrl_check_config``).
    """
    name = getattr(algorithm, "adv_estimator", None)
    estimator = registry.estimators.get(name) if isinstance(name, str) else None
    if estimator is None:
        known = ", ".join(sorted(registry.estimators)) or "none (add a plugin that registers one to `plugins:`)"
        raise PluginError(f"algorithm.adv_estimator {name!r} is not registered; registered: {known}")
    return estimator


def configure_plugins(config: Any, registry: Registry, *, training: bool) -> Registry:
    """Let every plugin settle its part of ``config`` and name the plugins the run needs beside the loaded ones
    (hook ``plugrl_configure``); those are appended to ``config.plugins`` (the run's config.yaml names what ran)
    and loaded, and the plugins are asked again until none is missing. Call it right after :func:`load_plugins`,
    before the checks. Returns the registry of every plugin of the run.

    Raises :class:`PluginError` naming the plugin that asked, the plugin it needs, why, and what to install,
    when that plugin is not installed; or naming a plugin whose hook returns something else than
    ``{plugin: why}``."""
    hook_name = "plugrl_configure"
    for _ in range(16):  # each round loads at least one more plugin: a bound against plugins that never agree
        wanted: dict[str, tuple[str, str]] = {}  # plugin -> (the plugin that asked, why)
        for asker, result in call_hook(
            registry,
            hook_name,
            "it must return {plugin: why} or None",
            config=config,
            registry=registry,
            training=training,
        ):
            if result is None:
                continue
            if not isinstance(result, Mapping) or not all(isinstance(v, str) for v in [*result, *result.values()]):
                raise PluginError(
                    f"plugin {asker!r}: hook {hook_name} must return {{plugin name: why}} or None, got {result!r:.200}"
                )
            for name, why in result.items():
                if name not in registry.plugins:
                    wanted.setdefault(name, (asker, why))
        if not wanted:
            return registry
        installed = {p.name for p in installed_plugins()}
        for name, (asker, why) in wanted.items():
            if ":" not in name and name not in installed:
                raise PluginError(
                    f"plugin {asker!r} needs the plugin {name!r} for this run: {why}. It is not installed: "
                    f"{install_hint(name)}"
                )
        config.plugins = [*config.plugins, *wanted]
        registry = load_plugins(config.plugins)
    raise PluginError(f"the plugins kept asking for more plugins (hook {hook_name}); plugins: {config.plugins}")


def check_policy_loss(loss_mode: str, registry: Registry) -> PolicyLossSpec:
    """The policy loss named by ``actor.loss_mode``; a :class:`PluginError` naming the key and the registered
    losses (the kernel's ``vanilla``, and any a plugin adds) when it is not registered."""
    spec = registry.policy_losses.get(loss_mode)
    if spec is None:
        raise PluginError(
            f"actor.loss_mode {loss_mode!r} is not registered{_did_you_mean(loss_mode, registry.policy_losses)}; "
            f"registered policy losses: {', '.join(sorted(registry.policy_losses))}"
        )
    return spec


def check_options(config: Any, registry: Registry) -> list[str]:
    """Validate every plugin-owned part of ``config`` against the options its function declared
    (``options=`` of the decorators) and write the validated values back; returns the problems.

    - ``reward.options.<name>`` and ``reward.weights.<name>``: ``name`` must be a registered reward;
      a reward that declares options gets them validated (defaults filled in).
    - ``algorithm.*`` beyond the kernel's keys: only the chosen estimator's declared options, validated
      and set on the ``algorithm`` section; any other extra key is an unknown key.
    - ``data.dataset_options``: validated when the named dataset declares options.
    - ``reward.default`` and ``reward.extra`` (:func:`plugrl.rewards.routing.check_route_options`); ``environment``,
      ``environment_options`` and the tools named (:func:`plugrl.rollout.routing.check_environment_options`).
    """
    problems: list[str] = []
    rewards = {r.name: r for r in registry.rewards}
    reward_cfg = config.reward
    check_route_options(config, registry, problems)  # reward.default, reward.extra
    for section, table in (("options", reward_cfg.options), ("weights", reward_cfg.weights)):
        for name in table:
            if name not in rewards:
                problems.append(
                    f"reward.{section}.{name} names no registered reward{_did_you_mean(name, rewards)}; "
                    f"registered: {', '.join(sorted(rewards)) or 'none'}"
                )
    for name, spec in rewards.items():
        if spec.options is not None:
            checked = _checked(spec.options, reward_cfg.options.get(name, {}), f"reward.options.{name}", problems)
            if checked is not None and (name in reward_cfg.options or checked):
                reward_cfg.options[name] = checked
    _check_algorithm_options(config.algorithm, registry, problems)
    check_environment_options(config, registry, problems)
    data = config.data
    dataset = registry.datasets.get(data.dataset) if data.dataset else None
    if dataset is not None and dataset.options is not None:
        checked = _checked(dataset.options, data.dataset_options, "data.dataset_options", problems)
        if checked is not None:
            data.dataset_options = checked
    return problems


def _check_algorithm_options(algorithm: Any, registry: Registry, problems: list[str]) -> None:
    estimator = registry.estimators.get(algorithm.adv_estimator)
    extras = dict(algorithm.model_extra or {})
    kernel_keys = list(type(algorithm).model_fields)
    if estimator is not None and estimator.options is not None:
        checked = _checked(estimator.options, extras, "algorithm", problems, extra_known=kernel_keys)
        for key, value in (checked or {}).items():
            setattr(algorithm, key, value)
    elif extras and estimator is not None:  # an estimator not loaded (plugrl eval calls none): its keys are its own
        owner = f"the estimator {algorithm.adv_estimator!r} declares no options"
        for key in sorted(extras):
            problems.append(
                f"unknown key 'algorithm.{key}'{_did_you_mean(key, kernel_keys, 'algorithm.')}: neither the kernel "
                f"knows it nor does the estimator ({owner})"
            )


def _impls_in_order(registry: Registry, hook_name: str) -> list[Any]:
    """The implementations of ``hook_name``, in the order of ``plugins:`` (a plugin's own hooks before its
    decorated functions), whatever pluggy's own call order is."""
    if registry.hooks is None:  # a Registry built by hand (tests, tools) has no plugins to ask
        return []
    order = {name: i for i, name in enumerate(registry.plugins)}
    impls = getattr(registry.hooks, hook_name).get_hookimpls()
    return sorted(impls, key=lambda impl: order.get(_plugin_of(impl), len(order)))  # stable: keeps ties


def _plugin_of(impl: Any) -> str:
    return impl.plugin_name.split("#", 1)[0]


def call_hook(registry: Registry, hook_name: str, should: str, /, **kwargs: Any) -> Iterator[tuple[str, Any]]:
    """(plugin name, result) of each implementation of ``hook_name``, in ``plugins:`` order, each called
    with the subset of ``kwargs`` it declares: the one path every hook of the kernel runs through.

    An implementation that raises is a :class:`PluginError` naming its plugin and saying what it
    ``should`` do instead (the original exception chained).
    """
    for impl in _impls_in_order(registry, hook_name):
        plugin_name = _plugin_of(impl)
        try:
            result = impl.function(*[kwargs[arg] for arg in impl.argnames])
        except Exception as e:
            raise PluginError(
                f"plugin {plugin_name!r}: hook {hook_name} raised {type(e).__name__}: {e} "
                f"({should}, not raise; report this to the plugin's authors)"
            ) from e
        yield plugin_name, result


class PluginRun:
    """``with PluginRun(registry, config, run_dir):`` brackets a run with the plugins' lifecycle hooks.

    Entering calls ``plugrl_run_start`` plugin by plugin, in ``plugins:`` order. Leaving calls
    ``plugrl_run_end`` (same order) for every plugin whose start succeeded (a plugin without a start
    hook counts as started), with ``error`` the exception ending the run or None, and calls every one
    even when another raises. When a start raises, the plugins started before it are ended with that
    error and a :class:`PluginError` naming the plugin stops the run. A raising end is reported with
    the plugin's name: as a :class:`PluginError` after a clean run, in the log when the run already
    fails with its own error (which is what propagates).
    """

    def __init__(self, registry: Registry, config: Any, run_dir: Any):
        self.registry, self.config, self.run_dir = registry, config, run_dir
        self.started: list[str] = []

    def __enter__(self) -> PluginRun:
        starts: dict[str, list[Any]] = {}
        for impl in _impls_in_order(self.registry, "plugrl_run_start"):
            starts.setdefault(_plugin_of(impl), []).append(impl)
        ends = [_plugin_of(impl) for impl in _impls_in_order(self.registry, "plugrl_run_end")]
        for plugin_name in dict.fromkeys([*self.registry.plugins, *starts, *ends]):  # extensions' after the named
            for impl in starts.get(plugin_name, []):
                try:
                    impl.function(*[{"config": self.config, "run_dir": self.run_dir}[a] for a in impl.argnames])
                except BaseException as e:
                    self._end(e)
                    if not isinstance(e, Exception):
                        raise  # Ctrl-C while a plugin starts: stop as asked, after ending the others
                    raise PluginError(
                        f"plugin {plugin_name!r}: plugrl_run_start failed, so the run stops before training: "
                        f"{type(e).__name__}: {e}"
                    ) from e
            self.started.append(plugin_name)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        failures = self._end(exc)
        if failures and exc is None:
            raise PluginError(
                "plugrl_run_end must not raise, but "
                + "; ".join(f"plugin {name!r} raised {type(e).__name__}: {e}" for name, e in failures)
                + " (the run itself finished; report this to the plugin's authors)"
            ) from failures[0][1]

    def _end(self, error: BaseException | None) -> list[tuple[str, BaseException]]:
        """Call ``plugrl_run_end`` of every started plugin; returns those that raised."""
        args = {"config": self.config, "run_dir": self.run_dir, "error": error}
        failures = []
        for impl in _impls_in_order(self.registry, "plugrl_run_end"):
            plugin_name = _plugin_of(impl)
            if plugin_name not in self.started:
                continue
            try:
                impl.function(*[args[a] for a in impl.argnames])
            except Exception as e:
                failures.append((plugin_name, e))
                log.error("plugin %r: plugrl_run_end raised %s: %s", plugin_name, type(e).__name__, e)
        self.started = []
        return failures


def final_checkpoint(registry: Registry, config: Any, run_dir: Path, checkpoint: Path | None, steps: int) -> None:
    """Hook ``plugrl_final_checkpoint`` of every plugin and extension (rank 0, once the steps are done). A
    :class:`PluginError` it raises (a failed hand-over, said for the user) ends the run as it is; anything else is
    reported as a bug of the plugin."""
    try:
        for _ in call_hook(
            registry,
            "plugrl_final_checkpoint",
            "it must raise a PluginError saying what failed, or nothing",
            config=config,
            run_dir=run_dir,
            checkpoint=checkpoint,
            steps=steps,
        ):
            pass
    except PluginError as e:
        if isinstance(e.__cause__, PluginError):  # the plugin's own message for the user
            raise e.__cause__ from None
        raise


def check_config(config: Any, registry: Registry, *, training: bool = True) -> None:
    """Check the plugins' part of ``config``: the options their functions declared (:func:`check_options`,
    validated values written back) and every plugin's own check (hook ``plugrl_check_config``); call it
    right after :func:`load_plugins`, before any model loads. ``training``: False for ``plugrl eval``.

    Raises :class:`plugrl.config.ConfigError` listing every plugin's problems at once, each after the name of
    the plugin that found it, and :class:`PluginError` when a plugin's function cannot take the arguments the
    kernel passes it (a TypeError in every call) or a plugin's check itself is broken (it raised, or returned
    something other than a list of messages).
    """
    uncallable = [p.split(": ", 1) for p in check_registry(registry, uncallable_only=True)]
    if uncallable:  # a TypeError in every call, in the middle of a step: refused at start instead
        raise PluginError(
            "; ".join(f"plugin {plugin!r}: {problem}" for plugin, problem in uncallable)
            + f": give it the arguments shown, as {api.kernel(plugrl.__version__)} calls it"
        )
    problems: list[str] = check_options(config, registry) if hasattr(config, "reward") else []
    hook_name = "plugrl_check_config"
    for plugin_name, result in call_hook(
        registry,
        hook_name,
        "it must return the problems as a list of messages",
        config=config,
        registry=registry,
        training=training,
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
    for plugin_name, got in call_hook(
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
