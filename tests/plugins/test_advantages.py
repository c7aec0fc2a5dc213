"""The plugrl-advantages plugin: every estimator by hand (arithmetic in the comments), through its entry point."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import plugrl_advantages
from plugrl.algorithms import AdvantageBatch, AdvantageResult, response_mask
from plugrl.config import AlgorithmConfig
from plugrl.specs import EstimatorSpec, specs_of
from plugrl_advantages import grpo
from plugrl_advantages.classify import groups_by_strategy
from plugrl_advantages.estimators.gae import gae_advantages
from plugrl_advantages.estimators.grpo import grpo_outcome_advantage

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "advantages"

# five samples, T = 4; the score sits on the last response token (lengths 4, 2, 3, 1, 2)
#   group 0 = samples 0-3, rewards [1, 0, 0, 1]; group 1 = sample 4 alone, reward 0.5
LENGTHS = [4, 2, 3, 1, 2]
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5]
GROUPS = [0, 0, 0, 0, 1]


def make_batch(rewards=REWARDS, groups=GROUPS, lengths=LENGTHS, t=4, mask_dtype=torch.float32):
    mask = response_mask(lengths, width=t)
    token_rewards = torch.zeros(len(rewards), t)
    for i, (r, n) in enumerate(zip(rewards, lengths, strict=True)):
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
    assert "plugrl>=0.2,<0.3" in meta["project"]["dependencies"]  # the kernel range it was written for
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


# --------------------------------------------------------------------------- grpo_outcome_advantage (the math)

SCORES = torch.tensor(REWARDS)
IDS = torch.tensor(GROUPS)
# group 0 = [1, 0, 0, 1]: mean .5; deviations +-.5; unbiased var (4 * .25) / 3 = 1/3; std = 0.5773503
# -> +-.5 / (0.5773503 + 1e-6) = +-0.8660239
# group 1 = [0.5] alone: verl uses mean 0, std 1 -> 0.5 / (1 + 1e-6) = 0.4999995
A0 = 0.5 / (math.sqrt(1 / 3) + 1e-6)


def test_grpo_outcome_advantage_by_hand():
    out = grpo_outcome_advantage(SCORES, IDS)
    close(out, [A0, -A0, -A0, A0, 0.5 / (1 + 1e-6)])
    assert A0 == pytest.approx(0.8660239, abs=1e-6)
    # Dr. GRPO: r - mean; the single sample keeps its reward (mean 0)
    close(grpo_outcome_advantage(SCORES, IDS, norm_by_std=False), [0.5, -0.5, -0.5, 0.5, 0.5])
    # epsilon enters the denominator: .5 / (0.5773503 + 0.5) = 0.4641016
    e = 0.5 / (math.sqrt(1 / 3) + 0.5)
    assert e == pytest.approx(0.4641016, abs=1e-6)
    close(grpo_outcome_advantage(SCORES[:4], IDS[:4], epsilon=0.5), [e, -e, -e, e])


def test_grpo_outcome_advantage_all_equal_group_is_exactly_zero():
    # 0.3 in float32, 8 times: sum / 8 leaves a rounding residue of 3e-8, which a naive
    # (r - mean) / (std + 1e-6) blows up to ~0.03; the group statistics pin it to exactly 0
    scores = torch.full((8,), 0.3)
    assert (scores - scores.mean()).abs().max() > 0  # the residue is real
    out = grpo_outcome_advantage(scores, torch.zeros(8, dtype=torch.long))
    assert torch.equal(out, torch.zeros(8))
    out = grpo_outcome_advantage(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([3, 3, 9, 9]))
    # group 3 = [1, 1] -> 0; group 9 = [0, 1]: mean .5, std sqrt(.5) = .7071068 -> -+.5 / .7071078
    b = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(out, [0.0, 0.0, -b, b])


def test_grpo_outcome_advantage_interleaved_ids_and_dtypes():
    scores = torch.tensor([2.0, 10.0, 4.0, 30.0], dtype=torch.bfloat16)
    ids = torch.tensor([42, 7, 42, 7])  # interleaved, not contiguous
    out = grpo_outcome_advantage(scores, ids, norm_by_std=False)
    assert out.dtype == torch.float32
    close(out, [-1.0, -10.0, 1.0, 10.0])  # means 3 and 20


def verl_grpo_reference(scores, index, epsilon=1e-6, norm=True):
    """verl's compute_grpo_outcome_advantage loop, for comparison."""
    groups = defaultdict(list)
    for i, idx in enumerate(index.tolist()):
        groups[idx].append(scores[i])
    stats = {}
    for idx, vals in groups.items():
        stats[idx] = (
            (torch.tensor(0.0), torch.tensor(1.0))
            if len(vals) == 1
            else (torch.mean(torch.stack(vals)), torch.std(torch.stack(vals)))
        )
    out = scores.clone()
    for i, idx in enumerate(index.tolist()):
        mean, std = stats[idx]
        out[i] = (scores[i] - mean) / (std + epsilon) if norm else scores[i] - mean
    return out


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_outcome_advantage_matches_verl_loop_on_random_batches(norm):
    g = torch.Generator().manual_seed(3)
    for _ in range(20):
        n_groups = int(torch.randint(1, 6, (1,), generator=g))
        sizes = torch.randint(1, 6, (n_groups,), generator=g)
        ids = torch.repeat_interleave(torch.randperm(100, generator=g)[:n_groups], sizes)
        ids = ids[torch.randperm(ids.numel(), generator=g)]
        scores = torch.randint(0, 3, (ids.numel(),), generator=g).float() / 2  # ties are common
        ours = grpo_outcome_advantage(scores, ids, norm_by_std=norm)
        close(ours, verl_grpo_reference(scores, ids, norm=norm), tol=1e-5)


