"""Reward functions written for other trainers: the seam to the package that adapts them, and the signature helpers
the runner's planning uses.

TRL's ``fn(prompts, completions, **columns)`` (``trl_reward``, ``TRLReward``) and verl's ``compute_score(data_source,
solution_str, ground_truth, extra_info=None)`` (``verl_compute_score``, ``VerlScore``, ``AsyncVerlScore``) are
plugrl-compat's, the entry point of group ``plugrl.reward_adapters``: they are read from it when first asked for here
or in :mod:`plugrl.rewards`, and asking without it raises :class:`NoRewardAdapters` naming the package.
:class:`_CompletionOnly` calls a reward that takes no ground truth.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from plugrl.plugin_errors import implementation, package_hint

GROUP = "plugrl.reward_adapters"
PACKAGE = "plugrl-compat"
# the package's names that users import from plugrl.rewards (and from here, with verl's argument names VERL_ARGS)
ADAPTED = ("AsyncVerlScore", "TRLReward", "VerlScore", "trl_reward", "verl_compute_score")


class NoRewardAdapters(ImportError):
    """TRL's or verl's reward adapters asked for without the package that has them; the message names it."""


def adapted(name: str, where: str) -> Any:
    """``name`` of the installed reward adapters; :class:`NoRewardAdapters` naming ``where.name`` and the package
    when none is installed."""
    missing = NoRewardAdapters(
        f"{where}.{name} (TRL's and verl's reward functions as plugrl rewards) is in the package {PACKAGE}, which is "
        f"not installed: {package_hint(PACKAGE)}"
    )
    return getattr(implementation(GROUP, missing), name)


def __getattr__(name: str) -> Any:
    if name in (*ADAPTED, "VERL_ARGS"):
        return adapted(name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CompletionOnly:
    """Calls ``fn(completion, **context)`` for a reward that takes no ground truth (picklable)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, completion: Any, ground_truth: Any, **context: Any) -> Any:
        return self.fn(completion, **context)

    def __repr__(self) -> str:
        return repr(self.fn)


def parameters_of(fn: Callable[..., Any]) -> tuple[list[inspect.Parameter], bool]:
    """(parameters, takes **kwargs) of ``fn``."""
    ps = list(inspect.signature(fn).parameters.values())
    return ps, any(p.kind is p.VAR_KEYWORD for p in ps)


def keyword_names(ps: Iterable[inspect.Parameter]) -> frozenset[str]:
    return frozenset(p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def is_async_fn(fn: Any) -> bool:
    call = None if inspect.isroutine(fn) else type(fn).__call__  # callable instances
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)
