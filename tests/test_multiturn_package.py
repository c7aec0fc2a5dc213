"""Multi-turn episodes are played by plugrl-multiturn (plugins/multiturn), found through the entry-point group
plugrl.episode_runners: the kernel's seam (plugrl.rollout.episode_kit) finds it, a single-turn run never looks it up nor
imports it, and without it a multi-turn run (``environment``, ``rollout.tools``) is refused at start, for training
and for ``plugrl eval``, naming the key as the user typed it and the package."""

from __future__ import annotations

import copy
import importlib
import importlib.metadata
import sys

import pytest

from moved_names import hint_of
from plugrl.config import ConfigError, build_config
from plugrl.plugins import check_options
from plugrl.rollout import episode_kit, play
from plugrl.specs import Registry
from plugrl.startup import check_run

BASE = {"model": {"path": "/models/policy"}, "data": {"train_files": ["train.parquet"]}, "plugins": ["advantages"]}
MISSING = (
    r"multi-turn episodes are played by the package plugrl-multiturn, which is not installed: pip install "
    r"plugrl-multiturn \(in a plugrl checkout: pip install -e plugins/multiturn\)"
)


@pytest.fixture
def without_the_package(monkeypatch) -> list[str]:
    """plugrl-multiturn's entry point gone, as where the package is not installed; the module forgotten, so that a
    test can tell whether anything imports it. Returns the lookups of the group."""
    real = importlib.metadata.entry_points
    looked_up: list[str] = []

    def entry_points(**kw):
        if kw.get("group") == episode_kit.GROUP:
            looked_up.append(episode_kit.GROUP)
            return []
        return real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    for name in [m for m in sys.modules if m.split(".")[0] == "plugrl_multiturn"]:
        monkeypatch.delitem(sys.modules, name)
    return looked_up


def test_the_kit_is_plugrl_multiturns_and_makes_the_runs_player(smol_tokenizer):
    import plugrl_multiturn

    kit = episode_kit.kit("environment=x")
    assert kit is plugrl_multiturn
    functions = ("check_environments", "check_config", "check_first_prompts", "make_episode_player")
    assert all(callable(getattr(kit, f)) for f in functions)
    cfg = build_config(copy.deepcopy(BASE), ["rollout.tools=[python]", "rollout.max_turns=3"])
    registry = type("Registry", (), {"tools": {}, "environments": {}})()
    player = play.make_episode_runner(cfg, registry, engine=None, tokenizer=smol_tokenizer)
    try:
        assert isinstance(player, plugrl_multiturn.EpisodePlayer)
        assert player.runner.limits.max_turns == 3 and player.runner.default_tools == ["python"]
        assert all(callable(getattr(player, name)) for name in ("play", "close")) and "env" in player.timings
    finally:
        player.close()


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize(
    ("config", "overrides", "keys"),
    [
        ({}, ["environment=math_tools"], r"environment=math_tools"),
        ({"environment": {"gsm8k*": "math_tools"}}, [], r"environment=\{'gsm8k\*': 'math_tools'\}"),
        ({}, ["rollout.tools=[python]"], r"rollout.tools=\['python'\]"),
        (
            {},
            ["environment=math_tools", "rollout.tools=[python]"],
            r"environment=math_tools, rollout.tools=\['python'\]",
        ),
    ],
)
def test_a_multi_turn_run_without_the_package_is_refused_at_start(
    without_the_package, training, config, overrides, keys
):
    cfg = build_config({**copy.deepcopy(BASE), **config}, overrides)
    with pytest.raises(episode_kit.NoEpisodeRunner, match=rf"^{keys}: {MISSING}$"):
        check_run(cfg, training=training)
    assert isinstance(episode_kit.NoEpisodeRunner("x"), ConfigError)  # reported as a config error by the commands
    assert "plugrl_multiturn" not in sys.modules


def test_a_single_turn_run_needs_nothing_and_never_imports_the_package(without_the_package, tiny_model):
    cfg = build_config(copy.deepcopy(BASE), [f"model.path={tiny_model}", "rollout.max_turns=3"])
    assert not cfg.multi_turn and episode_kit.multi_turn_keys(cfg) == []
    episode_kit.check_installed(cfg)
    check_run(cfg, training=True)
    check_run(cfg, training=False)
    assert without_the_package == [] and "plugrl_multiturn" not in sys.modules


@pytest.mark.parametrize("name", ["EpisodeRunner", "EnvironmentTimeout"])
def test_a_plugin_importing_a_moved_name_is_told_where_it_went(name):
    assert hint_of(f"from plugrl.rollout.multiturn import {name}") == (
        f"; plugrl.rollout.multiturn.{name} moved in plugin API 2: import plugrl_multiturn.turns.{name} "
        "(package plugrl-multiturn)"
    )


@pytest.mark.parametrize(
    ("module", "name", "hint"),
    [
        (
            "plugrl.rollout.chat",
            "ChatFormat",
            "plugrl.rollout.chat moved in plugin API 2: import plugrl_multiturn.chat",
        ),
        (
            "plugrl.rollout.first_prompts",
            "check_first_prompts",
            "plugrl.rollout.first_prompts moved in plugin API 2: import plugrl_multiturn.first_prompts",
        ),
        *(
            (
                "plugrl.rollout.routing",
                name,
                f"plugrl.rollout.routing.{name} moved in plugin API 2: import plugrl_multiturn.routing.{name}",
            )
            for name in ("environment_options", "load_environment_families")
        ),
    ],
)
def test_the_chat_format_and_the_start_up_checks_moved_with_the_turns(module, name, hint):
    assert hint_of(f"from {module} import {name}") == f"; {hint} (package plugrl-multiturn)"
    new_module = module.replace("plugrl.rollout.", "plugrl_multiturn.")
    assert callable(getattr(importlib.import_module(new_module), name))  # where the hint says it is


def test_the_multi_turn_settings_check_moved_with_the_turns():
    """plugrl.startup.check_multi_turn is plugrl-multiturn's check_config now (the kit's, called at start)."""
    assert hint_of("from plugrl.startup import check_multi_turn") == (
        "; plugrl.startup.check_multi_turn moved in plugin API 2: import plugrl_multiturn.checks.check_config "
        "(package plugrl-multiturn)"
    )
    from plugrl_multiturn.checks import check_config

    cfg = build_config(copy.deepcopy(BASE), ["environment=math_tools", "data.apply_chat_template=false"])
    with pytest.raises(ConfigError, match=r"^data.apply_chat_template is false, but multi-turn episodes are written"):
        check_config(cfg)


def test_options_without_an_environment_are_the_kernels_to_refuse(without_the_package):
    """A single-turn config's environment_options (no environment to take them): the kernel's own check, with no
    lookup of the package."""
    cfg = build_config(copy.deepcopy(BASE), ["environment_options={turns: 3}"])
    assert check_options(cfg, Registry()) == [
        "environment_options is set but no environment is: set environment, or remove the options"
    ]
    assert without_the_package == [] and "plugrl_multiturn" not in sys.modules
