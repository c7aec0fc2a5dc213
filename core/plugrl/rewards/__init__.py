"""Scoring rollouts with the plugins' reward functions.

:class:`RewardRunner` routes every rollout to the reward functions registered for
its ``data_source`` (exact names before globs, see :func:`plugrl.rewards.routing.rewards_for`)
and sums their scores, weighted by ``reward.weights.<name>`` or the spec's weight.
A function that raises, times out, crashes its worker or returns something that is
not a finite number scores ``reward.error_score`` on that sample and is counted in
the metrics; scoring never stops training, unless the function raises :class:`StopRun`
(scoring cannot go on: a verifier server that stopped answering), which stops the run with
its message after the batch.

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
* **batch functions** (TRL style, see ``trl_reward``) are called once per
  batch with every sample routed to them, inline in the calling process and
  without a time limit (they may be vectorized or call a model).

Arguments: ``completion`` and ``ground_truth`` positionally, then the context
keywords ``data_source``, ``extra_info``, ``prompt`` (the rendered prompt text),
``sample``, each column of ``sample.row`` not named like one of these (dataset
columns such as ``nums`` or ``target``), and the options ``reward.options.<name>``
(which win over columns of the same name). A function gets only the keywords its
signature declares, unless it takes ``**kwargs``.

Adapters let users bring functions unchanged: ``trl_reward`` for TRL's
``fn(prompts, completions, **columns) -> list[float | None]`` and
``verl_compute_score`` for verl's ``compute_score(data_source, solution_str,
ground_truth, extra_info=None)``; both are plugrl-compat's, read from it when first
asked for here (:mod:`~plugrl.rewards.adapters`, which names the package without it).

Modules: :mod:`~plugrl.rewards.routing` (which functions score a ``data_source``, the routes' checks),
:mod:`~plugrl.rewards.runner` (planning, :class:`RewardRunner`),
:mod:`~plugrl.rewards.pool` (the worker pool and its scheduling), :mod:`~plugrl.rewards.adapters`
(the seam to TRL's and verl's adapters, the signature helpers) and :mod:`~plugrl.rewards.outcomes`
(a call's result as a tuple, shared with the workers).
"""

from __future__ import annotations

from typing import Any

from plugrl.rewards.adapters import ADAPTED, adapted
from plugrl.rewards.outcomes import StopRun
from plugrl.rewards.routing import check_routes
from plugrl.rewards.runner import RewardError, RewardItem, RewardOutput, RewardRunner


def __getattr__(name: str) -> Any:
    if name in ADAPTED:  # trl_reward, verl_compute_score and their wrappers: plugrl-compat's
        return adapted(name, __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AsyncVerlScore",
    "RewardError",
    "RewardItem",
    "RewardOutput",
    "RewardRunner",
    "StopRun",
    "TRLReward",
    "VerlScore",
    "check_routes",
    "trl_reward",
    "verl_compute_score",
]
