"""Run configuration: pydantic models, YAML loading, dotted overrides, redaction.

Key names follow verl where a verl user would look for them. The tree is flatter
than verl's: ``actor_rollout_ref.{model,actor,rollout,ref}`` become top-level
``model``, ``actor``, ``rollout`` and ``ref``; a key written the verl way
(``actor_rollout_ref.rollout.n=8``) is accepted and moved to its place.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib.metadata
import json
import logging
import os
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from plugrl.plugin_errors import own_packages, package_hint
from plugrl.readers import Fate, fate_of, settle, unknown_keys_hint

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A config problem, with the key and how to fix it in the message. ``fates``: what became of each key the
    user typed, when the problem was found while reading them (``plugrl train --check`` prints them)."""

    fates: list[Fate] = []


class Section(BaseModel):
    # inf and NaN are refused for every float (a time limit of .inf, a NaN coefficient): pydantic names the key
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelSection(Section):
    path: str = Field(description="HF model directory (or hub id when online) of the policy to train.")
    tokenizer_path: str | None = Field(None, description="Tokenizer directory; defaults to `model.path`.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Compute dtype; fp32 master weights either way. bfloat16: FSDP2's mixed precision (bf16 "
        "parameters in forward/backward, fp32 gradient reduction) under torchrun, autocast in one process. "
        "auto (the default): bfloat16 where the device has bf16 kernels (GPUs from Ampere on, CPUs with "
        "AVX512/AMX), else float32.",
    )
    enable_gradient_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    trust_remote_code: bool = False
    attn_implementation: str = Field("sdpa", description="HF attention implementation for training.")
    override_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Values that replace those of the model's config.json when the policy, reference, critic and "
        "engine load it (verl's model.override_config), e.g. {max_position_embeddings: 32768}.",
    )


class DataSection(Section):
    train_files: list[str] = Field(
        default_factory=list, description="Local parquet/jsonl/json files or hub dataset ids (`hub:owner/name`)."
    )
    val_files: list[str] = Field(default_factory=list, description="Validation files, same forms as train_files.")

    @model_validator(mode="before")
    @classmethod
    def _one_file(cls, data: Any) -> Any:
        """A plain string is one file (verl's scripts write `data.train_files=$HOME/data/train.parquet`)."""
        if isinstance(data, dict):
            for key in ("train_files", "val_files"):
                if isinstance(data.get(key), str):
                    data = {**data, key: [data[key]]}
        return data

    dataset: str | None = Field(None, description="Name of a dataset registered by a plugin (instead of files).")
    dataset_options: dict[str, Any] = Field(default_factory=dict, description="Keyword options for the dataset.")
    split: str = "train"
    val_split: str = "test"
    prompt_key: str = Field("prompt", description="Row field holding the prompt (text or chat messages).")
    question_field: str | None = Field(None, description="Field mapping: row field holding a plain question.")
    answer_field: str | None = Field(None, description="Field mapping: row field holding the ground truth.")
    data_source: str | None = Field(None, description="data_source for rows that carry none.")
    template: str | None = Field(None, description="Prompt template registered by a plugin.")
    raw_template: str | None = Field(
        None, description="Raw prompt text with {placeholders} filled from the row (e.g. '{question}')."
    )
    apply_chat_template: bool = Field(
        True,
        description="Render chat messages with the tokenizer's chat template; false: write them as ChatML by hand "
        "(<|im_start|>role\\ncontent<|im_end|>\\n per message, then <|im_start|>assistant\\n), as single-file "
        "trainers do.",
    )
    system_prompt: str | None = Field(None, description="System message put before the prompt.")
    prefill: str | None = Field(
        None,
        description="Text the assistant turn starts with (e.g. '<think>'): part of the prompt, not trained on; the "
        "rewards score it with the answer. In multi-turn episodes every assistant turn starts with it.",
    )
    train_batch_size: int = Field(16, ge=1, description="Prompts per training step (all ranks together).")
    max_prompt_length: int = Field(512, ge=1, description="Prompt tokens at most.")
    max_response_length: int = Field(256, ge=1, description="Generated tokens at most.")
    filter_overlong_prompts: bool = Field(
        False, description="Drop prompts over max_prompt_length (counted); off by default, as in verl."
    )
    truncation: Literal["error", "left", "right", "middle"] = Field(
        "error",
        description="Overlong prompts that are not filtered: error (stop at start, naming the row), left (keep the "
        "last max_prompt_length tokens), right (keep the first), middle (keep the first and the last halves), as "
        "verl's data.truncation.",
    )
    skip_invalid: bool = Field(False, description="Skip (and count) invalid rows instead of failing.")
    shuffle: bool = True
    seed: int = 0
    max_samples: int | None = Field(None, description="Use at most this many training rows.")
    val_max_samples: int | None = Field(None, description="Use at most this many validation rows.")
    apply_chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments for the tokenizer's apply_chat_template (e.g. {enable_thinking: false} for "
        "Qwen3), as verl's data.apply_chat_template_kwargs.",
    )


