"""verl and TRL configs read into plugrl's: the config readers ``verl`` (:mod:`plugrl_compat.verl`, the fate of
every verl key in :mod:`plugrl_compat.verl_keys`) and ``trl`` (:mod:`plugrl_compat.trl`, the translation in
:mod:`plugrl_compat.trl_config`, the fate of every TRL key in :mod:`plugrl_compat.trl_keys`). The kernel never
imports them: it finds them through the entry-point group ``plugrl.config_readers`` (:mod:`plugrl.readers`). Also
verl's sample dumps (:mod:`plugrl_compat.hooks`, an extension: group ``plugrl.extensions``) and TRL's metric names
(:mod:`plugrl_compat.trl_metrics`, group ``plugrl.metric_aliases``), and TRL's and verl's reward functions and TRL's
environments, unchanged (:mod:`plugrl_compat.reward_adapters`, group ``plugrl.reward_adapters``;
:mod:`plugrl_compat.trl_environment`, group ``plugrl.environment_adapters``), which users import as
``plugrl.rewards.trl_reward``, ``plugrl.rewards.verl_compute_score`` and ``plugrl.rollout.adapters.trl_environment``.
"""
