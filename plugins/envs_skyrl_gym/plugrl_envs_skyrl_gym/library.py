"""skyrl-gym itself: importing it, finding an environment in its registry, and building the ``env_config`` an
environment is made with.

Nothing here runs an episode. Every function raises an error that says what was wrong and how to fix it,
since what they raise at start-up is shown to the user as the reason the run did not start.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

INSTALL = "pip install plugrl-envs-skyrl-gym"  # the plugin pins the skyrl-gym release it was tested with
PINNED = "skyrl-gym==0.4.0"


def import_skyrl_gym() -> ModuleType:
    """The ``skyrl_gym`` module; a ModuleNotFoundError with the install command when it does not import."""
    try:
        import skyrl_gym
    except ImportError as e:  # missing, or broken by a missing dependency of its own
        raise ModuleNotFoundError(
            f"the skyrl-gym library does not import ({type(e).__name__}: {e}); install it with `{INSTALL}` "
            f"(which pins {PINNED}), or `pip install {PINNED}`"
        ) from e
    return skyrl_gym


def _registry() -> dict[str, Any]:
    from skyrl_gym.envs import registration  # the dict `register` fills; `skyrl_gym.registry` is the same one

    return registration.registry


def registered_ids() -> list[str]:
    """The ids ``skyrl_gym.make`` knows now (built-ins and those registered by imported modules), sorted."""
    return sorted(_registry())


def env_spec(env_id: str) -> Any:
    """skyrl-gym's ``EnvSpec`` for ``env_id``; a LookupError listing the registered ids when there is none."""
    spec = _registry().get(env_id)
    if spec is not None:
        return spec
    ids = registered_ids()
    close = difflib.get_close_matches(env_id, ids, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise LookupError(
        f"skyrl-gym has no environment {env_id!r}{hint}; registered: {', '.join(ids) or 'none'}. "
        "For an environment of your own, call skyrl_gym.register(id=..., entry_point='my_module:MyEnv') in a "
        "module listed in `plugins` (a local one as 'my_module:')"
    )


def env_creator(env_id: str) -> Callable[..., Any]:
    """What ``skyrl_gym.make(env_id)`` calls (usually the environment class), imported now so that an entry
    point that does not import stops the run at start-up rather than at its first episode."""
    spec = env_spec(env_id)
    entry = spec.entry_point
    if callable(entry):
        return entry
    if not isinstance(entry, str) or entry.count(":") != 1:
        raise ValueError(
            f"skyrl-gym environment {env_id!r} is registered with entry point {entry!r}, not 'module:Name'"
        )
    from skyrl_gym.envs.registration import load_env_creator

    try:
        return load_env_creator(entry)
    except Exception as e:  # its module, or a library that module needs, is missing
        raise ImportError(
            f"skyrl-gym environment {env_id!r}: its entry point {entry!r} does not import "
            f"({type(e).__name__}: {e}); install what it needs"
        ) from e


def config_dataclass(creator: Callable[..., Any]) -> type | None:
    """The dataclass an environment declares for its ``env_config`` (``Text2SQLEnvConfig`` for ``text2sql``,
    ``SearchEnvConfig`` for ``search``), read from its ``__init__`` annotation; None when it declares none."""
    init = getattr(creator, "__init__", None) if isinstance(creator, type) else creator
    try:
        hint = typing.get_type_hints(init).get("env_config")
    except Exception:  # unresolvable annotations: no declared config, as for most environments
        return None
    for candidate in (hint, *typing.get_args(hint)):
        if isinstance(candidate, type) and dataclasses.is_dataclass(candidate):
            return candidate
    return None


def make_env_config(env_id: str, creator: Callable[..., Any], options: Mapping[str, Any]) -> Any:
    """``environment_options`` as SkyRL hands them to an environment: an OmegaConf ``DictConfig`` (read as
    ``env_config.db_path`` or ``env_config["db_path"]``), over the defaults of the config dataclass the
    environment declares, which SkyRL's own config fills in; a ValueError for a key that dataclass lacks."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    schema = config_dataclass(creator)
    try:
        if schema is None:
            return OmegaConf.create(dict(options))
        return OmegaConf.merge(OmegaConf.structured(schema), dict(options))
    except OmegaConfBaseException as e:
        first = str(e).splitlines()[0]
        keys = ", ".join(f.name for f in dataclasses.fields(schema)) if schema else "any"
        raise ValueError(
            f"environment_options do not fit skyrl-gym environment {env_id!r}'s env_config "
            f"({schema.__name__ if schema else 'a mapping'}): {first}; its keys: {keys}"
        ) from None
