"""DAPO's keys, which this package adds to the run config (entry-point group ``plugrl.config_fields``): dynamic
sampling (``algorithm.filter_groups``, ``data.gen_batch_size``) and the soft overlong punishment
(``reward.overlong_buffer``), with the checks of what they combine with."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from plugrl.config import ConfigFields, Section


class FilterGroupsConfig(Section):
    """DAPO's dynamic sampling: drop groups whose rewards all agree, refill from more prompts."""

    enable: bool = False
    metric: str = Field(
        "score",
        description="What must differ within a group for it to be kept: score (the reward before penalties; also "
        "verl's names reward and seq_reward), seq_final_reward (with DAPO's overlong penalty), or a field the "
        "reward functions return in their dict; acc is that field, or the score of a reward that returns a "
        "number (verl's dapo reward manager).",
    )
    max_num_gen_batches: int = Field(
        4,
        ge=0,
        description="Generation rounds per step at most; 0: no limit (verl). At the limit the step trains on the "
        "groups it has (verl stops the run there).",
    )


class OverlongBufferConfig(Section):
    """DAPO's soft overlong punishment over the last ``len`` tokens before max_response_length."""

    enable: bool = False
    len: int = Field(64, ge=1)
    penalty_factor: float = Field(1.0, ge=0.0)


class DataKeys(Section):
    gen_batch_size: int | None = Field(
        None,
        ge=1,
        description="With algorithm.filter_groups: prompts generated per round (verl's DAPO gen_batch_size), of "
        "which the groups that vary fill data.train_batch_size; default data.train_batch_size.",
    )


class AlgorithmKeys(Section):
    filter_groups: FilterGroupsConfig = Field(default_factory=FilterGroupsConfig)


class RewardKeys(Section):
    overlong_buffer: OverlongBufferConfig = Field(default_factory=OverlongBufferConfig)


class DapoChecks(Section):
    @model_validator(mode="after")
    def _buffer_within_the_response(self) -> DapoChecks:
        ob, limit = self.reward.overlong_buffer, self.data.max_response_length
        if ob.enable and ob.len >= limit:
            raise ValueError(
                f"reward.overlong_buffer.len ({ob.len}) must be smaller than data.max_response_length ({limit}); "
                "the penalty ramps over the last `len` tokens"
            )
        return self


def ignored(cfg: Any) -> list[str]:
    """``data.gen_batch_size`` without dynamic sampling: no generation rounds to size (said at start)."""
    if cfg.data.gen_batch_size and not cfg.algorithm.filter_groups.enable:
        return ["data.gen_batch_size (prompts of a generation round of algorithm.filter_groups, which is off)"]
    return []


FIELDS = ConfigFields(
    sections={"data": DataKeys, "algorithm": AlgorithmKeys, "reward": RewardKeys, "": DapoChecks}, ignored=ignored
)
