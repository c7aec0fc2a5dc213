"""The keys of verl's and TRL's features that plugrl-compat implements, which it adds to the run config (entry-point
group ``plugrl.config_fields``): verl's custom reward function (``reward.custom_reward_function``) and sample files
(``trainer.rollout_data_dir``, ``trainer.validation_data_dir``), TRL's ``reward.reward_funcs``; and verl's keys that
plugrl accepts and does not act on (:data:`NOT_ACTED`), named at start."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from plugrl.config import ConfigFields, Section


class CustomRewardFunctionConfig(Section):
    """verl's custom reward function: ``compute_score(data_source, solution_str, ground_truth, extra_info,
    **reward_kwargs)`` from the user's file scores every sample (verl's ``custom_reward_function`` and
    ``reward.custom_reward_function``; loaded and checked at start by plugrl-compat's
    :mod:`plugrl_compat.custom_reward`)."""

    path: str | None = Field(None, description="The Python file that defines the function; null: no custom function.")
    name: str = Field("compute_score", description="The function's name in that file (verl's default).")
    reward_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keywords passed to every call, over those of the call (as verl merges them)."
    )

    @model_validator(mode="before")
    @classmethod
    def _null_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name", "") is None:  # verl 0.9's legacy section writes name: null
            data = {**data, "name": "compute_score"}
        return data


class ModelKeys(Section):
    use_remove_padding: bool = Field(
        True, description="Accepted for verl compatibility; plugrl always trains on packed sequences."
    )


class CriticKeys(Section):
    forward_max_token_len_per_gpu: int | None = Field(None, description="Accepted for verl compatibility.")
    use_remove_padding: bool = Field(True, description="Accepted for verl compatibility.")


class RewardKeys(Section):
    reward_funcs: list[str] = Field(
        default_factory=list,
        description="TRL's reward_funcs: trl.rewards names as TRL's grpo script resolves them (accuracy_reward, "
        "reasoning_accuracy_reward, think_format_reward, get_soft_overlong_punishment), or `module.function` / "
        "`module:function` of your own TRL-style functions fn(prompts, completions, **columns); each scores every "
        "sample beside the routed rewards, weighed reward.weights.<its name>.",
    )
    custom_reward_function: CustomRewardFunctionConfig = Field(default_factory=CustomRewardFunctionConfig)


class TrainerKeys(Section):
    metric_aliases: Literal["none", "trl"] = Field(
        "none",
        description="trl: also log TRL's GRPO metric names beside plugrl's (reward, reward_std, completion_length, "
        "rewards/<func>/mean, kl, entropy, clip_ratio/region_mean, ...; in wandb and TensorBoard with TRL's "
        "`train/` prefix), so dashboards built on TRL runs work. On for runs started with --trl-config.",
    )

    @field_validator("metric_aliases")
    @classmethod
    def _installed_names(cls, value: str) -> str:
        from plugrl.tracking import metric_names

        metric_names(value)  # the names come with a package (group plugrl.metric_aliases): named when missing
        return value

    n_gpus_per_node: int | None = Field(None, description="Accepted for verl compatibility; torchrun decides.")
    nnodes: int | None = Field(None, description="Accepted for verl compatibility; torchrun decides.")
    rollout_data_dir: str | None = Field(
        None,
        description="Also write each step's samples here as verl does: {dir}/{step}.jsonl with input, output, gts, "
        "score, step and the reward's details per line (verl's trainer.rollout_data_dir).",
    )
    validation_data_dir: str | None = Field(
        None,
        description="Also write each validation's samples here as verl does: {dir}/{step}.jsonl, step 0 before "
        "training (verl's trainer.validation_data_dir).",
    )


# verl's keys plugrl accepts so that verl's commands load as written, and what plugrl does instead
NOT_ACTED = {
    ("model", "use_remove_padding"): "always packed sequences",
    ("critic", "use_remove_padding"): "always packed sequences",
    ("critic", "forward_max_token_len_per_gpu"): "critic passes by critic.ppo_max_token_len_per_gpu",
    ("trainer", "n_gpus_per_node"): "torchrun's --nproc_per_node decides",
    ("trainer", "nnodes"): "torchrun's --nnodes decides",
}


def ignored(cfg: Any) -> list[str]:
    """The verl keys of :data:`NOT_ACTED` the config sets, and keywords of a custom reward function where no
    function is named (said at start)."""
    out = [
        f"{section}.{name} ({instead})"
        for (section, name), instead in NOT_ACTED.items()
        if name in getattr(cfg, section).model_fields_set
    ]
    custom = cfg.reward.custom_reward_function
    if custom.reward_kwargs and not custom.path:
        prefix = "reward.custom_reward_function.reward_kwargs"
        typed = [t for p, t in getattr(cfg, "_typed_as", {}).items() if p.startswith(prefix)]
        out += [
            f"{key} (keywords of a custom reward function, and reward.custom_reward_function.path names none; a "
            "plugin's reward takes reward.options.<name>)"
            for key in typed or [f"{prefix}.{k}" for k in custom.reward_kwargs]
        ]
    return out


FIELDS = ConfigFields(
    sections={"model": ModelKeys, "critic": CriticKeys, "reward": RewardKeys, "trainer": TrainerKeys}, ignored=ignored
)