class ValKwargs(Section):
    """Sampling for validation (verl's ``rollout.val_kwargs``): greedy by default."""

    n: int = Field(
        1, ge=1, description="Samples per prompt; unbiased pass@k is reported for k = 1, 2, 4, ... up to n, and n."
    )
    temperature: float = Field(0.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = -1
    do_sample: bool | None = Field(None, description="Accepted for verl compatibility (temperature decides).")


class RolloutSection(Section):
    name: str = Field(
        "vllm",
        description="Rollout engine, by its registered name (`engine` is an alias): vllm (vLLM in the training "
        "process), hf (transformers' generate), or one a plugin registers with @plugrl.rollout_engine.",
    )
    engine_log_level: Literal["debug", "info", "warning", "error"] = Field(
        "warning",
        description="vLLM's log level. At warning its start-up report (the engine config and ~30 INFO lines before "
        "step 1) is hidden, and a warning it repeats is shown once; `plugrl train --verbose` sets info. The "
        "environment variable VLLM_LOGGING_LEVEL, when set, wins.",
    )
    n: int = Field(8, ge=1, description="Samples per prompt.")
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, description="-1 disables top-k.")
    stop: list[str] = Field(
        default_factory=list,
        description="Stop strings: generation ends at the token that completes one. The trained response keeps the "
        "tokens the policy sampled, stop string included (as verl and TRL do); the text the rewards score ends "
        "before it (after it with include_stop_str_in_output). Both engines behave the same.",
    )
    include_stop_str_in_output: bool = Field(
        False,
        description="Keep the stop string in the text the rewards score and validation logs; the trained tokens "
        "include it either way.",
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0.0, le=1.0, description="vLLM memory fraction on GPU (weights + KV cache); see docs/scaling.md."
    )
    cpu_kv_cache_gb: float = Field(1.0, gt=0.0, description="vLLM KV-cache size on CPU, GiB.")
    block_size: int | None = Field(
        None,
        ge=1,
        description="vLLM KV-cache block size, tokens. Default: 32 on CPU (vLLM's CPU default of 128 shares no "
        "block of a prompt under 128 tokens between its n samples: 4.0 vs 3.3 s for 2 x 8 x 128 tokens here), "
        "vLLM's own elsewhere.",
    )
    tensor_model_parallel_size: int = Field(
        1, ge=1, description="vLLM tensor parallel size: each block of this many ranks drives one engine."
    )
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    enforce_eager: bool | None = Field(
        None,
        description="vLLM without CUDA graphs or torch.compile. Default: true on CPU (start-up stays fast), false on "
        "GPUs, where CUDA graphs make decoding several times faster. On CPU, false decodes 1.2-1.3x faster "
        "(SmolLM2-135M) and costs ~1 min at the first start on a machine, 5-8 s at later ones (compile caches): "
        "worth it for long CPU runs (docs/performance.md).",
    )
    calculate_log_probs: bool = Field(
        False,
        description="Have the engine return each sampled token's log-prob (Rollout.logprobs), as verl's option does: "
        "under the distribution it was sampled from (temperature, top-k and top-p applied; vLLM's logprobs_mode "
        "processed_logprobs). Training does not need them (it recomputes log-probs) unless "
        "algorithm.rollout_correction is on; with vLLM on CPU they cost ~4% of generation.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="auto: the model's training dtype.")
    mode: Literal["colocate", "server"] = Field(
        "colocate",
        description="colocate: the engine runs in each training process (vLLM in-process, sleeping while the "
        "policy trains on GPUs). server: generation runs on rollout servers (`plugrl rollout-serve MODEL`), "
        "separate processes with their own devices, which get the new weights after each update "
        "(rollout.weight_transport); rollout.server_urls names them, or plugrl starts rollout.servers of them on "
        "this host. docs/scaling.md, 'Rollout servers'.",
    )
    free_cache_engine: bool = Field(
        True,
        description="vLLM sleep mode (GPU only; `enable_sleep_mode` is an alias): level-1 sleep while training, "
        "woken before weight sync and generation.",
    )
    seed: int | None = Field(
        0,
        description="Sampling seed. vLLM: each engine is seeded once when built, with this plus the index of its "
        "engine group (rank // rollout.tensor_model_parallel_size), so data-parallel engines sample different "
        "streams and the ranks of one tensor-parallel engine share one; requests carry no seed (vLLM would sample "
        "them row by row). null: trainer.seed. The HF engine seeds each generation from it (in training plus an "
        "offset per step and data-parallel rank); null: unseeded.",
    )
    val_kwargs: ValKwargs = Field(default_factory=ValKwargs)

    @model_validator(mode="before")
    @classmethod
    def _engine_alias(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            for old, new in (("engine", "name"), ("enable_sleep_mode", "free_cache_engine")):
                if old in data:
                    data.setdefault(new, data.pop(old))
        return data


class OptimConfig(Section):
    lr: float = Field(1e-6, gt=0.0)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int | None = Field(
        None,
        ge=0,
        description="Linear warm-up steps (`lr_warmup_steps` is an alias); null (verl's -1, the default): "
        "warmup_steps_ratio x the run's steps (0 with its default).",
    )
    warmup_steps_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="Warm-up as a share of the run's steps, when warmup_steps is null (verl)."
    )
    lr_scheduler: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict) and "lr_warmup_steps" in data:
            data = dict(data)
            data.setdefault("warmup_steps", data.pop("lr_warmup_steps"))
        return data


class FSDPConfig(Section):
    param_offload: bool = Field(
        False,
        description="FSDP2 CPUOffloadPolicy: sharded parameters, gradients and optimizer state live in host memory, "
        "the optimizer step runs on CPU (needs torchrun; see docs/scaling.md). The reference model follows actor's.",
    )
    optimizer_offload: bool = Field(
        False, description="The same policy: FSDP2 offloads parameters and optimizer state together."
    )
    reshard_after_forward: bool = True
    fsdp_size: int = Field(
        -1,
        description="Shard group size: -1 shards over all data-parallel ranks (world / actor.tp_size), "
        "the only size supported (no hybrid sharding). `actor.fsdp_size` sets the actor's.",
    )


class ActorSection(Section):
    optim: OptimConfig = Field(default_factory=OptimConfig)
    tp_size: int = Field(
        1,
        ge=1,
        description="Tensor-parallel group size for the policy, reference and critic (a 2-D mesh: world / tp_size "
        "data-parallel groups x tp_size); must divide the process count and the model's heads, kv-heads and vocab.",
    )
    ppo_mini_batch_size: int | None = Field(
        None, ge=1, description="Prompts per optimizer step (all ranks); default: data.train_batch_size."
    )
    ppo_epochs: int = Field(1, ge=1)
    ppo_max_token_len_per_gpu: int = Field(
        8192,
        ge=1,
        description="Token budget of one micro-batch per rank. Left unset in a run: 1024 on the CPU; on a GPU the "
        "largest power of two (1024-32768) whose activations fit its memory beside the training state, for this "
        "model (docs/scaling.md), said at start and recorded in the run's config.yaml.",
    )
    share_prompt_prefix: bool = Field(
        True, description="Pack a prompt's n responses behind one copy of it (sdpa/eager attention)."
    )
    grad_clip: float = Field(1.0, gt=0.0)
    clip_ratio: float = Field(0.2, gt=0.0)
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float | None = Field(
        3.0, gt=1.0, description="Dual-clip bound for negative advantages; null: no dual clip (TRL's loss)."
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    entropy_coeff: float = 0.0
    loss_mode: str = Field(
        "vanilla",
        description="Policy loss registered by name: vanilla (token-level ratio: PPO/GRPO/DAPO), or one a plugin "
        "registers with @plugrl.policy_loss (plugrl-advantages: GSPO's sequence-level ratio, LUSPO, CISPO, SAPO).",
    )
    mask_truncated_completions: bool = Field(
        False, description="Leave responses cut at max_response_length out of the loss (DAPO, TRL)."
    )
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "low_var_kl"
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict) and "fsdp_size" in data:  # actor.fsdp_size -> actor.fsdp_config.fsdp_size
            data = dict(data)
            fsdp = data.get("fsdp_config") or {}
            fsdp = dict(fsdp.model_dump() if isinstance(fsdp, BaseModel) else fsdp)
            fsdp.setdefault("fsdp_size", data.pop("fsdp_size"))
            data["fsdp_config"] = fsdp
        return data

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


