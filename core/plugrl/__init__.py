"""plugrl: a small RL post-training kernel for LLMs, extended by plugins."""

from plugrl.api import PLUGIN_API, PluginAPIWarning
from plugrl.hookspecs import hookimpl
from plugrl.specs import (
    DatasetSpec,
    EngineSpec,
    EnvironmentSpec,
    EstimatorSpec,
    PolicyLossSpec,
    RewardSpec,
    TemplateSpec,
    advantage_estimator,
    dataset,
    environment,
    environment_family,
    policy_loss,
    reward,
    rollout_engine,
    template,
)

# the one place the kernel's version is written: pyproject.toml reads it (a literal, so the build need not import
# plugrl); `plugrl --version` prints it with PLUGIN_API, the plugin contract's number (plugrl.api says what changes it)
__version__ = "0.2.0"

# the environment contract's types, imported on first use: `import plugrl` stays light for reward workers
_ENVIRONMENT_TYPES = ("EnvStart", "EnvStep", "Environment", "EpisodeScore", "Turn")


def __getattr__(name: str):
    if name in _ENVIRONMENT_TYPES:
        from plugrl.rollout import environment as _environment

        return getattr(_environment, name)
    # @plugrl.tool is plugrl-tools' (a NoToolExecutor naming the package without it: a RuntimeError, not an
    # AttributeError, which `from plugrl import tool` would turn into an ImportError that names nothing)
    if name == "tool":
        from plugrl.rollout.tools import tool_authoring

        return tool_authoring().tool
    if name == "__all__":  # `tool` only where plugrl-tools is installed: `from plugrl import *` must not raise
        import importlib.metadata

        from plugrl.rollout.tools import AUTHORING_GROUP

        has_tools = bool(importlib.metadata.entry_points(group=AUTHORING_GROUP))
        return [n for n in _ALL if n != "tool" or has_tools]
    raise AttributeError(f"module 'plugrl' has no attribute {name!r}")


__all__ = [
    "DatasetSpec",
    "EnvStart",
    "EnvStep",
    "EngineSpec",
    "Environment",
    "EnvironmentSpec",
    "EpisodeScore",
    "EstimatorSpec",
    "PLUGIN_API",
    "PluginAPIWarning",
    "PolicyLossSpec",
    "RewardSpec",
    "TemplateSpec",
    "advantage_estimator",
    "dataset",
    "environment",
    "environment_family",
    "hookimpl",
    "policy_loss",
    "reward",
    "rollout_engine",
    "template",
    "tool",
    "Turn",
]
_ALL = __all__
del __all__  # made on first use by __getattr__, which asks whether plugrl-tools is installed
