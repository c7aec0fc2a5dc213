"""plugrl-off-policy: rollouts generated ahead of training (``trainer.off_policy_steps``, k >= 1).

While step s trains, the rollouts of step s + k are generated on a thread of their own with the weights the engine
holds when that generation starts; the engine takes new weights only between two generations, so step t trains on
rollouts of the weights of step t - k (the first k steps: the starting weights). k = 1 is verl's
one-step-off-policy trainer. The lag is logged as ``rollout/policy_lag``.

The kernel finds this module through the entry-point group ``plugrl.off_policy`` (:func:`plugrl.rollouts_ahead.kit`;
its names are :mod:`.ahead`'s, imported on first use: every run config imports :mod:`.fields`, the key
``trainer.off_policy_steps``) and, for a training run with k >= 1, calls :func:`check` at start, before any model
loads, then builds :class:`RolloutsAhead` (k = 0 is the kernel's :class:`plugrl.rollouts_ahead.OnPolicy`). Who
calls what (the trainer, once a step, on its main thread; the protocol is :class:`plugrl.rollouts_ahead.Rollouts`):

- :meth:`RolloutsAhead.take` ``(step)``: that step's rollouts; waited for, or generated now on the calling thread
  when none were started (the first step, DAPO's refills).
- :meth:`RolloutsAhead.schedule` ``(last)``: start generating every step up to ``last`` not started yet, one after
  another on the rollout thread, each with the engine's weights when it starts.
- :meth:`RolloutsAhead.settle`: wait until no generation runs: before a weight sync, validation or a checkpoint.
- :meth:`RolloutsAhead.pending` / :meth:`RolloutsAhead.restore`: the rollouts generated ahead, for the checkpoint;
  put back on resume, so the run continues as if never stopped.

The rollout thread's collectives (DAPO's refill vote) go to a gloo group of its own
(:func:`plugrl.dist.collectives_on`), never meeting the training's. On a GPU the thread makes the rank's CUDA
device its current one (CUDA's is per thread, and vLLM launches its kernels in the calling thread). A daemon
thread: a run that stops on an error or a second signal does not wait for a generation in flight.
"""

from __future__ import annotations

from plugrl.api import names_on_first_use

_HOME = {"Generated": "ahead", "RolloutsAhead": "ahead", "check": "ahead"}
__all__ = sorted(_HOME)
__getattr__, __dir__ = names_on_first_use(__name__, _HOME)
