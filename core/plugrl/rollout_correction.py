"""Rollout correction (``algorithm.rollout_correction``): what the actor and the start of a run call, and where the
kernel finds the package that computes it.

The kernel keeps the keyword a policy loss takes the weights by (:data:`WEIGHTS_KEYWORD`, part of the contract of
:class:`plugrl.specs.PolicyLossSpec`) and the calls. plugrl-advantages brings the settings (the section
``algorithm.rollout_correction``, through the group ``plugrl.config_fields``:
:mod:`plugrl_advantages.correction_fields`, whose check sets mode ``truncate`` in an off-policy run) and the
implementation: the importance weights, the rejection, the ``rollout_corr/...`` metrics and the check that a loss
takes the weights are the entry point of group ``plugrl.rollout_correction``, an object with :class:`CorrectionKit`'s
functions (its module ``plugrl_advantages.rollout_correction``). A run with the mode off never imports it; a config
that sets the section without the package is refused, naming the key and the package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from plugrl.config import ConfigError
from plugrl.plugin_errors import implementation, package_hint

if TYPE_CHECKING:
    import torch

    from plugrl.config import Config
    from plugrl.specs import PolicyLossSpec

GROUP = "plugrl.rollout_correction"
PACKAGE = "plugrl-advantages"
WEIGHTS_KEYWORD = "rollout_is_weights"  # the keyword a policy loss takes the weights by


class NoRolloutCorrection(ConfigError):
    """No installed package computes the rollout correction; the message names the key and the package."""


class Correction(Protocol):
    """One batch's correction: ``weights`` [B, T] (detached; each token's policy-gradient loss is multiplied by
    them), ``mask`` [B, T] (the loss mask after rejection, every aggregation normalises by it) and ``metrics``
    (``rollout_corr/...`` as floats)."""

    weights: torch.Tensor
    mask: torch.Tensor
    metrics: dict[str, float]


class CorrectionKit(Protocol):
    """The entry point of group ``plugrl.rollout_correction``.

    - ``rollout_correction(old_logprobs, rollout_logprobs, response_mask, mode=, level=, cap=, low=, high=)``: the
      :class:`Correction` of one whole batch ([B, T] inputs: the trainer's old log-probs, the engine's, the mask) as
      ``algorithm.rollout_correction`` says (mode monitor, truncate or mask).
    - ``takes_weights(fn)``: whether the policy loss ``fn`` takes :data:`WEIGHTS_KEYWORD` by name.
    - ``check_loss_takes_weights(fn, loss_mode, plugin="", takers=())``: a ConfigError naming ``actor.loss_mode``
      and ``takers`` (the registered losses that take the weights) unless ``fn`` does.
    """

    def rollout_correction(
        self,
        old_logprobs: torch.Tensor,
        rollout_logprobs: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        mode: str,
        level: str,
        cap: float,
        low: float,
        high: float | None,
    ) -> Correction: ...
    def takes_weights(self, fn: Callable[..., Any]) -> bool: ...
    def check_loss_takes_weights(
        self, fn: Callable[..., Any], loss_mode: str, plugin: str = "", takers: Sequence[str] = ()
    ) -> None: ...


def kit(mode: str, off_policy_steps: int = 0) -> CorrectionKit:
    """The installed implementation; a :class:`NoRolloutCorrection` naming ``algorithm.rollout_correction.mode``
    (and ``trainer.off_policy_steps``, which turns it on) and the package when there is none."""
    why = f" (trainer.off_policy_steps={off_policy_steps} sets it when not given)" if off_policy_steps else ""
    missing = (
        f"algorithm.rollout_correction.mode={mode}{why}: the rollout correction is in the package {PACKAGE}, which "
        f"is not installed: {package_hint(PACKAGE)}; or set algorithm.rollout_correction.mode=off"
    )
    return implementation(GROUP, NoRolloutCorrection(missing))


def check_run(cfg: Config, policy_loss: PolicyLossSpec, losses: Mapping[str, PolicyLossSpec]) -> None:
    """At the start of a training run: a mode other than off needs the implementation (:func:`kit`); truncate and
    mask need a policy loss (``policy_loss``, chosen by ``actor.loss_mode``) that takes the weights, the message
    naming those of ``losses`` (the registered ones) that do."""
    rc = getattr(cfg.algorithm, "rollout_correction", None)  # the package's section: none without it
    if rc is None or rc.mode == "off":
        return
    correct = kit(rc.mode, getattr(cfg.trainer, "off_policy_steps", 0))
    if rc.mode != "monitor":  # monitor only logs: the loss is not weighted
        takers = [name for name, spec in sorted(losses.items()) if correct.takes_weights(spec.fn)]
        correct.check_loss_takes_weights(policy_loss.fn, cfg.actor.loss_mode, policy_loss.plugin, takers)
