"""plugrl plugin: advantage estimators.

Each estimator lives in its own module under :mod:`plugrl_advantages.estimators` and is
re-exported here, where the plugin loader collects the decorated functions (names as verl
spells them):

- ``grpo``: group-normalised outcome advantage (GRPO; Dr. GRPO with
  ``algorithm.norm_adv_by_std_in_grpo=false``);
- ``gae``: PPO's generalized advantage estimation with a critic (``needs_critic``);
- ``grpo_passk``: only each group's best response gets ``(r_max - r_2nd) / (std + eps)``;
- ``rloo``: leave-one-out baseline;
- ``reinforce_plus_plus`` / ``reinforce_plus_plus_baseline``: discounted returns or group-centred
  scores, whitened over the global batch;
- ``remax``: the greedy rollout's score as baseline (``needs_greedy_baseline``);
- ``opo``: length-weighted group baseline;
- ``gpg``: group-centred scores scaled by ``B / (non-zero scores)``;
- ``grpo_weighted_add`` / ``grpo_weighted_mul``: creativity-weighted GRPO, the GRPO advantage plus
  or times ``1 / freq^p`` of the response's solution strategy, which a solution classifier gives.

The math of each is a pure function next to its estimator (``*_advantage``, ``gae_advantages``), with
shapes and formula in its docstring.

Policy losses beside the kernel's ``vanilla`` (``actor.loss_mode``; :mod:`plugrl_advantages.losses`): ``gspo``,
``luspo``, ``cispo`` and ``sapo``, with their math (``*_policy_loss``).

The rollout correction (``algorithm.rollout_correction``: importance weights between the engine's log-probs and
the trainer's, truncated or masked; :mod:`plugrl_advantages.rollout_correction`) is the kernel's seam
:mod:`plugrl.rollout_correction`, found through the entry-point group ``plugrl.rollout_correction``; its config
section is this package's too (:mod:`plugrl_advantages.correction_fields`, group ``plugrl.config_fields``). Every
run config has it, so this module imports its parts (and torch) on first use of their names.

Solution classifiers are this plugin's own kind of record (:mod:`plugrl_advantages.classify`): another plugin
registers one with ``@plugrl_advantages.classify.solution_classifier("name")`` (the ``openai`` one: the plugin
classifier_openai), and this plugin's hooks settle and check ``algorithm.classifier`` at start
(:func:`~plugrl_advantages.classify.plugrl_configure`, :func:`~plugrl_advantages.classify.plugrl_check_config`).
"""

from plugrl.api import names_on_first_use

# each name, and the submodule it lives in: imported on first use (the plugin loader asks for every one)
_HOME = {
    "plugrl_check_config": "classify",  # the hooks, for the plugin loader: not exported
    "plugrl_configure": "classify",
    "gae": "estimators.gae",
    "gpg": "estimators.gpg",
    "grpo": "estimators.grpo",
    "grpo_passk": "estimators.grpo_passk",
    "opo": "estimators.opo",
    "reinforce_plus_plus": "estimators.reinforce_plus_plus",
    "reinforce_plus_plus_baseline": "estimators.reinforce_plus_plus",
    "remax": "estimators.remax",
    "rloo": "estimators.rloo",
    "grpo_weighted_add": "estimators.weighted",
    "grpo_weighted_mul": "estimators.weighted",
    "cispo": "losses",
    "gspo": "losses",
    "luspo": "losses",
    "sapo": "losses",
}
__all__ = sorted(name for name in _HOME if not name.startswith("plugrl_"))


__getattr__, __dir__ = names_on_first_use(__name__, _HOME)
