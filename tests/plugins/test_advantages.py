"""The plugrl-advantages plugin: the grpo estimator through its plugin entry point."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import plugrl_advantages
from plugrl.algorithms import AdvantageBatch, AdvantageResult
from plugrl.config import AlgorithmConfig
from plugrl.specs import EstimatorSpec, specs_of
from plugrl_advantages import grpo

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "advantages"

# five samples, T = 4; the score sits on the last response token (lengths 4, 2, 3, 1, 2)
#   group 0 = samples 0-3, rewards [1, 0, 0, 1]; group 1 = sample 4 alone, reward 0.5
LENGTHS = [4, 2, 3, 1, 2]
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5]
GROUPS = [0, 0, 0, 0, 1]


def make_batch(rewards=REWARDS, groups=GROUPS, lengths=LENGTHS, t=4, mask_dtype=torch.float32):
    mask = torch.zeros(len(rewards), t)
    token_rewards = torch.zeros(len(rewards), t)
    for i, (r, n) in enumerate(zip(rewards, lengths, strict=True)):
        mask[i, :n] = 1.0
        token_rewards[i, n - 1] = r
    return AdvantageBatch(
        token_level_rewards=token_rewards,
        response_mask=mask.to(mask_dtype),
        group_ids=torch.tensor(groups, dtype=torch.int64),
    )


def expected_tokens(per_seq, lengths=LENGTHS, t=4):
    return torch.tensor([[a] * n + [0.0] * (t - n) for a, n in zip(per_seq, lengths, strict=True)])


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(actual.double(), torch.as_tensor(expected).double(), rtol=tol, atol=tol)


def test_grpo_is_registered_at_module_level():
    assert plugrl_advantages.grpo is grpo
    (spec,) = specs_of(plugrl_advantages.grpo)
    assert isinstance(spec, EstimatorSpec)
    assert spec.name == "grpo" and spec.fn is grpo and not spec.needs_critic


def test_pyproject_declares_the_entry_point():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "plugrl-advantages"
    assert meta["project"]["version"] == "0.1.0"
    assert "plugrl" in meta["project"]["dependencies"]
    assert meta["project"]["entry-points"]["plugrl"] == {"advantages": "plugrl_advantages"}
    assert meta["build-system"]["build-backend"] == "setuptools.build_meta"


def test_grpo_by_hand():
    result = grpo(make_batch(), AlgorithmConfig())
    assert isinstance(result, AdvantageResult)
    # group 0: mean .5, unbiased std sqrt(1/3) = 0.5773503 -> +-.5 / (0.5773503 + 1e-6) = +-0.8660239
    # group 1 (alone): mean 0, std 1 -> .5 / (1 + 1e-6) = 0.4999995
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    per_seq = [a, -a, -a, a, 0.5 / (1 + 1e-6)]
    close(result.advantages, expected_tokens(per_seq))  # broadcast over tokens, 0 on padding
    assert result.advantages.shape == (5, 4) and result.advantages.dtype == torch.float32
    assert result.returns is result.advantages  # as verl: returns = advantages
    m = result.metrics
    # token mean: (4a - 2a - 3a + 1a + 2 * 0.4999995) / 12 tokens = 0.999999 / 12 = 0.0833333
    assert m["adv/mean"] == pytest.approx((4 * a - 2 * a - 3 * a + a + 2 * per_seq[4]) / 12)
    assert m["adv/max"] == pytest.approx(a) and m["adv/min"] == pytest.approx(-a)
    assert m["adv/std_groups_zero_frac"] == 0.0  # group 0 varies; the singleton has std 1
    assert all(isinstance(v, float) for v in m.values())


def test_grpo_dr_grpo_and_epsilon_from_config():
    # Dr. GRPO: r - mean: [.5, -.5, -.5, .5] and the singleton keeps its reward .5
    result = grpo(make_batch(), AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    close(result.advantages, expected_tokens([0.5, -0.5, -0.5, 0.5, 0.5]))
    # epsilon = 0.5: .5 / (0.5773503 + .5) = 0.4641016; singleton .5 / 1.5 = 0.3333333
    result = grpo(make_batch(), AlgorithmConfig(epsilon=0.5))
    e = 0.5 / (math.sqrt(1 / 3) + 0.5)
    close(result.advantages, expected_tokens([e, -e, -e, e, 0.5 / 1.5]))


def test_grpo_all_agreeing_groups_are_zero_and_counted():
    # groups: 5 = [1, 0] varies; 8 = [0.3, 0.3] agrees -> 0; 2 = [1] alone -> 1 / (1 + 1e-6)
    batch = make_batch(rewards=[1.0, 0.3, 0.0, 0.3, 1.0], groups=[5, 8, 5, 8, 2], lengths=[1, 2, 3, 4, 1])
    result = grpo(batch, AlgorithmConfig())
    # group 5: mean .5, std sqrt(.5) = .7071068 -> +-.5 / .7071078 = +-0.7071058
    b = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(result.advantages, expected_tokens([b, 0.0, -b, 0.0, 1 / (1 + 1e-6)], lengths=[1, 2, 3, 4, 1]))
    assert result.advantages[[1, 3]].eq(0).all()  # exactly zero
    assert result.metrics["adv/std_groups_zero_frac"] == pytest.approx(1 / 3)  # group 8 of 3 groups


def test_grpo_extra_config_keys_bool_mask_and_bf16_rewards():
    batch = make_batch(mask_dtype=torch.bool)
    batch.token_level_rewards = batch.token_level_rewards.bfloat16()
    config = AlgorithmConfig(some_future_option=3)  # estimator-specific keys are allowed
    result = grpo(batch, config)
    assert result.advantages.dtype == torch.float32
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    close(result.advantages, expected_tokens([a, -a, -a, a, 0.5 / (1 + 1e-6)]), tol=1e-5)


def test_grpo_empty_responses_give_zeros():
    batch = make_batch(rewards=[1.0, 0.0], groups=[0, 0], lengths=[1, 1])
    batch.response_mask = torch.zeros_like(batch.response_mask)  # scores are then 0
    result = grpo(batch, AlgorithmConfig())
    assert torch.equal(result.advantages, torch.zeros(2, 4))
    assert result.metrics["adv/mean"] == 0.0
    assert result.metrics["adv/std_groups_zero_frac"] == 1.0
