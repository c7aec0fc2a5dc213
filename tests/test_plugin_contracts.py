"""The kernel's side of the plugin contract: one hook call path in ``plugins:`` order, the run lifecycle
(``plugrl_run_end`` for every started plugin), plugin options declared once and validated at start-up,
and policy losses registered like estimators.

Plugins here are real modules written to a temporary directory and loaded by name (``module:``), as a
third party's would be.
"""

from __future__ import annotations

import importlib
import re

import pytest
import torch

from plugrl.config import ConfigError, build_config
from plugrl.plugins import PluginError, PluginRun, call_hook, check_config, check_policy_loss, load_plugins


@pytest.fixture
def plugin(local_plugin):
    """Write a plugin module (conftest's ``local_plugin``); returns its plugin name ``module:``."""
    return lambda name, source: local_plugin(name, source) + ":"


LIFECYCLE = """
import plugrl
from plugrl_test_calls import CALLS

NAME = {name!r}

@plugrl.hookimpl
def plugrl_run_start(config, run_dir):
    CALLS.append(("start", NAME))
    if {fail_start}:
        raise RuntimeError("cannot start " + NAME)

@plugrl.hookimpl
def plugrl_run_end(config, run_dir, error):
    CALLS.append(("end", NAME, type(error).__name__ if error else None))
    if {fail_end}:
        raise RuntimeError("cannot end " + NAME)

@plugrl.hookimpl
def plugrl_step_metrics(step):
    CALLS.append(("metrics", NAME))
"""


@pytest.fixture
def calls(plugin):
    plugin("plugrl_test_calls", "CALLS = []\n")
    return importlib.import_module("plugrl_test_calls").CALLS


def lifecycle(plugin, name: str, fail_start: bool = False, fail_end: bool = False) -> str:
    return plugin(name, LIFECYCLE.format(name=name, fail_start=fail_start, fail_end=fail_end))


def test_hooks_run_in_plugins_order(plugin, calls):
    """pluggy's relay calls the last registered plugin first; the kernel calls them as `plugins:` lists them."""
    names = [lifecycle(plugin, n) for n in ("lc_b", "lc_a", "lc_c")]
    registry = load_plugins(names)
    with PluginRun(registry, None, None):
        list(call_hook(registry, "plugrl_step_metrics", "return metrics", step=1))
    assert calls == [
        ("start", "lc_b"),
        ("start", "lc_a"),
        ("start", "lc_c"),
        ("metrics", "lc_b"),
        ("metrics", "lc_a"),
        ("metrics", "lc_c"),
        ("end", "lc_b", None),
        ("end", "lc_a", None),
        ("end", "lc_c", None),
    ]


def test_a_raising_run_end_does_not_skip_the_others(plugin, calls, caplog):
    names = [lifecycle(plugin, "le_a"), lifecycle(plugin, "le_b", fail_end=True), lifecycle(plugin, "le_c")]
    with pytest.raises(PluginError, match=re.escape("plugin 'le_b:' raised RuntimeError: cannot end le_b")):
        with PluginRun(load_plugins(names), None, None):
            pass
    assert [c for c in calls if c[0] == "end"] == [("end", "le_a", None), ("end", "le_b", None), ("end", "le_c", None)]

    # the run failed anyway: its own error propagates, every plugin is ended with it, the bad end is logged
    calls.clear()
    with pytest.raises(KeyError, match="the run's own"), PluginRun(load_plugins(names), None, None):
        raise KeyError("the run's own")
    assert [c for c in calls if c[0] == "end"] == [
        ("end", "le_a", "KeyError"),
        ("end", "le_b", "KeyError"),
        ("end", "le_c", "KeyError"),
    ]
    assert "plugin 'le_b:': plugrl_run_end raised RuntimeError: cannot end le_b" in caplog.text


def test_a_failed_start_ends_only_the_plugins_started_before_it(plugin, calls):
    names = [lifecycle(plugin, "ls_a"), lifecycle(plugin, "ls_b", fail_start=True), lifecycle(plugin, "ls_c")]
    body_ran = False
    with pytest.raises(PluginError, match=re.escape("plugin 'ls_b:': plugrl_run_start failed")) as info:
        with PluginRun(load_plugins(names), None, None):
            body_ran = True
    assert not body_ran
    assert isinstance(info.value.__cause__, RuntimeError)
    assert calls == [("start", "ls_a"), ("start", "ls_b"), ("end", "ls_a", "RuntimeError")]


