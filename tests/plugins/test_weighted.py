"""Creativity-weighted GRPO (grpo_weighted_add / grpo_weighted_mul): weights and advantages by hand."""

from __future__ import annotations

import math

import pytest
import torch

import plugrl_advantages
from plugrl.algorithms import AdvantageBatch, StepContext, response_mask
from plugrl.config import AlgorithmConfig, build_config
from plugrl.specs import EstimatorSpec, Registry, specs_of
from plugrl_advantages.classify import ClassifierSpec, SolutionGroupsOptions, groups_by_strategy
from plugrl_advantages.estimators.weighted import (
    WeightedOptions,
    creativity_weights,
    grpo_weighted_advantage,
    strategies_per_prompt,
    weight_power,
)

W2 = 2**-0.7  # 0.615572...: the weight of a strategy shared by two responses, p = 0.7
W3 = 3**-0.7  # 0.463294...

# one prompt, 4 responses (T = 3; lengths 3, 2, 1, 3), rewards [1, 0, 1, 0], strategies [0, 0, 1, 2]
#   GRPO: mean 0.5, unbiased std sqrt((4 * 0.25) / 3) = sqrt(1/3) -> A = +-0.5 / (sqrt(1/3) + 1e-6) = +-0.866025
#   freqs [2, 2, 1, 1] -> weights [2^-0.7, 2^-0.7, 1, 1] = [0.615572, 0.615572, 1, 1]
REWARDS = [1.0, 0.0, 1.0, 0.0]
LENGTHS = [3, 2, 1, 3]
STRATEGIES = [0, 0, 1, 2]
A = 0.5 / (math.sqrt(1 / 3) + 1e-6)


def by_text(prompt, responses, **_):
    """A stand-in solution classifier: each response's text is its strategy id."""
    return [int(r) for r in responses]


# the run's registry as the step context hands it to the estimator: a plugin registered the classifier `by_text`
REGISTRY = Registry(plugin_records=[ClassifierSpec("by_text", by_text, plugin="test")])


def make_batch(rewards=REWARDS, lengths=LENGTHS, groups=None, strategies=STRATEGIES, t=3):
    """A batch whose responses the classifier `by_text` groups into ``strategies``."""
    groups = [0] * len(rewards) if groups is None else groups
    mask = response_mask(lengths, width=t)
    token_rewards = torch.zeros(len(rewards), t)
    for i, (r, n) in enumerate(zip(rewards, lengths, strict=True)):
        token_rewards[i, n - 1] = r
    return AdvantageBatch(
        token_rewards,
        mask,
        torch.tensor(groups, dtype=torch.int64),
        prompts=[f"prompt {g}" for g in groups],
        responses=[str(s) for s in strategies],
        context=StepContext(registry=REGISTRY),
    )


def tokens(per_seq, lengths=LENGTHS, t=3):
    return torch.tensor([[a] * n + [0.0] * (t - n) for a, n in zip(per_seq, lengths, strict=True)])


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual).double(), torch.as_tensor(expected).double(), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- creativity_weights


def test_weights_of_the_worked_example():
    w = creativity_weights(torch.tensor(STRATEGIES), torch.zeros(4, dtype=torch.int64), 0.7)
    assert w.dtype == torch.float32 and w.shape == (4,)
    close(w, [0.61557, 0.61557, 1.0, 1.0])
    close(w, [W2, W2, 1.0, 1.0], tol=1e-7)


def test_weights_count_within_each_prompt_only():
    # prompt 0: strategy 5 x3 -> freq 3; prompt 1 reuses id 5 once and has 7 once -> freq 1, 1
    w = creativity_weights(torch.tensor([5, 5, 5, 5, 7]), torch.tensor([0, 0, 0, 1, 1]), 0.7)
    close(w, [W3, W3, W3, 1.0, 1.0], tol=1e-7)
    # the classifier step's ids (unique across prompts, renumbered from each prompt's offset) give the same weights
    close(creativity_weights(torch.tensor([0, 0, 0, 3, 4]), torch.tensor([0, 0, 0, 1, 1]), 0.7), w, tol=1e-7)
    # prompt ids need not be sorted or contiguous: prompt 9 has strategy 1 twice, prompt 4 strategies 2 and 1
    close(creativity_weights(torch.tensor([1, 2, 1, 1]), torch.tensor([9, 4, 9, 4]), 1.0), [0.5, 1.0, 0.5, 1.0])


@pytest.mark.parametrize(("power", "expected"), [(1.0, [0.5, 0.5, 1, 1]), (2, [0.25, 0.25, 1, 1]), (0.5, None)])
def test_weight_power(power, expected):
    w = creativity_weights(torch.tensor(STRATEGIES), torch.zeros(4), power)
    close(w, expected or [2**-0.5, 2**-0.5, 1, 1])


def test_one_group_per_response_weighs_one_and_one_group_for_all_weighs_n_to_the_minus_p():
    close(creativity_weights(torch.arange(8), torch.zeros(8), 0.7), [1.0] * 8)  # the classifier's fallback
    close(creativity_weights(torch.zeros(8), torch.zeros(8), 0.7), [8**-0.7] * 8)
    assert creativity_weights(torch.zeros(0), torch.zeros(0), 0.7).shape == (0,)


