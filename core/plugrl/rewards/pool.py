"""The process pool that runs plain reward functions, one task per sample and function.

:class:`RewardPool` owns the worker processes for the lifetime of a :class:`plugrl.rewards.RewardRunner`:
started once (at ``start()``, or on first use), replaced only when a worker dies or a call runs past
``reward.timeout_s``. :class:`_PoolRun` schedules one batch of calls on it. The worker side is here too; workers
import this module by reference, so it stays cheap to import.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import pickle
import signal
import threading
import time
from collections import deque
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any

from plugrl.rewards.outcomes import Outcome, RewardError, _error, _normalize, _short

if TYPE_CHECKING:  # not imported at run time: worker processes import this module, keep their start cheap
    from plugrl.config import RewardConfig
    from plugrl.rewards.runner import _Call

# One logger for the whole package, so records keep the name they had when it was one module.
log = logging.getLogger("plugrl.rewards")

CRASH_LIMIT = 8  # a function that kills its worker this often in one batch is not run on the rest of it
WARMUP_TIMEOUT_S = 120.0  # for fresh workers to start and import the reward functions' modules

# --------------------------------------------------------------------------- worker side

_FN_CACHE: dict[bytes, Any] = {}


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


# --------------------------------------------------------------------------- parent side


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


class RewardPool:
    """``reward.num_workers`` worker processes that import the reward functions ``fn_blobs`` once, kept across
    batches; :meth:`restart` replaces them when a worker dies or a call times out (counted in ``restarts``)."""

    def __init__(self, cfg: RewardConfig, fn_blobs: list[bytes], start_method: str):
        self.cfg = cfg
        self.fn_blobs = fn_blobs
        self.start_method = start_method
        self.restarts = 0
        self._executor: cf.ProcessPoolExecutor | None = None

    def start(self, strict: bool = False) -> None:
        """Start the worker processes unless they run; ``strict``: raise if they do not start."""
        if self._executor is None:
            self._executor = self._new(strict)

    def close(self) -> None:
        """Kill the worker processes; a later :meth:`start` or :meth:`run` starts fresh ones."""
        if self._executor is not None:
            _kill_pool(self._executor)
            self._executor = None

    def restart(self, reason: str) -> None:
        log.warning("restarting the reward worker pool: %s", reason)
        if self._executor is not None:
            _kill_pool(self._executor)
        self._executor = self._new()
        self.restarts += 1

    def submit(self, fn_blob: bytes, args_blob: bytes) -> cf.Future:
        """Send one call; raises :class:`BrokenProcessPool` if a worker has died."""
        assert self._executor is not None, "RewardPool.submit before start"
        return self._executor.submit(_pool_call, fn_blob, args_blob)

    def run(self, calls: list[_Call]) -> dict[tuple[int, int], Outcome]:
        """Each call's outcome; see :class:`_PoolRun`."""
        return _PoolRun(self, calls).run()

    def _make_executor(self) -> cf.ProcessPoolExecutor:
        return cf.ProcessPoolExecutor(
            max_workers=self.cfg.num_workers,
            mp_context=multiprocessing.get_context(self.start_method),
            initializer=_init_worker,
            initargs=(self.fn_blobs,),
        )

    def _new(self, strict: bool = False) -> cf.ProcessPoolExecutor:
        pool = self._make_executor()
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
            pool = self._make_executor()
        return pool


