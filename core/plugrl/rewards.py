"""Scoring rollouts with the plugins' reward functions.

:class:`RewardRunner` routes every rollout to the reward functions registered for
its ``data_source`` (exact names before globs, see :func:`plugrl.plugins.rewards_for`)
and sums their scores, weighted by ``reward.weights.<name>`` or the spec's weight.
A function that raises, times out, crashes its worker or returns something that is
not a finite number scores ``reward.error_score`` on that sample and is counted in
the metrics; scoring never stops training.

How each kind of function runs:

* **plain functions** ``fn(completion, ground_truth, **context)`` run in a
  :class:`concurrent.futures.ProcessPoolExecutor` of ``reward.num_workers``
  processes (forkserver context where available, else spawn; never fork, the
  trainer has threads), one task per sample and function, at most one task per
  worker in flight, so a task starts when it is sent and ``reward.timeout_s`` is
  measured from there. The function is sent by reference, so it must be a
  module-level function of an importable module (an installed plugin). A sample
  that times out leaves its worker busy forever, so the pool's processes are
  killed and a fresh pool is started (``reward/pool_restarts``); the other samples
  that were running are sent again. A worker that dies (``os._exit``, segfault)
  breaks the pool: it is replaced, and the samples that were running are run
  again one at a time, so only the one that kills its worker scores
  ``error_score``. One task per sample costs roughly 0.1-0.2 ms of overhead per
  sample and function (measured on 2 CPU cores), negligible next to generation.
  With ``num_workers: 0`` plain functions run inline in the calling process,
  *without* a time limit (for debugging, or for functions that cannot be pickled).
* **async functions** (``async def``) run concurrently on an event loop owned by
  the runner (one thread, kept across batches so clients bound to the loop keep
  working), at most ``reward.max_concurrency`` at a time, each under
  ``asyncio.wait_for(..., reward.timeout_s)``. They must not block the loop.
* **batch functions** (TRL style, see :func:`trl_reward`) are called once per
  batch with every sample routed to them, inline in the calling process and
  without a time limit (they may be vectorized or call a model).

Arguments: ``completion`` and ``ground_truth`` positionally, then the context
keywords ``data_source``, ``extra_info``, ``prompt`` (the rendered prompt text),
``sample``, each column of ``sample.row`` not named like one of these (dataset
columns such as ``nums`` or ``target``), and the options ``reward.options.<name>``
(which win over columns of the same name). A function gets only the keywords its
signature declares, unless it takes ``**kwargs``.

Adapters let users bring functions unchanged: :func:`trl_reward` for TRL's
``fn(prompts, completions, **columns) -> list[float | None]`` and
:func:`verl_compute_score` for verl's ``compute_score(data_source, solution_str,
ground_truth, extra_info=None)``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import inspect
import logging
import math
import multiprocessing
import numbers
import pickle
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugrl.plugins import PluginError, rewards_for
from plugrl.specs import Registry, RewardSpec

if TYPE_CHECKING:  # not imported at run time: worker processes import this module, keep their start cheap
    from plugrl.config import RewardConfig

log = logging.getLogger(__name__)

CONTEXT_KEYS = ("data_source", "extra_info", "prompt", "sample")
RESERVED = frozenset({"completion", "ground_truth", *CONTEXT_KEYS})
# A function whose worker dies this many times in one batch is not run on the rest of it.
CRASH_LIMIT = 8
# Time allowed for fresh worker processes to start and import the reward functions' modules.
WARMUP_TIMEOUT_S = 120.0
_MSG_LIMIT = 500

__all__ = [
    "RewardError",
    "RewardItem",
    "RewardOutput",
    "RewardRunner",
    "TRLReward",
    "VerlScore",
    "check_routes",
    "trl_reward",
    "verl_compute_score",
]


class _CompletionOnly:
    """Calls ``fn(completion, **context)`` for a reward that takes no ground truth (picklable)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn

    def __call__(self, completion: Any, ground_truth: Any, **context: Any) -> Any:
        return self.fn(completion, **context)

    def __repr__(self) -> str:
        return repr(self.fn)


