"""verl's custom reward function, unchanged: ``custom_reward_function.path`` / ``.name`` (verl's legacy top-level
section) or ``reward.custom_reward_function.path`` / ``.name`` (verl 0.9's), both read into
:class:`plugrl.config.CustomRewardFunctionConfig`.

As in verl, the function scores every sample, whatever its ``data_source`` (it replaces the default scorer), and is
called with keywords only::

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=..., **reward_kwargs)

``reward_kwargs`` are ``custom_reward_function.reward_kwargs`` (verl merges them over the call's keywords: they win).
It may return a number, or a dict holding ``score`` whose other fields are logged (``reward/<name>/<field>``), and may
be ``async def``. A function whose signature lacks one of verl's four keywords gets the others only (as plugrl's
adapters do), so ``compute_score(solution_str, ground_truth)`` works too.

:func:`custom_reward_spec` loads and checks the file at start-up, before any model loads: a missing file, a file that
fails to import, no such function or a signature that cannot take verl's call is a :class:`RewardError` naming the key
as the user typed it and the file. The reward runs in plugrl's reward workers like any plugin's; they load the file
again by its path (:class:`CustomScore` pickles as the path, the name and the keywords), once per process.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from plugrl.rewards.adapters import is_async_fn, keyword_names, parameters_of
from plugrl.rewards.outcomes import RewardError
from plugrl.specs import Registry, RewardSpec
from plugrl_compat.reward_adapters import VERL_ARGS, AsyncVerlScore, VerlScore

PLUGIN = "custom_reward_function"  # the plugin name its RewardSpec carries (named in routes and errors)
PATH_KEY = "reward.custom_reward_function.path"
NAME_KEY = "reward.custom_reward_function.name"
KWARGS_KEY = "reward.custom_reward_function.reward_kwargs"
PKG_PREFIX = "pkg://"  # verl's load_module: an importable module instead of a file
FILE_PREFIX = "file://"
VERL_CALL = "compute_score(data_source=, solution_str=, ground_truth=, extra_info=, **reward_kwargs)"

log = logging.getLogger("plugrl.rewards")

_MODULES: dict[str, ModuleType] = {}  # by resolved path (or pkg:// name), once per process
_LOCK = threading.Lock()


class _ImportFailed(Exception):
    """Importing the user's file raised; the message says what."""


def _module_name(location: str) -> str:
    digest = hashlib.sha1(location.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"plugrl_custom_reward_{digest}"


def load_module(path: str) -> ModuleType:
    """The module at ``path`` (a file, ``file://FILE`` or ``pkg://dotted.module``, as verl's ``load_module``), imported
    once per process. FileNotFoundError when the file is not there; :class:`_ImportFailed` when importing it raises."""
    if path.startswith(PKG_PREFIX):
        location = path[len(PKG_PREFIX) :].replace("/", ".")
    else:
        location = str(Path(path.removeprefix(FILE_PREFIX)).expanduser().resolve())
    with _LOCK:
        module = _MODULES.get(location)
        if module is not None:
            return module
        try:
            module = _import(path, location)
        except (FileNotFoundError, _ImportFailed):
            raise
        except BaseException as e:  # SystemExit, a syntax error, whatever the file's top level raises
            raise _ImportFailed(f"{type(e).__name__}: {e}") from e
        _MODULES[location] = module
        return module


def _import(path: str, location: str) -> ModuleType:
    if path.startswith(PKG_PREFIX):
        return importlib.import_module(location)
    file = Path(location)
    if not file.is_file():
        raise FileNotFoundError(location)
    name = _module_name(location)
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise _ImportFailed(f"{file} cannot be imported as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling inside the file look their module up by name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


class CustomScore(VerlScore):
    """The user's ``compute_score`` as a plugrl reward ``fn(completion, ground_truth, data_source=, extra_info=,
    **options)``, called as verl calls it (keywords only, ``reward_kwargs`` over the call's). Picklable: it carries the
    file's path, the function's name and the keywords, and loads the function in each process on first use."""

    def __init__(self, path: str, name: str, reward_kwargs: Mapping[str, Any], accepts: frozenset[str] | None):
        self.path = path
        self.name = name
        self.reward_kwargs = dict(reward_kwargs)
        self.accepts = accepts  # the keywords the function takes; None: **kwargs
        self.__name__ = name
        self._fn: Callable[..., Any] | None = None  # loaded in this process on first use

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "reward_kwargs": self.reward_kwargs, "accepts": self.accepts}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["name"], state["reward_kwargs"], state["accepts"])  # type: ignore[misc]

    def function(self) -> Callable[..., Any]:
        if self._fn is None:
            self._fn = getattr(load_module(self.path), self.name)
        return self._fn

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r}, {self.name!r})"


class AsyncCustomScore(CustomScore, AsyncVerlScore):
    """:class:`CustomScore` for an ``async def compute_score`` (run on the reward runner's event loop)."""


def _typed(key: str, typed_as: Mapping[str, str]) -> str:
    """``key`` as the user typed it; reward_kwargs, which they may not have typed, in the spelling of their path."""
    if key == KWARGS_KEY and key not in typed_as:
        return _typed(PATH_KEY, typed_as).removesuffix(".path") + ".reward_kwargs"
    return typed_as.get(key, key)


