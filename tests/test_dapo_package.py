"""DAPO is plugrl-dapo's (plugins/dapo): its keys (algorithm.filter_groups, data.gen_batch_size,
reward.overlong_buffer) through the entry-point group plugrl.config_fields, what the trainer calls through
plugrl.dynamic_sampling. Without the package a config that sets them is refused naming it, and a run that sets none
never looks it up."""

from __future__ import annotations

import copy

import pytest

from plugrl.config import ConfigError, build_config
from plugrl.episodes import SAMPLING_GROUP, dapo_settings, dynamic_sampling

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}}
HINT = "pip install plugrl-dapo (in a plugrl checkout: pip install -e plugins/dapo)"


def test_the_keys_and_the_sampling_are_plugrl_dapos():
    import plugrl_dapo.sampling

    cfg = build_config(
        copy.deepcopy(BASE), ["algorithm.filter_groups.enable=true", "reward.overlong_buffer.enable=true"]
    )
    assert dapo_settings(cfg) == (True, True) and dynamic_sampling() is plugrl_dapo.sampling
    assert dapo_settings(build_config(copy.deepcopy(BASE))) == (False, False)
    with pytest.raises(ConfigError, match=r"reward.overlong_buffer.len \(512\) must be smaller than"):
        build_config(copy.deepcopy(BASE), ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=512"])


def test_without_the_package_its_keys_are_refused_naming_it(without_config_fields, hide_entry_points):
    without_config_fields("plugrl-dapo")
    hide_entry_points(SAMPLING_GROUP)
    with pytest.raises(ConfigError) as err:
        build_config(copy.deepcopy(BASE), ["algorithm.filter_groups.enable=true", "data.gen_batch_size=32"])
    assert str(err.value).splitlines()[1:] == [
        f"  algorithm.filter_groups.enable is a key of the package plugrl-dapo, which is not installed: {HINT}",
        f"  data.gen_batch_size is a key of the package plugrl-dapo, which is not installed: {HINT}",
    ]
    cfg = build_config(copy.deepcopy(BASE))
    assert dapo_settings(cfg) == (False, False)  # a run without them: nothing to look up
    with pytest.raises(
        ConfigError, match="DAPO's dynamic sampling and overlong penalty are in the package plugrl-dapo"
    ):
        dynamic_sampling()
