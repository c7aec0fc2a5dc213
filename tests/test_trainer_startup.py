"""The trainer checks the config and the plugins' options before it loads anything heavy.

Every test points ``model.path`` at a directory that does not exist and makes every model-loading step
of the trainer raise :class:`ModelTouched`: a check that ran too late would show up as that (or as the
tokenizer's "not found" error), never as the expected message.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import plugrl.trainer as trainer_module
from plugrl.config import ConfigError, build_config
from plugrl.plugins import PluginError, check_config, load_plugins


class ModelTouched(AssertionError):
    """A model, tokenizer or process group was about to be set up: the check came too late."""


@pytest.fixture
def no_models(monkeypatch):
    """Every step of Trainer.__init__ that loads or prepares something raises ModelTouched."""

    def touched(what: str):
        def fail(*args: Any, **kwargs: Any):
            raise ModelTouched(f"{what} was called before the config error was raised")

        return fail

    import transformers

    import plugrl.startup as startup_module

    monkeypatch.setattr(startup_module, "resolve_model_path", touched("resolve_model_path"))  # the shared start-up
    monkeypatch.setattr(trainer_module, "resolve_model_path", touched("resolve_model_path"))  # the critic's
    monkeypatch.setattr(trainer_module, "init_distributed", touched("init_distributed"))
    monkeypatch.setattr(trainer_module, "PolicyModel", touched("PolicyModel"))
    monkeypatch.setattr(trainer_module, "make_engine", touched("make_engine"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", touched("AutoTokenizer.from_pretrained"))


def tree(tmp_path: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {
        "plugins": ["advantages"],
        "model": {"path": str(tmp_path / "no_such_model")},  # loading it would fail with another error
        "data": {"train_files": [str(tmp_path / "no_such_data.jsonl")]},
        "trainer": {"output_dir": str(tmp_path / "runs"), "experiment_name": "startup"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values} if isinstance(values, dict) else values
    return base


@pytest.mark.parametrize(
    ("algorithm", "error", "message"),
    [
        ({"adv_estimator": "grpoo"}, PluginError, "algorithm.adv_estimator 'grpoo' is not registered; registered: "),
        (
            # an unset classifier is the openai default now; a name nothing registers is still refused here, by the
            # advantages plugin's check of the config (its estimators call the classifier)
            {"adv_estimator": "grpo_weighted_add", "classifier": "nope"},
            ConfigError,
            "plugin 'advantages': algorithm.adv_estimator 'grpo_weighted_add' groups responses by strategy and needs "
            "algorithm.classifier; got 'nope'",
        ),
    ],
)
def test_bad_estimator_fails_before_any_model_loads(tmp_path, no_models, algorithm, error, message):
    cfg = build_config(tree(tmp_path, algorithm=algorithm))
    with pytest.raises(error, match=re.escape(message)) as info:
        trainer_module.Trainer(cfg)
    if "not registered" in message:
        assert "grpo" in str(info.value)  # lists what is registered
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # the kernel checks reward.options.tinyv against the reward's declared options (plugrl_tinyv.Options)
        ({"base_url": "http://127.0.0.1:8000/v1"}, "'reward.options.tinyv.model' is required"),
        (
            {"model": "m", "base_url": "localhost:8000"},
            "reward.options.tinyv.base_url: must be an http(s) URL such as http://127.0.0.1:8000/v1 "
            "(got 'localhost:8000')",
        ),
        ({"model": "m", "retries": "many"}, "reward.options.tinyv.retries: must be a number (got 'many')"),
        (
            {"model": "m", "setup": "both"},
            "reward.options.tinyv.setup: must be one of tinyv_only, addon, mixed (got 'both')",
        ),
        ({"model": "m", "api_key": "sk-x"}, "reward.options.tinyv.api_key: keep keys out of configs"),
    ],
)
def test_bad_plugin_options_fail_before_any_model_loads(tmp_path, no_models, options, message):
    cfg = build_config(tree(tmp_path, plugins=["advantages", "tinyv"], reward={"options": {"tinyv": options}}))
    with pytest.raises(ConfigError) as info:
        trainer_module.Trainer(cfg)
    text = str(info.value)
    assert message in text, text
    assert "before any model was loaded" in text
    assert "sk-x" not in text  # a key pasted into the config is never echoed
    assert not (tmp_path / "runs").exists()


def test_valid_plugin_options_pass_the_checks(tmp_path, no_models):
    """With good options the trainer gets past every check, to the first model-loading step."""
    cfg = build_config(tree(tmp_path, plugins=["advantages", "tinyv"], reward={"options": {"tinyv": {"model": "m"}}}))
    with pytest.raises(ModelTouched, match="resolve_model_path"):
        trainer_module.Trainer(cfg)


def test_tinyv_options_are_checked_by_the_kernel_and_its_hook_loads_the_tokenizer(tmp_path):
    registry = load_plugins(["tinyv"])
    base = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}, "plugins": ["tinyv"]}
    with pytest.raises(ConfigError, match=re.escape("'reward.options.tinyv.model' is required")):
        check_config(build_config(base), registry)  # loading tinyv needs a verifier model name
    good = build_config({**base, "reward": {"options": {"tinyv": {"model": "m", "setup": "mixed", "weight": 0.5}}}})
    check_config(good, registry)
    checked = good.reward.options["tinyv"]  # the validated values, defaults filled in, JSON types
    assert (checked["setup"], checked["weight"], checked["max_tokens"]) == ("mixed", 0.5, 16)
    assert checked["launch_args"] == []
    import plugrl_tinyv

    assert plugrl_tinyv.parse_options(checked).model_dump(mode="json") == checked  # what the reward parses again
    bad = build_config({**base, "reward": {"options": {"tinyv": {"model": "m", "max_tokens": 0}}}})
    with pytest.raises(ConfigError) as info:
        check_config(bad, registry)
    assert "  reward.options.tinyv.max_tokens: must be >= 1 (got 0)\n" in str(info.value) + "\n"
    # the plugin's own hook checks only what a value cannot tell: that the tokenizer loads
    assert plugrl_tinyv.plugrl_check_config(config=bad) is None  # the kernel reports the value
    assert plugrl_tinyv.plugrl_check_config(config=None) is None
    missing = build_config(
        {**base, "reward": {"options": {"tinyv": {"model": "m", "tokenizer_path": str(tmp_path / "nowhere")}}}}
    )
    with pytest.raises(ConfigError, match=r"plugin 'tinyv': reward.options.tinyv.tokenizer_path=.*no tokenizer"):
        check_config(missing, registry)


def test_plugrl_train_prints_the_option_error_and_exits_2(tmp_path, no_models, capsys):
    """What a user sees: one line (several problems joined by '; '), naming the key and the fix, and exit
    status 2 (no traceback)."""
    from plugrl import cli

    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tree(tmp_path, plugins=["advantages", "tinyv"])))
    overrides = ["reward.options.tinyv.model=m", "reward.options.tinyv.base_url=ftp://x/v1"]
    status = cli.main(["train", str(config), *overrides])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err == (
        "plugrl: error: invalid config (found by the plugins' checks, before any model was loaded): "
        "reward.options.tinyv.base_url: must be an http(s) URL such as http://127.0.0.1:8000/v1 "
        "(got 'ftp://x/v1')\n"
    )


def test_plugrl_eval_checks_plugin_options_before_any_model_loads(tmp_path, monkeypatch):
    import plugrl.models
    from plugrl_commands.evaluate import evaluate_cli

    def touched(*args: Any, **kwargs: Any):
        raise ModelTouched("plugrl eval resolved the model path before checking the plugins' options")

    monkeypatch.setattr(plugrl.models, "resolve_model_path", touched)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tree(tmp_path, plugins=["tinyv"], reward={"options": {"tinyv": {"model": " "}}})))
    with pytest.raises(ConfigError, match=re.escape("reward.options.tinyv.model: is required")):
        evaluate_cli(str(config), None, [], n=None, temperature=None, split=None)


def test_prompt_plus_response_over_the_models_positions_fails_before_it_loads(tmp_path, monkeypatch):
    """A local model whose config.json allows 2048 positions: 1800 + 512 tokens cannot fit (vLLM would
    otherwise stop with a raw validation traceback after the policy had loaded)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 2048}')
    monkeypatch.setattr(trainer_module, "init_distributed", lambda *a, **k: (_ for _ in ()).throw(ModelTouched()))
    cfg = build_config(
        tree(tmp_path, model={"path": str(model)}, data={"max_prompt_length": 1800, "max_response_length": 512})
    )
    with pytest.raises(
        ConfigError,
        match=r"data.max_prompt_length \(1800\) \+ data.max_response_length \(512\) = "
        r"2312 tokens, more than the 2048 positions",
    ):
        trainer_module.Trainer(cfg)
    # within the limit the check passes (and the next step, which this test stops, is reached)
    cfg = build_config(
        tree(tmp_path, model={"path": str(model)}, data={"max_prompt_length": 1536, "max_response_length": 512})
    )
    with pytest.raises(ModelTouched):
        trainer_module.Trainer(cfg)
