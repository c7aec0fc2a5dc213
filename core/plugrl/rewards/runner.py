"""Planning how to call the reward functions routed to each rollout, and combining their scores.

:func:`plugrl.rewards.routing.check_routes` finds the functions for each ``data_source``; :class:`RewardRunner`
works out once per function how to call it (:class:`_Plan`: pool, inline, async or batch), sends each batch's
calls down those lanes (the pool: :mod:`plugrl.rewards.pool`), and sums the weighted outcomes into a
:class:`RewardOutput`.

A batch function that says it is collective (``plugrl_collective = True``, e.g. a reward model sharded over the
ranks with FSDP2) is called in every scoring round on every rank, with that rank's items for it or none, so its
collectives meet; the trainer brackets each round with :meth:`RewardRunner.scoring_round`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import multiprocessing
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugrl.rewards.adapters import _CompletionOnly, is_async_fn, keyword_names, parameters_of
from plugrl.rewards.outcomes import Outcome, RewardError, StopRun, _error, _normalize
from plugrl.rewards.pool import RewardPool
from plugrl.rewards.routing import check_routes, has_reward
from plugrl.specs import Registry, RewardSpec

if TYPE_CHECKING:  # not imported at run time: worker processes import this package, keep their start cheap
    from plugrl.config import RewardConfig

# One logger for the whole package, so records keep the name they had when it was one module.
log = logging.getLogger("plugrl.rewards")

CONTEXT_KEYS = ("data_source", "extra_info", "prompt", "sample")
RESERVED = frozenset({"completion", "ground_truth", *CONTEXT_KEYS})


@dataclass(frozen=True)
class RewardItem:
    """One rollout to score: its :class:`plugrl.data.Sample`, the rendered prompt and the completion text;
    ``messages``: a multi-turn episode's whole conversation (None for one response). For TRL-style batch rewards:
    ``completion_ids``, the response's token ids (TRL's ``completion_ids``); an episode's ``trl_prompt`` and
    ``trl_completion``, its prompt and its turns as TRL passes them (:meth:`Conversation.trl_completion
    <plugrl.rollout.multiturn.Conversation.trl_completion>`)."""

    sample: Any
    prompt_text: str
    completion: str
    messages: list[dict[str, Any]] | None = None
    completion_ids: list[int] | None = None
    trl_prompt: list[dict[str, Any]] | None = None
    trl_completion: list[dict[str, Any]] | None = None


@dataclass
class RewardOutput:
    """``scores[i]``: the weighted sum for item i. ``details[i]``: ``{name: score or None (skipped),
    "name/field": extra field of a dict result, "name/error": message, "error": bool, "timeout": bool}``."""

    scores: list[float]
    details: list[dict[str, Any]]
    metrics: dict[str, float]


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
    collective: bool = False  # a batch function called in every round, on every rank, with its items or none

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
        self._plans = {id(spec): self._plan(spec, j) for j, spec in enumerate(registry.rewards)}
        reweighed = [
            f"{p.name} ({p.spec.weight:g})"
            for p in self._plans.values()
            if p.name not in cfg.weights and p.weight != p.spec.weight
        ]
        if reweighed:  # said once: a run from a TRL config weighs every reward 1.0, as TRL does
            log.info(
                "reward.default_weight=%g weighs %s, not their plugins' weights in brackets (set reward.weights.<name> "
                "to choose)",
                cfg.default_weight,
                ", ".join(reweighed),
            )
        # in registry order, the same on every rank: the order their collectives run in
        self._collective = sorted((p for p in self._plans.values() if p.collective), key=lambda p: p.index)
        self._rounds = 0  # score() calls so far: scoring_round() tells whether its body scored
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
        # No processes yet: they start in start(), or on the first batch with a pool call.
        blobs = sorted({p.blob for p in self._plans.values() if p.kind == "pool"})
        self._pool = RewardPool(cfg, blobs, self.start_method)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._sem: asyncio.Semaphore | None = None

    @property
    def pool_restarts(self) -> int:
        """Worker pool restarts over the runner's lifetime."""
        return self._pool.restarts

    # ------------------------------------------------------------------ setup

    def _plan(self, spec: RewardSpec, index: int) -> _Plan:
        fn = spec.fn
        options = dict(self.cfg.options.get(spec.name, {}))
        # reward.default_weight (a TRL run: 1.0) for every reward weighed; one its plugin turns off (0) stays off
        default = spec.weight if self.cfg.default_weight is None or spec.weight == 0 else self.cfg.default_weight
        weight = float(self.cfg.weights.get(spec.name, default))
        where = f"reward {spec.name!r}" + (f" of plugin {spec.plugin!r}" if spec.plugin else "")
        bad = sorted(set(options) & RESERVED)
        if bad:
            raise RewardError(f"reward.options.{spec.name} sets {', '.join(bad)}, which the kernel passes itself")
        collective = bool(getattr(fn, "plugrl_collective", False))
        if getattr(fn, "plugrl_batch", False):
            return _Plan(spec, index, "batch", weight, options, None, collective=collective)
        if collective:
            raise RewardError(
                f"{where}: {fn!r} sets plugrl_collective but is not a batch reward; a collective reward is called "
                "once per round with a list of items (possibly none) on every rank: make it a batch reward "
                "(fn(prompts, completions, **columns) with plugrl_batch = True, or trl_reward(fn, collective=True)), "
                "or remove plugrl_collective"
            )
        try:
            ps, var_kw = parameters_of(fn)
        except (TypeError, ValueError) as e:
            raise RewardError(f"{where}: cannot read the signature of {fn!r} ({e})") from None
        positional = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) == 1 and not any(p.kind is p.VAR_POSITIONAL for p in ps):
            fn = _CompletionOnly(fn)  # a reward that needs no ground truth, e.g. a format check
            positional.append(None)
        elif len(positional) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in ps):
            raise RewardError(f"{where}: {fn!r} must take (completion, ground_truth, **context) positionally")
        named = keyword_names(ps) - {p.name for p in positional[:2] if p is not None}
        wanted = getattr(fn, "plugrl_context", None)
        context = frozenset(wanted) if wanted is not None else (None if var_kw else named)
        accepts_option = getattr(fn, "accepts_option", None) or (lambda k: var_kw or k in named)
        rejected = sorted(k for k in options if not accepts_option(k))
        if rejected:
            inner = getattr(fn, "accepts", None)  # an adapter: list the options the wrapped function takes
            takes = sorted(filter(accepts_option, inner)) if isinstance(inner, frozenset) else sorted(named)
            raise RewardError(
                f"reward.options.{spec.name} sets {', '.join(rejected)}, which {where} does not take; "
                f"it takes: {', '.join(takes) or 'no keywords'}"
            )
        if is_async_fn(fn):
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
        if "pool" in kinds:
            self._pool.start(strict=True)
        if "async" in kinds:
            self._ensure_loop()

    def close(self) -> None:
        """Kill the worker processes and stop the event loop. Safe to call twice."""
        self._pool.close()
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

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="plugrl-rewards-loop", daemon=True)
            thread.start()
            self._loop, self._loop_thread = loop, thread
        return self._loop

    # ------------------------------------------------------------------ scoring

    def can_score(self, data_source: str) -> bool:
        """Some reward function is registered for ``data_source`` (:func:`plugrl.rewards.routing.has_reward`)."""
        return has_reward(self.registry, data_source)

    @property
    def collective(self) -> bool:
        """Some loaded batch reward is collective: every rank must take part in every scoring round."""
        return bool(self._collective)

    @property
    def rounds(self) -> int:
        """How many times :meth:`score` has run."""
        return self._rounds

    @property
    def collective_rewards(self) -> list[str]:
        """The names of the collective batch rewards loaded (``plugrl_collective``), in the order they run."""
        return [p.name for p in self._collective]

    @contextmanager
    def scoring_round(self) -> Iterator[None]:
        """One scoring round: its body calls :meth:`score` at most once; when it did not (nothing to score here: a
        tensor-parallel group's later rank, an empty share, every episode scored by its environment) and a
        collective batch reward is loaded, ``score([])`` runs at its end, meeting the other ranks' calls. Every rank
        must run the same rounds in the same order (the trainer does: each generation, greedy baseline and
        validation is one round on every rank)."""
        before = self._rounds
        yield
        if self._collective and self._rounds == before:
            self.score([])

    def score(self, items: Sequence[RewardItem]) -> RewardOutput:
        """Score ``items``; never raises because of what a reward function does, but :class:`StopRun` when one
        raised it (the run stops), and :class:`RewardError` for an item whose ``data_source`` no reward serves.

        Metrics: ``reward/<name>/mean`` (and ``/std``) over the items the function scored (``error_score``
        included, skipped items not), ``reward/mean`` and ``reward/std`` of the weighted sums, ``reward/timeouts``,
        ``reward/errors`` (raised, crashed or returned a non-finite or non-numeric score; timeouts not included),
        ``reward/pool_restarts`` and ``reward/time_s``. Batch rewards run in registry order; a collective one in
        every call, with the items routed to it or none.
        """
        t0 = time.perf_counter()
        self._rounds += 1
        stats = _Stats()
        routes = [self._route(item.sample.data_source) for item in items]
        lanes, batches = self._calls(items, routes)
        for plan in self._collective:  # called in every round, with none when no item here is routed to it
            batches.setdefault(plan.index, (plan, []))

        results: dict[tuple[int, int], Outcome] = {}
        pending_async = None
        if lanes["async"]:
            loop = self._ensure_loop()
            pending_async = asyncio.run_coroutine_threadsafe(self._run_async(lanes["async"]), loop)
        try:
            if lanes["pool"]:
                before = self._pool.restarts
                results.update(self._pool.run(lanes["pool"]))
                stats.pool_restarts += self._pool.restarts - before
            results.update(self._run_inline(lanes["inline"]))
            for j, (plan, idxs) in sorted(batches.items()):  # registry order: collectives meet in the same order
                results.update(self._run_batch(plan, j, [items[i] for i in idxs], idxs))
        except BaseException:
            if pending_async is not None:
                pending_async.cancel()
            raise
        if pending_async is not None:
            results.update(pending_async.result())
        stop = next((out[1] for out in results.values() if out[0] == "stop"), None)
        if stop is not None:  # a reward said scoring cannot go on: the run stops here, before it trains on this
            raise StopRun(stop)
        return self._combine(items, routes, results, stats, time.perf_counter() - t0)

    def _calls(
        self, items: Sequence[RewardItem], routes: list[list[_Plan]]
    ) -> tuple[dict[str, list[_Call]], dict[int, tuple[_Plan, list[int]]]]:
        """The calls of each lane ("pool", "inline", "async"), and the items of each batch function by plan index."""
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
                kwargs = dict(ctx) if plan.context is None else {k: ctx[k] for k in plan.context if k in ctx}
                kwargs.update(plan.options)
                lanes[plan.kind].append(_Call(key, plan, item.completion, item.sample.ground_truth, kwargs))
        return lanes, batches

    @staticmethod
    def _run_inline(calls: list[_Call]) -> dict[tuple[int, int], Outcome]:
        """num_workers == 0: each call in this process, without a time limit."""
        results: dict[tuple[int, int], Outcome] = {}
        for call in calls:
            try:
                results[call.key] = _normalize(call.plan.fn(call.completion, call.ground_truth, **call.kwargs))
            except (Exception, SystemExit) as e:
                results[call.key] = _error(e)
        return results

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
        prompts, completions, rows = _trl_batch(items)
        names = list(dict.fromkeys(k for row in rows for k in row))
        columns = {k: [row.get(k) for row in rows] for k in names if isinstance(k, str)}
        columns["completion_ids"] = [item.completion_ids for item in items]  # TRL's; None where not known
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
            if not idxs:  # a collective reward called with none of this rank's items: no score to carry the error
                log.warning("reward %r failed on a round with no items for it on this rank: %s", plan.name, err[1])
            return {(i, j): err for i in idxs}
        return {(i, j): ("skip",) if v is None else _normalize(v) for i, v in zip(idxs, out, strict=True)}

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
        metrics.update({f"reward/{name}/std": _std(v) for name, v in per_fn.items()})
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


