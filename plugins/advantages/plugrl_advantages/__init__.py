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
:mod:`plugrl.rollout_correction`, found through the entry-point group ``plugrl.rollout_correction``.

Solution classifiers are this plugin's own kind of record (:mod:`plugrl_advantages.classify`): another plugin
registers one with ``@plugrl_advantages.classify.solution_classifier("name")`` (the ``openai`` one: the plugin
classifier_openai), and this plugin's hooks settle and check ``algorithm.classifier`` at start
(:func:`~plugrl_advantages.classify.plugrl_configure`, :func:`~plugrl_advantages.classify.plugrl_check_config`).
"""

# the hooks: attributes of the module for the plugin loader, not part of the exported estimators
from .classify import plugrl_check_config, plugrl_configure  # noqa: F401
from .estimators.gae import gae
from .estimators.gpg import gpg
from .estimators.grpo import grpo
from .estimators.grpo_passk import grpo_passk
from .estimators.opo import opo
from .estimators.reinforce_plus_plus import reinforce_plus_plus, reinforce_plus_plus_baseline
from .estimators.remax import remax
from .estimators.rloo import rloo
from .estimators.weighted import grpo_weighted_add, grpo_weighted_mul
from .losses import cispo, gspo, luspo, sapo

__all__ = [
    "cispo",
    "gae",
    "gpg",
    "grpo",
    "grpo_passk",
    "grpo_weighted_add",
    "grpo_weighted_mul",
    "gspo",
    "luspo",
    "opo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
    "sapo",
]