# =========================================================================== the other estimators

ALL_ESTIMATORS = (
    "gae",
    "gpg",
    "grpo",
    "grpo_passk",
    "grpo_weighted_add",
    "grpo_weighted_mul",
    "opo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
)


def custom_batch(token_rewards, mask, groups):
    return AdvantageBatch(
        token_level_rewards=torch.tensor(token_rewards, dtype=torch.float32),
        response_mask=torch.tensor(mask, dtype=torch.float32),
        group_ids=torch.tensor(groups, dtype=torch.int64),
    )


def test_every_estimator_is_registered_under_its_verl_name():
    from plugrl.plugins import load_plugins

    assert sorted(load_plugins(["advantages"]).estimators) == sorted(ALL_ESTIMATORS)
    for name in ALL_ESTIMATORS:
        fn = getattr(plugrl_advantages, name)
        (spec,) = specs_of(fn)
        assert spec.name == name and spec.fn is fn
        assert spec.needs_critic == (name == "gae")  # the kernel builds a value model only for gae
        assert spec.needs_greedy_baseline == (name == "remax")  # the kernel generates the greedy baseline
        # the estimator asks a classifier itself (its options declare the classifier keys): no kernel input
        assert groups_by_strategy(spec) == name.startswith("grpo_weighted")
    losses = sorted(load_plugins(["advantages"]).policy_losses.keys() - {"vanilla"})  # vanilla: the kernel's
    assert losses == ["cispo", "gspo", "luspo", "sapo"]
    assert sorted(plugrl_advantages.__all__) == sorted([*ALL_ESTIMATORS, *losses])


def test_docs_list_every_estimator():
    docs = (PLUGIN_DIR.parents[1] / "docs" / "algorithms.md").read_text()
    readme = (PLUGIN_DIR / "README.md").read_text()
    for name in ALL_ESTIMATORS:
        assert f"`{name}`" in docs and f"`{name}`" in readme, name


@pytest.mark.parametrize("name", ALL_ESTIMATORS)
def test_every_estimator_returns_masked_float32_and_float_metrics(name):
    batch = make_batch(rewards=[1.0, 0.0, 0.5, 0.2, 0.7], groups=[0, 0, 0, 1, 1])
    batch.baseline_scores = torch.tensor([0.5, 0.5, 0.5, 0.2, 0.2])  # greedy scores, for remax
    batch.values = torch.full((5, 4), 0.1)  # critic values, for gae
    # grpo_weighted_*: no classifier settled (a test's config), so a strategy per response
    result = getattr(plugrl_advantages, name)(batch, AlgorithmConfig(adv_estimator=name))
    assert result.advantages.shape == (5, 4) and result.advantages.dtype == torch.float32
    assert torch.isfinite(result.advantages).all()
    assert result.advantages[batch.response_mask == 0].eq(0).all()  # 0 on padding
    assert result.returns is not None and result.returns[batch.response_mask == 0].eq(0).all()
    assert {"adv/mean", "adv/max", "adv/min"} <= set(result.metrics)
    assert all(isinstance(v, float) for v in result.metrics.values())


