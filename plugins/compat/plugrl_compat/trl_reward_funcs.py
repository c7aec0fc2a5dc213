"""TRL's ``reward_funcs``, as TRL's ``grpo.py`` resolves them: ``reward.reward_funcs``.

Each entry is one of TRL's own reward names (``accuracy_reward``, ``reasoning_accuracy_reward``,
``think_format_reward``, ``get_soft_overlong_punishment``, the last made with TRL's script's values
``max_completion_len=1280, soft_punish_cache=256``) or the path of the user's function, ``module.function`` (TRL's
spelling; the current directory is importable, as TRL's script makes it) or ``module:function``.
:func:`use_reward_funcs` loads them at start-up, before any model loads, and registers each as a batch reward
(:class:`plugrl_compat.reward_adapters.TRLReward`) that scores every sample beside the routed rewards, as TRL's
``reward_funcs`` score every sample; its name (weights, metrics) is the function's, as TRL logs it
(:func:`trl_reward_name`). A name that is neither, a module that does not import, or no such
function is a :class:`RewardError` naming the entry as typed and the fix.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from plugrl.rewards.outcomes import RewardError
from plugrl.specs import Registry, RewardSpec
from plugrl_compat.reward_adapters import TRLReward

PLUGIN = "reward_funcs"  # the plugin name their RewardSpecs carry (named in routes and errors)
KEY = "reward.reward_funcs"

log = logging.getLogger("plugrl.rewards")


# TRL's grpo.py's own reward names -> the name of the function each makes (TRL logs and weighs by __name__)
TRL_REWARD_NAMES = {
    "accuracy_reward": "accuracy_reward",
    "reasoning_accuracy_reward": "reasoning_accuracy_reward",
    "think_format_reward": "think_format_reward",
    "get_soft_overlong_punishment": "soft_overlong_punishment_reward",
}


def trl_reward_name(entry: str) -> str:
    """The name a ``reward_funcs`` function entry is weighted and logged under: the function's name, as TRL logs
    it (``get_soft_overlong_punishment`` makes ``soft_overlong_punishment_reward``), else the last part of its path
    (``my_lib.rewards.custom_reward`` or ``my_lib.rewards:custom_reward``: ``custom_reward``)."""
    if entry in TRL_REWARD_NAMES:
        return TRL_REWARD_NAMES[entry]
    return entry.replace(":", ".").rsplit(".", 1)[-1]


def _trl_own(name: str) -> Callable[..., Any]:
    try:
        from trl import rewards
    except ImportError as e:
        raise RewardError(
            f"{KEY} names {name!r}, one of TRL's own reward functions, and TRL does not import here ({e}); "
            "pip install trl (plugrl's `bench` extra pins the version its tests use)"
        ) from None
    if name == "get_soft_overlong_punishment":  # as TRL's grpo.py makes it
        return rewards.get_soft_overlong_punishment(max_completion_len=1280, soft_punish_cache=256)
    return getattr(rewards, name)


def _import(entry: str) -> Callable[..., Any]:
    module_name, _, attr = entry.partition(":") if ":" in entry else entry.rpartition(".")
    if not module_name or not attr:
        raise RewardError(
            f"{KEY} entry {entry!r} is not a reward function TRL's script knows ({', '.join(TRL_REWARD_NAMES)}) "
            "nor a path to one: write `module.function` or `module:function` (a module importable from the current "
            "directory or installed)"
        )
    if os.getcwd() not in sys.path:  # TRL's grpo.py imports the path from the current directory too
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise RewardError(
            f"{KEY} entry {entry!r}: importing {module_name!r} failed: {type(e).__name__}: {e} (run from the "
            "directory that holds it, or install it)"
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        what = "has no" if fn is None else f"has a {type(fn).__name__}, not a function, named"
        raise RewardError(f"{KEY} entry {entry!r}: module {module_name!r} {what} {attr!r}")
    return fn


def reward_func_spec(entry: str) -> RewardSpec:
    """The :class:`RewardSpec` of one ``reward_funcs`` entry: every data source through ``reward.extra``'s
    mechanism (no pattern of its own), weight 1.0 unless ``reward.weights`` names it."""
    fn = _trl_own(entry) if entry in TRL_REWARD_NAMES else _import(entry)
    return RewardSpec(name=trl_reward_name(entry), fn=TRLReward(fn), data_sources=(), plugin=PLUGIN)


def use_reward_funcs(cfg: Any, registry: Registry) -> list[RewardSpec]:
    """Load ``reward.reward_funcs`` into ``registry``: each scores every sample beside the rewards its data source
    routes to (``registry.extra_rewards``). A name a loaded plugin registers too is an error naming both."""
    specs = [reward_func_spec(entry) for entry in cfg.reward.reward_funcs]
    for spec in specs:
        clash = next((r for r in registry.rewards if r.name == spec.name), None)
        if clash is not None:
            raise RewardError(
                f"{KEY} entry {spec.name!r}: plugin {clash.plugin!r} registers a reward of that name too; rename your "
                "function, or leave that plugin out of `plugins:`"
            )
        registry.rewards.append(spec)
    if specs:
        registry.extra_rewards = tuple(dict.fromkeys([*registry.extra_rewards, *(s.name for s in specs)]))
        log.info("%s: %s score every sample, as TRL's reward_funcs", KEY, ", ".join(s.name for s in specs))
    return specs
