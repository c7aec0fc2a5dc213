"""plugrl-compat beyond its config readers: verl's sample dumps on the kernel's hook ``plugrl_samples`` (its extension
``compat``), TRL's metric names for ``trainer.metric_aliases: trl`` (group ``plugrl.metric_aliases``), verl's
``reward_model.enable`` settled by its reader, and verl's null; without the package, each of those keys is refused
naming it."""

from __future__ import annotations

import importlib.metadata
import json
from types import SimpleNamespace

import pytest

from plugrl import config, plugins, readers
from plugrl.config import ConfigError, build_config
from plugrl.plugin_errors import PluginError
from plugrl.plugins import call_hook, load_plugins
from plugrl.tracking import Tracker

INSTALL = "pip install plugrl-compat (in a plugrl checkout: pip install -e plugins/compat)"
TREE = {"model": {"path": "m"}, "data": {"train_files": ["train.parquet"]}}


@pytest.fixture
def without_compat(monkeypatch):
    """Every entry point of plugrl-compat hidden, in every group; the kernel's caches of them cleared."""
    real = importlib.metadata.entry_points

    def patched(**kw):
        return [ep for ep in real(**kw) if not ep.value.startswith("plugrl_compat")]

    monkeypatch.setattr(importlib.metadata, "entry_points", patched)
    readers.installed_readers.cache_clear()
    plugins.extensions.cache_clear()
    fields = config.installed_fields.__wrapped__()  # the config's classes built without plugrl-compat's keys
    monkeypatch.setattr(config, "installed_fields", lambda: fields)
    monkeypatch.setattr(config, "_built", {})
    yield
    readers.installed_readers.cache_clear()
    plugins.extensions.cache_clear()


def test_the_package_adds_its_hook_and_trls_metric_names():
    def group(name: str) -> dict[str, str]:
        return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=name)}

    assert group("plugrl.extensions")["compat"] == "plugrl_compat.hooks"
    assert group("plugrl.metric_aliases") == {"trl": "plugrl_compat.trl_metrics:NAMES"}
    assert group("plugrl.moved_names") == {"compat": "plugrl_compat.moved_names:MOVED"}


