"""TRL's config reader: a TRL GRPOConfig YAML, given as ``--trl-config FILE`` or where a plugrl config goes.

The translation is :mod:`plugrl_compat.trl_config`; :data:`READER` is what the kernel's entry-point group
``plugrl.config_readers`` finds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from plugrl.config import Config
from plugrl.readers import ConfigReader, Fate, TrainArguments
from plugrl_compat.trl_config import is_trl_config_file, key_fates, load_trl_config, split_overrides
from plugrl_compat.trl_reward_funcs import use_reward_funcs

FLAG = "--trl-config"


class TrlReader(ConfigReader):
    """``--trl-config FILE``, or a CONFIG that holds TRL's keys and no plugrl section."""

    name = "trl"

    def _file(self, args: TrainArguments) -> str | None:
        return args.flags.get(FLAG) or (args.config if args.config and is_trl_config_file(args.config) else None)

    def claims(self, args: TrainArguments) -> bool:
        return self._file(args) is not None

    def load(self, args: TrainArguments) -> Config:
        path = self._file(args)
        if FLAG not in args.flags:  # a TRL GRPOConfig where a plugrl config goes: read as --trl-config would
            logging.getLogger("plugrl.trl_config").info(
                "%s holds TRL GRPOConfig keys, not plugrl's: read as `--trl-config %s`", path, path
            )
        return load_trl_config(path, args.overrides)

    def add_rewards(self, cfg: Config, registry: Any) -> None:
        """``reward.reward_funcs`` (TRL's ``reward_funcs``): those functions score every sample
        (:func:`plugrl_compat.trl_reward_funcs.use_reward_funcs`)."""
        use_reward_funcs(cfg, registry)

    def check_fates(self, args: TrainArguments, fates: Sequence[Fate]) -> list[Fate]:
        """The file's keys and the TRL overrides as typed, with their TRL fates, then the plugrl overrides' own
        (``fates`` holds those, beside the keys of the translated tree, which the user did not type)."""
        plugrl_keys = {o.split("=", 1)[0].lstrip("+") for o in split_overrides(args.overrides)[1]}
        return key_fates(self._file(args), args.overrides) + [f for f in fates if f.key in plugrl_keys]


READER = TrlReader()
