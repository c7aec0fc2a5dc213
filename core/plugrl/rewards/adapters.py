"""Adapters that let users bring reward functions unchanged.

:func:`trl_reward` for TRL's ``fn(prompts, completions, **columns) -> list[float | None]``,
:func:`verl_compute_score` for verl's ``compute_score(data_source, solution_str, ground_truth,
extra_info=None)``, and :class:`_CompletionOnly` for a reward that takes no ground truth. Also the
signature helpers the runner's planning uses.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from plugrl.specs import RewardSpec

VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


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


class TRLReward:
    """A TRL-style batch reward ``fn(prompts, completions, **columns) -> list[float | None]``.

    The runner calls it once per batch, inline, with ``prompts`` (each sample's
    prompt as in the dataset: text or chat messages), ``completions`` (text, or
    ``[{"role": "assistant", "content": text}]`` when the prompt is chat
    messages, as TRL does), one list per dataset column, and the reward's
    options. ``fn`` gets only the keywords it declares unless it takes
    ``**kwargs``. A ``None`` score means "does not apply": the function does not
    count for that sample. Picklable when ``fn`` is a module-level function.

    ``collective`` (``plugrl_collective``): ``fn`` runs collectives across the ranks (a model sharded with
    FSDP2): it is called on every rank in every scoring round, with this rank's items for it, possibly none
    (empty lists), and must run the same collectives on every rank, whatever its share (the reward model's
    ``shard: true`` agrees on the number of forward passes and pads with dummy ones). It must not raise on one
    rank alone: the others would wait in their collectives until the process group's timeout.
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
    """A :class:`RewardSpec` for TRL's ``fn(prompts, completions, **columns) -> list[float | None]``.

    ``collective``: ``fn`` runs collectives across the ranks; it is then called on every rank in every scoring
    round, with this rank's items, possibly none, and must run the same collectives on every rank
    (:class:`TRLReward`)."""
    if not data_sources:
        raise TypeError("trl_reward needs at least one data_source name or glob")
    wrapper = TRLReward(fn, collective=collective)
    return RewardSpec(name=name or wrapper.__name__, fn=wrapper, data_sources=tuple(data_sources), weight=weight)


class VerlScore:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs)``
    as a plugrl reward ``fn(completion, ground_truth, data_source=, extra_info=, **options)``.

    Called with keywords, as verl's reward manager does; the reward's options
    play the part of verl's ``reward_kwargs``. Picklable when ``fn`` is a
    module-level function, so it runs in the worker pool.
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