# --------------------------------------------------------------------------- rloo


def test_rloo_by_hand():
    result = plugrl_advantages.rloo(make_batch(), AlgorithmConfig())
    # group 0 = [1, 0, 0, 1], n = 4: r_i minus the mean of the other three
    #   sample 0: 1 - (0 + 0 + 1) / 3 = 2/3     (verl's form: 4/3 * (1 - .5) = 2/3)
    #   sample 1: 0 - (1 + 0 + 1) / 3 = -2/3
    # group 1 = [.5] alone: verl leaves the reward unchanged -> .5
    close(result.advantages, expected_tokens([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.5]))
    assert result.returns is result.advantages
    assert result.metrics["adv/std_groups_zero_frac"] == 0.0


def test_rloo_pairs_and_agreeing_groups():
    from plugrl_advantages.estimators.rloo import rloo_outcome_advantage

    # group 7 = [3, 1]: 3 - 1 = 2, 1 - 3 = -2; group 2 = [.3, .3, .3] (float32 .3 does not sum exactly) -> exactly 0
    out = rloo_outcome_advantage(torch.tensor([3.0, 0.3, 1.0, 0.3, 0.3]), torch.tensor([7, 2, 7, 2, 2]))
    close(out, [2.0, 0.0, -2.0, 0.0, 0.0])
    assert out[[1, 3, 4]].eq(0).all()


# --------------------------------------------------------------------------- reinforce++


def test_discounted_returns_gamma_ragged_mask_and_holes():
    from plugrl_advantages.estimators.reinforce_plus_plus import discounted_returns

    rewards = torch.tensor(
        [
            [0.0, 0.0, 1.0, 0.0],  # mask [1, 1, 1, 0]
            [-0.1, 2.0, 7.0, 0.0],  # mask [1, 1, 0, 0]: the 7 on padding must not leak back
            [1.0, 5.0, 0.0, 2.0],  # mask [1, 0, 1, 1]: a masked hole cuts the return (verl's reset)
        ]
    )
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 1]])
    # gamma = .5, G_t = r_t + gamma * m_{t+1} * G_{t+1}:
    #   row 0: G_2 = 1, G_1 = 0 + .5 * 1 = .5, G_0 = 0 + .5 * .5 = .25
    #   row 1: G_1 = 2, G_0 = -.1 + .5 * 2 = .9
    #   row 2: G_3 = 2, G_2 = 0 + .5 * 2 = 1, G_1 masked -> 0, G_0 = 1 + .5 * 0 = 1
    close(
        discounted_returns(rewards, mask, 0.5),
        [[0.25, 0.5, 1.0, 0.0], [0.9, 2.0, 0.0, 0.0], [1.0, 0.0, 1.0, 2.0]],
    )
    # gamma = 1: plain return-to-go within the segment: row 0 -> [1, 1, 1, 0]; row 2 -> [1, 0, 2, 2]
    close(discounted_returns(rewards, mask, 1.0)[[0, 2]], [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 2.0, 2.0]])


def test_reinforce_plus_plus_gamma_one_by_hand():
    result = plugrl_advantages.reinforce_plus_plus(make_batch(), AlgorithmConfig())
    # gamma = 1 and one reward on the last token: G = the score on every response token
    #   tokens: 4 x 1, 2 x 0, 3 x 0, 1 x 1, 2 x .5 -> N = 12, sum = 6, mean = .5
    #   squared deviations: 5 x .25 + 5 x .25 + 2 x 0 = 2.5; unbiased var = 2.5 / 11 = 0.2272727
    #   A = (G - .5) / sqrt(0.2272727 + 1e-8): 1 -> +1.0488088, 0 -> -1.0488088, .5 -> 0
    a = 0.5 / math.sqrt(2.5 / 11 + 1e-8)
    assert a == pytest.approx(1.0488088, abs=1e-6)
    close(result.advantages, expected_tokens([a, -a, -a, a, 0.0]))
    close(result.returns, expected_tokens(REWARDS))  # returns = the discounted returns


