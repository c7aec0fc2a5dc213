"""A run without ``plugins:`` loads the installed plugins that provide what it names (plugrl.plugin_choice), and
verl's truncation and warm-up semantics that a verl command line relies on."""

from __future__ import annotations

import pytest

from plugrl.actor import _lr_lambda
from plugrl.config import OptimConfig, build_config
from plugrl.plugin_choice import Installed, Needs, choose_plugins, load_installed
from plugrl.plugins import PluginError
from plugrl.prompts import truncate_ids


@pytest.fixture(scope="module")
def installed() -> Installed:
    return load_installed()


def test_the_plugins_a_run_names_are_chosen_from_the_installed_ones(installed):
    needs = Needs()
    needs.add("advantage estimator", "rloo", "algorithm.adv_estimator")
    needs.add("policy loss", "vanilla", "actor.loss_mode")  # the kernel's own: no plugin
    needs.add("dataset", "countdown", "data.dataset")
    needs.data_sources = {"countdown", "grade"}
    names, chosen = choose_plugins(installed, needs, [])
    assert set(names) == {"advantages", "countdown", "grade"}
    assert chosen["advantages"] == ["rloo"] and sorted(chosen["countdown"]) == ["countdown", "countdown"]


def test_a_policy_loss_of_plugrl_advantages_loads_it_as_an_estimator_of_it_does(installed):
    """actor.loss_mode=sapo (or gspo, luspo, cispo) with no `plugins:`: plugrl-advantages, which registers it."""
    for loss in ("gspo", "luspo", "cispo", "sapo"):
        needs = Needs()
        needs.add("policy loss", loss, "actor.loss_mode")
        assert choose_plugins(installed, needs, []) == (["advantages"], {"advantages": [loss]})


def test_a_data_source_two_plugins_score_is_an_error_unless_one_is_preferred(installed):
    needs = Needs(data_sources={"openai/gsm8k"})  # plugrl's gsm8k plugin and verl's scorers both score it
    with pytest.raises(PluginError, match=r"data_source 'openai/gsm8k' is provided by several installed plugins"):
        choose_plugins(installed, needs, [])
    assert choose_plugins(installed, needs, ["verl_default"])[0] == ["verl_default"]
    assert choose_plugins(installed, needs, ["gsm8k"])[0] == ["gsm8k"]


def test_a_name_no_installed_plugin_provides_is_an_error_naming_it_and_the_key(installed):
    needs = Needs()
    needs.add("advantage estimator", "grpo_weighted_cubic", "algorithm.adv_estimator")
    with pytest.raises(PluginError) as e:
        choose_plugins(installed, needs, [])
    assert "advantage estimator 'grpo_weighted_cubic' (algorithm.adv_estimator)" in str(e.value)


def test_a_data_source_routed_by_the_most_specific_glob_picks_its_plugin(installed):
    assert choose_plugins(installed, Needs(data_sources={"polaris_tinyv"}), [])[0] == ["tinyv"]


@pytest.mark.parametrize(
    ("side", "kept"),
    [("left", [5, 6, 7, 8]), ("right", [0, 1, 2, 3]), ("middle", [0, 1, 7, 8]), ("error", [0, 1, 2, 3])],
)
def test_overlong_prompts_are_cut_as_verls_data_truncation_cuts_them(side, kept):
    assert truncate_ids(list(range(9)), 4, side) == kept
    assert truncate_ids([1, 2], 4, side) == [1, 2]
    assert truncate_ids(list(range(9)), 5, "middle") == [0, 1, 6, 7, 8]  # verl: limit // 2 first, the rest last


def test_verls_warmup_ratio_applies_when_warmup_steps_is_null():
    ratio = _lr_lambda(OptimConfig(warmup_steps=None, warmup_steps_ratio=0.1), total_steps=50)
    assert [ratio(s) for s in (0, 4, 5)] == [0.2, 1.0, 1.0]  # 5 warm-up steps
    fixed = _lr_lambda(OptimConfig(warmup_steps=2, warmup_steps_ratio=0.5), total_steps=50)
    assert [fixed(s) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    verl = build_config(
        {"model": {"path": "/m"}, "data": {"train_files": ["t"]}},
        ["actor_rollout_ref.actor.optim.lr_warmup_steps=-1", "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"],
    )
    assert (verl.actor.optim.warmup_steps, verl.actor.optim.warmup_steps_ratio) == (None, 0.1)