class _PoolRun:
    """One batch on a :class:`RewardPool`: one task per call, at most ``num_workers`` in flight, deadlines
    from when a task is sent (a task starts when it is sent, since no worker holds more than one).

    A call past its deadline scores a timeout; its worker never comes back, so the pool is replaced and the
    other calls that were running are sent again. A worker that dies breaks the pool: it is replaced, and
    the calls that were running are run again one at a time, so only the one that kills its worker scores
    an error (after ``CRASH_LIMIT`` such deaths in the batch, that function is not run on the rest).
    """

    def __init__(self, pool: RewardPool, calls: list[_Call]):
        self.pool = pool
        self.calls = calls
        self.timeout, self.window = pool.cfg.timeout_s, pool.cfg.num_workers
        self.results: dict[tuple[int, int], Outcome] = {}
        self.pending: deque[int] = deque()  # call numbers not sent yet
        self.suspects: deque[int] = deque()  # were running when a worker died: rerun one at a time
        self.crashes: dict[str, int] = {}  # reward name -> workers it killed in this batch
        self.inflight: dict[cf.Future, tuple[int, float]] = {}  # future -> (call number, deadline)

    def run(self) -> dict[tuple[int, int], Outcome]:
        self._pickle_args()
        while self.pending or self.suspects or self.inflight:
            self.pool.start()  # when the runner was not started, or its start failed
            broken = not self._dispatch()
            if not broken and self.inflight:
                broken = self._collect()
            if broken:
                self._on_broken_pool()
                continue
            self._on_timeouts()
        return self.results

    def _give_up(self, n: int, outcome: Outcome) -> None:
        self.results[self.calls[n].key] = outcome

    def _pickle_args(self) -> None:
        """Pickle each call's arguments once; a call whose arguments cannot be pickled is an error."""
        for n, call in enumerate(self.calls):
            try:
                call.blob = pickle.dumps((call.completion, call.ground_truth, call.kwargs), pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                self.results[call.key] = ("error", _short(f"arguments cannot be sent to a worker: {e!r}"), "")
                continue
            self.pending.append(n)

    def _next(self) -> int | None:
        """The next call to send: a suspect, alone in the pool; else a pending call while a worker is free."""
        if self.suspects:
            return None if self.inflight else self.suspects.popleft()
        if self.pending and len(self.inflight) < self.window:
            return self.pending.popleft()
        return None

    def _dispatch(self) -> bool:
        """Send calls while there is room; False if the pool turned out to be broken."""
        while (n := self._next()) is not None:
            name = self.calls[n].plan.name
            if self.crashes.get(name, 0) >= CRASH_LIMIT:
                self._give_up(n, ("error", f"not run: {name} killed its worker {CRASH_LIMIT} times in this batch", ""))
                continue
            try:
                fut = self.pool.submit(self.calls[n].plan.blob, self.calls[n].blob)
            except BrokenProcessPool:
                self.pending.appendleft(n)
                return False
            self.inflight[fut] = (n, time.monotonic() + self.timeout)
        return True

    def _collect(self) -> bool:
        """Wait for a call to finish or the nearest deadline and keep what finished; True if the pool broke."""
        wait_s = max(0.0, min(d for _, d in self.inflight.values()) - time.monotonic())
        done, _ = cf.wait(list(self.inflight), timeout=wait_s, return_when=cf.FIRST_COMPLETED)
        broken = False
        for fut in done:
            exc = fut.exception()
            if isinstance(exc, BrokenProcessPool):
                broken = True
                continue
            n, _ = self.inflight.pop(fut)
            self.results[self.calls[n].key] = _error(exc) if exc is not None else fut.result()
        return broken

    def _drain_inflight(self) -> list[int]:
        """Keep the results of the calls in flight that finished; empty the in-flight set; the others' numbers."""
        lost = []
        for fut, (n, _) in self.inflight.items():
            if fut.done() and fut.exception() is None:
                self.results[self.calls[n].key] = fut.result()
            else:
                lost.append(n)
        self.inflight.clear()
        return lost

    def _on_broken_pool(self) -> None:
        """The pool is dead: keep what finished, find out who killed it, start a fresh pool."""
        lost = self._drain_inflight()
        if len(lost) == 1:  # it was alone, so it killed the worker
            n = lost[0]
            name = self.calls[n].plan.name
            self.crashes[name] = self.crashes.get(name, 0) + 1
            self._give_up(n, ("error", "the worker process died while running it (crash, os._exit or killed)", ""))
        else:
            self.suspects.extend(lost)
        self.pool.restart(f"a worker process died ({len(lost)} samples were running)")

    def _on_timeouts(self) -> None:
        """Calls past their deadline time out; their workers stay busy forever, so the pool is replaced."""
        now = time.monotonic()
        expired = [fut for fut, (_, d) in self.inflight.items() if d <= now and not fut.done()]
        if not expired:
            return
        names = set()
        for fut in expired:
            n, _ = self.inflight.pop(fut)
            names.add(self.calls[n].plan.name)
            self._give_up(n, ("timeout", f"timed out after {self.timeout:g}s"))
        for n in self._drain_inflight():
            self.pending.appendleft(n)  # innocent: sent again to the fresh pool
        self.pool.restart(f"{', '.join(sorted(names))} exceeded reward.timeout_s={self.timeout:g}")
