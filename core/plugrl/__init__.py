"""plugrl: a small RL post-training kernel for LLMs, extended by plugins."""

from plugrl.hookspecs import hookimpl
from plugrl.specs import (
    DatasetSpec,
    EstimatorSpec,
    RewardSpec,
    TemplateSpec,
    advantage_estimator,
    dataset,
    reward,
    template,
)

__version__ = "0.1.0"

__all__ = [
    "DatasetSpec",
    "EstimatorSpec",
    "RewardSpec",
    "TemplateSpec",
    "advantage_estimator",
    "dataset",
    "hookimpl",
    "reward",
    "template",
]
