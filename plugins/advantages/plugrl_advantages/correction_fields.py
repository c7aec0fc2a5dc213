"""The keys this package adds to the run config (entry-point group ``plugrl.config_fields``): the
``algorithm.rollout_correction`` section (its math is :mod:`plugrl_advantages.rollout_correction`): the mode, level
and bounds of the importance weights between the engine's sampler and the trainer, and what a correction needs of
the rest of the config (the engine's log-probs; mode truncate in an off-policy run); and SAPO's temperatures
``actor.tau_pos`` and ``actor.tau_neg`` (its loss: :func:`plugrl_advantages.losses.sapo`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from plugrl.config import ConfigFields, Section
from plugrl.readers import read_section


class RolloutCorrectionConfig(Section):
    """Importance sampling between the engine's sampler and the trainer (docs/algorithms.md, "Rollout correction").

    Another project's spelling of the section (verl's ``rollout_is``, ``rollout_is_threshold``, ``rollout_rs``...:
    keys that combine) is read into these by the installed config readers (:func:`plugrl.readers.read_section`);
    combinations plugrl does not compute are errors naming the key.
    """

    mode: Literal["off", "monitor", "truncate", "mask"] = Field(
        "off",
        description="off (the default): no correction, the update as without this section. truncate: each "
        "token's policy-gradient loss is multiplied by min(w, cap), w = pi_old / pi_engine at `level` (truncated "
        "importance sampling, TIS). mask: tokens (sequences, at the sequence levels) with w outside [low, high] "
        "leave the loss mask, and so the loss's normaliser; the kept ones are weighted by w (masked importance "
        "sampling, MIS). monitor: no change to the loss, the rollout_corr/ diagnostics alone. Any mode but off "
        "needs the engine's log-probs (rollout.calculate_log_probs, turned on when not set) and one more "
        "log-prob pass in on-policy runs (the old log-probs). Off by default: plugrl's default job is on-policy, "
        "and its engines match the trainer within float tolerance on CPU (TRL turns its correction on with vLLM; "
        "--trl-config does so too).",
    )
    level: Literal["token", "sequence", "geometric"] = Field(
        "token",
        description="token: w per token, exp(log pi_old - log pi_engine). sequence: the sequence's product "
        "exp(sum of its tokens' log-ratios), on each of its tokens. geometric: its geometric mean, exp(mean "
        "log-ratio). Log-weights are clamped to [-20, 20].",
    )
    cap: float = Field(2.0, gt=1.0, description="mode truncate: the largest weight, min(w, cap).")
    low: float = Field(
        0.5, ge=0.0, lt=1.0, description="mode mask: tokens / sequences with w < low are left out; 0: no lower bound."
    )
    high: float | None = Field(
        2.0, gt=1.0, description="mode mask: tokens / sequences with w > high are left out; null: no upper bound."
    )

    @model_validator(mode="before")
    @classmethod
    def _spellings(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if set(data) - set(cls.model_fields):  # keys of another project's spelling, or unknown ones
            data = read_section("algorithm.rollout_correction", data)
        mode = data.get("mode")
        if mode is False or (isinstance(mode, str) and mode.strip().lower() in ("false", "no", "none")):
            data = {**data, "mode": "off"}  # YAML reads off and no as false
        elif mode is True:
            raise ValueError(
                "mode true (YAML reads on and yes as true) names no mode: set algorithm.rollout_correction.mode to "
                "truncate, mask or monitor, or off"
            )
        return data

    def changed(self, key: str) -> bool:
        """Whether ``key`` was set to a value other than its default (a run's config.yaml sets every key)."""
        return key in self.model_fields_set and getattr(self, key) != type(self).model_fields[key].default

    @model_validator(mode="after")
    def _keys_of_the_mode(self) -> RolloutCorrectionConfig:
        unused = {"truncate": ("low", "high"), "mask": ("cap",)}.get(self.mode, ())
        for key in unused:
            if self.changed(key):
                uses = "cap" if self.mode == "truncate" else "low and high"
                raise ValueError(
                    f"{key} is not used by mode {self.mode} (it uses {uses}); remove "
                    f"algorithm.rollout_correction.{key} or pick the mode that uses it"
                )
        return self


class AlgorithmCorrection(Section):
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)


class CorrectionChecks(Section):
    @model_validator(mode="after")
    def _rollout_correction(self) -> CorrectionChecks:
        """Off-policy runs (trainer.off_policy_steps > 0) correct their stale samples: mode truncate when the mode is
        not set. A correction needs the engine's log-probs: rollout.calculate_log_probs is turned on when not set (the
        trainer says so at start), an explicit false is an error. vLLM reports log-probs of the raw model
        distribution, before temperature, which the trainer's recomputed ones (at rollout.temperature) match
        only at temperature 1 (or 0, greedy, where the trainer uses 1 as well)."""
        rc, r = self.algorithm.rollout_correction, self.rollout
        if getattr(self.trainer, "off_policy_steps", 0) and "mode" not in rc.model_fields_set:  # plugrl-off-policy's
            rc.mode = "truncate"  # the stale samples of an off-policy run are corrected unless the mode is set
        if rc.mode == "off":
            return self
        if not r.calculate_log_probs:
            if "calculate_log_probs" in r.model_fields_set:
                raise ValueError(
                    f"algorithm.rollout_correction.mode={rc.mode} compares the trainer's log-probs with the engine's, "
                    "but rollout.calculate_log_probs=false asks the engine for none; set rollout.calculate_log_probs="
                    "true (or leave it out: it is then turned on), or algorithm.rollout_correction.mode=off"
                )
            r.calculate_log_probs = True
            self._log_probs_turned_on = True
        return self


def ignored(cfg: Any) -> list[str]:
    """Settings of a correction that is off (or only monitors): named at start."""
    rc = cfg.algorithm.rollout_correction
    if rc.mode in ("off", "monitor"):
        unused = ("level", "cap", "low", "high") if rc.mode == "off" else ("cap", "low", "high")
        return [
            f"algorithm.rollout_correction.{k} (mode is {rc.mode}: the loss is not corrected)"
            for k in unused
            if rc.changed(k)
        ]
    return []


class SAPOTemperatures(Section):
    tau_pos: float = Field(
        1.0, gt=0.0, description="SAPO's loss: the gate's temperature where the advantage is positive."
    )
    tau_neg: float = Field(
        1.05, gt=0.0, description="SAPO's loss: the gate's temperature where the advantage is not positive."
    )


FIELDS = ConfigFields(
    sections={"algorithm": AlgorithmCorrection, "actor": SAPOTemperatures, "": CorrectionChecks}, ignored=ignored
)