class RefSection(Section):
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)
    log_prob_max_token_len_per_gpu: int = Field(16384, ge=1)


class CriticModelConfig(Section):
    path: str | None = Field(None, description="Value model initialisation; default: the policy's model.path.")
    enable_gradient_checkpointing: bool = False


class CriticSection(Section):
    """The value model, built when the advantage estimator needs one (e.g. `gae`)."""

    model: CriticModelConfig = Field(default_factory=CriticModelConfig)
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_epochs: int | None = Field(None, ge=1, description="Default: actor.ppo_epochs.")
    ppo_max_token_len_per_gpu: int = Field(
        8192,
        ge=1,
        description="Token budget of one micro-batch per rank. Left unset in a run: 1024 on the CPU; on a GPU the "
        "largest power of two (1024-32768) whose activations fit its memory beside the training state, for this "
        "model (docs/scaling.md), said at start and recorded in the run's config.yaml.",
    )
    cliprange_value: float = Field(0.5, gt=0.0, description="Value clipping around the old values.")
    grad_clip: float = Field(1.0, gt=0.0)
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        "token-mean"
    )
    fsdp_config: FSDPConfig = Field(default_factory=FSDPConfig)


class KLControlConfig(Section):
    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


class AlgorithmSection(Section):
    """The ``algorithm`` section. Estimators may read their own extra keys from ``model_extra``."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    adv_estimator: str = Field("grpo", description="Advantage estimator registered by a plugin.")
    norm_adv_by_std_in_grpo: bool = True
    epsilon: float = Field(1e-6, gt=0.0, description="Added to the group std in grpo.")
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_in_reward: bool = False
    kl_penalty: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "kl"
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig)


class RewardSection(Section):
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Keyword options per reward function name."
    )
    weights: dict[str, float] = Field(default_factory=dict, description="Weight per reward function name.")
    default_weight: float | None = Field(
        None,
        description="The weight of every reward reward.weights does not name, except those their plugin turns off "
        "(weight 0); null: the weight its plugin gives it. --trl-config sets 1.0, TRL's weight of every reward "
        "function.",
    )
    default: str | None = Field(
        None,
        description="A registered reward (by name) for every data_source that no reward's names or patterns match, "
        "as verl's default scorer has a last branch; without it such a data_source is an error at start.",
    )
    extra: list[str] = Field(
        default_factory=list,
        description="Registered rewards (by name) scored on every sample besides those its data_source routes to, "
        "summed with reward.weights, as TRL's reward_funcs score every sample (a reward model beside a rule reward).",
    )
    num_workers: int = Field(1, ge=0, description="Processes for rule-based rewards; 0 runs them inline.")
    timeout_s: float = Field(10.0, gt=0.0, description="Per-sample time limit.")
    error_score: float = Field(0.0, description="Score of a sample whose reward raised or timed out.")
    max_concurrency: int = Field(32, ge=1, description="Concurrent calls of async reward functions.")


class TrainerSection(Section):
    total_steps: int | None = Field(None, ge=1, description="Training steps; default: total_epochs over the data.")
    total_epochs: int = Field(1, ge=1)
    output_dir: str = Field("runs", description="Where run directories go (`default_local_dir` is an alias).")
    project_name: str = "plugrl"
    experiment_name: str = "run"
    logger: list[str] = Field(
        default_factory=lambda: ["console", "jsonl"],
        description="Where metrics go: console, jsonl (metrics.jsonl) and the loggers of installed packages "
        "(entry-point group plugrl.loggers: wandb and tensorboard from plugrl-loggers).",
    )

    @field_validator("logger")
    @classmethod
    def _installed_loggers(cls, value: list[str]) -> list[str]:
        from plugrl.tracking import unknown_loggers

        problem = unknown_loggers(value)
        if problem:  # the message names the key and, for plugrl's own loggers, the package to install
            raise ValueError(problem.removeprefix("trainer.logger: "))
        return value

    log_freq: int = Field(1, ge=1, description="Console metrics line every N steps.")
    table_freq: int | None = Field(
        None,
        ge=1,
        description="With `wandb` in trainer.logger: a table of the step's completions (up to 64: prompt, completion, "
        "reward, details) every N steps and at the last step; default: about ten per run (total_steps // 10).",
    )
    save_freq: int | Literal["end"] = Field(
        "end",
        description="Checkpoint every N steps and at the end; end: only at the end; 0 or -1: never (verl's -1).",
    )
    test_freq: int = Field(-1, description="Validate every N steps; -1 never.")
    val_before_train: bool = False
    val_correct_threshold: float = Field(
        1.0, description="A validation sample counts as correct when its reward is at least this."
    )
    save_rollouts: bool = Field(True, description="Write each step's samples to rollouts/step_N.jsonl.")
    default_local_dir: str | None = Field(
        None,
        description="The run directory itself (verl's key: checkpoints, metrics and samples go here); default "
        "trainer.output_dir/trainer.experiment_name, and checkpoints/{project_name}/{experiment_name} (verl's) "
        "for a run given as overrides only.",
    )
    resume: Literal["auto", "disable"] | str = Field(
        "auto",
        description="auto: continue the newest checkpoint in the run dir; disable: start afresh; a path resumes "
        "from it; resume_path (verl's resume_mode): from trainer.resume_from_path. `resume_mode` is an alias.",
    )
    resume_from_path: str | None = Field(None, description="The checkpoint trainer.resume=resume_path resumes from.")
    max_checkpoints: int = Field(
        2,
        ge=1,
        description="Checkpoints kept: the newest ones that pass their checksums (older ones are deleted only "
        "when this many good ones are newer); a damaged one is renamed to checkpoints/damaged_step_N, never deleted.",
    )
    seed: int = 0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    keep_freed_host_memory: bool | None = Field(
        None,
        description="Tell glibc malloc to keep freed memory for reuse (no mmap'd blocks, no trimming): on CPU each "
        "update's activations otherwise page-fault in again (~20% of the update here, docs/performance.md). "
        "Default: on when training on the CPU, off on GPUs (activations live in GPU memory there, and a host "
        "heap that never shrinks would only hold the offloaded shards' peaks).",
    )
    dist_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="How long a collective waits for a rank that does not come (torch.distributed's timeout, "
        "also for the gloo barrier where ranks wait for rank 0 to write a checkpoint) before the job fails.",
    )
    critic_warmup: int = Field(0, ge=0, description="Steps the critic trains alone before the policy updates.")
    max_bad_steps: int = Field(
        5,
        ge=1,
        description="Stop (with a checkpoint) after this many steps in a row that trained nothing: their updates "
        "skipped for non-finite gradients, or no episode to train on (every one failed at its start; such a step is "
        "skipped and counted in rollout/failed_episodes).",
    )

    @model_validator(mode="after")
    def _resume_path(self) -> TrainerSection:
        if self.resume == "resume_path":  # verl: resume_mode=resume_path resumes from resume_from_path
            if not self.resume_from_path:
                raise ValueError(
                    "trainer.resume_mode=resume_path resumes from trainer.resume_from_path, which is not set: set it "
                    "to a checkpoint (RUN_DIR/checkpoints/step_N), or trainer.resume_mode=auto"
                )
            self.resume = self.resume_from_path
        return self

    @model_validator(mode="before")
    @classmethod
    def _aliases(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = dict(data)
            if "resume_mode" in data:
                data.setdefault("resume", data.pop("resume_mode"))
            if isinstance(data.get("logger"), str):  # `trainer.logger=console`: one logger, as verl reads it
                data["logger"] = [data["logger"]]
        return data

    @property
    def saves(self) -> bool:
        """Whether the run writes checkpoints (save_freq N or end; 0 and verl's -1 write none)."""
        return self.save_freq == "end" or self.save_freq > 0

    @property
    def run_dir(self) -> Path:
        """Where this run writes: trainer.default_local_dir, else trainer.output_dir/trainer.experiment_name."""
        return Path(self.default_local_dir or Path(self.output_dir) / self.experiment_name).expanduser()


class KernelConfig(Section):
    plugins: list[str] = Field(
        default_factory=list,
        description="Plugins this run loads (entry-point names, or module:object). Not set: the installed plugins "
        "that provide what the run names (its estimator, template, dataset, environments, tools, and a reward for "
        "every data_source of its data), said at start.",
    )
    plugin_preference: list[str] = Field(
        default_factory=list,
        description="When plugins is not set and several installed plugins provide one name (a data_source two "
        "plugins score), the first of these that does is loaded; otherwise that is an error naming them.",
    )
    model: ModelSection
    environment: str | dict[str, str] | None = Field(
        None,
        description="Multi-turn episodes: the registered environment for every sample, or {data_source pattern: "
        "environment} routed like rewards (exact name, then globs; a sample no route matches is single-turn).",
    )
    environment_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword options of the environment; with routes, {environment name: options}.",
    )
    data: DataSection = Field(default_factory=DataSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    actor: ActorSection = Field(default_factory=ActorSection)
    ref: RefSection = Field(default_factory=RefSection)
    critic: CriticSection = Field(default_factory=CriticSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    reward: RewardSection = Field(default_factory=RewardSection)
    trainer: TrainerSection = Field(default_factory=TrainerSection)

    @model_validator(mode="after")
    def _check_combinations(self) -> Config:
        mini = self.actor.ppo_mini_batch_size or self.data.train_batch_size
        if mini > self.data.train_batch_size:  # verl's own check, in its words (both count prompts)
            raise ValueError(
                f"data.train_batch_size ({self.data.train_batch_size}) must be >= actor.ppo_mini_batch_size "
                f"({mini}), as verl requires: both count prompts (a mini-batch holds ppo_mini_batch_size x "
                f"rollout.n responses); set actor.ppo_mini_batch_size to at most {self.data.train_batch_size}, "
                "or raise data.train_batch_size"
            )
        if self.data.train_batch_size % mini:
            raise ValueError(
                f"data.train_batch_size ({self.data.train_batch_size}) is not a multiple of "
                f"actor.ppo_mini_batch_size ({mini}); pick a mini-batch size that divides it"
            )
        # an environment of a family (`verifiers:<id>`) may bring its own data: checked once it has loaded
        family_env = isinstance(self.environment, str) and ":" in self.environment
        if not self.data.train_files and not self.data.dataset and not family_env:
            raise ValueError("no training data: set data.train_files or data.dataset")
        return self  # a loss that fixes its aggregation refuses loss_agg_mode at start (policy_losses.check_agg_mode)

    @property
    def multi_turn(self) -> bool:
        """Whether episodes are multi-turn: an environment or tools are configured."""
        return bool(self.environment) or bool(getattr(self.rollout, "tools", None))

    @property
    def mini_batch_size(self) -> int:
        return self.actor.ppo_mini_batch_size or self.data.train_batch_size


def turn_off(section: BaseModel, key: str) -> None:
    """``section.key = False`` as plugrl's choice, not the user's: the key stays out of the fields the user set,
    so the accepted-but-ignored check (``ignored_keys``) does not name it."""
    setattr(section, key, False)
    section.__pydantic_fields_set__.discard(key)


# The run config is the kernel's sections plus the fields installed packages add to them (entry-point group
# plugrl.config_fields), built on first use: ``plugrl.config.Config`` and ``plugrl.config.RolloutConfig`` (...) are
# the built classes, ``KernelConfig`` and ``RolloutSection`` (...) the kernel's own.
FIELDS_GROUP = "plugrl.config_fields"
SECTIONS = {
    "model": (ModelSection, "ModelConfig"),
    "data": (DataSection, "DataConfig"),
    "rollout": (RolloutSection, "RolloutConfig"),
    "actor": (ActorSection, "ActorConfig"),
    "ref": (RefSection, "RefConfig"),
    "critic": (CriticSection, "CriticConfig"),
    "algorithm": (AlgorithmSection, "AlgorithmConfig"),
    "reward": (RewardSection, "RewardConfig"),
    "trainer": (TrainerSection, "TrainerConfig"),
}
if TYPE_CHECKING:  # for type checkers, the built classes are the kernel's (whose fields they all have)
    Config = KernelConfig
    ModelConfig, DataConfig, RolloutConfig = ModelSection, DataSection, RolloutSection
    ActorConfig, RefConfig, CriticConfig = ActorSection, RefSection, CriticSection
    AlgorithmConfig, RewardConfig, TrainerConfig = AlgorithmSection, RewardSection, TrainerSection
PACKAGE_KEYS = own_packages("config key")  # key prefix -> the package of plugrl's own that adds it


@dataclass(frozen=True)
class ConfigFields:
    """What a package adds to the run config: the object an entry point of the group ``plugrl.config_fields`` names.

    ``sections`` maps a section (``rollout``, ``actor``, ``trainer``, ...; ``""`` for the top level) to a pydantic
    model (a :class:`Section`) whose fields and validators join that section's: its keys are then read, checked,
    documented and written to the run's config.yaml like the kernel's. ``ignored(cfg)`` lists the package's keys
    that ``cfg`` sets but that change nothing, each with what plugrl does instead (said at start)."""

    sections: Mapping[str, type[BaseModel]]
    ignored: Callable[[Any], list[str]] | None = None


_building = False
_failed: dict[str, str] = {}  # package -> why its fields did not load


@functools.cache
def installed_fields() -> dict[str, ConfigFields]:
    """The :class:`ConfigFields` of the installed packages, by package. One that fails to load is named in a
    warning and left out (a broken package cannot stop a run that does not use its keys); a key of it is then
    refused with the reason."""
    found = {}
    for ep in sorted(importlib.metadata.entry_points(group=FIELDS_GROUP), key=lambda e: e.name):
        package = ep.dist.name if ep.dist else ep.name
        try:
            fields = ep.load()
            if not isinstance(fields, ConfigFields) or not set(fields.sections) <= {"", *SECTIONS}:
                raise TypeError(f"{ep.value} is no ConfigFields of the sections {['', *SECTIONS]}")
        except Exception as e:
            _failed[package] = f"{type(e).__name__}: {e}"
            log.warning("%s: its config fields (%s) failed to load: %s", package, ep.value, _failed[package])
            continue
        found[package] = fields
    return found


_built: dict[str, type[BaseModel]] = {}


def built_classes() -> dict[str, type[BaseModel]]:
    """The run config's classes, the kernel's sections with every installed package's fields: by public name.
    Built once per process."""
    global _building
    if _built:
        return _built
    _building = True
    try:
        installed = installed_fields()
    finally:
        _building = False
    owner = {key: "the kernel" for key in _known_keys(KernelConfig)}
    for package, fields in installed.items():  # one key, one owner: a second would replace the first
        for key in (f"{s}.{name}".lstrip(".") for s, model in fields.sections.items() for name in model.model_fields):
            first = next((o for k, o in owner.items() if key == k or k.startswith(key + ".")), None)
            if first:
                raise ConfigError(f"{package} adds the config key {key}, which {first} has: uninstall one of them")
            owner[key] = package
    added = [fields.sections for fields in installed.values()]
    built: dict[str, Any] = {}
    for section, (base, name) in SECTIONS.items():
        bases = (*[a[section] for a in added if section in a], base)
        built[name] = type(name, bases, {"__module__": __name__, "__qualname__": name})
    sections = {
        section: (built[name], ... if section == "model" else Field(default_factory=built[name]))
        for section, (_, name) in SECTIONS.items()
    }
    roots = tuple(a[""] for a in added if "" in a)
    built["Config"] = create_model("Config", __base__=(*roots, KernelConfig), __module__=__name__, **sections)
    _built.update(built)
    return _built


_BUILT_NAMES = {"Config", *(name for _, name in SECTIONS.values())}


def __getattr__(name: str) -> Any:
    if name not in _BUILT_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _building:
        raise ImportError(
            f"plugrl.config.{name} was asked for while the config's classes are built: a module of the group "
            f"{FIELDS_GROUP} may import Section and helpers from plugrl.config, not the built classes"
        )
    return built_classes()[name]


def config_model() -> type[KernelConfig]:
    """The run config's class (``plugrl.config.Config``): the kernel's sections and the installed packages' fields."""
    return built_classes()["Config"]


def key_packages() -> dict[str, str]:
    """Each key the installed packages add (``trainer.push_to_hub``; a sub-section: ``actor.lora``), with its
    package."""
    return {
        f"{section}.{name}".lstrip("."): package
        for package, fields in installed_fields().items()
        for section, model in fields.sections.items()
        for name in model.model_fields
    }


def package_of_key(key: str) -> str | None:
    """The plugrl package that owns ``key`` (``rollout.server_urls``: plugrl-rollout-servers), when it is not
    installed; None for any other key."""
    for prefix, package in PACKAGE_KEYS.items():
        if key == prefix or key.startswith(prefix + "."):
            return None if package in installed_fields() else package
    return None


def _unknown_key(key: str, shown: str) -> str:
    """The line of an unknown key: the package to install for a key of a missing package, else a near key."""
    package = package_of_key(key)
    if package in _failed:
        return f"  {shown} is a key of the package {package}, whose config fields failed to load: {_failed[package]}"
    if package:
        return f"  {shown} is a key of the package {package}, which is not installed: {package_hint(package)}"
    return f"  unknown key '{shown}'{_suggest(key)}"


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values

# rollout settings only the vLLM engine reads: named at start when the HF engine generates
VLLM_ONLY = (
    "gpu_memory_utilization",
    "cpu_kv_cache_gb",
    "block_size",
    "tensor_model_parallel_size",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enforce_eager",
    "free_cache_engine",
    "engine_log_level",
)

# Keys whose values are secrets (api_key, openai_api_key, password, client_secret, hf_token).
# "token" anywhere would be too broad (tokenizer_path, ppo_max_token_len_per_gpu): it marks a
# secret only at the end of the key (`token`, `hf_token`, `accessToken`).
_SECRET_RE = re.compile(r"api_?key|secret|passw(or)?d|private_?key|credential|token$|(^|\.)key$|authorization|cookie")
# Secrets recognised by their shape, under any key and inside any text: a password in a URL's user part,
# an HTTP authorization value, and the token formats of the common providers.
_SECRET_SHAPES = (
    (re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)[^@\s/]+(@)"), r"\1***\2"),
    # a credential holds a digit: "Token embeddings" in a log line is left alone
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)(?=[A-Za-z._~+/=-]*[0-9])[A-Za-z0-9._~+/=-]{8,}"), r"\1\2***"),
    (
        re.compile(
            r"\b(?:sk-[A-Za-z0-9_-]{16,}|sk-ant-[A-Za-z0-9_-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
            r"|github_pat_[A-Za-z0-9_]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,})"
        ),
        "***",
    ),
)


MAX_CONFIG_KEYS = 10_000  # far above any real config; YAML aliases can multiply a small file's keys exponentially


def _flatten(tree: dict[str, Any], prefix: str = "", _within: frozenset[int] = frozenset()) -> dict[str, Any]:
    if id(tree) in _within:  # `a: &x {b: *x}`: YAML builds a dict that holds itself
        raise ConfigError(f"config key '{prefix.rstrip('.')}' holds itself (a YAML alias inside its own anchor)")
    flat: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not key.endswith(("options", "dataset_options", "weights")):
            flat.update(_flatten(v, key + ".", _within | {id(tree)}))
        else:
            flat[key] = v
        if len(flat) > MAX_CONFIG_KEYS:  # an alias bomb: stop before it costs minutes and gigabytes
            raise ConfigError(
                f"the config has more than {MAX_CONFIG_KEYS} keys (under '{key}'): YAML aliases that expand "
                "to a huge tree? Write the keys out"
            )
    return flat


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.get(p)
        if not isinstance(child, dict):
            child = node[p] = {}
        node = child
    node[parts[-1]] = value


class _YAMLLoader(yaml.SafeLoader):
    """SafeLoader that reads ``1e-6`` and ``1.0e6`` as floats, as YAML 1.2 (and verl's OmegaConf) do.

    PyYAML follows YAML 1.1, where a float needs a dot and a signed exponent: ``1e-6`` would
    stay a string, which typed fields coerce but ``algorithm`` extras and ``reward.options`` do not.
    """


# Python's spelling of null: `data.prefill=None` would otherwise become the text "None" in every prompt
_YAMLLoader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^None$"), ["N"])
_YAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error on one line: where (line, column) and what (PyYAML's own text spans several lines)."""
    mark = getattr(e, "problem_mark", None)
    what = " ".join(filter(None, [getattr(e, "context", None), getattr(e, "problem", None)])) or str(e)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + " ".join(what.split())


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_YAMLLoader)  # a SafeLoader subclass: builds no arbitrary objects


def parse_override(text: str) -> tuple[str, Any]:
    """``a.b=value`` -> ("a.b", parsed value). Values are parsed as YAML (``[a, b]``, ``true``, ``1e-6``)."""
    key, sep, raw = text.partition("=")
    key = key.strip().lstrip("+")  # hydra's "+key=value" means the same here
    if not sep or not key:  # `hf_token:sk-...`: any word of it may be the secret's key
        shown = text if sep or not any(is_secret_key(w) for w in re.split(r"[\s:]+", text)) else "***"
        raise ConfigError(f"override {shown!r} is not of the form key.sub=value")
    try:
        value = _load_yaml(raw) if raw.strip() else ""
    except Exception as e:  # YAMLError, and what tag constructors raise (`!!float abc`: ValueError)
        if is_secret_key(key):  # never echo a secret, not even in an error
            raise ConfigError(f"override '{key}=***': the value is not valid YAML") from None
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({e})") from None
    return key, value


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _known_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _required_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += _required_keys(ann, f"{prefix}{name}.")
        elif f.is_required():
            keys.append(prefix + name)
    return keys


def _suggest(key: str) -> str:
    """A key of the same meaning as the unknown ``key``, if one is near: a typo of a plugrl key in the same section
    (``actor.optim.lrr``), or its last part under another section (a misplaced ``lr``). Nothing otherwise: a key
    that only looks alike (``actor_rollout_ref.hybrid_engine`` and ``actor.kl_loss_coef``) is no help."""
    known = _known_keys(config_model())
    section, _, leaf = key.rpartition(".")
    same_section = [k for k in known if k.rpartition(".")[0] == section]
    close = difflib.get_close_matches(key, same_section, n=1, cutoff=0.8)
    if not close:
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.9)
    if not close:
        close = [k for k in known if k.rsplit(".", 1)[-1] == leaf][:1]
    return f"; did you mean '{close[0]}'?" if close else ""


