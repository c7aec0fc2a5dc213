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
  or times ``1 / freq^p`` of the response's solution strategy (``needs_solution_groups``).

The math of each is a pure function next to its estimator (``*_advantage``, ``gae_advantages``), with
shapes and formula in its docstring.
"""

from .estimators.gae import gae
from .estimators.gpg import gpg
from .estimators.grpo import grpo
from .estimators.grpo_passk import grpo_passk
from .estimators.opo import opo
from .estimators.reinforce_plus_plus import reinforce_plus_plus, reinforce_plus_plus_baseline
from .estimators.remax import remax
from .estimators.rloo import rloo
from .estimators.weighted import grpo_weighted_add, grpo_weighted_mul

__all__ = [
    "gae",
    "gpg",
    "grpo",
    "grpo_passk",
    "grpo_weighted_add",
    "grpo_weighted_mul",
    "opo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
]
