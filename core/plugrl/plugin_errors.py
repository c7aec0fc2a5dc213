"""The error of the plugin layer and what its messages point to: :class:`PluginError`, the entry-point group that
declares plugins (``GROUP``), this checkout's own plugins (:func:`first_party`), what plugrl's own packages
provide (:data:`OWN_PACKAGES`) and how to install one (:func:`install_hint`, :func:`package_hint`).

Below the loader (:mod:`plugrl.plugins`), so that what routes through the plugins' records
(:mod:`plugrl.rewards.routing`) raises and words the same errors without importing it, and the kernel's seams load
the packages that implement them (:func:`implementation`). This module imports nothing of plugrl.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

GROUP = "plugrl"

# What plugrl's own packages provide, by kind: a name that is missing because its package is not installed gets a
# message naming the package (a config key covers the keys below it: actor.lora covers actor.lora.r).
OWN_PACKAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "plugrl-commands": {
        "command": ("plugins", "prepare-model", "eval", "report", "new-plugin", "export"),
        "local model": ("SmolLM2-135M-Instruct",),
    },
    "plugrl-rollout-servers": {
        "command": ("rollout-serve",),
        "config key": tuple(
            f"rollout.{k}"
            for k in ("server_urls", "servers", "weight_transport", "weight_chunk_mb", "server_timeout_s")
        ),
    },
    "plugrl-lora": {"config key": ("actor.lora", "critic.lora", "rollout.lora_sync")},
    "plugrl-compat": {
        "config reader": ("verl", "trl"),
        "config key": (
            *("model.use_remove_padding", "critic.use_remove_padding", "critic.forward_max_token_len_per_gpu"),
            *("trainer.n_gpus_per_node", "trainer.nnodes", "reward.custom_reward_function", "reward.reward_funcs"),
            *("trainer.rollout_data_dir", "trainer.metric_aliases", "trainer.validation_data_dir"),
        ),
    },
    "plugrl-multiturn": {
        "config key": tuple(
            f"rollout.{k}"
            for k in (
                *("max_turns", "max_turn_tokens", "step_wise", "tools", "tool_parser", "tool_time_limit_s"),
                *("env_time_limit_s", "tool_workers", "max_tool_calls_per_turn", "max_tool_response_chars"),
            )
        )
    },
    "plugrl-advantages": {"config key": ("algorithm.rollout_correction", "actor.tau_pos", "actor.tau_neg")},
    "plugrl-off-policy": {"config key": ("trainer.off_policy_steps",)},
    "plugrl-dapo": {"config key": ("data.gen_batch_size", "algorithm.filter_groups", "reward.overlong_buffer")},
    "plugrl-hub": {"config key": ("trainer.push_to_hub", "trainer.hub_model_id", "trainer.hub_private_repo")},
    "plugrl-vision": {
        "config key": ("data.image_key", "actor.freeze_vision_tower"),
        "local model": ("Idefics3-SmolLM2-135M-test",),
    },
    "plugrl-loggers": {"logger": ("wandb", "tensorboard")},
}


def own_packages(kind: str) -> dict[str, str]:
    """``{name: package}`` of what plugrl's own packages provide of ``kind`` (:data:`OWN_PACKAGES`): ``command``,
    ``config key``, ``config reader``, ``local model``, ``logger``."""
    return {name: package for package, provides in OWN_PACKAGES.items() for name in provides.get(kind, ())}


class PluginError(RuntimeError):
    """A plugin could not be found, imported or registered; the message says how to fix it."""


@cache
def first_party() -> dict[str, tuple[str, str]]:
    """Plugins of this repository: entry-point name -> (distribution, source folder), read from each
    ``plugins/*/pyproject.toml`` of the checkout plugrl runs from (empty for an installed wheel)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: no TOML reader in the standard library; only the hint is lost
        return {}
    repo = Path(__file__).resolve().parents[2]
    found: dict[str, tuple[str, str]] = {}
    for pyproject in sorted(repo.glob("plugins/*/pyproject.toml")):
        try:
            project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue  # a broken plugin folder only loses its install hint
        for name in project.get("entry-points", {}).get(GROUP, {}):
            found[name] = (project.get("name", "?"), pyproject.parent.relative_to(repo).as_posix())
    return found


def package_hint(package: str) -> str:
    """How to install one of plugrl's own packages: ``pip install plugrl-x (in a plugrl checkout: pip install -e
    plugins/x)``."""
    folder = package.removeprefix("plugrl-").replace("-", "_")
    return f"pip install {package} (in a plugrl checkout: pip install -e plugins/{folder})"


def implementation(group: str, missing: Exception) -> Any:
    """What the first entry point (by name) of ``group`` loads: the package that implements a seam of the kernel
    (tool calls, images, adapters); raises ``missing``, whose message names the package, when none is installed."""
    import importlib.metadata

    found = sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name)
    if not found:
        raise missing
    return found[0].load()


def install_hint(name: str) -> str:
    """How to install plugin ``name``: the package of this checkout that declares it, else how a package declares
    one (or names a local plugin)."""
    if name in first_party():
        dist, folder = first_party()[name]
        return f"install it with `pip install {dist}` (or `pip install -e {folder}` in a plugrl checkout)"
    return (
        f'install the package that declares it: an entry point `{name} = "your_module"` '
        f"under [project.entry-points.{GROUP}] in its pyproject.toml; or name a local plugin as `module:object`"
    )
