"""Config readers: configs written for other projects, read into plugrl's by the packages that know them.

A config reader is an object an installed package exposes in the entry-point group ``plugrl.config_readers``
(``verl = "<module>:READER"``): a :class:`ConfigReader`. The kernel asks the installed readers, by name
order, two things:

- **a key** (:func:`fate_of`): every key a config holds as typed (a plugrl YAML's, an override's, a translated
  file's) goes to each reader's ``fate_of`` first; the first :class:`Fate` wins. A key no reader decides is
  plugrl's own (acted on as itself) or unknown (refused; the error names the package of a reader that is not
  installed). So verl's ``actor_rollout_ref.rollout.n=8`` works in a plugrl file too. Keys that combine (verl's
  ``algorithm.rollout_correction.rollout_is`` and its thresholds) are read as a whole section (:func:`read_section`);
  a key that means more than one plugrl key (verl's ``reward_model.enable``) the reader settles in the merged tree
  (:func:`settle`).
- **a command line** (:func:`claiming_reader`): ``plugrl train``'s arguments (:class:`TrainArguments`) go to
  each reader's ``claims``; the first that claims them builds the run's config (``load``), says what became of
  each key for ``plugrl train --check`` (``check_fates``) and what the start must say about how it read them
  (``start_notes``). Arguments no reader claims are a plugrl YAML and its overrides, which the kernel reads itself.

plugrl's own readers are the package plugrl-compat: ``verl`` (a verl script: overrides only, on verl's defaults;
the fate of every verl key) and ``trl`` (a TRL GRPOConfig file: ``--trl-config FILE``, or given as CONFIG).
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from plugrl.plugin_errors import own_packages, package_hint

if TYPE_CHECKING:
    from plugrl.config import Config

GROUP = "plugrl.config_readers"
# the readers of plugrl's own packages, and the package each comes in: named when it is not installed
KNOWN_READERS = own_packages("config reader")
# command-line flags of `plugrl train` the kernel keeps for a reader: flag -> the reader that reads its file
READER_FLAGS = {"--trl-config": "trl"}
log = logging.getLogger("plugrl.readers")

FateKind = Literal["acted", "not acted", "refused"]


@dataclass(frozen=True)
class Fate:
    """What becomes of one key as the user typed it: its plugrl key (acted), or why not (not acted, refused)."""

    key: str
    value: Any
    kind: FateKind
    target: str | None = None
    why: str = ""
    unknown: bool = False  # refused because no reader and no plugrl key knows it
    converted: Any = None  # acted on: the value plugrl's key takes, when it is not ``value`` (see ``plugrl_value``)
    is_converted: bool = False
    settled: bool = False  # acted on by its reader's ``settle`` (``target`` says where), not set as one key

    @property
    def plugrl_value(self) -> Any:
        """The value the plugrl key takes: the typed value converted (verl's ``-1`` -> None), or as typed."""
        return self.converted if self.is_converted else self.value


@dataclass(frozen=True)
class TrainArguments:
    """``plugrl train``'s arguments as typed: CONFIG (None when the command line holds overrides only), the
    ``key=value`` overrides, and the file each reader flag names (``{"--trl-config": "grpo.yaml"}``)."""

    config: str | None
    overrides: tuple[str, ...] = ()
    flags: Mapping[str, str] = field(default_factory=dict)


class ConfigReader:
    """One project's way of writing a config. Subclass it and override what the project needs; the defaults
    decide nothing and claim nothing."""

    name: str = ""

    def fate_of(self, key: str, value: Any, is_plugrl_key: Callable[[str], bool]) -> Fate | None:
        """The fate of ``key=value`` as typed in any config, or None for a key this project's spelling does not
        decide (``is_plugrl_key`` tells plugrl's own keys)."""
        return None

    def claims(self, args: TrainArguments) -> bool:
        """Whether ``plugrl train``'s arguments are this project's (its file, its flag, its command line)."""
        return False

    def load(self, args: TrainArguments) -> Config:
        """The run's config from arguments this reader claims; :class:`plugrl.config.ConfigError` naming the key
        as typed and the fix for bad input."""
        raise NotImplementedError(f"config reader {self.name!r} claims arguments it cannot load")

    def read_section(self, section: str, data: dict[str, Any]) -> dict[str, Any] | None:
        """A section whose keys in this project's spelling combine into plugrl's (``algorithm.rollout_correction``:
        verl's ``rollout_is`` and its thresholds), as plugrl's mapping; None when ``data`` is not this project's.
        A ``ValueError`` names what plugrl cannot honour (the config's error adds the section)."""
        return None

    def settle(self, tree: dict[str, Any], fates: Sequence[Fate]) -> None:
        """Put into the merged plugrl ``tree`` what the keys this reader marked ``settled`` mean (verl's
        ``reward_model.enable``: a plugin in ``plugins`` and ``reward.default``); ``fates``: every key's, in the
        order read (the base's defaults first). Nothing by default."""

    def check_fates(self, args: TrainArguments, fates: Sequence[Fate]) -> list[Fate]:
        """The keys' fates ``plugrl train --check`` prints for these arguments, given ``fates``: those the built
        config (or the error that stopped it) carries."""
        return list(fates)

    def start_notes(self, cfg: Config) -> list[str]:
        """Lines the start of a run says about a config this reader read (warnings); none by default."""
        return []

    def add_rewards(self, cfg: Config, registry: Any) -> None:
        """Put the reward functions ``cfg`` names in this project's way (verl's ``custom_reward_function``, TRL's
        ``reward_funcs``) into ``registry``, after the plugins load and before the checks; nothing by default."""


@functools.cache
def installed_readers() -> tuple[ConfigReader, ...]:
    """Every reader of the entry-point group ``plugrl.config_readers``, by name (read once per process: tests that
    change the installed entry points call ``installed_readers.cache_clear()``). A reader that fails to load is
    named in a warning and left out, so that a broken package cannot stop plugrl's own configs."""
    found = []
    for ep in sorted(importlib.metadata.entry_points(group=GROUP), key=lambda e: e.name):
        try:
            reader = ep.load()
        except Exception as e:
            log.warning("config reader %r (%s) failed to load: %s", ep.name, ep.value, e)
            continue
        found.append(reader)
    return tuple(found)


def fate_of(key: str, value: Any, is_plugrl_key: Callable[[str], bool]) -> Fate | None:
    """The fate of ``key=value`` as typed: the first installed reader's that decides it, else plugrl's own key
    acted on as itself; None for a key nothing knows (the caller refuses it as unknown)."""
    for reader in installed_readers():
        fate = reader.fate_of(key, value, is_plugrl_key)
        if fate is not None:
            return fate
    return Fate(key, value, "acted", key) if is_plugrl_key(key) else None


def read_section(section: str, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` of the config section ``section`` in plugrl's keys: the first installed reader's reading of it, or
    ``data`` as it is (keys nothing reads are then unknown to the section's validation)."""
    for reader in installed_readers():
        out = reader.read_section(section, data)
        if out is not None:
            return out
    return data


def settle(tree: dict[str, Any], fates: Sequence[Fate]) -> None:
    """Every installed reader's :meth:`ConfigReader.settle` of the merged ``tree``, given every key's fate."""
    for reader in installed_readers():
        reader.settle(tree, fates)


def claiming_reader(args: TrainArguments) -> ConfigReader | None:
    """The first installed reader that claims ``plugrl train``'s arguments, or None (a plugrl YAML)."""
    return next((r for r in installed_readers() if r.claims(args)), None)


def start_notes(cfg: Config) -> list[str]:
    """What the installed readers say at start about how ``cfg`` was read (a verl script: the defaults plugrl
    does not take from verl)."""
    return [line for reader in installed_readers() for line in reader.start_notes(cfg)]


def missing_packages(names: Sequence[str] = tuple(KNOWN_READERS)) -> list[str]:
    """The packages of plugrl's own readers among ``names`` that are not installed."""
    installed = {r.name for r in installed_readers()}
    return list(dict.fromkeys(KNOWN_READERS[n] for n in names if n not in installed))


def install_hint(package: str) -> str:
    """``pip install plugrl-compat (in a plugrl checkout: pip install -e plugins/compat)``."""
    return package_hint(package)


def unknown_keys_hint() -> str | None:
    """For an error with unknown keys: the line that names the package reading verl's and TRL's keys when it is
    not installed, else None."""
    missing = missing_packages()
    if not missing:
        return None
    where = "; ".join(install_hint(p) for p in missing)
    return f"verl's and TRL's keys are read by the package {', '.join(missing)}, which is not installed: {where}"