def test_reinforce_plus_plus_gamma_below_one_by_hand():
    # the returns of test_discounted_returns (rows 0 and 1), gamma = .5, per-token rewards (e.g. KL in reward)
    batch = custom_batch([[0.0, 0.0, 1.0, 0.0], [-0.1, 2.0, 7.0, 0.0]], [[1, 1, 1, 0], [1, 1, 0, 0]], [0, 1])
    result = plugrl_advantages.reinforce_plus_plus(batch, AlgorithmConfig(gamma=0.5))
    # G on response tokens: .25, .5, 1 | .9, 2 -> N = 5, sum = 4.65, mean = .93
    #   deviations -.68, -.43, .07 | -.03, 1.07; squares .4624 + .1849 + .0049 + .0009 + 1.1449 = 1.798
    #   unbiased var = 1.798 / 4 = .4495; A = deviation / sqrt(.4495 + 1e-8)
    sd = math.sqrt(0.4495 + 1e-8)
    close(result.advantages, [[-0.68 / sd, -0.43 / sd, 0.07 / sd, 0.0], [-0.03 / sd, 1.07 / sd, 0.0, 0.0]], tol=1e-5)
    close(result.returns, [[0.25, 0.5, 1.0, 0.0], [0.9, 2.0, 0.0, 0.0]])


def test_reinforce_plus_plus_needs_two_tokens():
    batch = custom_batch([[1.0, 0.0]], [[1, 0]], [0])
    with pytest.raises(ValueError, match="at least two response tokens"):
        plugrl_advantages.reinforce_plus_plus(batch, AlgorithmConfig())


def test_reinforce_plus_plus_baseline_by_hand():
    result = plugrl_advantages.reinforce_plus_plus_baseline(make_batch(), AlgorithmConfig())
    # a = r - group mean: group 0 (mean .5) -> [.5, -.5, -.5, .5]; the singleton uses mean 0 -> .5
    # tokens: 4 x .5, 2 x -.5, 3 x -.5, 1 x .5, 2 x .5 -> 7 x .5 and 5 x -.5: N = 12, sum = 1, mean = 1/12
    #   squared deviations: 7 x (5/12)^2 + 5 x (7/12)^2 = (175 + 245) / 144 = 2.9166667
    #   unbiased var = 2.9166667 / 11 = 0.2651515, sd = 0.5149287
    #   A(+.5) = (5/12) / sd = 0.8091734; A(-.5) = -(7/12) / sd = -1.1328428
    sd = math.sqrt(420 / 144 / 11 + 1e-8)
    plus, minus = (5 / 12) / sd, -(7 / 12) / sd
    assert plus == pytest.approx(0.8091734, abs=1e-6) and minus == pytest.approx(-1.1328428, abs=1e-6)
    close(result.advantages, expected_tokens([plus, minus, minus, plus, plus]))
    assert result.returns is result.advantages


def test_reinforce_plus_plus_baseline_agreeing_group_is_shifted_by_whitening():
    # group 0 = [1, 0] with lengths 2 and 1; group 1 = [.3, .3] (agree), lengths 1 and 1
    batch = make_batch(rewards=[1.0, 0.0, 0.3, 0.3], groups=[0, 0, 1, 1], lengths=[2, 1, 1, 1], t=2)
    result = plugrl_advantages.reinforce_plus_plus_baseline(batch, AlgorithmConfig())
    # a = [.5, -.5, 0, 0]; tokens .5, .5 | -.5 | 0 | 0 -> N = 5, sum = .5, mean = .1
    #   deviations .4, .4, -.6, -.1, -.1; squares .16 + .16 + .36 + .01 + .01 = .7; var = .7 / 4 = .175
    #   the agreeing group: (0 - .1) / sqrt(.175) = -0.2390457, not 0 (as verl)
    sd = math.sqrt(0.175 + 1e-8)
    close(result.advantages, [[0.4 / sd, 0.4 / sd], [-0.6 / sd, 0.0], [-0.1 / sd, 0.0], [-0.1 / sd, 0.0]], tol=1e-5)
    assert result.metrics["adv/std_groups_zero_frac"] == 0.5


