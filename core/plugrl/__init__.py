"""plugrl: a small RL post-training kernel for LLMs, extended by plugins."""

from plugrl.hookspecs import hookimpl
from plugrl.specs import (
    ClassifierSpec,
    DatasetSpec,
    EstimatorSpec,
    PolicyLossSpec,
    RewardSpec,
    TemplateSpec,
    advantage_estimator,
    dataset,
    policy_loss,
    reward,
    solution_classifier,
    template,
)

__version__ = "0.1.0"

__all__ = [
    "ClassifierSpec",
    "DatasetSpec",
    "EstimatorSpec",
    "PolicyLossSpec",
    "RewardSpec",
    "TemplateSpec",
    "advantage_estimator",
    "dataset",
    "hookimpl",
    "policy_loss",
    "reward",
    "solution_classifier",
    "template",
]