def test_verls_sample_files_are_written_by_the_hook(tmp_path):
    """trainer.rollout_data_dir gets a training step's samples, trainer.validation_data_dir a validation's, in
    verl's layout: {dir}/{step}.jsonl with input, output, gts, score and step first, then the reward's details."""
    cfg = build_config(
        TREE, [f"+trainer.rollout_data_dir={tmp_path / 'train'}", f"trainer.validation_data_dir={tmp_path / 'val'}"]
    )
    rows = [
        {
            "prompt": "2+2?",
            "completion": "4",
            "data_source": "arith",
            "ground_truth": "4",
            "reward": 1.0,
            "details": {"acc": 1.0, "score": 9.0},
            "finish_reason": "stop",
        }
    ]
    registry = load_plugins([])
    for step, validation in ((3, False), (0, True)):
        kwargs = {"config": cfg, "run_dir": tmp_path, "step": step, "rows": rows, "validation": validation}
        assert [name for name, _ in call_hook(registry, "plugrl_samples", "", **kwargs)] == ["compat"]
    (line,) = (tmp_path / "train" / "3.jsonl").read_text().splitlines()
    assert json.loads(line) == {
        "input": "2+2?",
        "output": "4",
        "gts": "4",
        "score": 1.0,
        "step": 3,
        "acc": 1.0,
        "data_source": "arith",
    }
    assert list(json.loads(line))[:5] == ["input", "output", "gts", "score", "step"]
    assert json.loads((tmp_path / "val" / "0.jsonl").read_text())["step"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train", "val"]  # nothing else, no temporary file
    plain = build_config(TREE)  # no directory set: nothing written
    kwargs = {"config": plain, "run_dir": tmp_path / "run", "step": 1, "rows": rows, "validation": False}
    list(call_hook(registry, "plugrl_samples", "", **kwargs))
    assert not (tmp_path / "run").exists()


def test_verls_reward_model_switch_is_settled_by_its_reader():
    """The last of verl's two spellings of reward_model.enable read decides; its fate says what it sets."""
    on = build_config(TREE, ["reward.reward_model.enable=false", "reward_model.enable=yes", "plugins=gsm8k"])
    assert on.plugins == ["gsm8k", "reward_model"] and on.reward.default == "reward_model"
    fate = next(f for f in on._key_fates if f.key == "reward_model.enable")
    assert (fate.kind, fate.target, fate.settled) == ("acted", "plugins, reward.default", True)
    off = build_config(TREE, ["reward_model.enable=true", "reward.reward_model.enable=false"])
    assert off.plugins == [] and off.reward.default is None


def test_verls_null_leaves_plugrls_default():
    cfg = build_config(TREE, ["actor_rollout_ref.rollout.n=null"])
    assert cfg.rollout.n == 8
    (fate,) = [f for f in cfg._key_fates if f.key == "actor_rollout_ref.rollout.n"]
    assert (fate.kind, fate.why) == ("not acted", "null: plugrl's default rollout.n=8 stands")


def test_without_the_package_its_keys_are_refused_naming_it(without_compat, tmp_path):
    for override, said in (
        (f"trainer.rollout_data_dir={tmp_path}", "trainer.rollout_data_dir is a key of the package plugrl-compat"),
        (
            f"trainer.validation_data_dir={tmp_path}",
            "trainer.validation_data_dir is a key of the package plugrl-compat",
        ),
        ("trainer.metric_aliases=trl", "trainer.metric_aliases is a key of the package plugrl-compat"),
        ("reward_model.enable=true", "unknown key 'reward_model.enable'"),
    ):
        with pytest.raises(ConfigError) as e:
            build_config(TREE, [override])
        assert said in str(e.value) and "package plugrl-compat, which is not installed" in str(e.value)
        assert INSTALL in str(e.value)
    with pytest.raises(ValueError, match="the metric names 'trl' come with no installed package"):
        Tracker(tmp_path / "run", SimpleNamespace(logger=["jsonl"], metric_aliases="trl"), total_steps=1)
    assert getattr(build_config(TREE).trainer, "metric_aliases", "none") == "none"  # the kernel's reading of it
    kwargs = {"config": None, "run_dir": tmp_path, "step": 1, "rows": [], "validation": False}
    assert [name for name, _ in call_hook(load_plugins([]), "plugrl_samples", "", **kwargs)] == []


def test_trls_and_verls_adapters_users_import_from_the_kernel_are_the_packages():
    """``plugrl.rewards.trl_reward``, ``plugrl.rewards.verl_compute_score`` (and their wrappers) and
    ``plugrl.rollout.adapters.trl_environment``, as users import them, are plugrl-compat's."""
    import plugrl_compat.reward_adapters as rewards_package
    import plugrl_compat.trl_environment as environment_package
    from plugrl import rewards
    from plugrl.rewards import adapters as reward_seam
    from plugrl.rewards import trl_reward, verl_compute_score
    from plugrl.rollout.adapters import trl_environment

    assert trl_reward is rewards_package.trl_reward
    assert verl_compute_score is rewards_package.verl_compute_score
    assert trl_environment is environment_package.trl_environment
    for name in ("TRLReward", "VerlScore", "AsyncVerlScore"):
        assert getattr(rewards, name) is getattr(rewards_package, name) is getattr(reward_seam, name)
    assert reward_seam.VERL_ARGS == ("data_source", "solution_str", "ground_truth", "extra_info")
    assert not hasattr(rewards, "no_such_name")  # any other name is still an AttributeError


def test_without_the_package_trls_and_verls_adapters_are_refused_naming_it(without_compat, tmp_path, monkeypatch):
    for typed, said in (
        ("from plugrl.rewards import trl_reward", "plugrl.rewards.trl_reward (TRL's and verl's reward functions"),
        ("from plugrl.rewards import verl_compute_score", "plugrl.rewards.verl_compute_score (TRL's and verl's"),
        ("from plugrl.rewards.adapters import VerlScore", "plugrl.rewards.adapters.VerlScore (TRL's and verl's"),
        ("from plugrl.rollout.adapters import trl_environment", "plugrl.rollout.adapters.trl_environment (TRL's"),
    ):
        with pytest.raises(ImportError) as e:
            exec(typed, {})  # the import statement as users type it
        assert said in str(e.value) and "is in the package plugrl-compat, which is not installed" in str(e.value)
        assert INSTALL in str(e.value)
    # a plugin written with them fails to load with that message
    (tmp_path / "trl_style_plugin_no_compat.py").write_text(
        "from plugrl.rewards import trl_reward\n\nreward = trl_reward(lambda prompts, completions: [1.0])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="trl_style_plugin_no_compat") as e:
        load_plugins(["trl_style_plugin_no_compat:"])
    assert INSTALL in str(e.value)