def test_global_whiten_identity_equals_kernel_masked_whiten_and_ignores_nan_padding():
    from plugrl.algorithms import masked_whiten
    from plugrl_advantages.common import global_masked_whiten

    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 7, generator=g)
    mask = (torch.rand(6, 7, generator=g) > 0.3).float()
    close(global_masked_whiten(x, mask), masked_whiten(x, mask) * mask, tol=1e-5)
    x_nan = torch.where(mask == 0, torch.tensor(float("nan")), x)
    close(global_masked_whiten(x_nan, mask), masked_whiten(x, mask) * mask, tol=1e-5)


class FakeRanks:
    """In-process ranks on threads: ``reducer(rank)`` sums a tensor over all ranks, like all_reduce(SUM)."""

    def __init__(self, world):
        import threading

        self.slots = [None] * world
        self.barrier = threading.Barrier(world)

    def reducer(self, rank):
        def reduce(t):
            self.slots[rank] = t.clone()
            self.barrier.wait()
            total = sum(self.slots)
            self.barrier.wait()  # every rank has read the slots before the next call overwrites them
            return total

        return reduce

    def run(self, fn, parts):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(parts)) as pool:
            return list(pool.map(lambda rp: fn(*rp[1], reduce=self.reducer(rp[0])), enumerate(parts)))


def test_whitening_across_two_ranks_equals_the_whole_batch():
    from plugrl_advantages.estimators.reinforce_plus_plus import (
        reinforce_plus_plus_advantage,
        reinforce_plus_plus_baseline_advantage,
    )

    batch = make_batch(rewards=[1.0, 0.0, 0.0, 1.0, 0.5, 0.2], groups=[0, 0, 1, 1, 2, 2], lengths=[4, 2, 3, 1, 2, 4])
    rew, mask, ids = batch.token_level_rewards, batch.response_mask, batch.group_ids
    whole, _ = reinforce_plus_plus_advantage(rew, mask, 0.9)
    # rank 0 holds groups 0 and 1, rank 1 group 2 (whole groups per rank, as the kernel)
    halves = FakeRanks(2).run(reinforce_plus_plus_advantage, [(rew[:4], mask[:4], 0.9), (rew[4:], mask[4:], 0.9)])
    close(torch.cat([h[0] for h in halves]), whole, tol=1e-5)
    # per-rank whitening alone differs: the global statistics matter
    alone, _ = reinforce_plus_plus_advantage(rew[4:], mask[4:], 0.9)
    assert not torch.allclose(alone, whole[4:], atol=1e-3)

    scores = batch.scores
    whole = reinforce_plus_plus_baseline_advantage(scores, mask, ids)
    halves = FakeRanks(2).run(
        reinforce_plus_plus_baseline_advantage, [(scores[:4], mask[:4], ids[:4]), (scores[4:], mask[4:], ids[4:])]
    )
    close(torch.cat(halves), whole, tol=1e-5)


def test_wrappers_all_reduce_when_distributed(monkeypatch):
    import torch.distributed as dist

    from plugrl_advantages import common

    # pretend to be one of two ranks that hold the same batch: all_reduce doubles every sum
    monkeypatch.setattr(common, "is_distributed", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda *a: "gloo")

    def doubling_all_reduce(t, op=None):
        t.mul_(2)

    monkeypatch.setattr(dist, "all_reduce", doubling_all_reduce)
    batch = make_batch()
    twice = make_batch(rewards=REWARDS * 2, groups=GROUPS + [g + 2 for g in GROUPS], lengths=LENGTHS * 2)
    # the batch and its copy on the other rank: the same statistics as one batch of both copies
    # (N = 24 and var = 5 / 23 instead of N = 12 and var = 2.5 / 11)
    got = plugrl_advantages.reinforce_plus_plus(batch, AlgorithmConfig()).advantages
    monkeypatch.setattr(common, "is_distributed", lambda: False)
    want = plugrl_advantages.reinforce_plus_plus(twice, AlgorithmConfig()).advantages[:5]
    close(got, want, tol=1e-5)
    a = 0.5 / math.sqrt(5 / 23 + 1e-8)
    close(got, expected_tokens([a, -a, -a, a, 0.0]), tol=1e-5)


