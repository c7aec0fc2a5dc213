"""The plugin API: which plugins this kernel loads, and the forms of the contract that changed.

``PLUGIN_API`` numbers the plugin contract. It goes up (with the kernel's minor version, 0.x) when a
change can break a plugin written against the previous contract: a hook renamed, removed, or given other
arguments or another return form; a field of a record that plugins build or read (``RewardSpec`` and the
other specs, ``AdvantageBatch``, ``AdvantageResult``, ``Sample``, ``EnvStart``, ``EnvStep``, ``Turn``)
renamed, removed or retyped; a function plugins import from ``plugrl`` moved or removed. Additions (a new
hook, a new optional field or keyword) leave it as it is.

- API 1: plugrl 0.1.x.
- API 2: plugrl 0.2.x. ``AdvantageBatch.extras`` became the typed fields ``prompts``, ``responses`` and
  ``baseline_scores`` (``extras`` still reads, with a warning, until 0.3); a solution-grouping estimator asks the
  step context (``batch.context``) for its groups through plugrl-advantages' ``classify``, where the solution
  classifiers moved with their hook and record; ``plugrl.algorithms.grpo_outcome_advantage`` and
  ``gae_advantages`` moved into the advantages plugin; the optional parts moved into packages beside the kernel
  (:func:`moved_names` says where each went: the managed model server, the sandbox and tool pool, agents,
  rollout servers, vision-language models, LoRA, the policy losses beside ``vanilla``, ``plugrl eval``, the hub
  upload, the rollout correction, the shared-prompt attention kernels, tensor parallelism, the multi-turn episode
  runner, tool authoring, the rollouts generated ahead, the GPU placement of servers and of a reward model's own
  process).

A plugin says which kernels it works with. An installed plugin declares the range in its distribution's
dependencies (``dependencies = ["plugrl>=0.2,<0.3"]`` in its ``pyproject.toml``); a local ``module:`` plugin
may set ``PLUGRL_REQUIRES = ">=0.2,<0.3"`` in its module. The loader refuses a plugin whose range leaves out
the running kernel before importing it (:mod:`plugrl.plugins`), and warns about an installed plugin that
declares none. A form that an API change replaced keeps working for one release with a
:class:`PluginAPIWarning` that names the new form, and is removed in the next.

This module imports nothing of plugrl: the kernel's version is passed in (``plugrl.__version__``).
"""

from __future__ import annotations

import dis
import functools
import importlib
import importlib.metadata
import inspect
import re
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PLUGIN_API = 2


class PluginAPIWarning(DeprecationWarning):
    """A plugin uses a form of the plugin API that this kernel still accepts and the next release removes."""


# shown once per place in the code, also outside __main__ (Python hides DeprecationWarning there by default):
# the person who runs training must see it, not only the plugin's author
warnings.filterwarnings("default", category=PluginAPIWarning)


def running_version() -> str:
    """The running kernel's ``plugrl.__version__``, read from the loaded package (this module imports none of
    plugrl, so the modules below the package can use it)."""
    return sys.modules["plugrl"].__version__


def kernel(version: str) -> str:
    """``plugrl 0.2.0 (plugin API 2)``: how messages name the running kernel."""
    return f"plugrl {version} (plugin API {PLUGIN_API})"


def suggested_range(version: str) -> str:
    """The range a plugin built against kernel ``version`` declares: that version's minor series, ``>=0.2,<0.3``
    for any 0.2.x (a minor release may change the plugin API; ``plugrl new-plugin`` writes the same range)."""
    major, minor = (int(p) for p in re.findall(r"\d+", version)[:2])
    return f">={major}.{minor},<{major}.{minor + 1}"


def required_range(requires: Iterable[str] | None) -> str | None:
    """The ``plugrl`` range among a distribution's ``Requires-Dist`` lines: ``">=0.2,<0.3"``; ``""`` when it
    depends on plugrl without a range; None when it does not depend on plugrl at all (or only under an extra)."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    found: str | None = None
    for line in requires or ():
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue  # not ours to judge; pip installed it
        if canonicalize_name(req.name) != "plugrl":
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        spec = str(req.specifier)
        found = spec if not found else ",".join(filter(None, (found, spec)))
    return found


def range_problem(spec: str, version: str, *, who: str, fix_plugin: str) -> str | None:
    """None when kernel ``version`` is in ``spec`` (``">=0.2,<0.3"``), else one line saying so and how to fix
    it; ``who`` names the plugin (``plugin 'x' (dist y 1.0)``), ``fix_plugin`` how to get another release of it."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        specs = SpecifierSet(spec)
    except InvalidSpecifier:
        return (
            f"{who} declares the plugrl range {spec!r}, which is not a version range: write one such as "
            f"{suggested_range(version)!r}"
        )
    try:
        running = Version(version)
    except InvalidVersion:  # a kernel built from an odd tree: nothing to compare against
        return None
    if specs.contains(running, prereleases=True):
        return None
    wanted = f"pip install 'plugrl{specs}'"
    if _kernel_too_old(specs, running):
        fix = f"upgrade plugrl ({wanted}), or {fix_plugin} made for plugrl {_series(running)}"
    else:
        fix = f"{fix_plugin} made for plugrl {_series(running)}, or install a plugrl it supports ({wanted})"
    return f"{who} requires plugrl{specs}; this is {kernel(version)}: {fix}"


