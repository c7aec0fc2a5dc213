"""Environments written for other trainers: the seam to the package that adapts them.

``trl_environment`` (a class written for TRL's ``GRPOTrainer(environment_factory=...)``, unchanged, as a plugrl
environment; docs/environments.md) is plugrl-compat's, the entry point of group ``plugrl.environment_adapters``:
``from plugrl.rollout.adapters import trl_environment`` reads it from there, and raises
:class:`NoEnvironmentAdapters` naming the package when it is not installed.
"""

from __future__ import annotations

from typing import Any

from plugrl.plugin_errors import implementation, package_hint

GROUP = "plugrl.environment_adapters"
PACKAGE = "plugrl-compat"
ADAPTED = ("trl_environment",)


class NoEnvironmentAdapters(ImportError):
    """TRL's environment adapter asked for without the package that has it; the message names it."""


def __getattr__(name: str) -> Any:
    if name in ADAPTED:
        missing = NoEnvironmentAdapters(
            f"{__name__}.{name} (TRL's environment classes as plugrl environments) is in the package {PACKAGE}, "
            f"which is not installed: {package_hint(PACKAGE)}"
        )
        return getattr(implementation(GROUP, missing), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