def _holds_secret(value: Any, key: str = "") -> bool:
    """Whether ``value`` is, or holds, something under a secret-looking key (cycles and shared YAML aliases
    allowed: each container is looked into once)."""
    seen: set[int] = set()
    todo = [(key, value)]
    while todo:
        k, v = todo.pop()
        if is_secret_key(k) and v:
            return True
        if isinstance(v, (dict, list, tuple)) and id(v) not in seen:
            seen.add(id(v))
            todo.extend((str(kk), vv) for kk, vv in v.items()) if isinstance(v, dict) else todo.extend(
                (k, x) for x in v
            )
    return False


def _shown_input(got: Any, loc: tuple[Any, ...]) -> str:
    """`` (got ...)`` for a message: nothing for a mapping or a secret, at most 200 characters."""
    if isinstance(got, dict) or any(is_secret_key(str(p)) for p in loc) or _holds_secret(got):
        return ""
    try:
        text = repr(got)
    except ValueError:  # an int past Python's 4 300-digit str() limit
        return " (got a number too long to show)"
    return f" (got {text if len(text) <= 200 else text[:200] + '...'})"


def _shown_override(text: str) -> str:
    """An override as typed, or ``key=***`` when its key looks secret or its value holds a secret."""
    key, sep, raw = text.partition("=")
    key = key.strip().lstrip("+")
    try:
        value = _load_yaml(raw)
    except Exception:
        value = raw
    return f"{key}=***" if sep and (is_secret_key(key) or _holds_secret(value, key)) else text


