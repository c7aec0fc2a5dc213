"""Rollouts generated ahead of training (``trainer.off_policy_steps``, k): what the trainer calls for a step's
rollouts, and the seam to the package that generates them on a thread.

k = 0 (the default): each step generates its rollouts with the weights it then trains, on-policy, on the calling
thread (:class:`OnPolicy`). k >= 1: while step s trains, plugrl-off-policy generates the rollouts of step s + k on a
thread of their own, so step t trains on rollouts of the weights of step t - k (``rollout/policy_lag``). The kernel
finds it through the entry-point group ``plugrl.off_policy`` (:func:`kit`); its key ``trainer.off_policy_steps``
comes with it (group ``plugrl.config_fields``), so a config that sets the key without it is refused, naming the
package.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from plugrl.config import ConfigError
from plugrl.plugin_errors import implementation, package_hint

if TYPE_CHECKING:
    from plugrl.config import Config

GROUP = "plugrl.off_policy"
PACKAGE = "plugrl-off-policy"


class NoOffPolicy(ConfigError):
    """No installed package generates rollouts ahead; the message names the key and the package."""


@dataclass
class Generated:
    """One step's rollouts as ``take`` returns them (and a checkpoint keeps them). ``result``: what the trainer's
    ``generate(step)`` returned; ``version``: the number of the step whose weights the engine held when the
    generation started (steps trained before it); ``waited_s``: how long ``take`` waited for it."""

    step: int
    result: Any
    version: int
    waited_s: float = 0.0


class Rollouts(Protocol):
    """What the trainer calls, once a step, on its main thread (``steps_ahead``: k).

    - ``take(step)``: that step's rollouts, waited for, or generated now when none were started; raises what their
      generation raised. ``schedule(last)``: start generating each step up to ``last`` not started yet.
    - ``settle()``: wait until no generation runs (before a weight sync, validation or a checkpoint); the seconds.
    - ``weights_changed(version)``: the engine now holds the weights of ``version`` steps trained.
    - ``pending()`` / ``restore(generated)``: the rollouts generated ahead and not taken yet, for the checkpoint;
      put back on resume. ``close()``: nothing more is generated ahead.
    """

    steps_ahead: int

    def take(self, step: int) -> Generated: ...
    def schedule(self, last: int) -> None: ...
    def settle(self) -> float: ...
    def weights_changed(self, version: int) -> None: ...
    def pending(self) -> list[Generated]: ...
    def restore(self, generated: list[Generated]) -> None: ...
    def close(self) -> None: ...


class OffPolicyKit(Protocol):
    """The entry point of group ``plugrl.off_policy`` (plugrl-off-policy's module ``plugrl_off_policy``):
    ``RolloutsAhead(generate, steps_ahead, group)`` is the :class:`Rollouts` that runs ``generate(step)`` k steps
    ahead on a thread whose collectives go to ``group`` (a gloo group of its own; None when alone).
    ``check(cfg, estimator)``: at start, before any model loads (:func:`plugrl.startup.check_run`): a
    :class:`ConfigError` naming what cannot run beside a generation in flight (an estimator that generates a greedy
    baseline, ``actor.tp_size`` > 1)."""

    RolloutsAhead: Callable[..., Rollouts]

    def check(self, cfg: Config, estimator: Any) -> None: ...


class OnPolicy:
    """k = 0: ``take`` generates the step's rollouts now, on the calling thread; those restored from a checkpoint
    of an off-policy run are taken first (the data is past their batches)."""

    steps_ahead = 0

    def __init__(self, generate: Callable[[int], Any]):
        self.generate, self.version = generate, 0
        self._ready: dict[int, Generated] = {}

    def take(self, step: int) -> Generated:
        if step in self._ready:
            return self._ready.pop(step)
        return Generated(step, self.generate(step), self.version)

    def weights_changed(self, version: int) -> None:
        self.version = version

    def pending(self) -> list[Generated]:
        return sorted(self._ready.values(), key=lambda g: g.step)

    def restore(self, generated: list[Generated]) -> None:
        self._ready.update((g.step, g) for g in generated)

    def settle(self) -> float:
        return 0.0  # nothing runs beside the caller

    def schedule(self, last: int) -> None: ...  # nothing is generated ahead
    def close(self) -> None: ...


def kit(steps_ahead: int) -> OffPolicyKit:
    """The installed implementation; a :class:`NoOffPolicy` naming ``trainer.off_policy_steps`` and the package
    when there is none."""
    missing = (
        f"trainer.off_policy_steps={steps_ahead}: generating rollouts ahead of training is in the package {PACKAGE}, "
        f"which is not installed: {package_hint(PACKAGE)}; or set trainer.off_policy_steps=0"
    )
    return implementation(GROUP, NoOffPolicy(missing))
