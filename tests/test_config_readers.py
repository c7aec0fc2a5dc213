"""The config-reader hook (plugrl.readers, entry-point group plugrl.config_readers): an installed reader decides the
fate of keys in any config and claims `plugrl train` command lines; verl's and TRL's readers are the package
plugrl-compat, and without it each of their inputs is an error that names the package to install."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import textwrap

import pytest
import yaml

from plugrl import cli, config, readers
from plugrl.config import ConfigError, build_config, ignored_keys, load_config

INSTALL = "pip install plugrl-compat (in a plugrl checkout: pip install -e plugins/compat)"

# a third party's reader, as a module of its own: the "toy" project writes `toy.lr` for the learning rate and keeps
# its runs in *.toy files of `key: value` lines
TOY_READER = """
from plugrl.config import build_config
from plugrl.readers import ConfigReader, Fate


class ToyReader(ConfigReader):
    name = "toy"

    def fate_of(self, key, value, is_plugrl_key):
        if key == "toy.lr":
            return Fate(key, value, "acted", "actor.optim.lr")
        if key == "toy.fast":
            return Fate(key, value, "not acted", why="plugrl has no fast mode")
        return None

    def claims(self, args):
        return args.config is not None and args.config.endswith(".toy")

    def load(self, args):
        items = [line.split(": ", 1) for line in open(args.config).read().splitlines() if line]
        cfg = build_config({}, [f"{k}={v}" for k, v in items] + list(args.overrides), origin=f"in {args.config}")
        cfg._toy = True
        return cfg

    def check_fates(self, args, fates):
        return [f for f in fates if f.key.startswith("toy.")]

    def start_notes(self, cfg):
        return ["read as a toy run"] if getattr(cfg, "_toy", False) else []


