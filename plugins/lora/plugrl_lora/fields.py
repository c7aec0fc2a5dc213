"""The keys of LoRA, which this package adds to the run config (entry-point group ``plugrl.config_fields``):
``actor.lora`` and ``critic.lora`` (:class:`LoRAConfig`: rank, alpha, dropout, target modules) and
``rollout.lora_sync`` (how the engine gets a LoRA policy), with the checks of what they combine with."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from plugrl.config import VLLM_LORA_RANKS, ConfigFields, Section


class LoRAConfig(Section):
    """LoRA adapters (through peft) on the trained policy (actor.lora) or the critic's trunk (critic.lora): the base
    weights stay frozen, only the adapters (and a critic's new value head, trained whole) train."""

    r: int = Field(
        0,
        ge=0,
        description="Adapter rank; 0: no LoRA (the whole model trains). With r > 0 only the adapters are trained and "
        "checkpointed in PEFT format: checkpoints/step_N/policy_adapter/ for the actor, whose reference log-probs "
        "then come from the policy with its adapters off (no second model) and whose engine gets the policy as "
        "rollout.lora_sync says; critic_adapter/, value head included, for the critic. verl: "
        "actor_rollout_ref.model.lora_rank, critic.model.lora_rank.",
    )
    alpha: float = Field(
        16.0, gt=0.0, description="The adapter's scale is alpha / r (peft's lora_alpha). verl: lora_alpha."
    )
    dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout on the adapters' input in the training forward (peft's lora_dropout); log-prob and "
        "value passes run without it.",
    )
    target_modules: Literal["all-linear"] | list[str] = Field(
        "all-linear",
        description="Linear layers that get adapters: all-linear (every linear layer but the LM head or the critic's "
        "value head), or names matched as peft matches them (a module name or the end of its dotted path: "
        "[q_proj, v_proj]); each name must match a linear layer of the model. verl: model.target_modules.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_string(cls, data: Any) -> Any:
        """``target_modules=q_proj,v_proj`` (a command line's spelling) is the list [q_proj, v_proj]."""
        names = data.get("target_modules") if isinstance(data, dict) else None
        if isinstance(names, str) and names != "all-linear":
            names = [n.strip() for n in names.split(",") if n.strip()]
            data = {**data, "target_modules": names}
        if isinstance(names, list) and not names:
            raise ValueError("target_modules is empty: name at least one linear layer (q_proj, ...) or all-linear")
        return data


class ActorLoRA(Section):
    lora: LoRAConfig = Field(default_factory=LoRAConfig)

    @model_validator(mode="after")
    def _lora_combinations(self) -> ActorLoRA:
        if self.lora.r and self.tp_size > 1:  # tensor parallelism shards nn.Linear modules; LoRA wraps them
            raise ValueError(
                f"actor.lora.r={self.lora.r} cannot combine with actor.tp_size={self.tp_size}: LoRA adapters are "
                "not tensor-parallel in plugrl; use actor.tp_size=1 (FSDP2 data parallelism trains LoRA on any "
                "number of ranks) or actor.lora.r=0"
            )
        return self


class CriticLoRA(Section):
    lora: LoRAConfig = Field(default_factory=LoRAConfig)


class RolloutLoRA(Section):
    lora_sync: Literal["merged", "adapter"] = Field(
        "merged",
        description="With actor.lora: how the engine gets the policy after each update. merged: the base weights "
        "with the adapters merged in (W + alpha / r * B @ A), reloaded like full fine-tuning's; adapter: the "
        "adapters alone, handed to vLLM's LoRA support in memory (enable_lora), the base weights loaded once. "
        "bench/lora.py measures both (docs/performance.md). vLLM only; ranks up to 512.",
    )


class LoRAChecks(Section):
    @model_validator(mode="after")
    def _lora_sync(self) -> LoRAChecks:
        if self.rollout.lora_sync == "adapter" and self.actor.lora.r:
            if self.rollout.mode == "server":
                raise ValueError(
                    "rollout.lora_sync=adapter hands the adapter to an in-process vLLM engine; rollout servers take "
                    "merged weights: set rollout.lora_sync=merged (or rollout.mode=colocate)"
                )
            if self.rollout.name != "vllm":
                raise ValueError(
                    "rollout.lora_sync=adapter hands the adapters to vLLM's LoRA support, but rollout.name is "
                    f"{self.rollout.name}; set rollout.lora_sync=merged (or rollout.name=vllm)"
                )
            if self.actor.lora.r > VLLM_LORA_RANKS[-1]:
                raise ValueError(
                    f"rollout.lora_sync=adapter: vLLM serves adapters of rank up to {VLLM_LORA_RANKS[-1]}, "
                    f"actor.lora.r is {self.actor.lora.r}; set rollout.lora_sync=merged or a smaller actor.lora.r"
                )
        return self

    @model_validator(mode="after")
    def _critic_lora_combinations(self) -> LoRAChecks:
        # the critic shares the policy's mesh (actor.tp_size); tensor parallelism shards the nn.Linear LoRA wraps
        if self.critic.lora.r and self.actor.tp_size > 1:
            raise ValueError(
                f"critic.lora.r={self.critic.lora.r} cannot combine with actor.tp_size={self.actor.tp_size} (the "
                "critic is tensor-parallel on the policy's mesh): LoRA adapters are not tensor-parallel in plugrl; "
                "use actor.tp_size=1 (FSDP2 data parallelism trains LoRA on any number of ranks) or critic.lora.r=0"
            )
        return self


def ignored(cfg: Any) -> list[str]:
    """``rollout.lora_sync=adapter`` without adapters: nothing to hand the engine (said at start)."""
    if cfg.rollout.lora_sync == "adapter" and not cfg.actor.lora.r:  # not "set": a run's config.yaml sets all
        return ["rollout.lora_sync (actor.lora.r is 0: the policy has no adapters, the engine gets its weights)"]
    return []


FIELDS = ConfigFields(
    sections={"actor": ActorLoRA, "critic": CriticLoRA, "rollout": RolloutLoRA, "": LoRAChecks}, ignored=ignored
)
