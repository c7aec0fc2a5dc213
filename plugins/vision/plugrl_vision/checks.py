"""What a vision-language model does not train with yet, refused at start naming the key: each would otherwise fail
mid-step or drop the images."""

from __future__ import annotations

from typing import Any

from plugrl.config import Config, ConfigError


def check_config(cfg: Config, registry: Any = None) -> None:
    """Refuse, naming the key, what a vision-language model does not train with yet (the kernel's call at start,
    :func:`plugrl.startup.load_run_data`). Raises :class:`ConfigError`."""
    from plugrl.rollout.environment import own_runner

    env = cfg.environment
    names = [env] if isinstance(env, str) else list((env or {}).values())
    own = [n for n in names if registry is not None and n in registry.environments]
    own = [n for n in own if own_runner(registry.environments[n].factory) is not None]
    refused = {
        "rollout.mode=server with rollout.name=hf (servers take image prompts with vllm)": cfg.rollout.mode == "server"
        and cfg.rollout.name == "hf",
        f"agents and other environments that play their own episodes (environment {', '.join(own)}: their calls "
        "reach the policy through the OpenAI-compatible endpoint, which takes text)": bool(own),
    }
    named = [k for k, on in refused.items() if on]
    if named:
        raise ConfigError(
            f"{cfg.model.path} is a vision-language model; with it plugrl does not support {', '.join(named)} yet "
            "(docs/vision.md lists what it trains with); turn those off"
        )
    if cfg.actor.lora.r and cfg.rollout.lora_sync == "adapter":
        # vLLM puts LoRA on the language model's layers only and drops the connector's adapter with a warning:
        # the engine would sample from another policy than the one trained
        raise ConfigError(
            f"{cfg.model.path} is a vision-language model: rollout.lora_sync=adapter hands vLLM adapters it applies "
            "to the language model only (the connector's would be dropped); set rollout.lora_sync=merged"
        )