# --------------------------------------------------------------------------- gae


def test_gae_advantages_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.4, 0.3, 9.9]])  # the last position is padding: its value is never used
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72), V after the last token = 0:
    # t=2: delta = 1 - 0.3 = 0.7;               A2 = 0.7
    # t=1: delta = 0.9*0.3 - 0.4 = -0.13;       A1 = -0.13 + 0.72*0.7   = 0.374
    # t=0: delta = 0.9*0.4 - 0.5 = -0.14;       A0 = -0.14 + 0.72*0.374 = 0.12928
    raw, returns = gae_advantages(rewards, values, mask, 0.9, 0.8, whiten=False)
    torch.testing.assert_close(raw, torch.tensor([[0.12928, 0.374, 0.7, 0.0]]))
    torch.testing.assert_close(returns, torch.tensor([[0.62928, 0.774, 1.0, 0.0]]))
    whitened, _ = gae_advantages(rewards, values, mask, 0.9, 0.8)
    a = torch.tensor([0.12928, 0.374, 0.7])
    torch.testing.assert_close(whitened[0, :3], (a - a.mean()) / torch.sqrt(a.var() + 1e-8))


# --------------------------------------------------------------------------- remax


def test_remax_by_hand():
    batch = make_batch()
    batch.baseline_scores = torch.tensor([0.5, 0.5, 0.5, 0.5, 1.0])  # greedy score of each prompt
    result = plugrl_advantages.remax(batch, AlgorithmConfig())
    # A = r - b: [1 - .5, 0 - .5, 0 - .5, 1 - .5, .5 - 1] = [.5, -.5, -.5, .5, -.5]; not whitened
    close(result.advantages, expected_tokens([0.5, -0.5, -0.5, 0.5, -0.5]))
    close(result.returns, expected_tokens(REWARDS))  # return-to-go = the score on every token
    assert result.metrics["adv/remax_baseline_mean"] == pytest.approx(0.6)  # (4 x .5 + 1) / 5


def test_remax_rewards_spread_over_tokens():
    # rewards spread over tokens (KL in reward): return-to-go [1.3, 1.2, 1.0, 0], baseline .3
    batch = custom_batch([[0.1, 0.2, 1.0, 9.0]], [[1, 1, 1, 0]], [0])
    batch.baseline_scores = torch.tensor([0.3])
    result = plugrl_advantages.remax(batch, AlgorithmConfig())
    close(result.returns, [[1.3, 1.2, 1.0, 0.0]])  # the 9 on padding is ignored
    close(result.advantages, [[1.0, 0.9, 0.7, 0.0]])


def test_remax_without_baseline_names_the_field_and_the_flag():
    assert make_batch().baseline_scores is None  # AdvantageBatch's default
    with pytest.raises(
        ValueError, match=r"batch\.baseline_scores.*greedy.*trainer supplies it.*needs_greedy_baseline.*is None"
    ):
        plugrl_advantages.remax(make_batch(), AlgorithmConfig())
    batch = make_batch()
    batch.baseline_scores = torch.zeros(3)
    with pytest.raises(ValueError, match=r"shape \[B\]"):
        plugrl_advantages.remax(batch, AlgorithmConfig())


# --------------------------------------------------------------------------- opo