def as_typed(text: str, typed_as: Mapping[str, str]) -> str:
    """``text`` with each plugrl key replaced by the key as the user typed it (``actor.optim.lr`` ->
    ``actor_rollout_ref.actor.optim.lr``), so that a message names what the user wrote."""
    for ours, theirs in sorted(typed_as.items(), key=lambda kv: -len(kv[0])):
        if ours != theirs:
            text = re.sub(rf"(?<![\w.]){re.escape(ours)}(?![\w])", theirs, text)
    return text


def _validation_problems(err: ValidationError, typed_as: Mapping[str, str]) -> list[str]:
    """pydantic's errors, one line each, naming each key as the user typed it."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":  # a section's typed keys by name (verl's lora_rank for actor.lora)
            under = [typed for ours, typed in typed_as.items() if ours.startswith(key + ".")]
            lines += [_unknown_key(key, shown) for shown in under or [as_typed(key, typed_as)]]
        elif e["type"] == "missing":  # a missing section: name the keys it needs (`model` -> `model.path`)
            needed = [k for k in _required_keys(config_model()) if k.startswith(key + ".")] or [key]
            lines.append(f"  '{needed[0]}' is required; set it in the config file or as `{needed[0]}=...`")
        else:
            msg = as_typed(e["msg"].removeprefix("Value error, "), typed_as)
            shown = as_typed(key, typed_as) or "config"
            lines.append(f"  {shown}: {msg}{_shown_input(e.get('input'), e['loc'])}")
    return lines


# plugrl keys that its validators move to their place: keys as much as the fields themselves
ALIASES = (
    "rollout.engine",
    "rollout.enable_sleep_mode",
    "actor.optim.lr_warmup_steps",
    "critic.optim.lr_warmup_steps",
    "actor.fsdp_size",
    "trainer.resume_mode",
)


def _holds_free_keys(annotation: Any) -> bool:
    """Whether a field's type is (or may be) a mapping whose keys are the user's (``reward.options``)."""
    if typing.get_origin(annotation) is dict:
        return True
    return any(_holds_free_keys(a) for a in typing.get_args(annotation))


def is_plugrl_key(key: str) -> bool:
    """Whether ``key`` is a plugrl key: a field of :class:`Config` or a section of it, an alias its validators move,
    a key inside a free-form mapping (``reward.options.judge.model``), or an estimator's own ``algorithm`` option or a
    key inside its mapping of options, named ``*_options`` as every such mapping is (``algorithm.classifier_options.
    base_url``); those are checked against the estimator's declaration once the plugins load. Any other key inside an
    unknown ``algorithm`` key is not plugrl's (verl's ``algorithm.pf_ppo.*``)."""
    if key in ALIASES:
        return True
    model: type[BaseModel] = config_model()
    parts = key.split(".")
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return issubclass(model, AlgorithmSection) and (
                i == len(parts) - 1 or (i == 1 and part.endswith("_options"))
            )
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            continue
        return i == len(parts) - 1 or _holds_free_keys(annotation)
    return True


def _refusal(fate: Fate) -> str:
    if fate.unknown:
        return _unknown_key(fate.key, fate.key)
    shown = "***" if is_secret_key(fate.key) else _shown_input(fate.value, ()).removeprefix(" (got ").removesuffix(")")
    return f"  {fate.key}={shown or '...'} is not supported: {fate.why}"


NO_DEFAULT = object()


def plugrl_default(key: str) -> Any:
    """plugrl's own default of a plugrl key (``critic.optim.lr``: 1e-5), or ``NO_DEFAULT``."""
    built = built_classes()
    node: Any = built["Config"].model_construct(
        model=built["ModelConfig"].model_construct()
    )  # every section with its defaults
    for part in key.split("."):
        if not isinstance(node, BaseModel) or part not in type(node).model_fields:
            return NO_DEFAULT
        node = getattr(node, part, NO_DEFAULT)
    return node


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return type(a) is type(b) and a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b)


