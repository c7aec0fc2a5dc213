"""verl's config reader: a verl script's keys in any config, and a command line of overrides only on verl's defaults.

``plugrl train key=value ...`` with no CONFIG is a verl script (:func:`load_overrides`); a verl key in a plugrl
YAML or override (``actor_rollout_ref.rollout.n=8``) takes its fate from :mod:`plugrl_compat.verl_keys`
(:data:`READER`, in the kernel's entry-point group ``plugrl.config_readers``); verl's
``algorithm.rollout_correction`` keys, which combine, are read as a section
(:mod:`plugrl_compat.verl_rollout_correction`). ``python -m plugrl_compat.verl docs/coming_from_verl.md`` rewrites
that page's table of every key of verl's trainer config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from plugrl.config import NO_DEFAULT, Config, build_config, is_plugrl_key, plugrl_default
from plugrl.readers import ConfigReader, Fate, TrainArguments
from plugrl_compat.custom_reward import use_custom_reward
from plugrl_compat.verl_keys import (
    DIFFERS_FROM_VERL,
    VERL_DEFAULTS,
    VERL_PLUGIN_PREFERENCE,
    fate_of,
    rule_of,
    verl_fate,
)
from plugrl_compat.verl_rollout_correction import VERL_ROLLOUT_CORRECTION_KEYS, rollout_correction


def load_overrides(overrides: Sequence[str]) -> Config:
    """A run given as ``key=value`` overrides only, as a verl script is: on verl's defaults (:data:`VERL_DEFAULTS`
    for the keys plugrl acts on), the run directory verl's ``checkpoints/{project_name}/{experiment_name}`` unless
    ``trainer.default_local_dir`` is set. ``cfg._verl_defaults`` marks such a run (the start says where plugrl's
    defaults differ from verl's)."""
    base = {**VERL_DEFAULTS, "plugin_preference": VERL_PLUGIN_PREFERENCE}
    cfg = build_config({}, overrides, origin="(given as overrides, on verl's defaults)", base=base)
    if cfg.trainer.default_local_dir is None:
        cfg.trainer.default_local_dir = f"checkpoints/{cfg.trainer.project_name}/{cfg.trainer.experiment_name}"
    cfg._verl_defaults = True  # type: ignore[attr-defined]
    return cfg


def verl_differences(cfg: Config) -> str | None:
    """For a run given as overrides only: the verl defaults plugrl does not take, among the keys the user left
    unset, as one line (:data:`plugrl_compat.verl_keys.DIFFERS_FROM_VERL`); None for any other run."""
    if not getattr(cfg, "_verl_defaults", False):
        return None
    typed = {f.key for f in getattr(cfg, "_key_fates", [])}
    differ = [f"{key}: {why}" for key, why in DIFFERS_FROM_VERL.items() if key not in typed]
    head = "given as overrides only, this run takes verl's defaults (docs/coming_from_verl.md)"
    return f"{head}, except {'; '.join(differ)}" if differ else head


# verl's switch of a discriminative reward model (its legacy and 0.9 spellings): scores every data source
REWARD_MODEL_SWITCHES = ("reward_model.enable", "reward.reward_model.enable")


def null_keeps_default(fate: Fate | None) -> Fate | None:
    """verl's null means "verl decides": a verl key set to null that becomes another plugrl key leaves plugrl's
    default (when that is not null itself) as it is, not acted on."""
    if fate is None or fate.kind != "acted" or not fate.target or fate.target == fate.key:
        return fate
    default = plugrl_default(fate.target) if fate.plugrl_value is None else None
    if default is None or default is NO_DEFAULT:
        return fate
    return Fate(fate.key, fate.value, "not acted", why=f"null: plugrl's default {fate.target}={default!r} stands")


def use_reward_model(tree: dict[str, Any], fates: Sequence[Fate]) -> None:
    """verl's ``reward_model.enable``, the last one read, when true: the reward_model plugin (the model at
    ``reward_model.model.path``) scores every data source no rule reward claims, as verl's reward model does."""
    switches = [f.value for f in fates if f.key in REWARD_MODEL_SWITCHES]
    if not switches or not (switches[-1] is True or str(switches[-1]).strip().lower() in ("true", "1", "yes")):
        return
    plugins = tree.get("plugins")
    plugins = [plugins] if isinstance(plugins, str) else list(plugins or [])
    tree["plugins"] = plugins if "reward_model" in plugins else [*plugins, "reward_model"]
    if isinstance(tree.get("reward"), dict):
        tree["reward"].setdefault("default", "reward_model")
    else:
        tree["reward"] = {"default": "reward_model"}


class VerlReader(ConfigReader):
    """verl's keys wherever a config is read; a command line of overrides alone is a verl script."""

    name = "verl"

    def fate_of(self, key: str, value: Any, is_plugrl_key: Callable[[str], bool]) -> Fate | None:
        if key in REWARD_MODEL_SWITCHES:  # acted on together with the others read (settle)
            return Fate(key, value, "acted", "plugins, reward.default", settled=True)
        return null_keeps_default(verl_fate(key, value, is_plugrl_key))

    def settle(self, tree: dict[str, Any], fates: Sequence[Fate]) -> None:
        use_reward_model(tree, fates)

    def claims(self, args: TrainArguments) -> bool:
        return args.config is None and not args.flags and bool(args.overrides)

    def load(self, args: TrainArguments) -> Config:
        return load_overrides(args.overrides)

    def read_section(self, section: str, data: dict[str, Any]) -> dict[str, Any] | None:
        if section == "algorithm.rollout_correction" and any(k in data for k in VERL_ROLLOUT_CORRECTION_KEYS):
            return rollout_correction(data)
        return None

    def add_rewards(self, cfg: Config, registry: Any) -> None:
        """``reward.custom_reward_function.path`` (verl's ``custom_reward_function``): that function scores every
        sample (:func:`plugrl_compat.custom_reward.use_custom_reward`)."""
        use_custom_reward(cfg, registry)

    def start_notes(self, cfg: Config) -> list[str]:
        differences = verl_differences(cfg)
        return [differences] if differences else []


READER = VerlReader()


def _described(value: object) -> str:
    text = "null" if value is None else repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def verl_key_table(verl_keys: dict[str, object]) -> str:
    """Every key of verl's trainer config (``verl_keys``: dotted key -> verl's default) with its fate here, as a
    markdown table (docs/coming_from_verl.md; tests/test_verl_keys.py compares it with verl's installed file)."""
    rows = ["| verl key | verl's default | in plugrl |", "| --- | --- | --- |"]
    for key, default in verl_keys.items():
        fate = fate_of(key, default, is_plugrl_key)
        rule = rule_of(key) if fate is not None and fate.target is None else None
        if fate is None:
            cell = "refused: unknown"
        elif rule is not None and rule.accepts is not None:
            allowed = ", ".join(f"`{_described(a)}`" for a in rule.accepts)
            cell = f"at {allowed}: what plugrl does; other values refused: {rule.why}"
        elif fate.kind == "not acted":
            cell = f"accepted, not acted on: {fate.why}"
        elif fate.target == key:
            cell = "acted on, as in verl"
        else:
            cell = f"acted on as `{fate.target}`"
        cells = [f"`{key}`", f"`{_described(default)}`", cell]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def verl_config_keys() -> dict[str, object]:
    """Every leaf key of the installed verl wheel's trainer config (verl 0.9.1's ``_generated_ppo_trainer.yaml``)
    with its default; hydra's ``_target_`` class paths left out. Needs verl installed (``make setup`` installs it
    without its dependencies; nothing of it is imported)."""
    import importlib.metadata
    from pathlib import Path

    import yaml

    path = Path(importlib.metadata.distribution("verl").locate_file("verl/trainer/config/_generated_ppo_trainer.yaml"))

    def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in tree.items():
            if key == "_target_":
                continue
            if isinstance(value, dict) and value:
                out.update(leaves(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    return leaves(yaml.safe_load(path.read_text()))


def write_verl_key_table(path: str) -> None:
    """Replace the table between ``<!-- verl-keys:begin -->`` and ``<!-- verl-keys:end -->`` in ``path``."""
    from pathlib import Path

    begin, end = "<!-- verl-keys:begin -->\n", "<!-- verl-keys:end -->"
    text = Path(path).read_text()
    head, rest = text.split(begin, 1)
    Path(path).write_text(head + begin + verl_key_table(verl_config_keys()) + end + rest.split(end, 1)[1])


if __name__ == "__main__":  # `python -m plugrl_compat.verl docs/coming_from_verl.md`: the key table, from verl's file
    import sys

    write_verl_key_table(sys.argv[1])
