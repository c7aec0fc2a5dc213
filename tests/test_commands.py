"""The user commands are packages of their own (entry-point group plugrl.commands): installed, `plugrl plugins`,
`eval`, `report`, `new-plugin` and `export` (plugrl-commands) and `rollout-serve` (plugrl-rollout-servers) are
there; not installed, each says which package to install; the kernel's own dependencies hold nothing only a command
needs."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import tomllib

from plugrl import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_commands_come_from_their_entry_points():
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=cli.COMMANDS_GROUP)}
    assert names == {
        "plugins": "plugrl_commands.plugins_list:register",
        "prepare-model": "plugrl_commands.local_models:register",
        "eval": "plugrl_commands.evaluate:register",
        "report": "plugrl_commands.report:register",
        "new-plugin": "plugrl_commands.scaffold:register",
        "export": "plugrl_commands.export:register",
        "rollout-serve": "plugrl_rollout_servers.command:register",
    }


@pytest.mark.parametrize(
    "command, package, folder",
    [
        ("plugins", "plugrl-commands", "plugins/commands"),
        ("prepare-model", "plugrl-commands", "plugins/commands"),
        ("eval", "plugrl-commands", "plugins/commands"),
        ("report", "plugrl-commands", "plugins/commands"),
        ("new-plugin", "plugrl-commands", "plugins/commands"),
        ("export", "plugrl-commands", "plugins/commands"),
        ("rollout-serve", "plugrl-rollout-servers", "plugins/rollout_servers"),
    ],
)
def test_a_command_whose_package_is_not_installed_names_the_package(command, package, folder, monkeypatch, capsys):
    real = importlib.metadata.entry_points

    def without_commands(**kw):
        return [] if kw.get("group") == cli.COMMANDS_GROUP else real(**kw)

    monkeypatch.setattr(importlib.metadata, "entry_points", without_commands)
    assert cli.main([command, "some", "--args"]) == 2
    err = capsys.readouterr().err
    assert f"`plugrl {command}` is in the package {package}, which is not installed" in err
    assert f"pip install -e {folder}" in err
    assert (ROOT / folder / "pyproject.toml").is_file()


def test_matplotlib_is_a_dependency_of_the_commands_not_of_the_kernel():
    kernel = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    commands = tomllib.loads((ROOT / "plugins/commands/pyproject.toml").read_text())["project"]["dependencies"]
    assert not any(d.startswith("matplotlib") for d in kernel)
    assert any(d.startswith("matplotlib") for d in commands)


def test_plugrl_eval_takes_its_arguments_as_before_and_prints_the_table(monkeypatch, capsys, tmp_path):
    """`plugrl eval` (plugrl-commands): the target, the overrides (-v adds vLLM's log level after them), --data,
    --split, --n, --temperature reach the evaluation; the metrics print as a table and --out writes them as JSON."""
    import json

    from plugrl_commands import evaluate

    seen = {}

    def fake(target, data, overrides, **options):
        seen.update(target=target, data=data, overrides=overrides, **options)
        return {"val/all/accuracy": 0.5, "val/all/prompts": 2.0}

    monkeypatch.setattr(evaluate, "evaluate_cli", fake)
    out = tmp_path / "m.json"
    argv = ["eval", "run.yaml", "rollout.name=hf", "--n", "2", "--temperature", "1.0", "--split", "test"]
    assert cli.main([*argv, "--out", str(out), "-v", "--data", "a.jsonl", "b.jsonl"]) == 0
    assert seen == {
        "target": "run.yaml",
        "data": ["a.jsonl", "b.jsonl"],
        "overrides": ["rollout.name=hf", "rollout.engine_log_level=info"],
        "n": 2,
        "temperature": 1.0,
        "split": "test",
    }
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["val/all/accuracy  0.5000", "val/all/prompts   2.0000", f"wrote {out}"]
    assert json.loads(out.read_text()) == {"val/all/accuracy": 0.5, "val/all/prompts": 2.0}


def test_local_models_come_from_their_packages_and_a_missing_one_names_its_package(hide_entry_points):
    """``model.path: local:NAME`` and ``plugrl prepare-model`` find the models of the group plugrl.local_models:
    SmolLM2 is plugrl-commands', the test VLM plugrl-vision's; without its package a known name says what to
    install."""
    from plugrl.config import ConfigError
    from plugrl.models import LOCAL_MODELS_GROUP, local_models, resolve_model_path

    found = {name: ep.value for name, ep in local_models().items()}
    assert found == {
        "SmolLM2-135M-Instruct": "plugrl_commands.local_models:prepare_smollm2",
        "Idefics3-SmolLM2-135M-test": "plugrl_vision.test_model:prepare_test_vlm",
    }
    hide_entry_points(LOCAL_MODELS_GROUP)
    with pytest.raises(ConfigError) as err:
        resolve_model_path("local:SmolLM2-135M-Instruct")
    assert str(err.value) == (
        "model.path 'local:SmolLM2-135M-Instruct': no local model 'SmolLM2-135M-Instruct'; it comes with the package "
        "plugrl-commands, which is not installed: pip install plugrl-commands (in a plugrl checkout: pip install -e "
        "plugins/commands)"
    )
    assert resolve_model_path("~/models/mine") != "~/models/mine"  # a path, not a name: no package needed


def test_train_check_without_the_package_names_it(hide_entry_points, capsys, tmp_path):
    """`plugrl train --check` prints plugrl-commands' report (group plugrl.train_check): without it, the command says
    what to install and exits 2; `plugrl train` itself needs no package."""
    from plugrl.cli import CHECK_GROUP

    hide_entry_points(CHECK_GROUP)
    assert cli.main(["train", "--check", str(tmp_path / "run.yaml")]) == 2
    assert capsys.readouterr().err.strip() == (
        "plugrl: error: `plugrl train --check` is in the package plugrl-commands, which is not installed: pip install "
        "plugrl-commands (in a plugrl checkout: pip install -e plugins/commands)"
    )
