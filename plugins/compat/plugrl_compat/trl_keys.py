"""What becomes of every key a TRL GRPO YAML may hold (``plugrl train --trl-config``): :data:`KEYS`.

The keys are the fields of the dataclasses TRL 1.16's ``grpo.py`` parses a YAML into (``GRPOConfig`` over
transformers' ``TrainingArguments``, ``ModelConfig``, ``GRPOScriptArguments`` over ``ScriptArguments``,
``DatasetMixtureConfig``), and a few older or script keys plugrl reads too (marked ``extra``). Each has a
:class:`Fate`:

- ``mapped``: translated into plugrl keys (:mod:`plugrl_compat.trl_config` does it; the text says into what);
- ``said``: accepted and named at start with why (unless its value is one of ``quiet``: what plugrl does anyway);
- ``refused``: an error at start naming the key, why and the nearest plugrl offers (unless ``quiet``);
- ``same``: TRL's grpo script does not act on it either (its value changes nothing there).

docs/coming_from_trl.md shows this table (tests/test_trl_keys.py checks that it does, and that every field of TRL's
dataclasses has a fate here). Data only: no TRL import.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Fate:
    kind: str  # mapped | said | refused | same
    text: str  # the plugrl keys it becomes, or why it is not acted on
    quiet: tuple[Any, ...] = ()  # values accepted in silence: what plugrl does anyway (said/refused keys)
    extra: bool = False  # not a field of TRL 1.16's dataclasses: an older TRL key, or a script's own


def _m(text: str, *, extra: bool = False) -> Fate:
    return Fate("mapped", text, extra=extra)


def _s(text: str, *quiet: Any, extra: bool = False) -> Fate:
    return Fate("said", text, quiet, extra)


def _r(text: str, *quiet: Any) -> Fate:
    return Fate("refused", text, quiet)


def _same(text: str) -> Fate:
    return Fate("same", text)


NO_SETTING = "no plugrl setting"
SHARDING = "see the accelerate section: FSDP2's offload, resharding and checkpointing follow it"
NO_TRACKIO = "plugrl has no trackio logger (trainer.logger: console, jsonl, wandb, tensorboard)"
ONE_VALIDATION = "plugrl validates every prompt of data.val_files in one generation"
LOADER = "plugrl batches prompts itself, with no torch DataLoader"
KERNEL_LOOP = "plugrl's trainer has no such option"

KEYS: dict[str, Fate] = {
    # ---- transformers' TrainingArguments, as GRPOConfig inherits them
    "output_dir": _m(
        "`trainer.output_dir` (its parent) + `trainer.experiment_name` (its last part): the run directory"
    ),
    "per_device_train_batch_size": _m("`data.train_batch_size`, `actor.ppo_mini_batch_size` (see Batches)"),
    "num_train_epochs": _m("`trainer.total_epochs` (a fraction is rounded up, and said)"),
    "max_steps": _m("`trainer.total_steps` (TRL's optimizer steps / k, rounded up)"),
    "learning_rate": _m("`actor.optim.lr`"),
    "lr_scheduler_type": _m(
        "`actor.optim.lr_scheduler`: constant, constant_with_warmup -> constant; cosine, cosine_with_min_lr -> "
        "cosine; others (linear, TRL's default) are said, and constant used"
    ),
    "lr_scheduler_kwargs": _m("`min_lr_rate` / `min_lr` -> `actor.optim.min_lr_ratio`; others said"),
    "warmup_steps": _m("`actor.optim.warmup_steps` (/ k); below 1, a share of max_steps"),
    "optim": _m("adamw_torch, adamw_torch_fused, adamw_hf: torch's AdamW, plugrl's optimizer; others said"),
    "optim_args": _s("plugrl's optimizer is torch's AdamW with actor.optim.*", None, ""),
    "weight_decay": _m("`actor.optim.weight_decay`"),
    "adam_beta1": _m("`actor.optim.betas[0]`"),
    "adam_beta2": _m("`actor.optim.betas[1]`"),
    "adam_epsilon": _m("`actor.optim.eps`"),
    "optim_target_modules": _s("plugrl's AdamW trains every trainable parameter", None),
    "gradient_accumulation_steps": _m("`actor.ppo_mini_batch_size` (see Batches)"),
    "average_tokens_across_devices": _s("plugrl's token-mean counts the tokens of every rank", True),
    "max_grad_norm": _m("`actor.grad_clip` (0 or below is said: plugrl always clips)"),
    "label_smoothing_factor": _s(NO_SETTING + " (GRPO has no labels)", 0, 0.0),
    "bf16": _m("`model.dtype: bfloat16 / float32` (fp32 master weights either way)"),
    "fp16": _s("plugrl has no fp16 mixed precision; model.dtype auto uses bf16 where the hardware has it", False),
    "bf16_full_eval": _s("plugrl validates in model.dtype", False),
    "fp16_full_eval": _s("plugrl validates in model.dtype", False),
    "tf32": _s("plugrl leaves torch's TF32 setting as it is", None),
    "gradient_checkpointing": _m("`model.enable_gradient_checkpointing`"),
    "gradient_checkpointing_kwargs": _m("use_reentrant false is plugrl's; others said"),
    "torch_compile": _s("plugrl does not compile the model it trains", False),
    "torch_compile_backend": _s("plugrl does not compile the model it trains", None),
    "torch_compile_mode": _s("plugrl does not compile the model it trains", None),
    "use_liger_kernel": _s("plugrl has its own packed-sequence kernels", False),
    "liger_kernel_config": _s("plugrl has its own packed-sequence kernels", None),
    "use_cache": _s("plugrl's training forward keeps no KV cache", False),
    "neftune_noise_alpha": _s("plugrl adds no noise to the embeddings", None),
    "torch_empty_cache_steps": _s("plugrl frees accelerator memory between the phases of a step itself", None),
    "auto_find_batch_size": _r("TRL refuses it for GRPO too: set per_device_train_batch_size", False),
    "logging_strategy": _s("plugrl logs every step to metrics.jsonl; logging_steps sets the console line", "steps"),
    "logging_steps": _m("`trainer.log_freq` (/ k)"),
    "logging_first_step": _s("plugrl logs every step to metrics.jsonl", False),
    "log_on_each_node": _s("plugrl logs from the first process", True),
    "logging_nan_inf_filter": _s("plugrl logs every value as computed", True),
    "include_num_input_tokens_seen": _s(NO_SETTING + " (metrics.jsonl has the step's token counts)", "no", False),
    "log_level": _s("plugrl's log level is its own (INFO)", "passive"),
    "log_level_replica": _s("plugrl logs from the first process", "warning"),
    "disable_tqdm": _s("plugrl shows no progress bar", None, True),
    "report_to": _m("`trainer.logger: [console, jsonl, wandb and/or tensorboard]`; others (trackio...) said"),
    "run_name": _s("the wandb run is named after the run directory (trainer.experiment_name)", None),
    "project": _s("trackio's project; wandb's is trainer.project_name", "huggingface"),
    "trackio_space_id": _s(NO_TRACKIO, None, "trackio"),
    "trackio_bucket_id": _s(NO_TRACKIO, None),
    "trackio_static_space_id": _s(NO_TRACKIO, None),
    "eval_strategy": _m("steps -> `trainer.test_freq` from eval_steps; no: no validation; epoch said"),
    "eval_steps": _m("`trainer.test_freq` (/ k)"),
    "eval_delay": _s("plugrl validates from the first test_freq step", 0, 0.0),
    "per_device_eval_batch_size": _s(ONE_VALIDATION, 8),
    "prediction_loss_only": _s(ONE_VALIDATION, False),
    "eval_on_start": _m("`trainer.val_before_train`"),
    "eval_do_concat_batches": _s(ONE_VALIDATION, True),
    "eval_use_gather_object": _s(ONE_VALIDATION, False),
    "eval_accumulation_steps": _s(ONE_VALIDATION, None),
    "include_for_metrics": _s(ONE_VALIDATION, None, []),
    "batch_eval_metrics": _s(ONE_VALIDATION, False),
    "save_only_model": _s("plugrl's checkpoints keep the optimizer state so that runs resume", False),
    "save_strategy": _m(
        "steps: `trainer.save_freq` from save_steps; no: `trainer.save_freq: end` (TRL's script "
        "still saves the final model); epoch, best: said, saved at the end only"
    ),
    "save_steps": _m("`trainer.save_freq` (/ k)"),
    "save_on_each_node": _s("plugrl writes checkpoints from the first process", False),
    "save_total_limit": _m("`trainer.max_checkpoints`"),
    "enable_jit_checkpoint": _s(NO_SETTING, False),
    "push_to_hub": _m("`trainer.push_to_hub`"),
    "hub_token": _s("plugrl reads the token from HF_TOKEN (or `hf auth login`), never from a config", None),
    "hub_private_repo": _m("`trainer.hub_private_repo`"),
    "hub_model_id": _m("`trainer.hub_model_id` (default: output_dir's name, as TRL)"),
    "hub_strategy": _s(
        "plugrl uploads the final checkpoint once, at the end (TRL's default uploads every save)", "end"
    ),
    "hub_always_push": _s("plugrl uploads once, at the end", False),
    "hub_revision": _s("plugrl uploads to the repo's main branch", None),
    "load_best_model_at_end": _s("plugrl keeps the last step's model", False),
    "metric_for_best_model": _s("plugrl keeps the last step's model", None),
    "greater_is_better": _s("plugrl keeps the last step's model", None),
    "ignore_data_skip": _s("a resumed plugrl run continues its data where it stopped", False),
    "restore_callback_states_from_checkpoint": _s(NO_SETTING + " (no callbacks)", False),
    "full_determinism": _s(
        "plugrl seeds torch, data and sampling (trainer.seed) but runs nondeterministic kernels", False
    ),
    "seed": _m("`trainer.seed` (and `rollout.seed: null`: the same)"),
    "data_seed": _m("`data.seed`"),
    "use_cpu": _s("plugrl uses the accelerator where there is one", False),
    "accelerator_config": _s(KERNEL_LOOP + " (accelerate's Accelerator is not used)", None),
    "parallelism_config": _s("plugrl's parallelism: actor.tp_size, FSDP2 over the rest", None),
    "dataloader_drop_last": _s(LOADER, False),
    "dataloader_num_workers": _s(LOADER, 0),
    "dataloader_pin_memory": _s(LOADER, True),
    "dataloader_persistent_workers": _s(LOADER, False),
    "dataloader_prefetch_factor": _s(LOADER, None),
    "dataloader_multiprocessing_context": _s(LOADER, None),
    "dataloader_in_order": _s(LOADER, True),
    "remove_unused_columns": _s("reward functions see every column (TRL's GRPO default)", False),
    "label_names": _s(NO_SETTING + " (GRPO has no labels)", None),
    "train_sampling_strategy": _s("shuffle_dataset decides the order (data.shuffle)", "random"),
    "length_column_name": _s(LOADER, "length"),
    "ddp_find_unused_parameters": _s("plugrl shards with FSDP2, not DDP", None, False),
    "ddp_bucket_cap_mb": _s("plugrl shards with FSDP2, not DDP", None),
    "ddp_broadcast_buffers": _s("plugrl shards with FSDP2, not DDP", None),
    "ddp_static_graph": _s("plugrl shards with FSDP2, not DDP", None),
    "ddp_backend": _s("plugrl picks nccl on GPUs, gloo on CPUs", None),
    "ddp_timeout": _m("`trainer.dist_timeout_s`"),
    "fsdp": _m(
        "full_shard (plugrl's), shard_grad_op -> `actor.fsdp_config.reshard_after_forward: false`, offload "
        "-> `param_offload` + `optimizer_offload`, auto_wrap (plugrl's); hybrid_shard and no_shard refused"
    ),
    "fsdp_config": _m(
        "`offload_params`, `reshard_after_forward`, `activation_checkpointing` as the accelerate "
        "section says; the rest said"
    ),
    "deepspeed": _m(
        "a DeepSpeed JSON (file or mapping) runs as FSDP2: its ZeRO stage and offload as the accelerate section says"
    ),
    "debug": _s(NO_SETTING, "", None, []),
    "skip_memory_metrics": _s("plugrl logs host and device memory every step", True),
    "do_train": _same("TRL's grpo script trains whatever it says; so does plugrl train"),
    "do_eval": _same("TRL's grpo script does not read it (eval_strategy decides)"),
    "do_predict": _same("TRL's grpo script does not read it"),
    "resume_from_checkpoint": _m("`trainer.resume` (true: auto; a path: that checkpoint)"),
    "local_rank": _same("set by the launcher"),
    # ---- GRPOConfig
    "model_init_kwargs": _m(
        "`dtype` / `torch_dtype` -> `model.dtype`, `attn_implementation`, `trust_remote_code` -> `model.*`; others said"
    ),
    "trust_remote_code": _m("`model.trust_remote_code`"),
    "router_aux_loss_coef": _s("plugrl adds no MoE router loss", None),
    "disable_dropout": _s("plugrl's policy always runs without dropout", True),
    "cast_lm_head_to_fp32": _s("plugrl's lm_head runs in model.dtype", False),
    "num_generations": _m("`rollout.n`"),
    "num_generations_eval": _m("`rollout.val_kwargs.n`"),
    "max_completion_length": _m("`data.max_response_length`"),
    "ds3_gather_for_generation": _s("plugrl's engine gets the whole weights every step", True),
    "shuffle_dataset": _m("`data.shuffle`"),
    "pad_to_multiple_of": _s("plugrl packs sequences without padding", "auto", None),
    "generation_batch_size": _m("`data.train_batch_size` (see Batches)"),
    "steps_per_generation": _m("`data.train_batch_size` (see Batches)"),
    "temperature": _m("`rollout.temperature`"),
    "top_p": _m("`rollout.top_p`"),
    "top_k": _m("`rollout.top_k` (0: -1, off)"),
    "min_p": _s("plugrl's engines sample without min-p", None, 0, 0.0),
    "generation_kwargs": _s("plugrl passes no extra sampling arguments", None, {}),
    "chat_template_kwargs": _m("`data.apply_chat_template_kwargs`"),
    "repetition_penalty": _s("plugrl's engines sample without a repetition penalty", 1, 1.0),
    "cache_implementation": _s("plugrl's HF engine picks its own KV cache", None),
    "use_vllm": _m("`rollout.name: vllm` (`hf` for false; not set: plugrl keeps vLLM, TRL's default is hf)"),
    "vllm_mode": _m("colocate: vLLM in the training processes; server: `rollout.mode: server`"),
    "vllm_model_impl": _s("plugrl's vLLM runs its own model classes", "vllm"),
    "vllm_enable_sleep_mode": _m("`rollout.free_cache_engine`"),
    "vllm_structured_outputs_regex": _s("plugrl's engines sample without a structured-output grammar", None),
    "vllm_server_base_url": _m("`rollout.server_urls` (vllm_mode: server)"),
    "vllm_server_host": _m("`rollout.server_urls` (vllm_mode: server; 0.0.0.0: this machine)"),
    "vllm_server_port": _m("`rollout.server_urls` (vllm_mode: server)"),
    "vllm_server_timeout": _m("`rollout.server_timeout_s`"),
    "vllm_group_port": _s("plugrl's trainer picks the port of its weight group itself", 51216),
    "vllm_gpu_memory_utilization": _m("`rollout.gpu_memory_utilization`"),
    "vllm_max_model_length": _s("plugrl sizes vLLM's context as max_prompt_length + max_completion_length", None),
    "vllm_tensor_parallel_size": _m("`rollout.tensor_model_parallel_size`"),
    "beta": _m("`actor.use_kl_loss`, `actor.kl_loss_coef`, `actor.kl_loss_type: low_var_kl` (0: no reference model)"),
    "num_iterations": _m("`actor.ppo_epochs`"),
    "epsilon": _m("`actor.clip_ratio_low` (cispo: 1, no lower bound, as TRL)"),
    "delta": _m("`actor.clip_ratio_c` (TRL's two-sided clip is the dual clip at delta; not set: null, no dual clip)"),
    "epsilon_high": _m("`actor.clip_ratio_high` (default: epsilon; cispo: epsilon_high - 1)"),
    "sapo_temperature_neg": _m("`actor.tau_neg`"),
    "sapo_temperature_pos": _m("`actor.tau_pos`"),
    "vespo_k_pos": _s("plugrl has no VESPO loss (loss_type vespo is refused)", 2.0),
    "vespo_lambda_pos": _s("plugrl has no VESPO loss (loss_type vespo is refused)", 3.0),
    "vespo_k_neg": _s("plugrl has no VESPO loss (loss_type vespo is refused)", 3.0),
    "vespo_lambda_neg": _s("plugrl has no VESPO loss (loss_type vespo is refused)", 2.0),
    "importance_sampling_level": _m("sequence: `actor.loss_mode: gspo` (luspo with loss_type luspo)"),
    "reward_weights": _m("`reward.weights.<function name>`, in reward_funcs' order"),
    "multi_objective_aggregation": _s("plugrl sums the weighted rewards, then normalizes", "sum_then_normalize"),
    "scale_rewards": _m("group / true -> `algorithm.norm_adv_by_std_in_grpo: true`; none / false -> false; batch said"),
    "loss_type": _m(
        "`actor.loss_mode` + `actor.loss_agg_mode`: grpo, bnpo, dr_grpo, dapo, luspo, cispo, sapo "
        "(Loss types); vespo refused"
    ),
    "mask_truncated_completions": _m("`actor.mask_truncated_completions`"),
    "sync_ref_model": _s("plugrl's reference model stays the initial policy (no TR-DPO syncing)", False),
    "ref_model_mixup_alpha": _s("read with sync_ref_model only", 0.6),
    "ref_model_sync_steps": _s("read with sync_ref_model only", 512),
    "top_entropy_quantile": _s("plugrl trains on every token (no entropy-quantile mask)", 1, 1.0),
    "entropy_coef": _m("`actor.entropy_coeff`"),
    "use_adaptive_entropy": _s("plugrl's entropy bonus has a fixed coefficient (actor.entropy_coeff)", False),
    "entropy_coef_min": _s("read with use_adaptive_entropy only", 0, 0.0),
    "entropy_coef_max": _s("read with use_adaptive_entropy only", 1, 1.0),
    "entropy_coef_delta": _s("read with use_adaptive_entropy only", 0.005),
    "entropy_target": _s("read with use_adaptive_entropy only", 0.2),
    "max_tool_calling_iterations": _m("`rollout.max_turns` = iterations + 1"),
    "vllm_importance_sampling_correction": _m("`algorithm.rollout_correction` (see Rollout correction)"),
    "vllm_importance_sampling_mode": _m("`algorithm.rollout_correction.mode` and `.level`"),
    "vllm_importance_sampling_clip_max": _m("`algorithm.rollout_correction.cap` / `.high`"),
    "vllm_importance_sampling_clip_min": _m("`algorithm.rollout_correction.low` (with a truncate mode: refused)"),
    "off_policy_mask_threshold": _s(
        "plugrl has no off-policy sequence mask; algorithm.rollout_correction masks by the vLLM/trainer ratio", None
    ),
    "use_bias_correction_kl": _s(
        "plugrl's KL term is not weighted by the importance ratio (said when beta > 0)", False
    ),
    "log_completions": _m("`trainer.save_rollouts`"),
    "log_multimodal": _s("plugrl writes no images to the completions it logs (read with log_completions)", False),
    "num_completions_to_print": _s("plugrl writes every completion to rollouts/step_N.jsonl", None),
    "log_unique_prompts": _s("plugrl writes every completion to rollouts/step_N.jsonl", False),
    "log_completions_hub_repo": _s("plugrl uploads no completions", None),
    "use_transformers_continuous_batching": _s("plugrl's HF engine batches its own way", False),
    "transformers_continuous_batching_config": _s("plugrl's HF engine batches its own way", None),
    "use_transformers_paged": _s("plugrl's HF engine batches its own way", False),
    "vllm_importance_sampling_cap": _m("deprecated `vllm_importance_sampling_clip_max`: wins over it, as in TRL"),
    # ---- ModelConfig
    "model_name_or_path": _m("`model.path`"),
    "model_revision": _s("plugrl loads the model path as it is; download the revision and point at it", "main"),
    "dtype": _m("`model.dtype` when bf16 is not set (bf16 decides otherwise, and a difference is said)"),
    "attn_implementation": _m("`model.attn_implementation`"),
    "use_peft": _m("`actor.lora` (with lora_r, lora_alpha, lora_dropout, lora_target_modules)"),
    "lora_r": _m("`actor.lora.r` (with use_peft)"),
    "lora_alpha": _m("`actor.lora.alpha` (with use_peft)"),
    "lora_dropout": _m("`actor.lora.dropout` (with use_peft)"),
    "lora_target_modules": _m("`actor.lora.target_modules` (with use_peft)"),
    "lora_target_parameters": _s("plugrl's LoRA targets modules (actor.lora.target_modules)", None),
    "lora_modules_to_save": _s("plugrl trains the adapters only", None),
    "lora_task_type": _s("plugrl's LoRA is a causal LM's", "CAUSAL_LM"),
    "use_rslora": _s("plugrl's LoRA scales by alpha / r", False),
    "use_dora": _s("plugrl's LoRA has no DoRA", False),
    "load_in_8bit": _r(
        "plugrl does not train quantized models: drop it (actor.lora trains adapters on a bf16 base)", False
    ),
    "load_in_4bit": _r(
        "plugrl does not train quantized models: drop it (actor.lora trains adapters on a bf16 base)", False
    ),
    "bnb_4bit_quant_type": _s("read with load_in_4bit only", "nf4"),
    "use_bnb_nested_quant": _s("read with load_in_4bit only", False),
    "bnb_4bit_quant_storage": _s("read with load_in_4bit only", None),
    # ---- ScriptArguments, GRPOScriptArguments, DatasetMixtureConfig
    "dataset_name": _m("`data.train_files: [name(:config)]`, `data.data_source`"),
    "dataset_config": _m("`data.train_files: [name:config]`"),
    "dataset_train_split": _m("`data.split`"),
    "dataset_test_split": _m("`data.val_split` (with eval_strategy)"),
    "dataset_streaming": _s("plugrl reads the whole dataset", False),
    "ignore_bias_buffers": _s("plugrl trains no DDP buffers", False),
    "reward_model_name_or_path": _m(
        "the reward_model plugin (`reward.options.reward_model.path`), first in reward_funcs' order"
    ),
    "reward_funcs": _m(
        "`reward.reward_funcs`: trl.rewards names as TRL's script resolves them, `module.function` or "
        "`module:function` of your own; a model id: the reward_model plugin"
    ),
    "datasets": _m("`data.train_files`, `data.split` (one split for every entry)"),
    "streaming": _s("plugrl reads the whole dataset", False),
    "test_split_size": _s("plugrl validates on data.val_files (eval_strategy steps: the training files)", None),
    # ---- older TRL / transformers keys, and scripts' own
    "max_prompt_length": _m("`data.max_prompt_length` (longer prompts are dropped and counted)", extra=True),
    "warmup_ratio": _m("`actor.optim.warmup_steps` from max_steps (transformers 4's key)", extra=True),
    "torch_dtype": _m("`model.dtype` (ModelConfig's older name of dtype)", extra=True),
    "overwrite_output_dir": _s(
        "plugrl resumes from the run directory's newest checkpoint (trainer.resume: auto)", False, extra=True
    ),
    "field_mapping": _m("`data.question_field`, `data.answer_field` (the TRL math guide's script)", extra=True),
    "reward_processing_classes": _m("`reward.options.reward_model.tokenizer_path`", extra=True),
}