@pytest.mark.parametrize("power", [0, -0.7, math.nan, math.inf, True, "0.7"])
def test_weights_reject_a_bad_power(power):
    with pytest.raises(ValueError, match="power"):
        creativity_weights(torch.tensor([0, 1]), torch.zeros(2), power)


def test_weights_reject_mismatched_shapes():
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        creativity_weights(torch.tensor([0, 1, 2]), torch.zeros(2), 0.7)


def test_strategies_per_prompt():
    assert strategies_per_prompt(torch.tensor([0, 0, 1, 2]), torch.zeros(4)) == 3.0
    assert strategies_per_prompt(torch.tensor([5, 5, 5, 5, 7]), torch.tensor([0, 0, 0, 1, 1])) == 1.5
    assert strategies_per_prompt(torch.zeros(0), torch.zeros(0)) == 0.0


# --------------------------------------------------------------------------- the estimators


def config(name="grpo_weighted_mul", **extra):
    return AlgorithmConfig(adv_estimator=name, **{"classifier": "by_text", **extra})


def test_mul_by_hand():
    result = plugrl_advantages.grpo_weighted_mul(make_batch(), config())
    # [A * w] = [0.866025 * 0.615572, -0.866025 * 0.615572, 0.866025 * 1, -0.866025 * 1]
    close(result.advantages, tokens([0.533105, -0.533105, 0.866025, -0.866025]))
    close(result.advantages, tokens([A * W2, -A * W2, A, -A]), tol=1e-6)
    assert result.advantages.dtype == torch.float32 and result.returns is result.advantages
    m = result.metrics
    close(m["creativity/grpo_adv_mean"], 0.0, tol=1e-7)
    close(m["creativity/weight_mean"], (2 * W2 + 2) / 4, tol=1e-6)  # 0.807786
    close(m["creativity/weight_min"], W2, tol=1e-6)
    assert m["creativity/weight_max"] == 1.0 and m["creativity/groups_mean"] == 3.0
    close(m["adv/max"], A, tol=1e-6)
    close(m["adv/min"], -A, tol=1e-6)
    assert m["adv/std_groups_zero_frac"] == 0.0
    # the classifier's metrics, from the estimator asking it through its step context
    assert m["classifier/failures"] == 0.0 and m["classifier/groups_mean"] == 3.0 and m["timing/classify"] >= 0.0
    assert all(isinstance(v, float) for v in m.values())


def test_add_by_hand():
    result = plugrl_advantages.grpo_weighted_add(make_batch(), config("grpo_weighted_add"))
    # [A + w] = [0.866025 + 0.615572, -0.866025 + 0.615572, 0.866025 + 1, -0.866025 + 1]
    close(result.advantages, tokens([1.481597, -0.250453, 1.866025, 0.133975]))
    close(result.advantages, tokens([A + W2, -A + W2, A + 1, -A + 1]), tol=1e-6)
    close(result.metrics["creativity/weight_mean"], 0.807786)


def test_weight_power_and_dr_grpo_centering_come_from_the_config():
    # p = 1: weights [0.5, 0.5, 1, 1]; norm_adv_by_std_in_grpo false: A = r - mean = [0.5, -0.5, 0.5, -0.5]
    cfg = config(weight_power=1.0, norm_adv_by_std_in_grpo=False)
    close(plugrl_advantages.grpo_weighted_mul(make_batch(), cfg).advantages, tokens([0.25, -0.25, 0.5, -0.5]))
    close(plugrl_advantages.grpo_weighted_add(make_batch(), cfg).advantages, tokens([1.0, 0.0, 1.5, 0.5]))
    # epsilon: A = 0.5 / (sqrt(1/3) + 0.5)
    a = 0.5 / (math.sqrt(1 / 3) + 0.5)
    result = plugrl_advantages.grpo_weighted_mul(make_batch(), config(epsilon=0.5))
    close(result.advantages, tokens([a * W2, -a * W2, a, -a]))


def test_two_prompts_and_the_classifier_fallback():
    # prompt 0: rewards [1, 0], strategies fall back to one per response (ids 0, 1): weights 1, 1
    # prompt 1: rewards [1, 1, 0], strategies [2, 2, 2]: all agree -> weight 3^-0.7; GRPO:
    #   mean 2/3, deviations [1/3, 1/3, -2/3], unbiased std sqrt((1/9 + 1/9 + 4/9) / 2) = sqrt(1/3)
    batch = make_batch(
        rewards=[1.0, 0.0, 1.0, 1.0, 0.0], lengths=[1, 2, 3, 1, 2], groups=[0, 0, 1, 1, 1], strategies=[0, 1, 2, 2, 2]
    )
    s = math.sqrt(1 / 3) + 1e-6
    grpo = [0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6), (1 / 3) / s, (1 / 3) / s, (-2 / 3) / s]
    weights = [1.0, 1.0, W3, W3, W3]
    result = plugrl_advantages.grpo_weighted_mul(batch, config())
    close(result.advantages, tokens([g * w for g, w in zip(grpo, weights, strict=True)], [1, 2, 3, 1, 2]), tol=1e-6)
    assert result.metrics["creativity/groups_mean"] == 1.5  # (2 + 1) / 2
    close(result.metrics["creativity/weight_max"], 1.0)
    close(result.metrics["creativity/weight_min"], W3)
    # with every response in its own strategy (the classifier's fallback everywhere), mul is exactly grpo
    batch = make_batch(
        rewards=[1.0, 0.0, 1.0, 1.0, 0.0], lengths=[1, 2, 3, 1, 2], groups=[0, 0, 1, 1, 1], strategies=range(5)
    )
    plain = plugrl_advantages.grpo(batch, config("grpo"))
    assert torch.equal(plugrl_advantages.grpo_weighted_mul(batch, config()).advantages, plain.advantages)
    added = plugrl_advantages.grpo_weighted_add(batch, config("grpo_weighted_add")).advantages
    close(added, plain.advantages + batch.response_mask)


