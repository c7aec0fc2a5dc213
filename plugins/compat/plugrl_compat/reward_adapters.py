"""Reward functions written for TRL and verl, unchanged, as plugrl rewards.

:func:`trl_reward` for TRL's ``fn(prompts, completions, **columns) -> list[float | None]`` and
:func:`verl_compute_score` for verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``.
Users import them as ``plugrl.rewards.trl_reward`` and ``plugrl.rewards.verl_compute_score``: the kernel loads this
module through the entry-point group ``plugrl.reward_adapters`` (:mod:`plugrl.rewards.adapters`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from plugrl.rewards.adapters import is_async_fn, keyword_names, parameters_of
from plugrl.specs import RewardSpec

VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


class TRLReward:
    """A TRL-style batch reward ``fn(prompts, completions, **columns) -> list[float | None]``.

    Called once per batch, inline, with the prompts as in the dataset, the completions as TRL passes them (text,
    or assistant messages for a chat prompt), one list per dataset column, and the reward's options; ``fn`` gets
    only the keywords it declares unless it takes ``**kwargs``. A ``None`` score means "does not apply": the
    function does not count for that sample. Picklable when ``fn`` is a module-level function.

    ``collective`` (``plugrl_collective``): ``fn`` runs collectives across the ranks (a model sharded with FSDP2):
    it is called on every rank in every scoring round, with this rank's items, possibly none (empty lists), and
    must run the same collectives on every rank whatever its share (e.g. agree on the number of forward passes,
    padding with dummy ones). It must not raise on one rank alone: the others would wait until the timeout.
    """

    plugrl_batch = True

    def __init__(self, fn: Callable[..., Any], *, collective: bool = False):
        self.fn = fn
        self.plugrl_collective = collective
        ps, var_kw = parameters_of(fn)
        self.accepts: frozenset[str] | None = None if var_kw else keyword_names(ps)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, prompts: list[Any], completions: list[Any], **columns: Any) -> Any:
        kwargs = {"prompts": prompts, "completions": completions, **columns}
        if self.accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        return self.fn(**kwargs)

    def __repr__(self) -> str:
        return f"TRLReward({self.fn!r})"


def trl_reward(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    data_sources: Sequence[str] = ("*",),
    weight: float = 1.0,
    collective: bool = False,
) -> RewardSpec:
    """A :class:`RewardSpec` for TRL's ``fn(prompts, completions, **columns) -> list[float | None]``;
    ``collective``: see :class:`TRLReward`."""
    if not data_sources:
        raise TypeError("trl_reward needs at least one data_source name or glob")
    wrapper = TRLReward(fn, collective=collective)
    return RewardSpec(name=name or wrapper.__name__, fn=wrapper, data_sources=tuple(data_sources), weight=weight)


class VerlScore:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs)``
    as a plugrl reward ``fn(completion, ground_truth, data_source=, extra_info=, **options)``.

    Called with keywords, as verl's reward manager does; the reward's options play the part of verl's
    ``reward_kwargs``. Picklable when ``fn`` is a module-level function, so it runs in the worker pool.
    """

    plugrl_context = ("data_source", "extra_info")  # the context keywords it needs; options are always passed
    reward_kwargs: dict[str, Any] = {}  # keywords over the call's (verl's custom_reward_function.reward_kwargs)

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        ps, var_kw = parameters_of(fn)
        self.accepts: frozenset[str] | None = None if var_kw else keyword_names(ps)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def function(self) -> Callable[..., Any]:
        return self.fn

    def _kwargs(self, completion: str, ground_truth: Any, data_source: Any, extra_info: Any, options: dict) -> dict:
        kwargs = {
            "data_source": data_source,
            "solution_str": completion,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
            **options,
            **self.reward_kwargs,  # verl: the configured reward_kwargs win over the call's keywords
        }
        if self.accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        return kwargs

    def accepts_option(self, key: str) -> bool:
        return key not in VERL_ARGS and (self.accepts is None or key in self.accepts)

    def __call__(
        self, completion: str, ground_truth: Any, data_source: Any = None, extra_info: Any = None, **options: Any
    ) -> Any:
        return self.function()(**self._kwargs(completion, ground_truth, data_source, extra_info, options))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fn!r})"


class AsyncVerlScore(VerlScore):
    """:class:`VerlScore` for an ``async def compute_score``."""

    async def __call__(  # type: ignore[override]
        self, completion: str, ground_truth: Any, data_source: Any = None, extra_info: Any = None, **options: Any
    ) -> Any:
        return await self.function()(**self._kwargs(completion, ground_truth, data_source, extra_info, options))


def verl_compute_score(fn: Callable[..., Any], *, data_sources: Sequence[str], name: str | None = None) -> RewardSpec:
    """A :class:`RewardSpec` for verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``."""
    if isinstance(data_sources, str) or not data_sources:
        raise TypeError("verl_compute_score needs data_sources, a non-empty sequence of names or globs")
    wrapper = (AsyncVerlScore if is_async_fn(fn) else VerlScore)(fn)
    return RewardSpec(name=name or wrapper.__name__, fn=wrapper, data_sources=tuple(data_sources))