class RewardError(RuntimeError):
    """Rewards are misconfigured (no route, bad options, unpicklable function); the message says how to fix it."""


@dataclass(frozen=True)
class RewardItem:
    """One rollout to score: its :class:`plugrl.data.Sample`, the rendered prompt and the completion text."""

    sample: Any
    prompt_text: str
    completion: str


@dataclass
class RewardOutput:
    """``scores[i]``: the weighted sum for item i. ``details[i]``: ``{name: score or None (skipped),
    "name/field": extra field of a dict result, "name/error": message, "error": bool, "timeout": bool}``."""

    scores: list[float]
    details: list[dict[str, Any]]
    metrics: dict[str, float]


# --------------------------------------------------------------------------- adapters


def _params(fn: Callable[..., Any]) -> tuple[list[inspect.Parameter], bool]:
    """(parameters, takes **kwargs) of ``fn``."""
    ps = list(inspect.signature(fn).parameters.values())
    return ps, any(p.kind is p.VAR_KEYWORD for p in ps)


def _keyword_names(ps: Iterable[inspect.Parameter]) -> frozenset[str]:
    return frozenset(p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def _is_async(fn: Any) -> bool:
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
    """

    plugrl_batch = True

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        ps, var_kw = _params(fn)
        self.accepts: frozenset[str] | None = None if var_kw else _keyword_names(ps)
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
    fn: Callable[..., Any], *, name: str | None = None, data_sources: Sequence[str] = ("*",), weight: float = 1.0
) -> RewardSpec:
    """A :class:`RewardSpec` for TRL's ``fn(prompts, completions, **columns) -> list[float | None]``."""
    if not data_sources:
        raise TypeError("trl_reward needs at least one data_source name or glob")
    wrapper = TRLReward(fn)
    return RewardSpec(name=name or wrapper.__name__, fn=wrapper, data_sources=tuple(data_sources), weight=weight)


_VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


class VerlScore:
    """verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None, **reward_kwargs)``
    as a plugrl reward ``fn(completion, ground_truth, data_source=, extra_info=, **options)``.

    Called with keywords, as verl's reward manager does; the reward's options
    play the part of verl's ``reward_kwargs``. Picklable when ``fn`` is a
    module-level function, so it runs in the worker pool.
    """

    plugrl_context = ("data_source", "extra_info")  # the context keywords it needs; options are always passed

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        ps, var_kw = _params(fn)
        self.accepts: frozenset[str] | None = None if var_kw else _keyword_names(ps)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def _kwargs(self, completion: str, ground_truth: Any, data_source: Any, extra_info: Any, options: dict) -> dict:
        kwargs = {
            "data_source": data_source,
            "solution_str": completion,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
            **options,
        }
        if self.accepts is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in self.accepts}
        return kwargs

    def accepts_option(self, key: str) -> bool:
        return key not in _VERL_ARGS and (self.accepts is None or key in self.accepts)

    def __call__(
        self, completion: str, ground_truth: Any, data_source: Any = None, extra_info: Any = None, **options: Any
    ) -> Any:
        return self.fn(**self._kwargs(completion, ground_truth, data_source, extra_info, options))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.fn!r})"


class AsyncVerlScore(VerlScore):
    """:class:`VerlScore` for an ``async def compute_score``."""

    async def __call__(  # type: ignore[override]
        self, completion: str, ground_truth: Any, data_source: Any = None, extra_info: Any = None, **options: Any
    ) -> Any:
        return await self.fn(**self._kwargs(completion, ground_truth, data_source, extra_info, options))