def _load(path: str, name: str, typed_as: Mapping[str, str]) -> Callable[..., Any]:
    """The function, or a :class:`RewardError` naming the key as typed, the file and the fix."""
    path_key, name_key = _typed(PATH_KEY, typed_as), _typed(NAME_KEY, typed_as)
    try:
        module = load_module(path)
    except FileNotFoundError:
        raise RewardError(
            f"{path_key}={path!r}: no such file (a relative path is read from {os.getcwd()}). Point it at the Python "
            f"file that defines {name}(data_source, solution_str, ground_truth, extra_info, **kwargs)"
        ) from None
    except ModuleNotFoundError as e:
        raise RewardError(f"{path_key}={path!r}: importing it failed: {type(e).__name__}: {e}") from None
    except _ImportFailed as e:
        raise RewardError(
            f"{path_key}={path!r}: importing the file raised {e}. Fix the file (it is imported once per reward "
            "worker process, so its top level must run without the trainer)"
        ) from None
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        own = module.__name__
        defined = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == own)
        what = "defines no function" if fn is None else f"defines {name!r} as a {type(fn).__name__}, not a function,"
        raise RewardError(
            f"{name_key}={name!r}: {path} {what} named {name!r}; it defines: {', '.join(defined) or 'no functions'}. "
            f"Set {name_key} to the function verl calls as {VERL_CALL}"
        )
    return fn


def _check_signature(fn: Callable[..., Any], path: str, name: str, kwargs: Mapping[str, Any], typed_as: Any) -> Any:
    """The keywords ``fn`` takes (None: ``**kwargs``), or a :class:`RewardError` when verl's call cannot bind."""
    name_key = _typed(NAME_KEY, typed_as)
    try:
        params, var_kw = parameters_of(fn)
    except (TypeError, ValueError) as e:
        raise RewardError(f"{name_key}={name!r} in {path}: its signature cannot be read ({e})") from None
    given = set(VERL_ARGS) | set(kwargs)
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    unbound = [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in given
    ]
    problems = []
    if positional_only:
        problems.append(f"it takes {', '.join(positional_only)} positionally only, and verl passes keywords")
    if unbound:
        problems.append(
            f"it requires {', '.join(unbound)}, which verl's call does not pass (set them in "
            f"{_typed(KWARGS_KEY, typed_as)}, or give them defaults)"
        )
    accepts = None if var_kw else keyword_names(params)
    if accepts is not None and "solution_str" not in accepts:
        problems.append("it takes no solution_str, so it would never see the completion")
    unknown = sorted(k for k in kwargs if accepts is not None and k not in accepts)
    if unknown:
        problems.append(f"{_typed(KWARGS_KEY, typed_as)} sets {', '.join(unknown)}, which it does not take")
    if problems:
        raise RewardError(
            f"{name_key}={name!r} in {path}: verl calls it as {VERL_CALL}, but " + "; ".join(problems) + "."
        )
    return accepts


def custom_reward_spec(path: str, name: str, reward_kwargs: Mapping[str, Any], typed_as: Any = None) -> RewardSpec:
    """Load and check the user's function; its :class:`RewardSpec` for every data source (``*``), named ``name``."""
    typed_as = typed_as or {}
    fn = _load(path, name, typed_as)
    accepts = _check_signature(fn, path, name, reward_kwargs, typed_as)
    wrapper = (AsyncCustomScore if is_async_fn(fn) else CustomScore)(path, name, reward_kwargs, accepts)
    return RewardSpec(name=name, fn=wrapper, data_sources=("*",), plugin=PLUGIN)


def use_custom_reward(cfg: Any, registry: Registry) -> RewardSpec | None:
    """With ``reward.custom_reward_function.path`` set: load and check the function (:func:`custom_reward_spec`) and
    make it the reward of every data source, as verl's custom function replaces its default scorer. The plugins'
    rewards stay registered (their options are still checked) but route no data source, except those named in
    ``reward.extra``, which are scored beside it; said at start. None without a custom function."""
    section = cfg.reward.custom_reward_function
    if not section.path:
        return None
    typed_as = getattr(cfg, "_typed_as", {})
    spec = custom_reward_spec(section.path, section.name, section.reward_kwargs, typed_as)
    clash = next((r for r in registry.rewards if r.name == spec.name), None)
    if clash is not None:
        raise RewardError(
            f"{_typed(NAME_KEY, typed_as)}={spec.name!r}: plugin {clash.plugin!r} registers a reward of that name too; "
            "rename the function (and set the key to the new name), or leave that plugin out of `plugins:`"
        )
    extra = set(cfg.reward.extra or ())
    unrouted = sorted(f"{r.name} ({r.plugin})" for r in registry.rewards if r.data_sources and r.name not in extra)
    registry.rewards[:] = [spec] + [replace(r, data_sources=()) for r in registry.rewards]  # reward.extra: by name
    log.info(
        "%s=%s: %s scores every sample, as verl's custom reward function%s",
        _typed(PATH_KEY, typed_as),
        section.path,
        spec.name,
        f"; the plugins' rewards {', '.join(unrouted)} route no data source in this run (name one in reward.extra "
        "to score it beside)"
        if unrouted
        else "",
    )
    if cfg.reward.default:
        log.warning("reward.default=%s is not used: %s scores every data source", cfg.reward.default, spec.name)
    return spec