def _trl_batch(items: Sequence[RewardItem]) -> tuple[list[Any], list[Any], list[dict[str, Any]]]:
    """The prompts, completions and dataset rows of ``items`` as TRL's GRPOTrainer passes them to a reward function:
    the prompt as in the dataset (text or chat messages, an environment's first observation appended); the
    completion as text for a text prompt, else as messages: ``[{"role": "assistant", "content": text}]`` for one
    reply, and for a multi-turn episode its turns (assistant messages with their parsed ``tool_calls``, the tools'
    ``{"role": "tool", "name", "content"}`` answers, an environment's messages)."""
    prompts, completions, rows = [], [], []
    for item in items:
        s = item.sample
        raw = getattr(s, "prompt", None)
        prompt = item.trl_prompt if item.trl_prompt is not None else item.prompt_text if raw is None else raw
        chat = isinstance(prompt, list)
        prompts.append(prompt)
        if item.trl_completion is not None:
            completions.append(item.trl_completion)
        else:
            completions.append([{"role": "assistant", "content": item.completion}] if chat else item.completion)
        row = {k: v for k, v in (getattr(s, "row", None) or {}).items() if k not in ("prompt", "completion")}
        for k in ("data_source", "ground_truth", "extra_info"):
            row.setdefault(k, getattr(s, k, None))
        rows.append(row)
    return prompts, completions, rows


def _context(item: RewardItem) -> dict[str, Any]:
    s = item.sample
    ctx = {k: v for k, v in (getattr(s, "row", None) or {}).items() if isinstance(k, str) and k not in RESERVED}
    ctx.update(data_source=s.data_source, extra_info=getattr(s, "extra_info", None), prompt=item.prompt_text, sample=s)
    if item.messages is not None:  # a multi-turn episode: the whole conversation (over a row's own column)
        ctx["messages"] = item.messages
    return ctx


def _std(values: list[float]) -> float:
    """The sample standard deviation (TRL's ``rewards/<func>/std``, torch's nanstd); 0 for one value."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


async def _await(awaitable: Any) -> Any:
    return await awaitable
