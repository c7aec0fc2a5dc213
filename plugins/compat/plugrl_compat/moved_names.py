"""Where the names went that plugin API changes moved out of the kernel: what :func:`plugrl.api.import_hint` tells a
plugin that still imports one (``from plugrl.algorithms import gae_advantages``). The kernel finds this table
through the entry-point group ``plugrl.moved_names``; without it a plugin that imports a moved name is told only
that it may be written for another plugrl. The table grows with every name that leaves the kernel, so it lives
here, with the other forms plugrl keeps for code written against another API.
"""

from __future__ import annotations

# names plugins imported from plugrl that plugin API 2 moved: (module, name) -> (api, where it is now); a name ""
# stands for the module itself. Each row: the module, the names that left it, where they are, their package.
_MOVES_API_2 = (
    ("plugrl.algorithms", "grpo_outcome_advantage", "plugrl_advantages.estimators.grpo", "plugrl-advantages"),
    ("plugrl.algorithms", "gae_advantages", "plugrl_advantages.estimators.gae", "plugrl-advantages"),
    ("plugrl", "solution_classifier ClassifierSpec", "plugrl_advantages.classify", "plugrl-advantages"),
    ("plugrl.specs", "solution_classifier ClassifierSpec", "plugrl_advantages.classify", "plugrl-advantages"),
    ("plugrl.classify", "", "plugrl_advantages.classify", "plugrl-advantages"),
    ("plugrl.servers", "", "plugrl_model_servers", "plugrl-model-servers"),
    ("plugrl.rollout.sandbox", "", "plugrl_tools.sandbox", "plugrl-tools"),
    ("plugrl.rollout.agents", "", "plugrl_agents", "plugrl-agents"),
    ("plugrl.rollout.agent_episodes", "", "plugrl_agents.episodes", "plugrl-agents"),
    ("plugrl.rollout.endpoint", "", "plugrl_agents.endpoint", "plugrl-agents"),
    ("plugrl.rollout.server", "", "plugrl_rollout_servers.server", "plugrl-rollout-servers"),
    ("plugrl.rollout.remote", "", "plugrl_rollout_servers.remote", "plugrl-rollout-servers"),
    ("plugrl.rollout.tools", "ToolExecutor call_in_process", "plugrl_tools.executor", "plugrl-tools"),
    ("plugrl.rollout.tools", "ToolCheck screen_call bad_arguments", "plugrl_tools.screening", "plugrl-tools"),
    (
        "plugrl.rollout.tools",
        "make_tool tool_schema check_schema is_importable tool_where strip_optional unannotate is_union",
        "plugrl_tools.authoring",
        "plugrl-tools",
    ),
    (
        "plugrl.algorithms",
        "gspo_policy_loss cispo_policy_loss sapo_policy_loss",
        "plugrl_advantages.losses",
        "plugrl-advantages",
    ),
    ("plugrl.policy_losses", "gspo luspo cispo sapo", "plugrl_advantages.losses", "plugrl-advantages"),
    ("plugrl.evaluate", "evaluate_cli", "plugrl_commands.evaluate", "plugrl-commands"),
    ("plugrl.hub", "", "plugrl_hub", "plugrl-hub"),
    ("plugrl.lora", "", "plugrl_lora.adapters", "plugrl-lora"),
    ("plugrl.config", "LoRAConfig", "plugrl_lora.fields", "plugrl-lora"),
    ("plugrl.config", "FilterGroupsConfig OverlongBufferConfig", "plugrl_dapo.fields", "plugrl-dapo"),
    ("plugrl.algorithms", "overlong_penalty", "plugrl_dapo.sampling", "plugrl-dapo"),
    (
        "plugrl.episodes",
        "group_metric check_group_metric varied_groups SCORE_METRICS FINAL_METRIC",
        "plugrl_dapo.sampling",
        "plugrl-dapo",
    ),
    ("plugrl.config", "RolloutCorrectionConfig", "plugrl_advantages.correction_fields", "plugrl-advantages"),
    (
        "plugrl.rollout.vllm_engine",
        "adapter_name_mapping POLICY_ADAPTER POLICY_ADAPTER_ID",
        "plugrl_lora.vllm",
        "plugrl-lora",
    ),
    ("plugrl.vision", "", "plugrl_vision", "plugrl-vision"),
    (
        "plugrl.rollout_correction",
        "rollout_correction RolloutCorrection importance_weights log_importance_weights "
        "truncate_weights reject correction_metrics takes_weights check_loss_takes_weights MODES LEVELS SAFETY_BOUND",
        "plugrl_advantages.rollout_correction",
        "plugrl-advantages",
    ),
    (
        "plugrl.attention",
        "NAME Tiles shared_prefix_attention FLEX_BLOCK prefix_block_mask flex_prefix_attention "
        "uses_flex attention_forward register",
        "plugrl_attention",
        "plugrl-attention",
    ),
    (
        "plugrl.tracking",
        "trl_aliases TRL_METRIC_ALIASES TRL_WANDB_PREFIX",
        "plugrl_compat.trl_metrics",
        "plugrl-compat",
    ),
    ("plugrl.tracking", "write_verl_samples", "plugrl_compat.verl_samples", "plugrl-compat"),
    ("plugrl.config", "reference_markdown write_reference", "plugrl_commands.config_reference", "plugrl-commands"),
    (
        "plugrl.parallel",
        "parallelize check_model VocabParallel vocab_parallel_logprobs vocab_parallel_entropy",
        "plugrl_tensor_parallel",
        "plugrl-tensor-parallel",
    ),
    ("plugrl.rollout.multiturn", "EpisodeRunner EnvironmentTimeout", "plugrl_multiturn.turns", "plugrl-multiturn"),
    ("plugrl.rollouts_ahead", "RolloutsAhead", "plugrl_off_policy", "plugrl-off-policy"),
    (
        "plugrl.rollout.multiturn",
        "EpisodeRecord EpisodeStart MultiTurnLimits reply_text trl_assistant",
        "plugrl_multiturn.records",
        "plugrl-multiturn",
    ),
    (
        "plugrl.rollout.environment",
        "as_env_start as_env_step check_score",
        "plugrl_multiturn.env_results",
        "plugrl-multiturn",
    ),
    ("plugrl.rollout.chat", "", "plugrl_multiturn.chat", "plugrl-multiturn"),
    ("plugrl.rollout.first_prompts", "", "plugrl_multiturn.first_prompts", "plugrl-multiturn"),
    (
        "plugrl.rollout.routing",
        "environment_options load_environment_families",
        "plugrl_multiturn.routing",
        "plugrl-multiturn",
    ),
    (
        "plugrl.placement",
        "rollout_server_gpus ServerGPUs",
        "plugrl_rollout_servers.placement",
        "plugrl-rollout-servers",
    ),
    (
        "plugrl.placement",
        "launched_server_gpu own_gpu_fraction shared_gpu_fraction OWN_GPU_FRACTION SERVER_CONTEXT_BYTES "
        "TRAINING_HEADROOM",
        "plugrl_model_servers.placement",
        "plugrl-model-servers",
    ),
    ("plugrl.placement", "child_device", "plugrl_reward_model.scoring", "plugrl-rewards-model"),
)
MOVED = {
    **{
        (module, name): (2, f"{where}.{name} (package {package})" if name else f"{where} (package {package})")
        for module, names, where, package in _MOVES_API_2
        for name in names.split() or [""]
    },
    # the same thing under another name: a whole module, or the decorator now at the top of plugrl
    ("plugrl", "lora"): (2, "plugrl_lora.adapters (package plugrl-lora)"),
    ("plugrl.startup", "check_vision_run"): (2, "plugrl_vision.checks.check_config (package plugrl-vision)"),
    ("plugrl.startup", "check_multi_turn"): (2, "plugrl_multiturn.checks.check_config (package plugrl-multiturn)"),
    ("plugrl.startup", "check_off_policy"): (2, "plugrl_off_policy.check (package plugrl-off-policy)"),
    ("plugrl.specs", "tool"): (2, "plugrl.tool"),
    ("plugrl.rollout.tools", "tool"): (2, "plugrl.tool"),
}