# ----------------------------------------------------------------------------------------- options

OPTIONS_PLUGIN = """
import plugrl
from pydantic import BaseModel, Field

class ScaleOptions(BaseModel):
    scale: float = Field(1.0, gt=0)
    label: str = "x"

class PowerOptions(BaseModel):
    power: float = Field(0.5, gt=0, allow_inf_nan=False)

SEEN = []

@plugrl.reward("src", options=ScaleOptions)
def scaled(completion, ground_truth, scale, label):
    SEEN.append((scale, label))
    return scale

@plugrl.advantage_estimator("powered", options=PowerOptions)
def powered(batch, config):
    return config.power
"""


def config(plugin_name: str, **sections):
    tree = {"plugins": [plugin_name], "model": {"path": "m"}, "data": {"train_files": ["d.jsonl"]}}
    tree.update(sections)
    return build_config(tree)


def problems_of(cfg) -> list[str]:
    with pytest.raises(ConfigError) as info:
        check_config(cfg, load_plugins(cfg.plugins))
    return str(info.value).splitlines()[1:]


def test_declared_options_are_validated_and_passed_with_defaults(plugin):
    name = plugin("opts_ok", OPTIONS_PLUGIN)
    cfg = config(
        name,
        reward={"options": {"scaled": {"scale": "2.5"}}},
        algorithm={"adv_estimator": "powered", "power": "0.25"},
    )
    check_config(cfg, load_plugins(cfg.plugins))
    assert cfg.reward.options["scaled"] == {"scale": 2.5, "label": "x"}  # coerced, defaults filled in
    assert cfg.algorithm.power == 0.25  # set on the section the estimator receives


def test_a_misspelt_estimator_option_is_refused_with_a_suggestion(plugin):
    """Before, any key under `algorithm` that the kernel did not know was accepted without a word."""
    name = plugin("opts_typo", OPTIONS_PLUGIN)
    cfg = config(name, algorithm={"adv_estimator": "powered", "powr": 0.5})
    [problem] = problems_of(cfg)
    assert "unknown key 'algorithm.powr'; did you mean 'algorithm.power'?" in problem


def test_an_option_of_an_estimator_that_declares_none_is_refused(plugin):
    cfg = config("advantages", algorithm={"adv_estimator": "grpo", "weight_powr": 0.5})
    [problem] = problems_of(cfg)
    assert problem.startswith("  unknown key 'algorithm.weight_powr'")
    assert "the estimator 'grpo' declares no options" in problem


def test_weighted_grpo_declares_weight_power():
    bad = config("advantages", algorithm={"adv_estimator": "grpo_weighted_add", "weight_powr": 0.5})
    registry = load_plugins(["advantages"])
    with pytest.raises(ConfigError, match=re.escape("did you mean 'algorithm.weight_power'?")):
        check_config(bad, registry)
    good = config("advantages", algorithm={"adv_estimator": "grpo_weighted_add", "weight_power": "0.5"})
    check_config(good, registry)
    assert good.algorithm.weight_power == 0.5


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"scaled": {"scale": -1}}, "reward.options.scaled.scale: Input should be greater than 0 (got -1)"),
        (
            {"scaled": {"scael": 2}},
            "unknown key 'reward.options.scaled.scael'; did you mean 'reward.options.scaled.scale'?",
        ),
        ({"scaledd": {}}, "reward.options.scaledd names no registered reward; did you mean 'scaled'?"),
        (
            {"scaled": {"label": {"api_key": "sk-secret"}}},
            "reward.options.scaled.label: Input should be a valid string",
        ),
    ],
)
def test_bad_reward_options_name_the_key(plugin, options, expected):
    name = plugin("opts_bad", OPTIONS_PLUGIN)
    problems = problems_of(config(name, reward={"options": options}))
    assert any(expected in p for p in problems), problems
    assert not any("sk-secret" in p for p in problems)


def test_an_infinite_option_is_refused(plugin):
    name = plugin("opts_inf", OPTIONS_PLUGIN)
    problems = problems_of(config(name, algorithm={"adv_estimator": "powered", "power": float("inf")}))
    assert any(p.startswith("  algorithm.power: Input should be a finite number") for p in problems), problems