def verl_compute_score(fn: Callable[..., Any], *, data_sources: Sequence[str], name: str | None = None) -> RewardSpec:
    """A :class:`RewardSpec` for verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``."""
    if isinstance(data_sources, str) or not data_sources:
        raise TypeError("verl_compute_score needs data_sources, a non-empty sequence of names or globs")
    wrapper = (AsyncVerlScore if _is_async(fn) else VerlScore)(fn)
    return RewardSpec(name=name or wrapper.__name__, fn=wrapper, data_sources=tuple(data_sources))


# --------------------------------------------------------------------------- routing


def check_routes(registry: Registry, data_sources: Iterable[str]) -> dict[str, list[RewardSpec]]:
    """The reward functions for each data source; raises :class:`RewardError` listing every one without any.

    The kernel calls it before any generation, with every data source of the
    training and validation data.
    """
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
            "Add the plugin that scores these data sources to `plugins:` in the run config, "
            "or register a function for them with @plugrl.reward('<data_source>')."
        )
        raise RewardError("\n".join(lines))
    return routes


# --------------------------------------------------------------------------- worker side

# Outcomes: ("ok", score, extras) | ("skip",) | ("error", message, traceback) | ("timeout", message)
Outcome = tuple

_FN_CACHE: dict[bytes, Any] = {}


def _short(text: str) -> str:
    return text if len(text) <= _MSG_LIMIT else text[: _MSG_LIMIT - 3] + "..."


def _error(e: BaseException) -> Outcome:
    return ("error", _short(f"{type(e).__name__}: {e}"), "".join(traceback.format_exception(e)))


def _normalize(result: Any) -> Outcome:
    """A function's return value -> outcome; non-numeric or non-finite scores are errors."""
    extras: dict[str, Any] = {}
    value = result
    if isinstance(result, dict):
        if "score" not in result:
            keys = ", ".join(sorted(map(str, result))[:10])
            return ("error", f"returned a dict without 'score' (keys: {keys})", "")
        value = result["score"]
        extras = {str(k): v for k, v in result.items() if k != "score"}
    if isinstance(value, (str, bytes)) or not (isinstance(value, numbers.Real) or hasattr(type(value), "__float__")):
        return ("error", _short(f"returned {type(value).__name__} {value!r}, expected a float"), "")
    try:
        score = float(value)
    except Exception as e:  # e.g. a tensor with several elements
        return ("error", _short(f"returned {type(value).__name__}, not convertible to float ({e})"), "")
    if not math.isfinite(score):
        return ("error", f"returned a non-finite score ({score})", "")
    return ("ok", score, extras)


def _load_fn(blob: bytes) -> Any:
    fn = _FN_CACHE.get(blob)
    if fn is None:
        fn = _FN_CACHE[blob] = pickle.loads(blob)
    return fn