def translate(
    items: list[tuple[str, Any]], base: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], list[Fate], dict[str, str], set[str]]:
    """``key=value`` items as typed (a file's keys, then the overrides) -> the plugrl tree, each typed key's
    :class:`Fate`, which typed key each plugrl key came from, and the plugrl keys only ``base`` set. ``base``:
    defaults applied first, in the same spellings (verl's, for a run given as overrides only); their fates are not
    the user's and are left out, and one equal to plugrl's own default is not applied at all. What keys mean
    together, beyond one plugrl key each, the readers then settle in the tree (:func:`plugrl.readers.settle`)."""
    merged: dict[str, Any] = {}
    fates: list[Fate] = []
    read: list[Fate] = []  # every item's, the defaults' too: what the readers settle together
    typed_as: dict[str, str] = {}
    from_base: set[str] = set()
    for key, value, typed in [(k, v, False) for k, v in (base or {}).items()] + [(k, v, True) for k, v in items]:
        fate = fate_of(key, value, is_plugrl_key) or Fate(key, value, "refused", unknown=True)
        read.append(fate)
        if typed:
            fates.append(fate)
        if fate.kind != "acted" or not fate.target or fate.settled:
            continue
        if not typed and _same_value(plugrl_default(fate.target), fate.plugrl_value):
            continue  # the base's default is plugrl's: nothing to set
        _set(merged, fate.target, fate.plugrl_value)
        if typed:
            typed_as[fate.target] = key
        else:
            from_base.add(fate.target)
    settle(merged, read)
    return merged, fates, typed_as, from_base - set(typed_as)