def _series(version: Any) -> str:
    return f"{version.major}.{version.minor}.x"


def _kernel_too_old(specs: Any, running: Any) -> bool:
    """The range wants a newer kernel (a lower bound fails) rather than an older one."""
    from packaging.version import Version

    for s in specs:
        if s.contains(running, prereleases=True):
            continue
        if s.operator in (">", ">="):
            return True
        if s.operator in ("~=", "==", "===") and Version(s.version.removesuffix(".*")) > running:
            return True
    return False


# --------------------------------------------------------------------------- forms an API change replaced


@dataclass(frozen=True)
class OldForm:
    """An attribute a plugin function may still read, kept for one release after ``api`` replaced it."""

    name: str  # what plugins wrote, e.g. "AdvantageBatch.extras"
    attribute: str  # the attribute read, e.g. "extras"
    api: int  # the plugin API that replaced it
    new: str  # what to write instead
    removed_in: str  # the kernel release that drops it


EXTRAS = OldForm(
    name="AdvantageBatch.extras",
    attribute="extras",
    api=2,
    new="the typed fields batch.prompts, batch.responses and batch.baseline_scores "
    '(batch.extras["responses"] is batch.responses)',
    removed_in="0.3",
)

# the old forms an estimator function may use (checked at load, warned at use)
ESTIMATOR_OLD_FORMS = (EXTRAS,)

MOVES_GROUP = "plugrl.moved_names"  # (module, name) -> (plugin API, where it is now): plugrl-compat's table


@functools.cache
def moved_names() -> dict[tuple[str, str], tuple[int, str]]:
    """``(module, name)`` (``""``: the module itself) -> (the plugin API that moved it, where it is now), for every
    name a plugin API change moved out of the kernel: the tables of the entry-point group ``plugrl.moved_names``
    (plugrl-compat's ``plugrl_compat.moved_names:MOVED``). One that fails to load is warned about and left out."""
    found: dict[tuple[str, str], tuple[int, str]] = {}
    for ep in importlib.metadata.entry_points(group=MOVES_GROUP):
        try:
            found.update(ep.load())
        except Exception as e:  # a hint's table: the failure that asked for the hint is the one to report
            warnings.warn(f"the moved names of {ep.value} (group {MOVES_GROUP}) failed to load: {e}", stacklevel=2)
    return found


def names_on_first_use(package: str, home: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` (PEP 562) for a package that imports its parts on first use of their names:
    ``home`` maps each name to the submodule it lives in; once loaded, a name is the package's own (pluggy finds
    hooks among those). For packages whose config fields (group ``plugrl.config_fields``) every run config imports,
    so that their ``__init__`` stays light."""

    def getattr_(name: str) -> Any:
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return getattr_, dir_


def old_form_message(form: OldForm, version: str, where: str) -> str:
    """The warning for ``where`` (e.g. ``plugin 'x' estimator 'y'``) using ``form``."""
    return (
        f"{where} reads {form.name}, a form of plugin API {form.api - 1} that {kernel(version)} still accepts "
        f"and plugrl {form.removed_in} removes: read {form.new} instead"
    )


def reads_attribute(fn: Callable[..., Any], attribute: str) -> bool:
    """``fn``'s own code (nested functions and comprehensions included; not the functions it calls) reads
    ``something.<attribute>``."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    todo = [code] if isinstance(code, types.CodeType) else []
    while todo:
        code = todo.pop()
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == attribute:
                return True
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return False


_MISSING_NAME = (
    re.compile(r"cannot import name '(?P<name>\w+)' from '(?P<module>plugrl[\w.]*)'"),
    re.compile(r"module '(?P<module>plugrl[\w.]*)' has no attribute '(?P<name>\w+)'"),
    re.compile(r"No module named '(?P<module>plugrl(?:\.[\w]+)*)'"),
)


def import_hint(error: BaseException, version: str) -> str:
    """For a plugin that failed to import because a name it takes from plugrl is gone: where that name went,
    or that the plugin was written for another kernel. Empty for any other failure."""
    if not isinstance(error, (ImportError, AttributeError)):
        return ""
    text = str(error)
    for pattern in _MISSING_NAME:
        m = pattern.search(text)
        if not m:
            continue
        module, name = m.group("module"), m.groupdict().get("name")
        if module.split(".")[0] != "plugrl" or (name is None and module == "plugrl"):
            return ""
        moved = moved_names().get((module, name or ""))
        missing = f"{module}.{name}" if name else module
        if moved:
            return f"; {missing} moved in plugin API {moved[0]}: import {moved[1]}"
        return (
            f"; {kernel(version)} has no {missing}: the plugin may be written for another plugrl: install a "
            "release of it made for this one"
        )
    return ""