def _init_worker(fn_blobs: list[bytes]) -> None:
    """Pool initializer: leave Ctrl-C to the trainer, import the reward functions once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for blob in fn_blobs:
        try:
            _load_fn(blob)
        except Exception:  # reported per sample when it is called
            pass


def _warmup(delay: float) -> int:
    time.sleep(delay)  # keeps each warm-up task busy so every worker process gets one
    return 0


def _pool_call(fn_blob: bytes, args_blob: bytes) -> Outcome:
    """Run one reward call in a worker; never raises (unpickling problems are the sample's error)."""
    try:
        fn = _load_fn(fn_blob)
        completion, ground_truth, kwargs = pickle.loads(args_blob)
        return _normalize(fn(completion, ground_truth, **kwargs))
    except BaseException as e:  # SystemExit too: a reward calling sys.exit() must not take the worker down
        return _error(e)


# --------------------------------------------------------------------------- runner


@dataclass
class _Plan:
    """How to call one reward spec, worked out once."""

    spec: RewardSpec
    index: int
    kind: str  # "pool" | "inline" | "async" | "batch"
    weight: float
    options: dict[str, Any]
    context: frozenset[str] | None  # context keywords it takes; None: all (**kwargs)
    blob: bytes = b""  # the pickled function, for the pool
    fn: Callable[..., Any] | None = None  # what to call: spec.fn, or an adapter around it

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class _Call:
    key: tuple[int, int]  # (item index, plan index)
    plan: _Plan
    completion: str
    ground_truth: Any
    kwargs: dict[str, Any]
    blob: bytes = b""  # (completion, ground_truth, kwargs) pickled, for the pool


@dataclass
class _Stats:
    timeouts: int = 0
    errors: int = 0
    pool_restarts: int = 0
    logged: set[str] = field(default_factory=set)


class RewardRunner:
    """Scores rollouts with the registry's reward functions; owns a process pool, so use it as a context manager.

    >>> with RewardRunner(registry, cfg.reward) as runner:      # doctest: +SKIP
    ...     out = runner.score([RewardItem(sample, prompt_text, completion), ...])

    ``score`` is not thread-safe: call it from one thread at a time.
    """

    def __init__(self, registry: Registry, cfg: RewardConfig, *, start_method: str | None = None):
        self.registry = registry
        self.cfg = cfg
        methods = multiprocessing.get_all_start_methods()
        self.start_method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if self.start_method not in ("forkserver", "spawn"):
            raise ValueError("reward workers need start method 'forkserver' or 'spawn'; fork is unsafe with threads")
        self._plans: dict[int, _Plan] = {}  # id(spec) -> plan
        for j, spec in enumerate(registry.rewards):
            self._plans[id(spec)] = self._plan(spec, j)
        known = {s.name for s in registry.rewards}
        for section, table in (("options", cfg.options), ("weights", cfg.weights)):
            unknown = sorted(set(table) - known)
            if unknown:
                log.warning(
                    "reward.%s names %s, which no loaded plugin registers (known: %s)",
                    section,
                    ", ".join(unknown),
                    ", ".join(sorted(known)) or "none",
                )
        self._routes: dict[str, list[_Plan]] = {}
        self._pool: cf.ProcessPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._sem: asyncio.Semaphore | None = None
        self.pool_restarts = 0  # over the runner's lifetime

    # ------------------------------------------------------------------ setup

    def _plan(self, spec: RewardSpec, index: int) -> _Plan:
        fn = spec.fn
        options = dict(self.cfg.options.get(spec.name, {}))
        weight = float(self.cfg.weights.get(spec.name, spec.weight))
        where = f"reward {spec.name!r}" + (f" of plugin {spec.plugin!r}" if spec.plugin else "")
        bad = sorted(set(options) & RESERVED)
        if bad:
            raise RewardError(f"reward.options.{spec.name} sets {', '.join(bad)}, which the kernel passes itself")
        if getattr(fn, "plugrl_batch", False):
            return _Plan(spec, index, "batch", weight, options, None)
        try:
            ps, var_kw = _params(fn)
        except (TypeError, ValueError) as e:
            raise RewardError(f"{where}: cannot read the signature of {fn!r} ({e})") from None
        positional = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) == 1 and not any(p.kind is p.VAR_POSITIONAL for p in ps):
            fn = _CompletionOnly(fn)  # a reward that needs no ground truth, e.g. a format check
            positional.append(None)
        elif len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in ps):
            raise RewardError(f"{where}: {fn!r} must take (completion, ground_truth, **context) positionally")
        named = _keyword_names(ps) - {p.name for p in positional[:2] if p is not None}
        wanted = getattr(fn, "plugrl_context", None)
        context = frozenset(wanted) if wanted is not None else (None if var_kw else named)
        accepts_option = getattr(fn, "accepts_option", None) or (lambda k: var_kw or k in named)
        rejected = sorted(k for k in options if not accepts_option(k))
        if rejected:
            inner = getattr(fn, "accepts", None)  # an adapter: list what the wrapped function takes
            takes = sorted(set(inner) - set(_VERL_ARGS)) if isinstance(inner, frozenset) else sorted(named)
            raise RewardError(
                f"reward.options.{spec.name} sets {', '.join(rejected)}, which {where} does not take; "
                f"it takes: {', '.join(takes) or 'no keywords'}"
            )
        if _is_async(fn):
            return _Plan(spec, index, "async", weight, options, context, fn=fn)
        if self.cfg.num_workers == 0:
            return _Plan(spec, index, "inline", weight, options, context, fn=fn)
        try:
            blob = pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(blob)
        except Exception as e:
            raise RewardError(
                f"{where}: {fn!r} cannot be sent to a worker process ({type(e).__name__}: {e}); make it a "
                "module-level function of an importable module, or set reward.num_workers=0 to run it inline"
            ) from None
        return _Plan(spec, index, "pool", weight, options, context, blob, fn=fn)

    def _route(self, data_source: str) -> list[_Plan]:
        plans = self._routes.get(data_source)
        if plans is None:
            specs = check_routes(self.registry, {data_source})[data_source]
            plans = self._routes[data_source] = [self._plans[id(s)] for s in specs]
        return plans

    def __enter__(self) -> RewardRunner:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> None:
        """Start the worker processes (and the event loop for async rewards) if any reward needs them."""
        kinds = {p.kind for p in self._plans.values()}
        if "pool" in kinds and self._pool is None:
            self._pool = self._new_pool(strict=True)
        if "async" in kinds:
            self._ensure_loop()

    def close(self) -> None:
        """Kill the worker processes and stop the event loop. Safe to call twice."""
        if self._pool is not None:
            _kill_pool(self._pool)
            self._pool = None
        if self._loop is not None:
            loop, thread = self._loop, self._loop_thread
            self._loop = self._loop_thread = self._sem = None

            async def _cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await asyncio.get_running_loop().shutdown_asyncgens()

            try:
                asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(timeout=5)
            except Exception:
                pass
            loop.call_soon_threadsafe(loop.stop)
            if thread is not None:
                thread.join(timeout=5)
            if not loop.is_running():
                loop.close()

    def _new_pool(self, strict: bool = False) -> cf.ProcessPoolExecutor:
        blobs = sorted({p.blob for p in self._plans.values() if p.kind == "pool"})
        pool = cf.ProcessPoolExecutor(
            max_workers=self.cfg.num_workers,
            mp_context=multiprocessing.get_context(self.start_method),
            initializer=_init_worker,
            initargs=(blobs,),
        )
        # Start every worker and import the reward modules now, so neither counts against a sample's time limit.
        futures = [pool.submit(_warmup, 0.05) for _ in range(self.cfg.num_workers)]
        done, not_done = cf.wait(futures, timeout=WARMUP_TIMEOUT_S)
        failed = [f for f in done if f.exception() is not None]
        if not_done or failed:
            _kill_pool(pool)
            why = f"{failed[0].exception()!r}" if failed else f"not ready after {WARMUP_TIMEOUT_S:.0f}s"
            msg = (
                f"reward worker processes did not start ({why}). Does importing a reward plugin hang or crash? "
                "A script that starts training must guard its entry point with `if __name__ == '__main__':` "
                f"(workers use the {self.start_method} start method)"
            )
            if strict:
                raise RewardError(msg)
            log.error("%s", msg)  # the samples will time out or error; training goes on
            pool = cf.ProcessPoolExecutor(
                max_workers=self.cfg.num_workers,
                mp_context=multiprocessing.get_context(self.start_method),
                initializer=_init_worker,
                initargs=(blobs,),
            )
        return pool

    def _restart_pool(self, stats: _Stats, reason: str) -> None:
        log.warning("restarting the reward worker pool: %s", reason)
        if self._pool is not None:
            _kill_pool(self._pool)
        self._pool = self._new_pool()
        stats.pool_restarts += 1
        self.pool_restarts += 1

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="plugrl-rewards-loop", daemon=True)
            thread.start()
            self._loop, self._loop_thread = loop, thread
        return self._loop

    # ------------------------------------------------------------------ scoring

    def score(self, items: Sequence[RewardItem]) -> RewardOutput:
        """Score ``items``; never raises because of what a reward function does.

        Raises :class:`RewardError` for an item whose ``data_source`` no reward
        serves. Metrics: ``reward/<name>/mean`` over the items the function scored
        (``error_score`` included, skipped items not), ``reward/mean`` and
        ``reward/std`` of the weighted sums, ``reward/timeouts``, ``reward/errors``
        (raised, crashed or returned a non-finite or non-numeric score; timeouts
        not included), ``reward/pool_restarts`` and ``reward/time_s``.
        """
        t0 = time.perf_counter()
        stats = _Stats()
        routes = [self._route(item.sample.data_source) for item in items]

        lanes: dict[str, list[_Call]] = {"pool": [], "inline": [], "async": []}
        batches: dict[int, tuple[_Plan, list[int]]] = {}
        for i, (item, plans) in enumerate(zip(items, routes, strict=True)):
            ctx: dict[str, Any] | None = None
            for plan in plans:
                key = (i, plan.index)
                if plan.kind == "batch":
                    batches.setdefault(key[1], (plan, []))[1].append(i)
                    continue
                if ctx is None:
                    ctx = _context(item)
                if plan.context is None:
                    kwargs = dict(ctx)
                else:
                    kwargs = {k: ctx[k] for k in plan.context if k in ctx}
                kwargs.update(plan.options)
                lanes[plan.kind].append(_Call(key, plan, item.completion, item.sample.ground_truth, kwargs))

        results: dict[tuple[int, int], Outcome] = {}
        pending_async = None
        if lanes["async"]:
            loop = self._ensure_loop()
            pending_async = asyncio.run_coroutine_threadsafe(self._run_async(lanes["async"]), loop)
        try:
            if lanes["pool"]:
                results.update(self._run_pool(lanes["pool"], stats))
            for call in lanes["inline"]:  # num_workers == 0: no time limit
                try:
                    results[call.key] = _normalize(call.plan.fn(call.completion, call.ground_truth, **call.kwargs))
                except (Exception, SystemExit) as e:
                    results[call.key] = _error(e)
            for j, (plan, idxs) in batches.items():
                results.update(self._run_batch(plan, j, [items[i] for i in idxs], idxs))
        except BaseException:
            if pending_async is not None:
                pending_async.cancel()
            raise
        if pending_async is not None:
            results.update(pending_async.result())
        return self._combine(items, routes, results, stats, time.perf_counter() - t0)

    async def _run_async(self, calls: list[_Call]) -> dict[tuple[int, int], Outcome]:
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.cfg.max_concurrency)
        sem, timeout = self._sem, self.cfg.timeout_s

        async def one(call: _Call) -> tuple[tuple[int, int], Outcome]:
            async with sem:
                try:
                    result = await asyncio.wait_for(
                        call.plan.fn(call.completion, call.ground_truth, **call.kwargs), timeout
                    )
                except asyncio.TimeoutError:
                    return call.key, ("timeout", f"timed out after {timeout:g}s")
                except (Exception, SystemExit, asyncio.CancelledError) as e:
                    return call.key, _error(e)
                return call.key, _normalize(result)

        return dict(await asyncio.gather(*(one(c) for c in calls)))

    def _run_batch(
        self, plan: _Plan, j: int, items: list[RewardItem], idxs: list[int]
    ) -> dict[tuple[int, int], Outcome]:
        prompts, completions, rows = [], [], []
        for item in items:
            s = item.sample
            raw = getattr(s, "prompt", None)
            prompt = item.prompt_text if raw is None else raw
            chat = isinstance(prompt, list)
            prompts.append(prompt)
            completions.append([{"role": "assistant", "content": item.completion}] if chat else item.completion)
            row = {k: v for k, v in (getattr(s, "row", None) or {}).items() if k not in ("prompt", "completion")}
            for k in ("data_source", "ground_truth", "extra_info"):
                row.setdefault(k, getattr(s, k, None))
            rows.append(row)
        names = list(dict.fromkeys(k for row in rows for k in row))
        columns = {k: [row.get(k) for row in rows] for k in names if isinstance(k, str)}
        columns.update(plan.options)
        n = len(items)
        try:
            out = plan.spec.fn(prompts, completions, **columns)
            if inspect.isawaitable(out):
                out = asyncio.run_coroutine_threadsafe(_await(out), self._ensure_loop()).result()
            out = list(out)
            if len(out) != n:
                raise ValueError(f"returned {len(out)} scores for {n} completions")
        except (Exception, SystemExit) as e:
            err = _error(e)
            return {(i, j): err for i in idxs}
        return {(i, j): ("skip",) if v is None else _normalize(v) for i, v in zip(idxs, out, strict=True)}

    def _run_pool(self, calls: list[_Call], stats: _Stats) -> dict[tuple[int, int], Outcome]:
        """One task per call, at most ``num_workers`` in flight; deadlines from when a task is sent."""
        results: dict[tuple[int, int], Outcome] = {}
        pending: deque[int] = deque()
        for n, call in enumerate(calls):
            try:
                call.blob = pickle.dumps((call.completion, call.ground_truth, call.kwargs), pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                results[call.key] = ("error", _short(f"arguments cannot be sent to a worker: {e!r}"), "")
                continue
            pending.append(n)
        suspects: deque[int] = deque()  # were running when a worker died: rerun one at a time
        crashes: dict[str, int] = {}
        inflight: dict[cf.Future, tuple[int, float]] = {}  # future -> (call number, deadline)
        timeout, window = self.cfg.timeout_s, self.cfg.num_workers

        def give_up(n: int, outcome: Outcome) -> None:
            results[calls[n].key] = outcome

        while pending or suspects or inflight:
            if self._pool is None:
                self._pool = self._new_pool()
            broken = False
            # dispatch
            while not broken:
                if suspects:
                    if inflight:
                        break
                    n = suspects.popleft()
                elif pending and len(inflight) < window:
                    n = pending.popleft()
                else:
                    break
                name = calls[n].plan.name
                if crashes.get(name, 0) >= CRASH_LIMIT:
                    give_up(n, ("error", f"not run: {name} killed its worker {CRASH_LIMIT} times in this batch", ""))
                    continue
                try:
                    fut = self._pool.submit(_pool_call, calls[n].plan.blob, calls[n].blob)
                except BrokenProcessPool:
                    pending.appendleft(n)
                    broken = True
                    break
                inflight[fut] = (n, time.monotonic() + timeout)
            if not broken and inflight:
                wait_s = max(0.0, min(d for _, d in inflight.values()) - time.monotonic())
                done, _ = cf.wait(list(inflight), timeout=wait_s, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    exc = fut.exception()
                    if isinstance(exc, BrokenProcessPool):
                        broken = True
                        continue
                    n, _ = inflight.pop(fut)
                    results[calls[n].key] = _error(exc) if exc is not None else fut.result()
            if broken:
                # The pool is dead: keep what finished, find out who killed it.
                lost = []
                for fut, (n, _) in inflight.items():
                    if fut.done() and fut.exception() is None:
                        results[calls[n].key] = fut.result()
                    else:
                        lost.append(n)
                inflight.clear()
                if len(lost) == 1:
                    n = lost[0]
                    name = calls[n].plan.name
                    crashes[name] = crashes.get(name, 0) + 1
                    give_up(n, ("error", "the worker process died while running it (crash, os._exit or killed)", ""))
                else:
                    suspects.extend(lost)
                self._restart_pool(stats, f"a worker process died ({len(lost)} samples were running)")
                continue
            now = time.monotonic()
            expired = [fut for fut, (_, d) in inflight.items() if d <= now and not fut.done()]
            if expired:
                names = set()
                for fut in expired:
                    n, _ = inflight.pop(fut)
                    names.add(calls[n].plan.name)
                    give_up(n, ("timeout", f"timed out after {timeout:g}s"))
                for fut, (n, _) in list(inflight.items()):
                    if fut.done() and fut.exception() is None:
                        results[calls[n].key] = fut.result()
                    else:
                        pending.appendleft(n)  # innocent: sent again to the fresh pool
                inflight.clear()
                self._restart_pool(stats, f"{', '.join(sorted(names))} exceeded reward.timeout_s={timeout:g}")
        return results

    def _combine(
        self,
        items: Sequence[RewardItem],
        routes: list[list[_Plan]],
        results: dict[tuple[int, int], Outcome],
        stats: _Stats,
        elapsed: float,
    ) -> RewardOutput:
        scores: list[float] = []
        details: list[dict[str, Any]] = []
        per_fn: dict[str, list[float]] = {}
        fields: dict[str, list[float]] = {}  # numeric extra fields of dict results, averaged into metrics
        error_score = float(self.cfg.error_score)
        for i, plans in enumerate(routes):
            total = 0.0
            d: dict[str, Any] = {"error": False, "timeout": False}
            for plan in plans:
                out = results.get((i, plan.index), ("error", "no result (internal error)", ""))
                name = plan.name
                kind = out[0]
                if kind == "skip":
                    d[name] = None
                    continue
                if kind == "ok":
                    value = out[1]
                    for k, v in out[2].items():
                        d[f"{name}/{k}"] = v
                        if isinstance(v, (bool, int, float)) and math.isfinite(v):  # e.g. correct, verifier_failed
                            fields.setdefault(f"reward/{name}/{k}", []).append(float(v))
                else:
                    value = error_score
                    d[f"{name}/error"] = out[1]
                    if kind == "timeout":
                        d["timeout"] = True
                        stats.timeouts += 1
                    else:
                        d["error"] = True
                        stats.errors += 1
                        if name not in stats.logged:
                            stats.logged.add(name)
                            log.warning(
                                "reward %r failed on a sample of %r (scored %g): %s\n%s",
                                name,
                                items[i].sample.data_source,
                                error_score,
                                out[1],
                                out[2] if len(out) > 2 else "",
                            )
                d[name] = value
                per_fn.setdefault(name, []).append(value)
                total += plan.weight * value
            scores.append(total)
            details.append(d)
        metrics: dict[str, float] = {f"reward/{name}/mean": sum(v) / len(v) for name, v in per_fn.items()}
        metrics.update({key: sum(v) / len(v) for key, v in fields.items()})
        n = len(scores)
        mean = sum(scores) / n if n else 0.0
        metrics["reward/mean"] = mean
        metrics["reward/std"] = math.sqrt(sum((s - mean) ** 2 for s in scores) / n) if n else 0.0
        metrics["reward/timeouts"] = float(stats.timeouts)
        metrics["reward/errors"] = float(stats.errors)
        metrics["reward/pool_restarts"] = float(stats.pool_restarts)
        metrics["reward/time_s"] = elapsed
        return RewardOutput(scores, details, metrics)


def _context(item: RewardItem) -> dict[str, Any]:
    s = item.sample
    ctx = {k: v for k, v in (getattr(s, "row", None) or {}).items() if isinstance(k, str) and k not in RESERVED}
    ctx.update(data_source=s.data_source, extra_info=getattr(s, "extra_info", None), prompt=item.prompt_text, sample=s)
    return ctx


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _kill_pool(pool: cf.ProcessPoolExecutor) -> None:
    """Kill a pool's processes (a hung worker never returns) and release it without waiting on its tasks."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    thread = getattr(pool, "_executor_manager_thread", None)  # shutdown() forgets it
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 1.0
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():  # ignores SIGTERM
            p.kill()
            p.join(timeout=1.0)
    pool.shutdown(wait=False, cancel_futures=True)
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=2.0)
