"""Rollouts generated ahead of training (plugrl-off-policy's kit: :mod:`plugrl_off_policy` says who calls what)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from plugrl.config import ConfigError
from plugrl.dist import collectives_on
from plugrl.rollouts_ahead import Generated

if TYPE_CHECKING:
    from plugrl.config import Config
    from plugrl.specs import EstimatorSpec

__all__ = ["Generated", "RolloutsAhead", "check"]


def check(cfg: Config, estimator: EstimatorSpec) -> None:
    """trainer.off_policy_steps > 0: what cannot run beside a generation in flight is refused, naming the key (the
    kernel's call at start, :func:`plugrl.startup.check_run`, with the run's estimator). Raises
    :class:`ConfigError`."""
    k = cfg.trainer.off_policy_steps
    if estimator.needs_greedy_baseline:
        raise ConfigError(
            f"trainer.off_policy_steps={k} generates the next steps' rollouts while a step trains, but "
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} generates its greedy baseline during the step, "
            "on the same engine; use another estimator or trainer.off_policy_steps=0"
        )
    if cfg.actor.tp_size > 1:
        raise ConfigError(
            f"trainer.off_policy_steps={k} with actor.tp_size={cfg.actor.tp_size}: a tensor-parallel group shares "
            "its first rank's rollouts over the group the training uses, which the rollout thread cannot share; "
            "use actor.tp_size=1 (FSDP2 shards the model over every rank) or trainer.off_policy_steps=0"
        )


class _Job:
    def __init__(self, step: int, version: int):
        self.step, self.version = step, version
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class RolloutsAhead:
    """Generation for the steps ahead (module docstring; k = 0 generates each step in :meth:`take`, as the
    kernel's :class:`plugrl.rollouts_ahead.OnPolicy` does). ``generate(step)`` makes one step's rollouts (and is
    what runs on the rollout thread); ``steps_ahead`` is k; ``group``: the gloo group of the rollout thread's
    collectives (None when alone); ``device``: the CUDA device the rollout thread works on (default: the one current
    in the thread that builds this, which :func:`plugrl.dist.init_distributed` set to the rank's; None on a CPU)."""

    def __init__(
        self, generate: Callable[[int], Any], steps_ahead: int, group=None, device: torch.device | None = None
    ):
        self.generate = generate
        self.steps_ahead = steps_ahead
        self.group = group
        if device is None and torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.version = 0  # the step whose weights the engine holds: see weights_changed
        self._jobs: dict[int, _Job] = {}
        self._ready: dict[int, Generated] = {}  # restored from a checkpoint
        self._last_started = -1
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def weights_changed(self, version: int) -> None:
        """The engine now holds the weights of ``version`` (steps trained): called after each sync, settled."""
        self.version = version

    def take(self, step: int) -> Generated:
        """Step ``step``'s rollouts (module docstring); raises what their generation raised."""
        if step in self._ready:
            return self._ready.pop(step)
        job = self._jobs.pop(step, None)
        if job is None:
            self._last_started = max(self._last_started, step)
            return Generated(step, self.generate(step), self.version)
        t0 = time.perf_counter()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return Generated(step, job.result, job.version, time.perf_counter() - t0)

    def schedule(self, last: int) -> None:
        """Start generating each step up to ``last`` that is not started yet (none when k = 0)."""
        if not self.steps_ahead:
            return
        for step in range(self._last_started + 1, last + 1):
            job = _Job(step, self.version)
            self._jobs[step] = job
            self._last_started = step
            self._start_thread()
            self._queue.put(job)

    def settle(self) -> float:
        """Wait until no generation runs (the ones started are done); returns the seconds waited. Raises what a
        generation raised."""
        t0 = time.perf_counter()
        for job in list(self._jobs.values()):
            job.done.wait()
            if job.error is not None:
                raise job.error
        return time.perf_counter() - t0

    def pending(self) -> list[Generated]:
        """The rollouts generated ahead and not taken yet, in step order (call :meth:`settle` first)."""
        done = [Generated(j.step, j.result, j.version) for j in self._jobs.values() if j.done.is_set()]
        if len(done) != len(self._jobs):
            raise RuntimeError("RolloutsAhead.pending() while a generation runs: settle() first")
        return sorted([*done, *self._ready.values()], key=lambda g: g.step)

    def restore(self, generated: list[Generated]) -> None:
        """Put back rollouts generated ahead by the run that wrote the checkpoint."""
        for g in generated:
            self._ready[g.step] = g
            self._last_started = max(self._last_started, g.step)

    def close(self) -> None:
        """Stop the rollout thread after the generation in flight (it is a daemon: nothing waits on it)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread = None

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="plugrl-rollouts-ahead", daemon=True)
            self._thread.start()

    def _work(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # this thread's current device: a new thread starts on device 0
        with collectives_on(self.group):
            while (job := self._queue.get()) is not None:
                try:
                    job.result = self.generate(job.step)
                except BaseException as e:  # handed to the main thread, which raises it in take() or settle()
                    job.error = e
                finally:
                    job.done.set()