def test_options_must_be_a_pydantic_model():
    import plugrl

    with pytest.raises(TypeError, match=r"plugrl.reward\(options=...\) takes a pydantic BaseModel subclass"):
        plugrl.reward("src", options={"scale": 1.0})


# ----------------------------------------------------------------------------------------- policy losses

LOSS_PLUGIN = """
import plugrl
import torch

CALLED = []

@plugrl.policy_loss("mean_ratio")
def mean_ratio(logprob, old_logprob, advantages, response_mask, config, **norm):
    CALLED.append(sorted(norm))
    ratio = torch.exp(logprob - old_logprob)
    loss = -(advantages * ratio * response_mask).sum() / response_mask.sum()
    return loss, {"actor/pg_loss": loss.item()}
"""


def test_kernel_losses_are_registrations_and_a_plugin_adds_one(plugin):
    registry = load_plugins([])
    assert {n: s.plugin for n, s in registry.policy_losses.items()} == {"vanilla": "plugrl"}
    name = plugin("loss_plugin", LOSS_PLUGIN)
    registry = load_plugins([name])
    spec = check_policy_loss("mean_ratio", registry)
    assert spec.plugin == name
    with pytest.raises(PluginError, match=re.escape("actor.loss_mode 'mean_ration' is not registered; did you mean")):
        check_policy_loss("mean_ration", registry)


def test_registering_a_kernel_loss_again_is_a_clash(plugin):
    name = plugin("loss_clash", LOSS_PLUGIN.replace('"mean_ratio"', '"vanilla"'))
    with pytest.raises(
        PluginError, match=re.escape(f"policy loss 'vanilla' is registered by two plugins: 'plugrl' and '{name}'")
    ):
        load_plugins([name])


def test_the_actor_trains_with_a_plugin_loss(plugin, tiny_model):
    """The registered function is what the update backpropagates (it needs no kernel edit)."""
    from plugrl.actor import PolicyModel, TrainBatch
    from plugrl.config import ActorConfig, ModelConfig

    name = plugin("loss_actor", LOSS_PLUGIN)
    loss = check_policy_loss("mean_ratio", load_plugins([name]))
    torch.manual_seed(0)
    policy = PolicyModel(
        str(tiny_model), ModelConfig(path=str(tiny_model)), ActorConfig(loss_mode="mean_ratio"), torch.device("cpu")
    )
    batch = TrainBatch.from_sequences([[1, 2, 3, 4, 5], [1, 2, 6, 7]], [2, 2], group_ids=[0, 0])
    batch.advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]])
    before = [p.detach().clone() for p in policy.model.parameters()]
    metrics = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=3, policy_loss=loss.fn)
    assert importlib.import_module("loss_actor").CALLED == [["norm_length", "num_seqs", "num_tokens"]]
    assert "actor/pg_loss" in metrics
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, policy.model.parameters(), strict=True))


ENGINE_PLUGIN = """
import plugrl


@plugrl.rollout_engine("scripted")
def scripted(**kwargs):
    return ("scripted engine", sorted(kwargs))
"""


def test_engines_are_registrations_and_a_plugin_adds_one(plugin):
    """rollout engines are registered like estimators: the kernel's vllm and hf (and plugrl-rollout-servers'
    server, an extension's, in every run like the kernel's, under its package), a plugin's by rollout.name; an
    unknown name stops the start naming rollout.name and the registered ones."""
    from plugrl.config import ConfigError, build_config
    from plugrl.rollout import make_engine
    from plugrl.startup import check_engine

    kernel = {"vllm": "plugrl", "hf": "plugrl", "server": "plugrl-rollout-servers"}
    assert {n: s.plugin for n, s in load_plugins([]).engines.items()} == kernel
    name = plugin("engine_plugin", ENGINE_PLUGIN)
    registry = load_plugins([name])
    assert registry.engines["scripted"].plugin == name
    assert make_engine("scripted", registry.engines, model_path="m", device="cpu") == (
        "scripted engine",
        ["device", "model_path"],
    )
    cfg = build_config({"model": {"path": "/m"}, "data": {"train_files": ["t"]}, "rollout": {"name": "sglang"}})
    with pytest.raises(ConfigError, match=r"rollout.name 'sglang' is not a registered rollout engine; registered: "):
        check_engine(cfg, registry)
    cfg.rollout.name = "scripted"
    check_engine(cfg, registry)