def test_opo_by_hand():
    # group 0: rewards [1, 0, 0], lengths [1, 2, 3]; group 1: [.5] alone, length 4; group 2: [.3, .3], lengths 1, 4
    batch = make_batch(rewards=[1.0, 0.0, 0.0, 0.5, 0.3, 0.3], groups=[0, 0, 0, 1, 2, 2], lengths=[1, 2, 3, 4, 1, 4])
    result = plugrl_advantages.opo(batch, AlgorithmConfig())
    # group 0: b = (1 * 1 + 2 * 0 + 3 * 0) / (1 + 2 + 3) = 1/6 (the plain mean would be 1/3)
    #   -> [1 - 1/6, -1/6, -1/6] = [5/6, -1/6, -1/6]
    # group 1 alone: b = 0 -> .5 (as verl); group 2 agrees -> exactly 0
    per_seq = [5 / 6, -1 / 6, -1 / 6, 0.5, 0.0, 0.0]
    close(result.advantages, expected_tokens(per_seq, lengths=[1, 2, 3, 4, 1, 4]))
    assert result.advantages[4:].eq(0).all()
    assert result.metrics["adv/std_groups_zero_frac"] == pytest.approx(1 / 3)


def test_opo_all_empty_group_gives_zero_baseline():
    from plugrl_advantages.estimators.opo import opo_outcome_advantage

    # group 0 has no response tokens at all: verl would divide 0 by 0; here b = 0 -> A = r
    out = opo_outcome_advantage(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([0, 0]))
    close(out, [1.0, 0.0])


# --------------------------------------------------------------------------- gpg


def test_gpg_by_hand():
    result = plugrl_advantages.gpg(make_batch(), AlgorithmConfig())
    # B = 5 samples, M = 3 non-zero scores (1, 1, .5) -> alpha = 5/3
    # group 0 (mean .5): 5/3 * +-.5 = +-0.8333333; singleton (mean 0): 5/3 * .5 = 0.8333333
    a = 5 / 3 * 0.5
    close(result.advantages, expected_tokens([a, -a, -a, a, a]))
    assert result.metrics["adv/gpg_alpha"] == pytest.approx(5 / 3)


def test_gpg_all_zero_batch_and_reduce():
    from plugrl_advantages.estimators.gpg import gpg_outcome_advantage

    # no non-zero score: alpha = B / max(0, 1) = 4, and every advantage is 0
    out, alpha = gpg_outcome_advantage(torch.zeros(4), torch.tensor([0, 0, 1, 1]))
    assert alpha == 4.0 and out.eq(0).all()
    # another rank holds 4 samples with no non-zero score: alpha = (5 + 4) / (3 + 0) = 3
    out, alpha = gpg_outcome_advantage(
        torch.tensor(REWARDS), torch.tensor(GROUPS), reduce=lambda t: t + torch.tensor([4.0, 0.0], dtype=t.dtype)
    )
    assert alpha == 3.0
    close(out, [1.5, -1.5, -1.5, 1.5, 1.5])  # 3 * [.5, -.5, -.5, .5, .5]


# --------------------------------------------------------------------------- grpo_passk


