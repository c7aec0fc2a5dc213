"""plugrl plugin: advantage estimators.

Each estimator lives in its own module under :mod:`plugrl_advantages.estimators` and is
re-exported here, where the plugin loader collects the decorated functions:

- ``grpo``: group-normalised outcome advantage (GRPO; Dr. GRPO with
  ``algorithm.norm_adv_by_std_in_grpo=false``).
"""

from .estimators.grpo import grpo

__all__ = ["grpo"]
