"""verl's command line in plugrl: the fate of every key of verl's trainer config, and verl's defaults.

A verl script is a list of ``key=value`` overrides on verl's ``ppo_trainer.yaml``. :func:`fate_of` gives each key
as typed one of three fates: **acted** (it becomes a plugrl key, or its value is what plugrl does anyway),
**not acted** (accepted so the script runs as written; what plugrl does instead is said at start) or **refused**
(plugrl cannot honour the value; the message says what to do). :data:`VERL_DEFAULTS` are verl's defaults for the
keys plugrl acts on, the base of a run given as overrides only (``plugrl train key=value ...``).

The keys are those of verl 0.9.1 (``verl/trainer/config/_generated_ppo_trainer.yaml``) and the older spellings
verl's example scripts still use; tests/test_verl_keys.py reads verl's own file and checks every key has a fate
here and every default equals verl's. :class:`Fate` is the kernel's record (:mod:`plugrl.readers`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugrl.readers import Fate
from plugrl_compat.verl_rollout_correction import VERL_ROLLOUT_CORRECTION_KEYS as ROLLOUT_CORRECTION


@dataclass(frozen=True)
class Rule:
    """A verl key (or an fnmatch pattern of them). ``target``: the plugrl key it becomes (``*`` in the pattern is
    carried over); ``accepts``: the values at which it changes nothing here (others are refused with ``why``);
    neither: accepted and not acted on, ``why`` saying what plugrl does instead. ``convert`` turns verl's value
    into plugrl's (``-1`` meaning "none" in verl, a single logger name, ...)."""

    pattern: str
    target: str | None = None
    why: str = ""
    accepts: tuple[Any, ...] | None = None
    convert: Callable[[Any], Any] | None = None


def _none_if_negative(value: Any) -> Any:
    """verl writes "no limit" as -1 (``data.train_max_samples``)."""
    return None if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0 else value


def _a_list(value: Any) -> Any:
    """``trainer.logger=console`` (one name) is the list [console], as verl's OmegaConf reads it."""
    return [value] if isinstance(value, str) else value


def _with_jsonl(value: Any) -> Any:
    """verl's loggers, plus plugrl's metrics.jsonl in the run directory (what `plugrl report` reads)."""
    names = _a_list(value)
    if isinstance(names, list) and "jsonl" not in names:
        return [*names, "jsonl"]
    return names


ARR = "actor_rollout_ref"
PROFILING = "profiling in verl's workers; plugrl has none built in (torch.profiler around `plugrl train`, bench/)"
CHECKPOINT = "plugrl's checkpoints always hold the model, the optimizer and the trainer's state (docs/reliability.md)"
KERNELS = "a kernel or memory option of verl's workers; plugrl packs sequences with its own attention kernels"
MICRO = "plugrl makes micro-batches by token budget (actor.ppo_max_token_len_per_gpu)"
FSDP = "plugrl wraps every decoder layer with FSDP2 under torchrun"
RAY = "plugrl runs under torchrun, not Ray"
COLOCATED = "plugrl's engine runs in each training process (rollout.mode=colocate), or on rollout servers"
ONE_LOOP = "plugrl has one training loop (one-step-off-policy: trainer.off_policy_steps=1)"
VLLM_OWN = "vLLM's own default here"

