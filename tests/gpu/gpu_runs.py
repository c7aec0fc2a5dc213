"""The training runs of the GPU suite, shared by the GPU tests and by test_configs_valid.py (which loads every
one through plugrl's config loader on the CPU, so a mistyped key fails there rather than on the GPU box).

Standard library only at import: the GPU test modules import this before the conftest's environment check
has had its say, and must still be collected (then skipped) on a machine without pydantic or CUDA.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GRPO_YAML = ROOT / "examples" / "countdown_grpo.yaml"
PPO_YAML = ROOT / "examples" / "ppo_gae.yaml"
LORA_YAML = ROOT / "examples" / "countdown_grpo_lora.yaml"

# plugrl's runtime dependencies ([project] dependencies in pyproject.toml): pip name -> import name.
# test_configs_valid.py checks this list against pyproject.toml; conftest.py skips the suite when one is missing.
REQUIRED_MODULES = {
    "torch": "torch",
    "transformers": "transformers",
    "pluggy": "pluggy",
    "pydantic": "pydantic",
    "pyyaml": "yaml",
    "numpy": "numpy",
    "safetensors": "safetensors",
    "datasets": "datasets",
    "pyarrow": "pyarrow",
    "rich": "rich",
    "packaging": "packaging",
}
# plugins the runs load (the example configs below, and REWARD_MODEL_HF's): entry-point name -> source folder
REQUIRED_PLUGINS = {
    "advantages": "plugins/advantages",
    "countdown": "plugins/datasets_countdown",
    "reward_model": "plugins/rewards_model",
}
# packages beside the kernel the runs use (the rollout server of server_collective): module -> source folder
REQUIRED_PACKAGES = {
    "plugrl_rollout_servers": "plugins/rollout_servers",
    "plugrl_model_servers": "plugins/model_servers",
    "plugrl_lora": "plugins/lora",  # test_gpu_lora's run (actor.lora)
    "plugrl_vision": "plugins/vision",  # test_gpu_vlm's policy (a vision-language model)
    "plugrl_attention": "plugins/attention",  # shared-prompt packing's attention kernels (FlexAttention on CUDA)
}

# what every run sets on top of its example config: small batches of the real model, entropy bonus so the
# first update moves the weights even when all rewards of a group agree (GRPO advantages 0)
ROLLOUT_N = 4
PROMPTS_PER_STEP = 4
DATASET_SIZE = 64


def common_overrides(model: str | Path, out: str | Path, name: str, steps: int) -> list[str]:
    return [
        f"model.path={model}",
        "model.dtype=auto",
        "trainer.device=auto",
        f"rollout.n={ROLLOUT_N}",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        f"data.dataset_options.size={DATASET_SIZE}",
        "actor.entropy_coeff=0.01",
        f"trainer.total_steps={steps}",
        f"trainer.output_dir={out}",
        f"trainer.experiment_name={name}",
        "trainer.save_freq=1",
        "trainer.logger=[console,jsonl]",
    ]


@dataclass(frozen=True)
class Scenario:
    """One run: an example config plus overrides; ``expect`` holds the dotted keys its loaded config must have
    (``algorithm`` accepts unknown keys, so a typo there would otherwise pass validation unnoticed)."""

    name: str
    config: Path
    extra: tuple[str, ...]
    expect: dict[str, Any] = field(default_factory=dict)
    needs_reward_model: bool = False  # overrides() then takes reward_model, the folder of a sequence classifier

    def overrides(
        self, model: str | Path, out: str | Path, steps: int, reward_model: str | Path | None = None
    ) -> list[str]:
        if self.needs_reward_model != (reward_model is not None):
            raise ValueError(f"{self.name}: reward_model is {'required' if self.needs_reward_model else 'unused'}")
        rm = [f"reward.options.reward_model.path={reward_model}"] if reward_model is not None else []
        return [*common_overrides(model, out, self.name, steps), *self.extra, *rm]


GRPO_HF = Scenario(
    "grpo_hf",
    GRPO_YAML,
    ("rollout.name=hf",),
    {"rollout.name": "hf", "algorithm.adv_estimator": "grpo", "actor.fsdp_config.param_offload": False},
)
FSDP_HF = Scenario(
    "fsdp2_hf",
    GRPO_YAML,
    ("rollout.name=hf", "actor.fsdp_config.param_offload=false"),
    {"rollout.name": "hf", "actor.fsdp_config.param_offload": False},
)
FSDP_OFFLOAD_HF = Scenario(
    "fsdp2_offload_hf",
    GRPO_YAML,
    ("rollout.name=hf", "actor.fsdp_config.param_offload=true"),
    {"rollout.name": "hf", "actor.fsdp_config.param_offload": True},
)
PPO_GAE_HF = Scenario(
    "ppo_gae_hf",
    PPO_YAML,
    ("rollout.name=hf", "trainer.critic_warmup=0"),  # the example's warm-up of 2 would leave the policy untrained
    {"rollout.name": "hf", "algorithm.adv_estimator": "gae", "trainer.critic_warmup": 0},
)
# vLLM runs: 0.15 of a GPU each, so the runs tests/gpu/run.sh starts side by side fit on one GPU (vLLM refuses to
# start when less than its share is free); the rollout correction in monitor mode turns on the engine's log-probs,
# which step 2 compares with the trainer's: an engine that generated with stale or dropped weights after the sync
# and the KV wake would be nats away
VLLM = ("rollout.name=vllm", "rollout.gpu_memory_utilization=0.15", "trainer.save_freq=0")
MONITOR = "algorithm.rollout_correction.mode=monitor"
VLLM_EXPECT = {"rollout.name": "vllm", "rollout.gpu_memory_utilization": 0.15, "trainer.save_freq": 0}
GRPO_VLLM = Scenario(
    "grpo_vllm",
    GRPO_YAML,
    (*VLLM, MONITOR),
    {**VLLM_EXPECT, "algorithm.rollout_correction.mode": "monitor", "rollout.calculate_log_probs": True},
)
# LoRA with vLLM, both syncs: merged weights (a full reload, sleep level 2) and the adapter alone (level 1);
# eager, the CUDA graphs are GRPO_VLLM's
LORA_VLLM_MERGED = Scenario(
    "lora_vllm_merged",
    LORA_YAML,
    (*VLLM, MONITOR, "rollout.lora_sync=merged", "rollout.enforce_eager=true"),
    {**VLLM_EXPECT, "rollout.lora_sync": "merged", "actor.lora.r": 16},
)
LORA_VLLM_ADAPTER = Scenario(
    "lora_vllm_adapter",
    LORA_YAML,
    (*VLLM, MONITOR, "rollout.lora_sync=adapter", "rollout.enforce_eager=true"),
    {**VLLM_EXPECT, "rollout.lora_sync": "adapter", "actor.lora.r": 16},
)
# two GPUs under torchrun, one step off the policy: each rank's rollout thread generates on its own GPU
OFF_POLICY_VLLM = Scenario(
    "off_policy_vllm",
    GRPO_YAML,
    (*VLLM, "trainer.off_policy_steps=1", "rollout.enforce_eager=true"),
    {**VLLM_EXPECT, "trainer.off_policy_steps": 1, "rollout.calculate_log_probs": True},
)
# a rollout server plugrl starts on the second GPU, the weights over NCCL (weight_transport collective)
SERVER_COLLECTIVE = Scenario(
    "server_collective",
    GRPO_YAML,
    (*VLLM, MONITOR, "rollout.mode=server", "rollout.weight_transport=collective", "rollout.enforce_eager=true"),
    {**VLLM_EXPECT, "rollout.mode": "server", "rollout.weight_transport": "collective"},
)
LORA_HF = Scenario(
    "lora_hf",
    LORA_YAML,
    ("rollout.name=hf",),
    {"rollout.name": "hf", "actor.lora.r": 16, "actor.lora.target_modules": "all-linear"},
)
# one step off the policy: step 2 trains on samples generated while step 1 trained, corrected by the engine's
# log-probs (rollout_correction mode truncate, turned on with calculate_log_probs by the config)
OFF_POLICY_HF = Scenario(
    "off_policy_hf",
    GRPO_YAML,
    ("rollout.name=hf", "trainer.off_policy_steps=1"),
    {
        "rollout.name": "hf",
        "trainer.off_policy_steps": 1,
        "algorithm.rollout_correction.mode": "truncate",
        "rollout.calculate_log_probs": True,
    },
)
# the countdown rule plus a reward model (plugins/rewards_model) in the trainer's process, as
# examples/gsm8k_grpo_rm.yaml mixes them; the model's folder is given at run time (reward_model_path)
REWARD_MODEL_HF = Scenario(
    "reward_model_hf",
    GRPO_YAML,
    (
        "rollout.name=hf",
        "plugins=[countdown,advantages,reward_model]",
        "reward.extra=[reward_model]",
        "reward.weights={countdown_reward: 1.0, reward_model: 0.2}",
        "reward.options.reward_model.normalize=running",
        "reward.options.reward_model.clip=3",
    ),
    {
        "rollout.name": "hf",
        "reward.extra": ["reward_model"],
        "reward.weights": {"countdown_reward": 1.0, "reward_model": 0.2},
    },
    needs_reward_model=True,
)
SCENARIOS = (
    GRPO_HF,
    FSDP_HF,
    FSDP_OFFLOAD_HF,
    PPO_GAE_HF,
    GRPO_VLLM,
    LORA_HF,
    OFF_POLICY_HF,
    REWARD_MODEL_HF,
    LORA_VLLM_MERGED,
    LORA_VLLM_ADAPTER,
    OFF_POLICY_VLLM,
    SERVER_COLLECTIVE,
)


def dotted(obj: Any, key: str) -> Any:
    """``cfg`` attribute (or dict entry) at ``a.b.c``."""
    for part in key.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


# ---- reading a finished run ------------------------------------------------------------------------------


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# present and finite in every step of every run (the jsonl writes a non-finite value as null)
STEP_METRICS = (
    "actor/pg_loss",
    "actor/entropy",
    "actor/grad_norm",
    "actor/lr",
    "reward/mean",
    "response_length/mean",
    "perf/tokens_per_s",
    "timing/step",
    "timing/generate",
    "timing/update",
)


def check_step_metrics(record: dict[str, Any], extra: tuple[str, ...] = ()) -> None:
    """The step trained: the named metrics are finite, no actor/critic metric is non-finite, one optimizer
    step was taken and none was skipped for a non-finite gradient."""
    step = record.get("step")
    for key in (*STEP_METRICS, *extra):
        value = record.get(key)
        assert isinstance(value, (int, float)) and math.isfinite(value), f"step {step}: {key} = {value!r}"
    bad = [k for k, v in record.items() if k.startswith(("actor/", "critic/")) and v is None]
    assert not bad, f"step {step}: non-finite {bad}"
    assert record["actor/optimizer_steps"] == 1 and record["actor/skipped_updates"] == 0, record
    assert record["actor/grad_norm"] > 0, record


def probes(probe_dir: Path) -> list[dict[str, Any]]:
    """What tests/gpu/train_probe.py wrote, one record per rank, by rank."""
    found = [json.loads(p.read_text()) for p in sorted(probe_dir.glob("rank_*.json"))]
    return sorted(found, key=lambda r: r["rank"])
