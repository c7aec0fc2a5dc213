"""plugrl: a small RL post-training kernel for LLMs, extended by plugins."""

from plugrl.hookspecs import hookimpl
from plugrl.specs import (
    ClassifierSpec,
    DatasetSpec,
    EstimatorSpec,
    RewardSpec,
    TemplateSpec,
    advantage_estimator,
    dataset,
    reward,
    solution_classifier,
    template,
)

__version__ = "0.1.0"

__all__ = [
    "ClassifierSpec",
    "DatasetSpec",
    "EstimatorSpec",
    "RewardSpec",
    "TemplateSpec",
    "advantage_estimator",
    "dataset",
    "hookimpl",
    "reward",
    "solution_classifier",
    "template",
]