# Rules, first match wins; an exact key before a pattern. Keys in plugrl's own spelling (actor.optim.lr) need none.
RULES: tuple[Rule, ...] = (
    # ---- the model
    Rule(f"{ARR}.model.path", "model.path"),
    Rule(f"{ARR}.model.tokenizer_path", "model.tokenizer_path"),
    Rule(f"{ARR}.model.trust_remote_code", "model.trust_remote_code"),
    Rule(f"{ARR}.model.enable_gradient_checkpointing", "model.enable_gradient_checkpointing"),
    Rule(f"{ARR}.model.use_remove_padding", "model.use_remove_padding"),
    Rule(f"{ARR}.model.override_config", "model.override_config"),
    Rule(f"{ARR}.model.override_config.*", "model.override_config.*"),
    Rule(f"{ARR}.model.lora_rank", "actor.lora.r"),
    Rule(f"{ARR}.model.lora_alpha", "actor.lora.alpha"),
    Rule(f"{ARR}.model.target_modules", "actor.lora.target_modules"),
    Rule(
        f"{ARR}.model.exclude_modules",
        accepts=(None,),
        why="plugrl's LoRA has no excluded modules: name the "
        "modules that get adapters in actor_rollout_ref.model.target_modules",
    ),
    Rule(
        f"{ARR}.model.lora_adapter_path",
        accepts=(None,),
        why="plugrl starts LoRA from fresh adapters; merge the "
        "adapter into the model (`plugrl export --merge`) and start from that",
    ),
    Rule(
        f"{ARR}.model.lora.rank",
        accepts=(0,),
        why="Megatron's LoRA block; with FSDP set actor_rollout_ref.model.lora_rank",
    ),
    Rule(f"{ARR}.model.lora.*", why="Megatron's LoRA block (its rank is 0: no adapters)"),
    Rule(
        f"{ARR}.model.hf_config_path",
        accepts=(None,),
        why="plugrl reads the config beside the weights; put config.json in actor_rollout_ref.model.path",
    ),
    Rule(
        f"{ARR}.model.custom_chat_template",
        accepts=(None,),
        why="plugrl renders with the tokenizer's chat "
        "template: save yours in the tokenizer's folder (tokenizer_config.json's chat_template)",
    ),
    Rule(
        f"{ARR}.model.external_lib",
        accepts=(None,),
        why='plugrl imports plugins by name: list your module in plugins=["your_module:"]',
    ),
    Rule(f"{ARR}.model.use_shm", why="plugrl reads the model from its folder"),
    Rule(
        f"{ARR}.model.enable_activation_offload",
        why="plugrl keeps activations on the device; "
        "actor_rollout_ref.model.enable_gradient_checkpointing saves their memory",
    ),
    Rule(f"{ARR}.model.use_liger", why=KERNELS),
    Rule(f"{ARR}.model.use_fused_kernels", why=KERNELS),
    Rule(f"{ARR}.model.fused_kernel_options.*", why=KERNELS),
    Rule(f"{ARR}.model.tiled_mlp.enabled", accepts=(False,), why="plugrl has no tiled MLP"),
    Rule(f"{ARR}.model.tiled_mlp.*", why="plugrl has no tiled MLP"),
    Rule(f"{ARR}.model.mtp.enable", accepts=(False,), why="plugrl does not train multi-token prediction heads"),
    Rule(f"{ARR}.model.mtp.*", why="multi-token prediction is off"),
    # ---- the actor
    Rule(f"{ARR}.actor.policy_loss.loss_mode", "actor.loss_mode"),
    Rule(
        f"{ARR}.actor.policy_loss.*",
        why="options of loss modes plugrl does not have (clip_cov, kl_cov, ...); unused by its losses",
    ),
    Rule(
        f"{ARR}.actor.strategy",
        accepts=("fsdp", "fsdp2"),
        why="plugrl trains with FSDP2 (actor.tp_size for tensor parallelism); Megatron is not supported",
    ),
    Rule(f"{ARR}.actor.optim.clip_grad", "actor.grad_clip"),
    Rule(f"{ARR}.actor.optim.lr_warmup_steps", "actor.optim.warmup_steps", convert=_none_if_negative),
    Rule(f"{ARR}.actor.optim.lr_warmup_steps_ratio", "actor.optim.warmup_steps_ratio"),
    Rule(f"{ARR}.actor.optim.warmup_style", "actor.optim.lr_scheduler"),
    Rule(f"{ARR}.actor.optim.lr_scheduler_type", "actor.optim.lr_scheduler"),
    Rule(f"{ARR}.actor.optim.optimizer", accepts=("AdamW", "adamw"), why="plugrl's optimizer is torch's AdamW"),
    Rule(f"{ARR}.actor.optim.optimizer_impl", accepts=("torch.optim",), why="plugrl's optimizer is torch's AdamW"),
    Rule(
        f"{ARR}.actor.optim.override_optimizer_config",
        accepts=(None, {}),
        why="plugrl's AdamW takes actor.optim.lr, weight_decay, betas and eps",
    ),
    Rule(f"{ARR}.actor.optim.num_cycles", accepts=(0.5,), why="plugrl's cosine schedule is half a cycle"),
    Rule(f"{ARR}.actor.optim.total_training_steps", why="verl's trainer fills it in; plugrl counts the steps itself"),
    Rule(f"{ARR}.actor.optim.zero_indexed_step", why="plugrl's schedule counts from step 0"),
    Rule(f"{ARR}.actor.ppo_micro_batch_size", why=MICRO),
    Rule(f"{ARR}.actor.ppo_micro_batch_size_per_gpu", why=MICRO),
    Rule(f"{ARR}.actor.use_dynamic_bsz", why="micro-batches are always by token budget"),
    Rule(f"{ARR}.actor.fsdp_config.fsdp_size", "actor.fsdp_config.fsdp_size"),
    Rule(f"{ARR}.actor.fsdp_config.param_offload", "actor.fsdp_config.param_offload"),
    Rule(f"{ARR}.actor.fsdp_config.optimizer_offload", "actor.fsdp_config.optimizer_offload"),
    Rule(f"{ARR}.actor.fsdp_config.reshard_after_forward", "actor.fsdp_config.reshard_after_forward"),
    Rule(f"{ARR}.actor.fsdp_config.grad_offload", why="gradients follow actor.fsdp_config.param_offload"),
    Rule(
        f"{ARR}.actor.fsdp_config.model_dtype",
        accepts=("fp32", "float32"),
        why="plugrl keeps float32 master weights (model.dtype sets the compute dtype)",
    ),
    Rule(f"{ARR}.actor.fsdp_config.strategy", accepts=("fsdp", "fsdp2"), why="plugrl shards with FSDP2"),
    Rule(f"{ARR}.actor.fsdp_config.qat.enable", accepts=(False,), why="plugrl does not train quantization-aware"),
    Rule(f"{ARR}.actor.qat.enable", accepts=(False,), why="plugrl does not train quantization-aware"),
    Rule(f"{ARR}.actor.fsdp_config.*", why=FSDP),
    Rule(f"{ARR}.actor.qat.*", why="quantization-aware training is off"),
    Rule(f"{ARR}.actor.checkpoint.*", why=CHECKPOINT),
    Rule(f"{ARR}.actor.profiler.*", why=PROFILING),
    Rule(f"{ARR}.actor.megatron.*", why="Megatron settings; plugrl trains with FSDP2"),
    Rule(f"{ARR}.actor.rollout_n", why="verl copies actor_rollout_ref.rollout.n here"),
    Rule(
        f"{ARR}.actor.loss_scale_factor",
        accepts=(None,),
        why="plugrl's losses are normalised by actor.loss_agg_mode alone",
    ),
    Rule(f"{ARR}.actor.tau_pos", "actor.tau_pos"),  # SAPO's temperatures (actor.loss_mode sapo)
    Rule(f"{ARR}.actor.tau_neg", "actor.tau_neg"),
    Rule(
        f"{ARR}.actor.ulysses_sequence_parallel_size",
        why="plugrl has no Ulysses sequence parallelism; long "
        "sequences: actor.tp_size, actor.ppo_max_token_len_per_gpu",
    ),
    Rule(f"{ARR}.actor.shuffle", why="plugrl takes each mini-batch's micro-batches in order"),
    Rule(f"{ARR}.actor.data_loader_seed", why="plugrl's data order follows data.seed"),
    Rule(f"{ARR}.actor.use_remove_padding", why="plugrl always trains on packed sequences"),
    Rule(f"{ARR}.actor.calculate_entropy", why="plugrl computes the entropy metric anyway"),
    Rule(f"{ARR}.actor.calculate_sum_pi_squared", why="a diagnostic plugrl does not compute"),
    Rule(f"{ARR}.actor.use_prefix_grouper", why="plugrl shares a prompt's prefix itself (actor.share_prompt_prefix)"),
    Rule(f"{ARR}.actor.use_torch_compile", why=KERNELS),
    Rule(f"{ARR}.actor.use_fused_kernels", why=KERNELS),
    Rule(f"{ARR}.actor.entropy_from_logits_with_chunking", why=KERNELS),
    Rule(f"{ARR}.actor.entropy_from_logits_chunk_size", why=KERNELS),
    Rule(f"{ARR}.actor.entropy_checkpointing", why=KERNELS),
    Rule(f"{ARR}.actor.pad_to_length", why=KERNELS),
    # ---- the reference model
    Rule(f"{ARR}.ref.log_prob_max_token_len_per_gpu", "ref.log_prob_max_token_len_per_gpu"),
    Rule(f"{ARR}.ref.fsdp_config.param_offload", "ref.fsdp_config.param_offload"),
    Rule(f"{ARR}.ref.fsdp_config.reshard_after_forward", "ref.fsdp_config.reshard_after_forward"),
    Rule(f"{ARR}.ref.fsdp_config.fsdp_size", "ref.fsdp_config.fsdp_size"),
    Rule(
        f"{ARR}.ref.fsdp_config.model_dtype",
        accepts=("fp32", "float32"),
        why="plugrl holds the reference model as the policy",
    ),
    Rule(f"{ARR}.ref.fsdp_config.qat.enable", accepts=(False,), why="plugrl does not train quantization-aware"),
    Rule(f"{ARR}.ref.fsdp_config.*", why=FSDP),
    Rule(f"{ARR}.ref.log_prob_micro_batch_size", why="log-prob passes by token budget"),
    Rule(f"{ARR}.ref.log_prob_micro_batch_size_per_gpu", why="log-prob passes by token budget"),
    Rule(f"{ARR}.ref.log_prob_use_dynamic_bsz", why="log-prob passes are always by token budget"),
    Rule(f"{ARR}.ref.profiler.*", why=PROFILING),
    Rule(f"{ARR}.ref.megatron.*", why="Megatron settings; plugrl trains with FSDP2"),
    Rule(f"{ARR}.ref.*", why="verl copies these from the actor's settings; plugrl's reference follows the actor"),
    # ---- the rollout engine
    Rule(f"{ARR}.rollout.engine", "rollout.name"),
    Rule(f"{ARR}.rollout.name", "rollout.name"),
    Rule(f"{ARR}.rollout.multi_turn.max_assistant_turns", "rollout.max_turns"),
    Rule(f"{ARR}.rollout.multi_turn.format", "rollout.tool_parser"),
    Rule(f"{ARR}.rollout.multi_turn.max_parallel_calls", "rollout.max_tool_calls_per_turn"),
    Rule(f"{ARR}.rollout.multi_turn.max_tool_response_length", "rollout.max_tool_response_chars"),
    Rule(f"{ARR}.rollout.multi_turn.enable", why="multi-turn is on when environment or rollout.tools is set"),
    Rule(
        f"{ARR}.rollout.multi_turn.tool_config_path",
        accepts=(None,),
        why="verl's tool classes need verl; "
        "plugrl's tools are plugin functions named in rollout.tools (docs/environments.md)",
    ),
    Rule(
        f"{ARR}.rollout.multi_turn.function_tool_path",
        accepts=(None,),
        why="plugrl's tools are plugin functions (@plugrl.tool) named in rollout.tools",
    ),
    Rule(
        f"{ARR}.rollout.multi_turn.interaction_config_path",
        accepts=(None,),
        why="verl's interactions need verl; plugrl's multi-turn partners are environments (docs/environments.md)",
    ),
    Rule(
        f"{ARR}.rollout.multi_turn.max_user_turns",
        why="an environment decides its own turns (rollout.max_turns bounds the policy's)",
    ),
    Rule(
        f"{ARR}.rollout.multi_turn.*",
        why="plugrl writes every turn with the tokenizer's chat template and "
        "trains on the sampled tokens exactly (docs/environments.md)",
    ),
    Rule(f"{ARR}.rollout.mode", why=COLOCATED),
    Rule(f"{ARR}.rollout.nnodes", why="torchrun decides"),
    Rule(f"{ARR}.rollout.n_gpus_per_node", why="torchrun decides"),
    Rule(f"{ARR}.rollout.prompt_length", why="plugrl takes data.max_prompt_length"),
    Rule(f"{ARR}.rollout.response_length", why="plugrl takes data.max_response_length"),
    Rule(
        f"{ARR}.rollout.max_model_len",
        why="plugrl sizes vLLM's context as data.max_prompt_length + data.max_response_length",
    ),
    Rule(f"{ARR}.rollout.ignore_eos", accepts=(False,), why="plugrl's engines stop at the end-of-sequence token"),
    Rule(
        f"{ARR}.rollout.do_sample",
        accepts=(True,),
        why="plugrl samples; for greedy decoding set actor_rollout_ref.rollout.temperature=0",
    ),
    Rule(
        f"{ARR}.rollout.over_sample_rate", accepts=(0, 0.0), why="plugrl generates exactly rollout.n samples per prompt"
    ),
    Rule(
        f"{ARR}.rollout.data_parallel_size",
        accepts=(1,),
        why="plugrl runs one engine per rollout.tensor_model_parallel_size ranks",
    ),
    Rule(f"{ARR}.rollout.expert_parallel_size", accepts=(1,), why="plugrl's engines have no expert parallelism"),
    Rule(
        f"{ARR}.rollout.pipeline_model_parallel_size", accepts=(1,), why="plugrl's engines have no pipeline parallelism"
    ),
    Rule(
        f"{ARR}.rollout.logprobs_mode",
        accepts=("processed_logprobs",),
        why="plugrl asks vLLM for the log-probs of the distribution it sampled from (processed_logprobs)",
    ),
    Rule(f"{ARR}.rollout.quantization", accepts=(None,), why="plugrl's engines run the policy's own weights"),
    Rule(f"{ARR}.rollout.quantization_config_file", accepts=(None,), why="plugrl's engines run the policy's weights"),
    Rule(f"{ARR}.rollout.disaggregation.enabled", accepts=(False,), why="plugrl's engines are not disaggregated"),
    Rule(f"{ARR}.rollout.disaggregation.*", why="plugrl's engines are not disaggregated"),
    Rule(f"{ARR}.rollout.enable_rollout_routing_replay", accepts=(False,), why="plugrl has no MoE routing replay"),
    Rule(
        f"{ARR}.rollout.engine_kwargs.*",
        accepts=(None, {}),
        why="plugrl passes no extra engine arguments; the "
        "engine's settings are the rollout.* keys (docs/configuration.md)",
    ),
    Rule(f"{ARR}.rollout.log_prob_micro_batch_size", why="log-prob passes by token budget"),
    Rule(f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu", why="log-prob passes by token budget"),
    Rule(f"{ARR}.rollout.log_prob_use_dynamic_bsz", why="log-prob passes are always by token budget"),
    Rule(
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
        why="the old log-probs come from the actor, by actor.ppo_max_token_len_per_gpu",
    ),
    Rule(f"{ARR}.rollout.full_determinism", why="plugrl seeds each engine once (rollout.seed)"),
    Rule(f"{ARR}.rollout.cudagraph_capture_sizes", why=VLLM_OWN),
    Rule(f"{ARR}.rollout.enable_chunked_prefill", why=VLLM_OWN),
    Rule(f"{ARR}.rollout.enable_prefix_caching", why=VLLM_OWN),
    Rule(f"{ARR}.rollout.scheduling_policy", why=VLLM_OWN),
    Rule(f"{ARR}.rollout.disable_log_stats", why="rollout.engine_log_level sets vLLM's logging"),
    Rule(f"{ARR}.rollout.load_format", why="plugrl's engine loads the policy's weights, then takes each update's"),
    Rule(f"{ARR}.rollout.layered_summon", why="plugrl gathers the weights layer by layer anyway"),
    Rule(f"{ARR}.rollout.multi_stage_wake_up", why="plugrl wakes the engine's weights, then its KV cache"),
    Rule(f"{ARR}.rollout.skip_tokenizer_init", why="plugrl's engine takes token ids"),
    Rule(f"{ARR}.rollout.router_config_path", why=COLOCATED),
    Rule(f"{ARR}.rollout.agent.*", why="plugrl's agents are environments (docs/environments.md)"),
    Rule(f"{ARR}.rollout.checkpoint_engine.*", why="plugrl sends weights to its engine in memory"),
    Rule(f"{ARR}.rollout.trace.*", why="plugrl writes every sample to the run's rollouts/step_N.jsonl"),
    Rule(f"{ARR}.rollout.prometheus.*", why="plugrl logs its metrics to console, metrics.jsonl, wandb, TensorBoard"),
    Rule(f"{ARR}.rollout.moe_load_balance_metrics_interval", why="plugrl reports no MoE metrics"),
    Rule(f"{ARR}.rollout.mtp", why="multi-token prediction is off"),
    Rule(f"{ARR}.rollout.qat", why="quantization-aware training is off"),
    Rule(f"{ARR}.rollout.profiler.*", why=PROFILING),
    Rule(f"{ARR}.rollout.val_kwargs.do_sample", why="val_kwargs.temperature decides: 0 is greedy"),
    Rule(f"{ARR}.hybrid_engine", accepts=(True,), why=COLOCATED),
    Rule(f"{ARR}.nccl_timeout", "trainer.dist_timeout_s"),
    Rule(f"{ARR}.*.profiler.*", why=PROFILING),
    # ---- data
    Rule("data.seed", "data.seed", convert=lambda v: 0 if v is None else v),  # verl's null: its sampler's default
    Rule("data.train_max_samples", "data.max_samples", convert=_none_if_negative),
    Rule("data.val_max_samples", "data.val_max_samples", convert=_none_if_negative),
    Rule("data.reward_fn_key", accepts=("data_source",), why="plugrl routes rewards by each row's data_source"),
    Rule("data.val_batch_size", why="validation generates every prompt at once"),
    Rule(
        "data.tokenizer",
        accepts=(None,),
        why="plugrl tokenizes with the model's tokenizer (actor_rollout_ref.model.tokenizer_path)",
    ),
    Rule(
        "data.custom_cls.path",
        accepts=(None,),
        why="plugrl's datasets are plugins: a @plugrl.dataset function named in data.dataset",
    ),
    Rule(
        "data.custom_cls.name",
        accepts=(None,),
        why="plugrl's datasets are plugins: a @plugrl.dataset function named in data.dataset",
    ),
    Rule("data.validation_shuffle", accepts=(False,), why="plugrl validates on the rows in their order"),
    Rule("data.video_key", why="plugrl's vision runs take images (data.image_key)"),
    Rule("data.audio_key", why="plugrl's runs take text and images"),
    Rule("data.use_shm", why="plugrl reads the data files where they are"),
    Rule("data.dataloader_num_workers", why="plugrl reads and encodes the data once, at start"),
    Rule("data.filter_overlong_prompts_workers", why="plugrl reads and encodes the data once, at start"),
    Rule("data.return_raw_input_ids", why="plugrl encodes prompts itself"),
    Rule("data.return_raw_chat", why="plugrl encodes prompts itself"),
    Rule("data.return_full_prompt", why="plugrl encodes prompts itself"),
    Rule("data.return_multi_modal_inputs", why="plugrl encodes prompts itself"),
    Rule("data.image_patch_size", why="plugrl takes the patch size from the model's processor"),
    Rule("data.trust_remote_code", why="actor_rollout_ref.model.trust_remote_code decides"),
    Rule("data.tool_config_path", why="verl copies it from multi_turn.tool_config_path"),
    Rule("data.function_tool_path", why="verl copies it from multi_turn.function_tool_path"),
    Rule("data.mm_processor_kwargs", accepts=(None, {}), why="plugrl calls the processor with its defaults"),
    Rule("data.apply_chat_template_kwargs", "data.apply_chat_template_kwargs"),
    Rule("data.apply_chat_template_kwargs.*", "data.apply_chat_template_kwargs.*"),
    # ---- the critic
    Rule("critic.optim.clip_grad", "critic.grad_clip"),
    Rule("critic.optim.lr_warmup_steps", "critic.optim.warmup_steps", convert=_none_if_negative),
    Rule("critic.optim.lr_warmup_steps_ratio", "critic.optim.warmup_steps_ratio"),
    Rule("critic.optim.warmup_style", "critic.optim.lr_scheduler"),
    Rule("critic.optim.lr_scheduler_type", "critic.optim.lr_scheduler"),
    Rule("critic.optim.optimizer", accepts=("AdamW", "adamw"), why="plugrl's optimizer is torch's AdamW"),
    Rule("critic.optim.optimizer_impl", accepts=("torch.optim",), why="plugrl's optimizer is torch's AdamW"),
    Rule(
        "critic.optim.override_optimizer_config",
        accepts=(None, {}),
        why="plugrl's AdamW takes critic.optim.lr, weight_decay, betas and eps",
    ),
    Rule("critic.optim.num_cycles", accepts=(0.5,), why="plugrl's cosine schedule is half a cycle"),
    Rule("critic.optim.*", why="verl's trainer fills these in"),
    Rule("critic.model.path", "critic.model.path"),
    Rule("critic.model.enable_gradient_checkpointing", "critic.model.enable_gradient_checkpointing"),
    Rule("critic.model.lora_rank", "critic.lora.r"),
    Rule("critic.model.lora_alpha", "critic.lora.alpha"),
    Rule("critic.model.target_modules", "critic.lora.target_modules"),
    Rule("critic.model.use_remove_padding", why="always packed sequences"),
    Rule("critic.model.tokenizer_path", why="the critic reads the policy's tokens"),
    Rule("critic.model.trust_remote_code", why="actor_rollout_ref.model.trust_remote_code decides"),
    Rule("critic.model.override_config", accepts=(None, {}), why="the critic is built from critic.model.path's config"),
    Rule("critic.model.fsdp_config.param_offload", "critic.fsdp_config.param_offload"),
    Rule("critic.model.fsdp_config.optimizer_offload", "critic.fsdp_config.optimizer_offload"),
    Rule("critic.model.fsdp_config.*", why=FSDP),
    Rule("critic.model.lora.rank", accepts=(0,), why="Megatron's LoRA block; with FSDP set critic.model.lora_rank"),
    Rule("critic.model.mtp.enable", accepts=(False,), why="plugrl does not train multi-token prediction heads"),
    Rule("critic.model.*", why="a kernel or loading option of verl's critic worker"),
    Rule("critic.fsdp.param_offload", "critic.fsdp_config.param_offload"),
    Rule("critic.fsdp.optimizer_offload", "critic.fsdp_config.optimizer_offload"),
    Rule("critic.fsdp.reshard_after_forward", "critic.fsdp_config.reshard_after_forward"),
    Rule("critic.fsdp.fsdp_size", "critic.fsdp_config.fsdp_size"),
    Rule("critic.fsdp.qat.enable", accepts=(False,), why="plugrl does not train quantization-aware"),
    Rule("critic.fsdp.*", why=FSDP),
    Rule("critic.strategy", accepts=("fsdp", "fsdp2"), why="plugrl trains with FSDP2; Megatron is not supported"),
    Rule(
        "critic.enable",
        accepts=(None,),
        why="plugrl trains a critic exactly when algorithm.adv_estimator needs one (gae): set the estimator instead",
    ),
    Rule("critic.rollout_n", why="verl copies actor_rollout_ref.rollout.n here"),
    Rule("critic.ppo_mini_batch_size", why="the critic updates on the actor's mini-batches"),
    Rule("critic.ppo_micro_batch_size", why="critic passes by critic.ppo_max_token_len_per_gpu"),
    Rule("critic.ppo_micro_batch_size_per_gpu", why="critic passes by critic.ppo_max_token_len_per_gpu"),
    Rule("critic.forward_micro_batch_size", why="critic passes by critic.ppo_max_token_len_per_gpu"),
    Rule("critic.forward_micro_batch_size_per_gpu", why="critic passes by critic.ppo_max_token_len_per_gpu"),
    Rule("critic.use_dynamic_bsz", why="critic passes are always by token budget"),
    Rule("critic.shuffle", why="plugrl takes each mini-batch's micro-batches in order"),
    Rule("critic.data_loader_seed", why="plugrl's data order follows data.seed"),
    Rule("critic.loss_scale_factor", accepts=(None,), why="the value loss is normalised by critic.loss_agg_mode"),
    Rule("critic.checkpoint.*", why=CHECKPOINT),
    Rule("critic.profiler.*", why=PROFILING),
    Rule("critic.megatron.*", why="Megatron settings; plugrl trains with FSDP2"),
    Rule("critic.ulysses_sequence_parallel_size", why="plugrl has no Ulysses sequence parallelism"),
    # ---- rewards (verl's legacy reward_model section and 0.9's reward section)
    Rule("custom_reward_function.path", "reward.custom_reward_function.path"),
    Rule("custom_reward_function.name", "reward.custom_reward_function.name"),
    Rule("custom_reward_function.reward_kwargs", "reward.custom_reward_function.reward_kwargs"),
    Rule("custom_reward_function.reward_kwargs.*", "reward.custom_reward_function.reward_kwargs.*"),
    Rule("reward.custom_reward_function.*", "reward.custom_reward_function.*"),
    Rule("reward_model.overlong_buffer.enable", "reward.overlong_buffer.enable"),
    Rule("reward_model.overlong_buffer.len", "reward.overlong_buffer.len"),
    Rule("reward_model.overlong_buffer.penalty_factor", "reward.overlong_buffer.penalty_factor"),
    Rule("reward_model.overlong_buffer.log", why="plugrl always logs reward/overlong_penalty_mean"),
    Rule("reward_model.reward_kwargs.overlong_buffer_cfg.enable", "reward.overlong_buffer.enable"),
    Rule("reward_model.reward_kwargs.overlong_buffer_cfg.len", "reward.overlong_buffer.len"),
    Rule("reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor", "reward.overlong_buffer.penalty_factor"),
    Rule("reward_model.reward_kwargs.overlong_buffer_cfg.log", why="plugrl always logs reward/overlong_penalty_mean"),
    Rule(
        "reward_model.reward_kwargs.max_resp_len",
        why="plugrl measures the overlong buffer from data.max_response_length",
    ),
    Rule("reward_model.reward_kwargs.*", "reward.custom_reward_function.reward_kwargs.*"),
    Rule(
        "reward_model.reward_manager",
        accepts=(None, "naive", "dapo", "prime", "batch"),
        why="plugrl's reward runner scores with the functions each data_source routes to; other managers need verl",
    ),
    Rule(
        "reward.reward_manager.name",
        accepts=(None, "naive", "dapo", "prime", "batch"),
        why="plugrl's reward runner scores with the functions each data_source routes to; other managers need verl",
    ),
    Rule("reward.reward_manager.source", accepts=("register",), why="plugrl's reward runner is built in"),
    Rule(
        "reward.reward_manager.module.path",
        accepts=(None,),
        why="plugrl's reward runner is built in; bring your scoring as custom_reward_function.path or a reward plugin",
    ),
    Rule("reward.reward_manager.*", why="plugrl's reward runner is built in"),
    Rule("reward_model.num_workers", "reward.num_workers"),
    Rule("reward.num_workers", "reward.num_workers"),
    Rule("reward_model.tinyv_setup", "reward.options.tinyv.setup"),
    Rule("reward_model.tinyv_weight", "reward.options.tinyv.weight"),
    Rule("reward_model.model.path", "reward.options.reward_model.path"),
    Rule("reward.reward_model.model_path", "reward.options.reward_model.path"),
    Rule("reward_model.model.trust_remote_code", "reward.options.reward_model.trust_remote_code"),
    Rule("reward_model.max_length", "reward.options.reward_model.max_length"),
    Rule("reward_model.forward_max_token_len_per_gpu", "reward.options.reward_model.max_tokens_per_batch"),
    Rule("reward_model.model.input_tokenizer", why="the reward model reads text, rendered with its own tokenizer"),
    Rule(
        "reward_model.micro_batch_size_per_gpu",
        why="the reward model batches by reward.options.reward_model.max_tokens_per_batch",
    ),
    Rule(
        "reward_model.micro_batch_size",
        why="the reward model batches by reward.options.reward_model.max_tokens_per_batch",
    ),
    Rule("reward_model.use_dynamic_bsz", why="the reward model always batches by token budget"),
    Rule("reward_model.strategy", why="one copy of the reward model per process (no FSDP for it yet)"),
    Rule(
        "reward_model.model.external_lib",
        accepts=(None,),
        why='plugrl imports plugins by name: plugins=["your_module:"]',
    ),
    Rule("reward_model.launch_reward_fn_async", why="plugrl scores in worker processes while the next batch waits"),
    Rule("reward_model.rollout.*", why="the reward model runs in the trainer's processes (no engine of its own)"),
    Rule("reward.reward_model.rollout.*", why="the reward model runs in the trainer's processes"),
    Rule("reward_model.*", why="the reward model's placement and serving are plugrl's own"),
    Rule("reward.reward_model.*", why="the reward model's placement and serving are plugrl's own"),
    Rule(
        "reward_model.sandbox_fusion.url",
        accepts=(None,),
        why="plugrl runs code in its own sandbox "
        "(plugrl_tools.sandbox); a remote sandbox-fusion server is not supported",
    ),
    Rule(
        "sandbox_fusion.url",
        accepts=(None,),
        why="plugrl runs code in its own sandbox (plugrl_tools.sandbox); "
        "a remote sandbox-fusion server is not supported",
    ),
    Rule(
        "reward.sandbox_fusion.url",
        accepts=(None,),
        why="plugrl runs code in its own sandbox; a remote sandbox-fusion server is not supported",
    ),
    Rule("sandbox_fusion.*", why="plugrl runs code in its own sandbox"),
    Rule("reward.sandbox_fusion.*", why="plugrl runs code in its own sandbox"),
    # ---- algorithm
    Rule("algorithm.filter_groups.max_inflight_gen_batches", accepts=(1,), why="plugrl generates one round at a time"),
    Rule("algorithm.use_pf_ppo", accepts=(False,), why="plugrl has no PF-PPO reweighting"),
    Rule("algorithm.pf_ppo.*", why="PF-PPO is off"),
    # verl's rollout_correction keys combine: the section is read whole (plugrl_compat.verl_rollout_correction)
    *(Rule(f"algorithm.rollout_correction.{k}", f"algorithm.rollout_correction.{k}") for k in ROLLOUT_CORRECTION),
    # ---- trainer
    Rule("trainer.total_training_steps", "trainer.total_steps"),
    Rule("trainer.resume_from_path", "trainer.resume_from_path"),
    Rule("trainer.max_actor_ckpt_to_keep", "trainer.max_checkpoints"),
    Rule(
        "trainer.max_critic_ckpt_to_keep",
        why="a checkpoint holds the actor and the critic together (trainer.max_checkpoints)",
    ),
    Rule("trainer.logger", "trainer.logger", convert=_with_jsonl),
    Rule("trainer.balance_batch", why="plugrl balances micro-batches by tokens on every rank"),
    Rule("trainer.log_val_generations", why="plugrl writes every validation sample to the run's validation/ files"),
    Rule("trainer.esi_redundant_time", why="plugrl saves on SIGTERM after the step in flight"),
    Rule(
        "trainer.checkpoint_callback_class", accepts=(None,), why="plugrl's plugins hook the run's end (plugrl_run_end)"
    ),
    Rule("trainer.val_only", accepts=(False,), why="validate without training with `plugrl eval CONFIG`"),
    Rule(
        "trainer.default_hdfs_dir",
        accepts=(None,),
        why="plugrl writes checkpoints to trainer.default_local_dir; copy them elsewhere yourself",
    ),
    Rule("trainer.del_local_ckpt_after_load", why="plugrl keeps trainer.max_checkpoints checkpoints"),
    Rule("trainer.ray_wait_register_center_timeout", why=RAY),
    Rule("trainer.device", accepts=("cuda", "cpu", "auto"), why="plugrl trains on cuda or cpu"),
    Rule("trainer.use_v1", why=ONE_LOOP),
    Rule("trainer.v1.*", why=ONE_LOOP),
    Rule("trainer.use_legacy_worker_impl", why=ONE_LOOP),
    Rule("trainer.profile_steps", why=PROFILING),
    Rule("trainer.profile_continuous_steps", why=PROFILING),
    Rule("trainer.controller_nsight_options.*", why=PROFILING),
    Rule("trainer.worker_nsight_options.*", why=PROFILING),
    Rule("trainer.npu_profile.*", why=PROFILING),
    # ---- sections plugrl has no part of
    Rule("global_profiler.*", why=PROFILING),
    Rule("ray_kwargs.*", why=RAY),
    Rule("ray_init.*", why=RAY),
    Rule("transfer_queue.*", why="verl's transfer queue; plugrl's ranks share one process group"),
    Rule("skip.*", why="verl's debugging shortcuts"),
    Rule("distillation.enabled", accepts=(False,), why="plugrl does not distil from a teacher"),
    Rule("distillation.enable", accepts=(False,), why="plugrl does not distil from a teacher"),
    Rule("distillation.*", why="distillation is off"),
)

_EXACT = {r.pattern: r for r in RULES if not any(c in r.pattern for c in "*?[")}
_PATTERNS = tuple(r for r in RULES if r.pattern not in _EXACT)
# verl's nesting -> plugrl's, for the keys the rules leave to it (when the result is a plugrl key)
PREFIXES = {
    f"{ARR}.model.": "model.",
    f"{ARR}.actor.": "actor.",
    f"{ARR}.rollout.": "rollout.",
    f"{ARR}.ref.": "ref.",
}


def _target(rule: Rule, key: str) -> str | None:
    """The rule's target for ``key``: a trailing ``*`` carries the rest of the key over."""
    if rule.target is None or not rule.target.endswith("*"):
        return rule.target
    return rule.target[:-1] + key[len(rule.pattern) - 1 :]


def _same(value: Any, accepted: Any) -> bool:
    if isinstance(accepted, str) and isinstance(value, str):
        return value.strip().lower() == accepted.lower()
    if isinstance(accepted, bool) or isinstance(value, bool):
        return value is accepted
    return value == accepted


def _apply(rule: Rule, key: str, value: Any) -> Fate:
    if rule.accepts is not None:
        if any(_same(value, a) for a in rule.accepts):
            return Fate(key, value, "acted", why=f"what plugrl does: {rule.why}")
        return Fate(key, value, "refused", why=rule.why)
    target = _target(rule, key)
    if target is None:
        return Fate(key, value, "not acted", why=rule.why)
    if rule.convert is None:
        return Fate(key, value, "acted", target)
    return Fate(key, value, "acted", target, converted=rule.convert(value), is_converted=True)


def rule_of(key: str) -> Rule | None:
    """The rule for a verl key as typed: its exact entry, else the first pattern that matches."""
    if key in _EXACT:
        return _EXACT[key]
    return next((r for r in _PATTERNS if fnmatch.fnmatchcase(key, r.pattern)), None)


def verl_fate(key: str, value: Any, is_plugrl_key: Callable[[str], bool]) -> Fate | None:
    """verl's fate of ``key=value`` as typed: a rule decides a verl key (an exact rule also a plugrl key of the
    same name: ``trainer.logger``, ``data.val_max_samples``); a verl key under ``actor_rollout_ref`` whose plugrl
    spelling is a plugrl key maps to it. None: a plugrl key verl's rules leave as it is (``is_plugrl_key``), or a
    key verl does not have."""
    rule = _EXACT.get(key)
    if rule is not None:
        return _apply(rule, key, value)
    if is_plugrl_key(key):
        return None
    for old, new in PREFIXES.items():
        if key.startswith(old) and is_plugrl_key(new + key[len(old) :]):
            return Fate(key, value, "acted", new + key[len(old) :])
    rule = rule_of(key)
    return _apply(rule, key, value) if rule is not None else None


def fate_of(key: str, value: Any, is_plugrl_key: Callable[[str], bool]) -> Fate | None:
    """The fate of ``key=value`` as typed where verl's rules are read: verl's (:func:`verl_fate`), else a plugrl
    key acted on as itself. None: no rule and no plugrl key (refused as unknown)."""
    fate = verl_fate(key, value, is_plugrl_key)
    if fate is None and is_plugrl_key(key):
        return Fate(key, value, "acted", key)
    return fate


# verl's defaults (verl 0.9.1) for the keys plugrl acts on: the base of a run given as overrides only. Where plugrl
# deliberately keeps its own (DIFFERS_FROM_VERL), the key is not here.
VERL_DEFAULTS: dict[str, Any] = {
    f"{ARR}.model.path": "~/models/deepseek-llm-7b-chat",
    f"{ARR}.model.enable_gradient_checkpointing": True,
    f"{ARR}.model.trust_remote_code": False,
    f"{ARR}.model.lora_rank": 0,
    f"{ARR}.model.lora_alpha": 16,
    f"{ARR}.model.target_modules": "all-linear",
    f"{ARR}.actor.optim.lr": 1e-6,
    f"{ARR}.actor.optim.weight_decay": 0.01,
    f"{ARR}.actor.optim.betas": [0.9, 0.999],
    f"{ARR}.actor.optim.lr_warmup_steps_ratio": 0.0,
    f"{ARR}.actor.optim.min_lr_ratio": 0.0,
    f"{ARR}.actor.optim.lr_scheduler_type": "constant",
    f"{ARR}.actor.ppo_mini_batch_size": 256,
    f"{ARR}.actor.ppo_epochs": 1,
    f"{ARR}.actor.clip_ratio": 0.2,
    f"{ARR}.actor.clip_ratio_low": 0.2,
    f"{ARR}.actor.clip_ratio_high": 0.2,
    f"{ARR}.actor.clip_ratio_c": 3.0,
    f"{ARR}.actor.loss_agg_mode": "token-mean",
    f"{ARR}.actor.entropy_coeff": 0,
    f"{ARR}.actor.use_kl_loss": False,
    f"{ARR}.actor.kl_loss_coef": 0.001,
    f"{ARR}.actor.kl_loss_type": "low_var_kl",
    f"{ARR}.actor.grad_clip": 1.0,
    f"{ARR}.actor.freeze_vision_tower": False,
    f"{ARR}.actor.policy_loss.loss_mode": "vanilla",
    f"{ARR}.actor.fsdp_config.param_offload": False,
    f"{ARR}.actor.fsdp_config.optimizer_offload": False,
    f"{ARR}.rollout.n": 1,
    f"{ARR}.rollout.temperature": 1.0,
    f"{ARR}.rollout.top_k": -1,
    f"{ARR}.rollout.top_p": 1,
    f"{ARR}.rollout.seed": 42,
    f"{ARR}.rollout.gpu_memory_utilization": 0.5,
    f"{ARR}.rollout.free_cache_engine": True,
    f"{ARR}.rollout.max_num_batched_tokens": 8192,
    f"{ARR}.rollout.max_num_seqs": 256,
    f"{ARR}.rollout.val_kwargs.n": 1,
    f"{ARR}.rollout.val_kwargs.temperature": 0,
    f"{ARR}.rollout.val_kwargs.top_p": 1.0,
    f"{ARR}.rollout.val_kwargs.top_k": -1,
    f"{ARR}.rollout.multi_turn.format": "hermes",
    f"{ARR}.rollout.multi_turn.max_parallel_calls": 1,
    f"{ARR}.rollout.multi_turn.max_tool_response_length": 256,
    f"{ARR}.ref.fsdp_config.param_offload": False,
    f"{ARR}.nccl_timeout": 600,
    "data.train_files": "~/data/rlhf/gsm8k/train.parquet",
    "data.val_files": "~/data/rlhf/gsm8k/test.parquet",
    "data.prompt_key": "prompt",
    "data.image_key": "images",
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.train_batch_size": 1024,
    "data.shuffle": True,
    "data.filter_overlong_prompts": False,
    "data.truncation": "error",
    "critic.optim.lr": 1e-5,
    "critic.optim.weight_decay": 0.01,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "critic.cliprange_value": 0.5,
    "critic.grad_clip": 1.0,
    "critic.model.enable_gradient_checkpointing": True,
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.adv_estimator": "gae",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.horizon": 10000,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.filter_groups.enable": False,
    "algorithm.filter_groups.max_num_gen_batches": 0,
    "trainer.total_epochs": 30,
    "trainer.project_name": "verl_examples",
    "trainer.experiment_name": "gsm8k",
    "trainer.logger": ["console", "wandb"],
    "trainer.save_freq": -1,
    "trainer.test_freq": -1,
    "trainer.val_before_train": True,
    "trainer.critic_warmup": 0,
    "trainer.resume_mode": "auto",
}

# a run given as overrides only scores as verl's default_compute_score does: where several installed plugins score a
# data_source, the plugin of verl's own scorers (plugrl-rewards-verl) wins
VERL_PLUGIN_PREFERENCE = ["verl_default"]

# verl's defaults plugrl does not take, each with why: said once at the start of a run given as overrides only
DIFFERS_FROM_VERL: dict[str, str] = {
    f"{ARR}.rollout.name": "verl requires it ('???'); plugrl's default is vllm",
    f"{ARR}.rollout.tensor_model_parallel_size": "verl's default 2 (two GPUs per engine) is 1 here unless set",
    f"{ARR}.rollout.calculate_log_probs": "verl's default true is false here: plugrl recomputes the log-probs it "
    "trains on, and turns the engine's on when algorithm.rollout_correction needs them",
    f"{ARR}.actor.ppo_max_token_len_per_gpu": "verl's 16384 applies only with use_dynamic_bsz; plugrl always "
    "micro-batches by token budget and picks it from the device unless set",
    f"{ARR}.ref.log_prob_max_token_len_per_gpu": "verl's 16384 applies only with use_dynamic_bsz; plugrl's default "
    "is its own",
    "trainer.max_actor_ckpt_to_keep": "verl keeps every checkpoint (null); plugrl keeps the newest 2 unless set",
    "trainer.device": "verl's cuda is auto here (cuda when present, else cpu)",
    "reward.num_workers": "verl's 8 reward workers are 1 here unless set",
    "trainer.logger": "plugrl writes metrics.jsonl beside verl's loggers",
}


def verl_default_of(plugrl_key: str) -> tuple[str, Any] | None:
    """The verl key and default behind a plugrl key in a run given as overrides only, or None."""
    for key, value in VERL_DEFAULTS.items():
        fate = fate_of(key, value, lambda _k: False)
        if fate is not None and fate.target == plugrl_key:
            return key, value
    return None