@pytest.mark.parametrize("classifier", ["off", None])
def test_classifier_off_reduces_mul_to_grpo_and_add_to_grpo_plus_one(classifier):
    """`algorithm.classifier: off` (and a config no start-up settled, as a test's): each response a group of its
    own, whatever the texts say (here every response of a prompt has the same strategy)."""
    batch = make_batch(
        rewards=[1.0, 0.0, 1.0, 1.0, 0.0], lengths=[1, 2, 3, 1, 2], groups=[0, 0, 1, 1, 1], strategies=[0] * 5
    )
    plain = plugrl_advantages.grpo(batch, config("grpo")).advantages
    mul = plugrl_advantages.grpo_weighted_mul(batch, config(classifier=classifier))
    assert torch.equal(mul.advantages, plain)
    assert mul.metrics["creativity/weight_min"] == 1.0 and mul.metrics["creativity/groups_mean"] == 2.5
    assert mul.metrics["classifier/groups_mean"] == 2.5 and mul.metrics["classifier/failures"] == 0.0
    added = plugrl_advantages.grpo_weighted_add(batch, config("grpo_weighted_add", classifier=classifier)).advantages
    close(added, plain + batch.response_mask)  # + 1 on every response token


def test_a_group_whose_rewards_agree_gets_zero_with_mul_and_the_weight_with_add():
    batch = make_batch(rewards=[1.0, 1.0, 1.0, 1.0])
    assert plugrl_advantages.grpo_weighted_mul(batch, config()).advantages.eq(0).all()
    close(plugrl_advantages.grpo_weighted_add(batch, config()).advantages, tokens([W2, W2, 1.0, 1.0]))


@pytest.mark.parametrize("bad", [0, -1, "many", True, math.inf, None])
def test_a_bad_weight_power_is_a_clear_error(bad):
    with pytest.raises(ValueError, match=r"algorithm\.weight_power must be a number > 0"):
        plugrl_advantages.grpo_weighted_mul(make_batch(), config(weight_power=bad))


def test_weight_power_default_and_from_yaml_overrides():
    assert weight_power(config()) == 0.7
    tree = {
        "model": {"path": "m"},
        "data": {"dataset": "countdown"},
        "algorithm": {"adv_estimator": "grpo_weighted_mul"},
    }
    cfg = build_config(tree, ["algorithm.weight_power=0.5"])
    assert weight_power(cfg.algorithm) == 0.5


def test_the_math_is_a_pure_function_of_the_strategies():
    batch = make_batch()
    pure = grpo_weighted_advantage(batch, config(), "mul", torch.tensor(STRATEGIES))
    assert torch.equal(pure.advantages, plugrl_advantages.grpo_weighted_mul(batch, config()).advantages)
    with pytest.raises(ValueError, match=r"grpo_weighted_mul: the strategy ids have shape \(2,\), the batch has"):
        grpo_weighted_advantage(batch, config(), "mul", torch.tensor([0, 1]))


def test_a_classifier_nothing_registers_is_a_clear_error():
    with pytest.raises(ValueError, match="algorithm.classifier 'nope': no loaded plugin registers it"):
        plugrl_advantages.grpo_weighted_add(make_batch(), config(classifier="nope"))


# --------------------------------------------------------------------------- registration


@pytest.mark.parametrize("name", ["grpo_weighted_add", "grpo_weighted_mul"])
def test_registered_with_the_classifier_keys(name):
    """No kernel input besides rewards: the classifier keys are the estimator's own options, which is what makes
    this plugin settle and check the classifier at start."""
    from plugrl.plugins import load_plugins

    fn = getattr(plugrl_advantages, name)
    (spec,) = specs_of(fn)
    assert isinstance(spec, EstimatorSpec) and spec.name == name and spec.fn is fn
    assert not spec.needs_critic and not spec.needs_greedy_baseline
    assert spec.options is WeightedOptions and issubclass(WeightedOptions, SolutionGroupsOptions)
    assert groups_by_strategy(spec)
    assert name in plugrl_advantages.__all__
    loaded = load_plugins(["advantages"]).estimators[name]
    assert groups_by_strategy(loaded) and loaded.plugin == "advantages"
