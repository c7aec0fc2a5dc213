"""The key ``trainer.off_policy_steps``, which this package adds to the run config (entry-point group
``plugrl.config_fields``), with what it asks of the engine (awake while the policy trains)."""

from __future__ import annotations

from pydantic import Field, model_validator

from plugrl.config import ConfigFields, Section, turn_off


class OffPolicyKeys(Section):
    off_policy_steps: int = Field(
        0,
        ge=0,
        description="k: generate the rollouts of step s + k, on a thread of their own, while step s trains, so "
        "step t trains on rollouts sampled with the weights of step t - k (verl's one-step-off-policy trainer "
        "at 1). 0: on-policy, each step generates with the weights it trains. The engine stays awake "
        "(rollout.free_cache_engine is turned off) and takes new weights between two generations; the stale "
        "samples are weighted by algorithm.rollout_correction (mode truncate unless set). Rollouts generated "
        "ahead are kept in checkpoints, so a resumed run continues exactly. docs/scaling.md, 'Off-policy'.",
    )


class OffPolicyChecks(Section):
    @model_validator(mode="after")
    def _off_policy(self) -> OffPolicyChecks:
        """Off-policy runs (trainer.off_policy_steps > 0): the engine generates while the policy trains, so it
        cannot sleep (an explicit rollout.free_cache_engine=true is an error, the default is turned off). (The stale
        samples are corrected: plugrl-advantages' check of algorithm.rollout_correction.)"""
        k = self.trainer.off_policy_steps
        if not k:
            return self
        if self.rollout.free_cache_engine and "free_cache_engine" in self.rollout.model_fields_set:
            raise ValueError(
                f"trainer.off_policy_steps={k} generates while the policy trains, but rollout.free_cache_engine=true "
                "puts the engine to sleep while training; remove rollout.free_cache_engine (it is then off) or set "
                "trainer.off_policy_steps=0"
            )
        turn_off(self.rollout, "free_cache_engine")
        return self


FIELDS = ConfigFields(sections={"trainer": OffPolicyKeys, "": OffPolicyChecks})