def _unset(section: BaseModel, keys: set[str], prefix: str = "") -> bool:
    """Take the plugrl keys ``keys`` (set by verl's defaults, not by the user) out of the fields the user set, in
    ``section`` and below, so that checks of what the user set (``critic.*`` without a critic) see only theirs.
    Returns whether anything under ``section`` is still the user's."""
    for name in list(section.model_fields_set):
        value = getattr(section, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            if not _unset(value, keys, key + "."):
                section.__pydantic_fields_set__.discard(name)
        elif key in keys:
            section.__pydantic_fields_set__.discard(name)
    return bool(section.model_fields_set)


def build_config(
    tree: dict[str, Any], overrides: Sequence[str] = (), origin: str = "", *, base: Mapping[str, Any] | None = None
) -> Config:
    """Validate a config tree plus ``key=value`` overrides into a :class:`Config`. Keys may be plugrl's or another
    project's (the installed config readers give each its fate: :mod:`plugrl.readers`); ``base`` holds defaults
    under the tree (verl's, for a run given as overrides only). Every problem is a :class:`ConfigError` naming the
    key as typed; the error, and the config, carry each typed key's fate (``fates``), which ``plugrl train
    --check`` prints."""
    tree = copy.deepcopy(tree)  # _set writes into sub-dicts of the tree (`reward.options`): keep the caller's intact
    typed = list(_flatten(tree).items()) + [parse_override(o) for o in overrides]
    merged, fates, typed_as, from_base = translate(typed, base)
    where = f"invalid config{' ' + origin if origin else ''}"
    problems = [_refusal(f) for f in fates if f.kind == "refused"]
    try:
        cfg = config_model().model_validate(merged)
    except ValidationError as e:  # every problem at once: the refused keys', then the values'
        problems += _validation_problems(e, typed_as)
    hint = unknown_keys_hint() if any(p.startswith("  unknown key") for p in problems) else None
    if hint:  # a verl or TRL key, and the package that reads them is not installed
        problems.append(f"  {hint}")
    if problems:
        error = ConfigError(f"{where}:\n" + "\n".join(problems))
        error.fates = fates
        raise error
    try:  # what the run directory keeps: free-form values (dataset_options, reward.options) must be writable
        dump_config(cfg)
    except (ValueError, RecursionError) as e:  # PydanticSerializationError is a ValueError
        raise ConfigError(
            f"{where}: a value cannot be written down ({type(e).__name__}: {e}); free-form options take plain "
            "values (no alias inside its own anchor, no integer over 4300 digits)"
        ) from None
    _unset(cfg, from_base)
    cfg._key_fates = fates  # type: ignore[attr-defined]
    cfg._typed_as = typed_as  # type: ignore[attr-defined]
    cfg._ignored_verl_keys = [f.key for f in fates if f.kind == "not acted"]  # type: ignore[attr-defined]
    cfg._not_acted_because = {f.key: f.why for f in fates if f.kind == "not acted"}  # type: ignore[attr-defined]
    return cfg


def ignored_keys(cfg: Config) -> list[str]:
    """Every key the config set that plugrl accepts but does not act on, each with what plugrl does instead (the
    start-up warning): verl keys it takes as written, and those the installed packages name (:class:`ConfigFields`:
    the fields plugrl-compat keeps only for verl's sake, ...)."""
    because = getattr(cfg, "_not_acted_because", {})
    out = [f"{k} ({because.get(k, 'not needed here')})" for k in getattr(cfg, "_ignored_verl_keys", [])]
    if cfg.rollout.val_kwargs.do_sample is not None:
        out.append("rollout.val_kwargs.do_sample (val_kwargs.temperature decides: 0 is greedy)")
    out += [line for fields in installed_fields().values() if fields.ignored for line in fields.ignored(cfg)]
    if cfg.rollout.name == "hf":
        out += [
            f"rollout.{name} (a vLLM setting; rollout.name is hf)"
            for name in VLLM_ONLY
            if name in cfg.rollout.model_fields_set
        ]
    return [as_typed(text, getattr(cfg, "_typed_as", {})) for text in out]


def read_yaml_mapping(path: str | os.PathLike[str], what: str = "config file", holds: str = "sections") -> dict:
    """The mapping a YAML file holds; a :class:`ConfigError` naming ``what`` and the file for a missing,
    unreadable, non-UTF-8 or invalid file, a value its tag cannot read, or a top level that is no mapping of
    ``holds``. Shared by plugrl configs and ``--trl-config`` files."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(p)!r} does not exist")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{what} {str(p)!r} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); save it as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"{what} {str(p)!r} cannot be read: {e.strerror or e}") from None
    try:
        tree = _load_yaml(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} {str(p)!r} is not valid YAML: {_yaml_problem(e)}") from None
    except Exception as e:  # what a tag's constructor raises (`!!int abc`: ValueError; `!!timestamp x`: ...)
        raise ConfigError(
            f"{what} {str(p)!r}: a value cannot be read as its YAML tag says ({type(e).__name__}: {e}); "
            "remove the tag (e.g. !!int) or fix the value"
        ) from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{what} {str(p)!r} must hold a mapping of {holds}, got {type(tree).__name__}")
    return tree


def load_config(path: str | os.PathLike[str], overrides: list[str] = (), *, run_record: bool = False) -> Config:
    """Read a YAML config file and apply dotted ``key=value`` overrides. ``run_record``: the file is a run's
    ``config.yaml``, which writes every key: the keys of plugrl's packages that are not installed here are left
    out, with a warning, rather than refused (``plugrl eval`` of a DAPO run's checkpoint without plugrl-dapo)."""
    p = Path(path)
    tree = read_yaml_mapping(p)
    if run_record:
        _leave_out_missing_packages(tree, p)
    shown = [_shown_override(o) for o in overrides]  # never a secret's value, not even in an error
    return build_config(tree, overrides, origin=f"in {p}" + (f" with overrides {shown}" if overrides else ""))


def _leave_out_missing_packages(tree: dict[str, Any], path: Path) -> None:
    """Take the keys of plugrl's packages that are not installed (:data:`PACKAGE_KEYS`) out of ``tree``, saying so."""
    left = []
    for key, package in PACKAGE_KEYS.items():
        if package in installed_fields():
            continue
        *sections, name = key.split(".")
        node: Any = tree
        for part in sections:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and name in node:
            del node[name]
            left.append(f"{key} ({package})")
    if left:
        log.warning("%s: keys of packages not installed here, left out: %s", path, ", ".join(left))


def redact(value: Any, key: str = "") -> Any:
    """A copy of ``value`` with anything under a secret-looking key replaced by '***', and secrets recognised
    by their shape masked in every string (:func:`redact_text`)."""
    if is_secret_key(key) and value:
        return "***"  # the whole value, also when it is a dict or list
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, key) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


def redact_text(text: str) -> str:
    """``text`` with secrets recognised by their shape masked: the password of ``scheme://user:PASSWORD@host``,
    ``Bearer``/``Basic``/``token`` credentials, and provider tokens (``sk-...``, ``hf_...``, ``ghp_...``,
    ``xoxb-...``, ``AKIA...``, ``AIza...``)."""
    for pattern, replacement in _SECRET_SHAPES:
        text = pattern.sub(replacement, text)
    return text


class RedactSecrets:
    """A logging filter that masks secrets recognised by their shape in every record it passes (the message
    after formatting its arguments); install it on the handlers that write the logs."""

    def filter(self, record: Any) -> bool:
        message = record.getMessage()
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, ()
        return True


def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    # `api_key_env` names an environment variable, not a secret
    return bool(_SECRET_RE.search(lowered)) and not lowered.endswith(("_env", "_var"))


def dump_config(cfg: Config) -> str:
    """The resolved config as YAML, secrets redacted; what the run directory keeps."""
    tree = redact(json.loads(cfg.model_dump_json()))
    return yaml.safe_dump(tree, sort_keys=False)