READER = ToyReader()
"""


@pytest.fixture
def entry_points(monkeypatch, tmp_path):
    """``install(*entry_points, hide=False)``: the group plugrl.config_readers as installed (``hide``: without
    plugrl-compat's readers and config keys), plus ``entry_points``; the kernel's cache of the readers is cleared
    around it."""
    real = importlib.metadata.entry_points
    real_fields, real_built = config.installed_fields, config._built

    def install(*extra: importlib.metadata.EntryPoint, hide: bool = False) -> None:
        def patched(**kw):
            if kw.get("group") == readers.GROUP:
                return ([] if hide else list(real(**kw))) + list(extra)
            return real(**kw)

        monkeypatch.setattr(importlib.metadata, "entry_points", patched)
        readers.installed_readers.cache_clear()
        kept = {p: f for p, f in real_fields().items() if not hide or p != "plugrl-compat"}
        monkeypatch.setattr(config, "installed_fields", lambda: kept)
        monkeypatch.setattr(config, "_built", {} if hide else real_built)

    yield install
    readers.installed_readers.cache_clear()


@pytest.fixture
def toy(entry_points, monkeypatch, tmp_path):
    (tmp_path / "toy_reader.py").write_text(TOY_READER)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry_points(importlib.metadata.EntryPoint("toy", "toy_reader:READER", readers.GROUP))


def _plugrl_tree(tmp_path) -> dict:
    return {"model": {"path": "m"}, "data": {"train_files": [str(tmp_path / "train.parquet")]}}


def test_plugrl_compat_provides_the_verl_and_trl_readers():
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=readers.GROUP)}
    assert found == {"verl": "plugrl_compat.verl:READER", "trl": "plugrl_compat.trl:READER"}
    assert [r.name for r in readers.installed_readers()] == ["trl", "verl"]
    assert readers.missing_packages() == [] and readers.unknown_keys_hint() is None


def test_a_plugins_reader_translates_its_keys_in_any_config(toy, tmp_path):
    cfg = build_config(_plugrl_tree(tmp_path), ["toy.lr=0.25", "toy.fast=true", "rollout.n=3"])
    assert cfg.actor.optim.lr == 0.25 and cfg.rollout.n == 3
    fates = {f.key: (f.kind, f.target) for f in cfg._key_fates}
    assert fates["toy.lr"] == ("acted", "actor.optim.lr")
    assert fates["toy.fast"] == ("not acted", None)
    assert fates["rollout.n"] == ("acted", "rollout.n")  # plugrl's own key: no reader decides it
    assert any(text.startswith("toy.fast (plugrl has no fast mode)") for text in ignored_keys(cfg))


def test_a_plugins_reader_claims_a_command_line(toy, tmp_path):
    run = tmp_path / "run.toy"
    run.write_text(f"model.path: m\ndata.train_files: {tmp_path / 'train.parquet'}\ntoy.lr: 0.5\n")
    cfg = cli._train_config(argparse.Namespace(config=str(run), overrides=["rollout.n=2"], trl_config=None))
    assert cfg.actor.optim.lr == 0.5 and cfg.rollout.n == 2
    assert readers.start_notes(cfg) == ["read as a toy run"]
    plain = build_config(_plugrl_tree(tmp_path))
    assert readers.start_notes(plain) == []  # a config the toy reader did not read: nothing to say


def test_the_check_prints_the_fates_the_claiming_reader_gives(toy, tmp_path, capsys):
    run = tmp_path / "run.toy"
    run.write_text(f"model.path: m\ndata.train_files: {tmp_path / 'missing.parquet'}\ntoy.lr: 0.5\n")
    assert cli.main(["train", "--check", str(run)]) == 2  # no model at model.path
    out = capsys.readouterr().out
    assert "keys set (1):" in out and "toy.lr=0.5" in out and "-> actor.optim.lr" in out
    assert "check: FAILED: model.path" in out


def test_a_reader_that_fails_to_load_is_named_and_left_out(entry_points, caplog, tmp_path):
    entry_points(importlib.metadata.EntryPoint("broken", "no_such_module_here:READER", readers.GROUP))
    with caplog.at_level(logging.WARNING, logger="plugrl.readers"):
        names = [r.name for r in readers.installed_readers()]
    assert names == ["trl", "verl"]
    assert "config reader 'broken' (no_such_module_here:READER) failed to load" in caplog.text


# ---- without plugrl-compat


def test_without_the_package_trl_config_names_it(entry_points, tmp_path, capsys):
    entry_points(hide=True)
    path = tmp_path / "grpo.yaml"
    path.write_text("model_name_or_path: m\nlearning_rate: 1.0e-5\n")
    assert cli.main(["train", "--trl-config", str(path)]) == 2
    assert f"--trl-config is read by the package plugrl-compat, which is not installed: {INSTALL}" in (
        capsys.readouterr().err
    )


def test_without_the_package_a_command_line_of_overrides_names_it(entry_points, capsys):
    entry_points(hide=True)
    assert cli.main(["train", "actor_rollout_ref.model.path=/m", "data.train_files=/d/train.parquet"]) == 2
    err = capsys.readouterr().err
    assert "a command line of overrides only is a verl script, read by the package plugrl-compat" in err
    assert INSTALL in err


def test_without_the_package_a_verl_key_is_unknown_and_names_it(entry_points, tmp_path):
    entry_points()  # installed: verl's key acts on plugrl's
    assert build_config(_plugrl_tree(tmp_path), ["actor_rollout_ref.rollout.n=8"]).rollout.n == 8
    entry_points(hide=True)
    with pytest.raises(ConfigError) as e:
        build_config(_plugrl_tree(tmp_path), ["actor_rollout_ref.rollout.n=8"])
    assert "unknown key 'actor_rollout_ref.rollout.n'" in str(e.value)
    assert f"verl's and TRL's keys are read by the package plugrl-compat, which is not installed: {INSTALL}" in str(
        e.value
    )
    # verl's rollout_correction keys combine: the reader reads the section whole, and without it they are unknown
    verl_tis = {"algorithm": {"rollout_correction": {"rollout_is": "token", "rollout_is_threshold": 2.0}}}
    with pytest.raises(ConfigError) as e:
        build_config(_plugrl_tree(tmp_path) | verl_tis)
    assert "unknown key 'algorithm.rollout_correction.rollout_is'" in str(e.value) and INSTALL in str(e.value)
    entry_points()
    rc = build_config(_plugrl_tree(tmp_path) | verl_tis).algorithm.rollout_correction
    assert (rc.mode, rc.level, rc.cap) == ("truncate", "token", 2.0)
    entry_points(hide=True)
    # plugrl's own keys need no reader; an error without unknown keys has no hint
    assert build_config(_plugrl_tree(tmp_path), ["rollout.n=8"]).rollout.n == 8
    with pytest.raises(ConfigError) as e:
        build_config(_plugrl_tree(tmp_path), ["rollout.n=0"])
    assert "plugrl-compat" not in str(e.value)


def test_without_the_package_a_trl_file_given_as_config_names_it(entry_points, tmp_path):
    entry_points(hide=True)
    path = tmp_path / "grpo.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "m", "learning_rate": 1e-5, "num_generations": 4}))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "unknown key 'learning_rate'" in str(e.value) and INSTALL in str(e.value)


def test_a_plugrl_yaml_loads_the_same_without_the_package(entry_points, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            model: {{path: m}}
            data: {{train_files: [{tmp_path / "train.parquet"}]}}
            actor: {{optim: {{lr: 2.0e-6}}}}
            rollout: {{n: 4}}
            """
        )
    )
    entry_points()
    with_readers = load_config(path).model_dump()
    entry_points(hide=True)
    for section, key in [key.split(".") for key in config.PACKAGE_KEYS if config.PACKAGE_KEYS[key] == "plugrl-compat"]:
        del with_readers[section][key]  # plugrl-compat's own keys
    assert load_config(path).model_dump() == with_readers


@pytest.mark.parametrize(
    "override, key",
    [
        ("reward.custom_reward_function.path=/my/reward.py", "reward.custom_reward_function.path"),
        ("reward.reward_funcs=[my_rewards.accuracy]", "reward.reward_funcs"),
        ("trainer.rollout_data_dir=/tmp/dumps", "trainer.rollout_data_dir"),
    ],
)
def test_without_the_package_a_key_of_verl_or_trl_names_it(entry_points, tmp_path, override, key):
    """verl's custom_reward_function and sample files and TRL's reward_funcs are plugrl-compat's keys (group
    plugrl.config_fields): set without it, the config is refused naming the key and the package."""
    entry_points(hide=True)
    with pytest.raises(ConfigError) as e:
        build_config(_plugrl_tree(tmp_path), [override])
    assert f"{key} is a key of the package plugrl-compat, which is not installed: {INSTALL}" in str(e.value)