def test_grpo_passk_by_hand():
    # group 0 = [.2, 1, .5]; group 1 = [1, 1, 0] (tie at the top); group 2 = [0, 0]
    batch = make_batch(
        rewards=[0.2, 1.0, 0.5, 1.0, 1.0, 0.0, 0.0, 0.0],
        groups=[0, 0, 0, 1, 1, 1, 2, 2],
        lengths=[1, 2, 3, 4, 1, 2, 3, 4],
    )
    result = plugrl_advantages.grpo_passk(batch, AlgorithmConfig())
    # group 0: r_max = 1 (sample 1), r_2nd = .5 -> gap .5; mean .5666667, deviations -.3666667, .4333333, -.0666667
    #   squares .1344444 + .1877778 + .0044444 = .3266667, unbiased var .1633333, std .4041452
    #   -> A_1 = .5 / (.4041452 + 1e-6) = 1.2371680; samples 0 and 2 get 0
    # group 1: r_max = r_2nd = 1 -> 0 everywhere; group 2: 0 everywhere
    a = 0.5 / (math.sqrt(0.3266667 / 2) + 1e-6)
    assert a == pytest.approx(1.2371680, abs=1e-5)
    close(result.advantages, expected_tokens([0, a, 0, 0, 0, 0, 0, 0], lengths=[1, 2, 3, 4, 1, 2, 3, 4]), tol=1e-5)
    # without the std (norm_adv_by_std_in_grpo: false): the plain gap .5
    result = plugrl_advantages.grpo_passk(batch, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    close(result.advantages[:3, 0], [0.0, 0.5, 0.0])


def test_grpo_passk_rejects_single_sample_groups():
    with pytest.raises(ValueError, match=r"at least 2 samples per group.*\[1\]"):
        plugrl_advantages.grpo_passk(make_batch(), AlgorithmConfig())  # group 1 has one sample


# --------------------------------------------------------------------------- Dr. GRPO from a run config


def test_dr_grpo_through_config_overrides():
    from plugrl.config import build_config

    tree = {"model": {"path": "/m"}, "data": {"dataset": "countdown"}}
    cfg = build_config(tree, ["algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false"])
    assert cfg.algorithm.norm_adv_by_std_in_grpo is False
    # r - mean, no std: group 0 -> [.5, -.5, -.5, .5]; the singleton keeps .5 (mean 0)
    close(grpo(make_batch(), cfg.algorithm).advantages, expected_tokens([0.5, -0.5, -0.5, 0.5, 0.5]))
    # Dr. GRPO on an agreeing group and a group of two: [.3, .3] -> 0, [2, 0] -> [1, -1] (no division by std 1.414)
    batch = make_batch(rewards=[0.3, 2.0, 0.3, 0.0], groups=[0, 1, 0, 1], lengths=[1, 2, 3, 4])
    close(grpo(batch, cfg.algorithm).advantages, expected_tokens([0.0, 1.0, 0.0, -1.0], lengths=[1, 2, 3, 4]))


# --------------------------------------------------------------------------- against loops written from verl's formulas


def loop_reference(name, scores, lengths, ids, epsilon=1e-6):
    groups = defaultdict(list)
    for i, g in enumerate(ids.tolist()):
        groups[g].append(i)
    out = scores.clone()
    m = int(torch.count_nonzero(scores))
    alpha = len(scores) / max(m, 1)
    for members in groups.values():
        r = scores[members]
        n = len(members)
        for k, i in enumerate(members):
            if name == "rloo":
                out[i] = r[k] - (r.sum() - r[k]) / (n - 1) if n > 1 else r[k]
            elif name == "opo":
                w = lengths[members].float()
                out[i] = r[k] - ((w * r).sum() / w.sum() if n > 1 else 0.0)
            elif name == "gpg":
                out[i] = alpha * (r[k] - (r.mean() if n > 1 else 0.0))
            elif name == "grpo_passk":
                top = torch.topk(r, 2).values
                best = members[int(torch.argmax(r))]  # ties: the gap is 0 whichever wins
                out[i] = (top[0] - top[1]) / (torch.std(r) + epsilon) if i == best else 0.0
    return out


@pytest.mark.parametrize("name", ["rloo", "opo", "gpg", "grpo_passk"])
def test_group_estimators_match_loops_on_random_batches(name):
    from plugrl_advantages.estimators.gpg import gpg_outcome_advantage
    from plugrl_advantages.estimators.grpo_passk import grpo_passk_outcome_advantage
    from plugrl_advantages.estimators.opo import opo_outcome_advantage
    from plugrl_advantages.estimators.rloo import rloo_outcome_advantage

    ours = {
        "rloo": lambda s, n, i: rloo_outcome_advantage(s, i),
        "opo": opo_outcome_advantage,
        "gpg": lambda s, n, i: gpg_outcome_advantage(s, i)[0],
        "grpo_passk": lambda s, n, i: grpo_passk_outcome_advantage(s, i),
    }[name]
    g = torch.Generator().manual_seed(11)
    for _ in range(15):
        n_groups = int(torch.randint(1, 5, (1,), generator=g))
        low = 2 if name == "grpo_passk" else 1
        sizes = torch.randint(low, 6, (n_groups,), generator=g)
        ids = torch.repeat_interleave(torch.randperm(50, generator=g)[:n_groups], sizes)
        ids = ids[torch.randperm(ids.numel(), generator=g)]
        scores = torch.randint(0, 4, (ids.numel(),), generator=g).float() / 3  # ties are common
        lengths = torch.randint(1, 9, (ids.numel(),), generator=g)
        close(ours(scores, lengths, ids), loop_reference(name, scores, lengths, ids), tol=1e-5)
