"""Hand-computed checks of plugrl.algorithms (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from plugrl import algorithms as alg
from plugrl.algorithms import (
    agg_loss,
    entropy_from_logits,
    group_mean_std,
    kl_penalty,
    logprobs_and_entropy,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    policy_loss,
)

LN2 = math.log(2.0)


def close(actual, expected, tol=1e-6):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(torch.as_tensor(actual).double(), expected, rtol=tol, atol=tol)


# --------------------------------------------------------------------------- masked statistics


def test_masked_sum_and_mean():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    close(masked_sum(x, m), 7.0)  # 1 + 2 + 4
    close(masked_mean(x, m), 7.0 / 3.0)  # 3 tokens
    close(masked_sum(x, m, dim=-1), [3.0, 4.0])
    close(masked_mean(x, m, dim=-1), [1.5, 4.0])
    close(masked_mean(x, m, dim=0), [2.5, 2.0, 0.0])  # column 3 is empty -> 0, not NaN


def test_masked_mean_ignores_nan_in_padding_and_its_gradient():
    x = torch.tensor([[1.0, float("nan"), float("inf")]], requires_grad=True)
    m = torch.tensor([[1.0, 0.0, 0.0]])
    out = masked_mean(x, m)
    close(out.detach(), 1.0)
    out.backward()
    close(x.grad, [[1.0, 0.0, 0.0]])


def test_masked_mean_bool_mask_and_bf16():
    x = torch.tensor([1.0, 2.0, 4.0], dtype=torch.bfloat16)
    m = torch.tensor([True, False, True])
    out = masked_mean(x, m)
    assert out.dtype == torch.float32
    close(out, 2.5)  # (1 + 4) / 2


def test_masked_var_and_whiten():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    m = torch.ones(2, 2)
    # mean 2.5; squared deviations 2.25 + .25 + .25 + 2.25 = 5; unbiased var 5 / 3
    close(masked_var(x, m), 5.0 / 3.0)
    close(masked_var(x, m, unbiased=False), 5.0 / 4.0)
    expected = (x - 2.5) / math.sqrt(5.0 / 3.0 + 1e-8)  # [-1.1619, -0.3873, 0.3873, 1.1619]
    close(masked_whiten(x, m), expected)
    close(masked_whiten(x, m, shift_mean=False), expected + 2.5)


def test_masked_whiten_uses_only_masked_entries():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    # over {1, 3}: mean 2, unbiased var ((1)^2 + (1)^2) / 1 = 2
    w = masked_whiten(x, m)
    close(w[0, :2], [-1 / math.sqrt(2.0), 1 / math.sqrt(2.0)])
    close(masked_mean(w, m), 0.0)


def test_masked_whiten_needs_two_entries():
    with pytest.raises(ValueError, match="at least two"):
        masked_whiten(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 0.0]))


# --------------------------------------------------------------------------- KL estimators

LOGP = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
REF = torch.tensor([[math.log(0.25)]], dtype=torch.float64)
# d = logp - ref = log(0.5 / 0.25) = ln 2 = 0.693147


@pytest.mark.parametrize(
    ("kinds", "forward", "backward"),
    [
        # k1: d; swapped: -d
        (("kl", "k1"), LN2, -LN2),
        # |d| both ways
        (("abs",), LN2, LN2),
        # 0.5 * (ln 2)^2 = 0.5 * 0.480453 = 0.240227, symmetric
        (("mse", "k2"), 0.5 * LN2**2, 0.5 * LN2**2),
        # k3: log r = ref - logp = -ln 2, r = 0.5: 0.5 - (-ln 2) - 1 = ln 2 - 0.5 = 0.193147
        # swapped: log r = ln 2, r = 2: 2 - ln 2 - 1 = 1 - ln 2 = 0.306853 (not symmetric)
        (("low_var_kl", "k3"), LN2 - 0.5, 1.0 - LN2),
    ],
)
def test_kl_kinds_by_hand(kinds, forward, backward):
    for kind in kinds:
        close(kl_penalty(LOGP, REF, kind), [[forward]])
        close(kl_penalty(REF, LOGP, kind), [[backward]])


def test_kl_symmetry_properties():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 7, generator=g, dtype=torch.float64)
    b = torch.randn(4, 7, generator=g, dtype=torch.float64)
    close(kl_penalty(a, b, "k1"), -kl_penalty(b, a, "k1"))
    close(kl_penalty(a, b, "abs"), kl_penalty(b, a, "abs"))
    close(kl_penalty(a, b, "k2"), kl_penalty(b, a, "k2"))
    assert (kl_penalty(a, b, "k3") >= 0).all()  # r - log r - 1 >= 0
    close(kl_penalty(a, a, "k3"), torch.zeros(4, 7))  # r = 1: 1 - 0 - 1 = 0
    close(kl_penalty(a, a, "k2"), torch.zeros(4, 7))
    # for small d, k3 ~ k2: r - log r - 1 = d^2 / 2 + O(d^3) with log r = -d
    d = torch.tensor([1e-3], dtype=torch.float64)
    close(kl_penalty(d, torch.zeros(1, dtype=torch.float64), "k3"), 0.5 * d**2, tol=1e-9)


def test_k3_clamps_at_ten_like_verl():
    # log r = ref - logp = 3: e^3 - 3 - 1 = 20.0855 - 4 = 16.0855 -> clamped to 10
    logp = torch.tensor([0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([3.0], dtype=torch.float64)
    out = kl_penalty(logp, ref, "k3")
    close(out.detach(), [10.0])
    out.sum().backward()
    close(logp.grad, [0.0])  # the clamp cuts the gradient, as in verl
    # log r = -2: e^-2 + 2 - 1 = 0.135335 + 1 = 1.135335 (inside the clamp)
    close(kl_penalty(torch.tensor([2.0]), torch.tensor([0.0]), "k3"), [math.exp(-2.0) + 1.0])
    # log r = +-30 is first clamped to +-20: e^20 - 21 and e^-20 + 19 are finite, then clamped to 10
    out = kl_penalty(torch.tensor([0.0, 30.0]), torch.tensor([30.0, 0.0]), "k3")
    assert torch.isfinite(out).all()
    close(out, [10.0, 10.0])


def test_kl_unknown_kind_names_the_valid_ones():
    with pytest.raises(ValueError, match="low_var_kl") as err:
        kl_penalty(LOGP, REF, "full")
    for kind in ("kl", "k1", "abs", "mse", "k2", "k3"):
        assert kind in str(err.value)


def test_kl_bf16_is_computed_in_float32():
    out = kl_penalty(LOGP.to(torch.bfloat16), REF.to(torch.bfloat16), "k3")
    assert out.dtype == torch.float32


# --------------------------------------------------------------------------- agg_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
# per-seq token sums S = [1 + 2, 4] = [3, 4]; lengths n = [2, 1]; 3 tokens, B = 2, T = 3


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, 7.0 / 3.0),  # (3 + 4) / 3 tokens = 2.3333
        ("token-mean", {"num_tokens": 10}, 0.7),  # (3 + 4) / 10
        ("seq-mean-token-sum", {}, 3.5),  # (3 + 4) / 2
        ("seq-mean-token-sum", {"num_seqs": 4}, 1.75),  # (3 + 4) / 4
        ("seq-mean-token-mean", {}, 2.75),  # (3/2 + 4/1) / 2 = 5.5 / 2
        ("seq-mean-token-sum-norm", {}, 7.0 / 6.0),  # (3 + 4) / T=3 / B=2
        ("seq-mean-token-sum-norm", {"norm_length": 10}, 0.35),  # (3 + 4) / 10 / 2
        ("seq-mean-token-sum-norm", {"norm_length": 10, "num_seqs": 7}, 0.1),  # 7 / 10 / 7
    ],
)
def test_agg_loss_by_hand(mode, kwargs, expected):
    close(agg_loss(LOSS, MASK, mode, **kwargs), expected)


def test_agg_loss_empty_sequences_contribute_zero():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    close(agg_loss(LOSS, mask, "token-mean"), 1.5)  # 3 / 2 tokens
    close(agg_loss(LOSS, mask, "seq-mean-token-sum"), 1.5)  # (3 + 0) / 2
    close(agg_loss(LOSS, mask, "seq-mean-token-mean"), 0.75)  # (1.5 + 0) / 2
    close(agg_loss(LOSS, mask, "seq-mean-token-sum-norm"), 0.5)  # 3 / 3 / 2
    empty = torch.zeros(2, 3)
    for mode in alg.LOSS_AGG_MODES:
        out = agg_loss(LOSS, empty, mode)
        assert torch.isfinite(out) and out.item() == 0.0, mode


def test_agg_loss_nan_on_padding_does_not_leak():
    loss = LOSS.clone()
    loss[0, 2] = float("nan")
    for mode in alg.LOSS_AGG_MODES:
        assert torch.isfinite(agg_loss(loss, MASK, mode)), mode


def test_token_mean_with_global_token_count_matches_one_batch():
    # micro-batch 1 = row 0 (2 tokens, sum 3), micro-batch 2 = row 1 (1 token, sum 4);
    # with the global count 3: 3/3 + 4/3 = 7/3, the token mean of the whole batch
    loss = LOSS.clone().requires_grad_(True)
    whole = agg_loss(loss, MASK, "token-mean")
    (g_whole,) = torch.autograd.grad(whole, loss)
    total = int(MASK.sum())
    parts = agg_loss(loss[:1], MASK[:1], "token-mean", num_tokens=total) + agg_loss(
        loss[1:], MASK[1:], "token-mean", num_tokens=total
    )
    (g_parts,) = torch.autograd.grad(parts, loss)
    close(parts.detach(), 7.0 / 3.0)
    close(g_parts, g_whole)  # 1/3 on each of the 3 tokens
    # the per-micro-batch default would weigh the 1-token row 3x: 3/2 + 4/1 != 7/3
    local = agg_loss(LOSS[:1], MASK[:1], "token-mean") + agg_loss(LOSS[1:], MASK[1:], "token-mean")
    assert abs(local.item() - 7.0 / 3.0) > 1.0
    # the sequence modes likewise with num_seqs = 2 over both micro-batches: 3/2 + 4/2 = 3.5
    seq = agg_loss(LOSS[:1], MASK[:1], "seq-mean-token-sum", num_seqs=2) + agg_loss(
        LOSS[1:], MASK[1:], "seq-mean-token-sum", num_seqs=2
    )
    close(seq, 3.5)


def test_agg_loss_accepts_tensor_counts_and_bf16():
    out = agg_loss(LOSS.bfloat16(), MASK.bool(), "token-mean", num_tokens=torch.tensor(3))
    assert out.dtype == torch.float32
    close(out, 7.0 / 3.0)


def test_agg_loss_unknown_mode_and_shape():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        agg_loss(LOSS, MASK, "sum")
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        agg_loss(LOSS[0], MASK[0], "token-mean")


# --------------------------------------------------------------------------- policy loss

CLIP = {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0}  # DAPO clip-higher: ratio bounds [0.8, 1.28]

# one row, six tokens (+ one padding token); ratio = exp(logp - old), A = advantage
#  t  ratio  A   pg1 = -A*r  pg2 = -A*clip(r)  clip1 = max  pg3 = -3A  loss                       d loss/d logp
#  0  1.1    1   -1.1        -1.1              -1.1         -3        clip1 = -1.1 (inside)      -A*r = -1.1
#  1  1.5    2   -3.0        -2.56             -2.56        -6        clip1 = -2.56 (clipped)     0
#  2  0.5   -1    0.5         0.8               0.8          3        min(3, .8) = 0.8 (clipped)  0
#  3  5.0   -1    5.0         1.28              5.0          3        min(3, 5) = 3 (dual clip)   0
#  4  2.0   -1    2.0         1.28              2.0          3        min(3, 2) = 2 (unclipped)  -A*r = 2
#  5  0.5    1   -0.5        -0.8              -0.5         -3        clip1 = -0.5 (unclipped)   -A*r = -0.5
RATIOS = [1.1, 1.5, 0.5, 5.0, 2.0, 0.5, 100.0]
ADVS = [1.0, 2.0, -1.0, -1.0, -1.0, 1.0, -7.0]
PG_MASK = torch.tensor([[1.0] * 6 + [0.0]], dtype=torch.float64)
TOKEN_LOSSES = [-1.1, -2.56, 0.8, 3.0, 2.0, -0.5]
TOKEN_GRADS = [-1.1, 0.0, 0.0, 0.0, 2.0, -0.5]


def pg_inputs(dtype=torch.float64):
    old = torch.full((1, 7), math.log(0.25), dtype=dtype)
    logp = (old + torch.log(torch.tensor([RATIOS], dtype=dtype))).detach().requires_grad_(True)
    return logp, old, torch.tensor([ADVS], dtype=dtype)


def test_policy_loss_cases_by_hand():
    logp, old, adv = pg_inputs()
    loss, metrics = policy_loss(logp, old, adv, PG_MASK, **CLIP)
    # token-mean: (-1.1 - 2.56 + 0.8 + 3 + 2 - 0.5) / 6 = 1.64 / 6 = 0.273333
    close(loss.detach(), sum(TOKEN_LOSSES) / 6)
    loss.backward()
    # gradient: 1/6 of each token's d loss / d logp; clipped tokens and the padding token get 0
    close(logp.grad, [[g / 6 for g in TOKEN_GRADS] + [0.0]])
    # clipfrac: pg2 > pg1 on tokens 1 and 2 -> 2/6; lower: dual clip on token 3 -> 1/6
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 6)
    # ppo_kl = mean(old - logp) = -ln(1.1 * 1.5 * 0.5 * 5 * 2 * 0.5) / 6 = -ln(4.125) / 6 = -0.236178
    assert metrics["actor/ppo_kl"] == pytest.approx(-math.log(4.125) / 6)
    assert metrics["actor/pg_loss"] == pytest.approx(sum(TOKEN_LOSSES) / 6)
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize(
    ("ratio", "adv", "loss", "grad"),
    [
        (1.1, 1.0, -1.1, -1.1),  # inside [0.8, 1.28]: -A * r, gradient -A * r
        (1.5, 2.0, -2.56, 0.0),  # above 1 + high with A > 0: -2 * 1.28, no gradient
        (0.5, -1.0, 0.8, 0.0),  # below 1 - low with A < 0: -(-1) * 0.8, no gradient
        (50.0, -0.5, 1.5, 0.0),  # dual clip: min(-A * c, -A * r) = 0.5 * 3 = 1.5, no gradient
        (1.2, -1.0, 1.2, 1.2),  # inside, A < 0: -A * r = 1.2
    ],
)
def test_policy_loss_single_token(ratio, adv, loss, grad):
    old = torch.tensor([[0.0]], dtype=torch.float64)
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    out, _ = policy_loss(logp, old, torch.tensor([[adv]], dtype=torch.float64), torch.ones(1, 1), **CLIP)
    close(out.detach(), loss)
    out.backward()
    close(logp.grad, [[grad]])


def test_policy_loss_symmetric_clip_and_ratio_clamp():
    # a log-ratio of 50 is clamped to 20 before exp: finite; with A > 0 the loss is -A * (1 + high)
    logp = torch.tensor([[50.0, -50.0]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, 1.0]])
    loss, metrics = policy_loss(logp, old, adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.2)
    # token 0: -1 * 1.2; token 1: ratio e^-20 ~ 0: pg1 = -2e-9 > pg2 = -0.8 -> -2e-9 (unclipped)
    close(loss.detach(), (-1.2 - math.exp(-20.0)) / 2)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0)  # (-20 + 20) / 2
    loss.backward()
    assert torch.isfinite(logp.grad).all()


def test_policy_loss_agg_modes_and_global_counts():
    logp, old, adv = pg_inputs()
    loss, _ = policy_loss(logp, old, adv, PG_MASK, agg_mode="seq-mean-token-sum", num_seqs=4, **CLIP)
    close(loss.detach(), sum(TOKEN_LOSSES) / 4)
    loss, metrics = policy_loss(logp, old, adv, PG_MASK, num_tokens=12, **CLIP)
    close(loss.detach(), sum(TOKEN_LOSSES) / 12)
    assert metrics["actor/pg_loss"] == pytest.approx(sum(TOKEN_LOSSES) / 12)
    # metrics stay means over this batch's tokens whatever the loss normaliser
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 6)


def test_policy_loss_bf16_and_validation():
    logp, old, adv = pg_inputs(torch.float32)
    loss, _ = policy_loss(logp.detach().bfloat16(), old.bfloat16(), adv.bfloat16(), PG_MASK.bool(), **CLIP)
    assert loss.dtype == torch.float32
    close(loss, sum(TOKEN_LOSSES) / 6, tol=0.05)
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(logp, old, adv, PG_MASK, clip_low=0.2, clip_high=0.2, clip_c=1.0)


# --------------------------------------------------------------------------- logits


def test_entropy_uniform_is_log_vocab():
    for vocab in (2, 7, 1000):
        close(entropy_from_logits(torch.zeros(3, vocab)), [math.log(vocab)] * 3, tol=1e-5)
    # any constant logits are uniform too, in any leading shape
    close(entropy_from_logits(torch.full((2, 4, 5), 123.0)), torch.full((2, 4), math.log(5)), tol=1e-5)


def test_entropy_matches_definition_and_is_stable():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 11, generator=g, dtype=torch.float64) * 3
    p = torch.softmax(z, -1)
    close(entropy_from_logits(z), -(p * p.log()).sum(-1), tol=1e-9)
    # two-point distribution p = (.5, .5): ln 2; a 1e4 offset changes nothing and stays finite
    close(entropy_from_logits(torch.tensor([[1e4, 1e4]])), [LN2])
    close(entropy_from_logits(z.float() + 1e4), entropy_from_logits(z), tol=5e-3)
    # -inf logits (masked vocabulary) contribute 0 and no NaN gradient
    z = torch.tensor([[0.0, 0.0, float("-inf")]], requires_grad=True)
    out = entropy_from_logits(z)
    close(out.detach(), [LN2])
    out.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_entropy_bf16_and_chunking(monkeypatch):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(9, 13, generator=g)
    whole = entropy_from_logits(z)
    low = entropy_from_logits(z.bfloat16())
    assert low.dtype == torch.float32
    close(low, entropy_from_logits(z.bfloat16().float()), tol=1e-6)  # same as upcasting first
    close(low, whole, tol=2e-2)  # bf16 rounding of the logits only
    monkeypatch.setattr(alg, "_CHUNK_ELEMENTS", 13 * 2)  # 2 rows per chunk
    zg = z.clone().requires_grad_(True)
    chunked = entropy_from_logits(zg)
    close(chunked.detach(), whole, tol=1e-6)
    chunked.sum().backward()
    # the chunked gradient equals that of the plain formula -sum p log p
    zp = z.clone().requires_grad_(True)
    p = torch.softmax(zp, -1)
    (-(p * torch.log_softmax(zp, -1)).sum()).backward()
    close(zg.grad, zp.grad, tol=1e-5)


def test_logprobs_from_logits_equals_log_softmax_gather(monkeypatch):
    g = torch.Generator().manual_seed(2)
    z = torch.randn(10, 17, generator=g, requires_grad=True)
    labels = torch.randint(0, 17, (10,), generator=g)
    ref = torch.log_softmax(z, -1).gather(-1, labels[:, None]).squeeze(-1)
    out = logprobs_from_logits(z, labels)
    close(out.detach(), ref.detach(), tol=1e-6)
    (g1,) = torch.autograd.grad(out.sum(), z)
    (g2,) = torch.autograd.grad(ref.sum(), z)
    close(g1, g2, tol=1e-6)
    # by hand: logits (0, ln 3) -> p = (1/4, 3/4)
    close(
        logprobs_from_logits(torch.tensor([[0.0, math.log(3.0)]] * 2), torch.tensor([0, 1])),
        [math.log(0.25), math.log(0.75)],
    )
    # leading dimensions, bf16, chunking
    z3 = z.detach().reshape(2, 5, 17)
    close(logprobs_from_logits(z3, labels.reshape(2, 5)), ref.detach().reshape(2, 5), tol=1e-6)
    assert logprobs_from_logits(z.detach().bfloat16(), labels).dtype == torch.float32
    monkeypatch.setattr(alg, "_CHUNK_ELEMENTS", 17 * 3)
    close(logprobs_from_logits(z.detach(), labels), ref.detach(), tol=1e-6)
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(z, labels[:5])


def test_logprobs_and_entropy_in_one_pass_equal_the_separate_functions(monkeypatch):
    g = torch.Generator().manual_seed(3)
    z = torch.randn(12, 19, generator=g) * 4
    labels = torch.randint(0, 19, (12,), generator=g)
    for temperature in (1.0, 0.7):
        zs = z / temperature
        for entropy_grad in (False, True):
            monkeypatch.setattr(alg, "_CHUNK_ELEMENTS", 19 * 5)  # 3 chunks: 5 + 5 + 2 rows
            za = z.clone().requires_grad_(True)
            lp, ent = logprobs_and_entropy(za, labels, temperature=temperature, entropy_grad=entropy_grad)
            close(lp.detach(), torch.log_softmax(zs, -1).gather(-1, labels[:, None]).squeeze(-1), tol=1e-5)
            p = torch.softmax(zs.double(), -1)
            close(ent.detach(), -(p * p.log()).sum(-1), tol=1e-5)
            assert ent.requires_grad == entropy_grad
            # the gradient of logp (+ entropy when asked) is that of the plain formulas
            (lp.sum() + (ent.sum() if entropy_grad else 0)).backward()
            zb = z.clone().requires_grad_(True)
            ref = torch.log_softmax(zb / temperature, -1).gather(-1, labels[:, None]).sum()
            if entropy_grad:
                q = torch.softmax(zb / temperature, -1)
                ref = ref - (q * torch.log_softmax(zb / temperature, -1)).sum()
            ref.backward()
            close(za.grad, zb.grad, tol=1e-5)
    # bf16 logits give what their float32 upcast gives; -inf logits count 0 and make no NaN
    lp16, ent16 = logprobs_and_entropy(z.bfloat16(), labels)
    lp32, ent32 = logprobs_and_entropy(z.bfloat16().float(), labels)
    assert lp16.dtype == ent16.dtype == torch.float32
    close(lp16, lp32, tol=1e-6)
    close(ent16, ent32, tol=1e-6)
    lp, ent = logprobs_and_entropy(torch.tensor([[0.0, 0.0, float("-inf")]]), torch.tensor([1]))
    close(lp, [-LN2])
    close(ent, [LN2])
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_and_entropy(z, labels[:5])


def test_logprobs_and_entropy_backward_is_exact_and_finite(monkeypatch):
    """The hand-written backward: float64 gradcheck (logp and entropy, with a temperature, over chunks),
    a masked (-inf) vocabulary entry gets gradient 0 and no NaN, and bf16 logits get a bf16 gradient."""
    monkeypatch.setattr(alg, "_CHUNK_ELEMENTS", 7 * 2)  # 2 rows per chunk
    g = torch.Generator().manual_seed(5)
    z = (torch.randn(5, 7, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    labels = torch.randint(0, 7, (5,), generator=g)
    for temperature in (1.0, 0.6):
        assert torch.autograd.gradcheck(
            lambda x, t=temperature: logprobs_and_entropy(x, labels, temperature=t, entropy_grad=True), (z,)
        )
    masked = torch.tensor([[1.0, 2.0, float("-inf")], [0.5, float("-inf"), 0.0]], requires_grad=True)
    lp, ent = logprobs_and_entropy(masked, torch.tensor([0, 0]), entropy_grad=True)
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(masked.grad).all() and masked.grad[0, 2] == 0 and masked.grad[1, 1] == 0
    zb = z.detach().bfloat16().requires_grad_(True)
    logprobs_and_entropy(zb, labels)[0].sum().backward()
    assert zb.grad.dtype == torch.bfloat16
    close(zb.grad.float(), torch.autograd.grad(logprobs_from_logits(z, labels).sum(), z)[0].float(), tol=1e-2)


# --------------------------------------------------------------------------- group statistics

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5])
GROUPS = torch.tensor([0, 0, 0, 0, 1])
# group 0 = [1, 0, 0, 1]: mean .5; deviations +-.5; unbiased var (4 * .25) / 3 = 1/3; std = 0.5773503
# group 1 = [0.5] alone: mean .5 (its own score), std 0


def test_group_mean_std_by_hand():
    mean, std, size = group_mean_std(REWARDS, GROUPS)
    close(mean, [0.5] * 4 + [0.5])  # the singleton's own score (grpo replaces it by 0)
    close(std, [math.sqrt(1 / 3)] * 4 + [0.0])
    assert size.tolist() == [4, 4, 4, 4, 1]
    with pytest.raises(ValueError, match="group_ids"):
        group_mean_std(REWARDS, GROUPS[:3])
    with pytest.raises(ValueError, match="shape"):
        group_mean_std(REWARDS.reshape(5, 1), GROUPS)


# --------------------------------------------------------------------------- docs/algorithms.md


def test_algorithms_doc_covers_every_kl_kind_and_agg_mode():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text()
    for name in alg.KL_KINDS + alg.LOSS_AGG_MODES:
        assert f"`{name}`" in doc, name
    # the clamps the doc quotes are the code's: k3 = exp(lr) - lr - 1, lr = clamp(-d, -20, 20), then [-10, 10]
    assert "[-10, 10]" in doc and "clamp(-d, -20, 20)" in doc
    d = torch.tensor([-30.0, 0.5])  # logprob - ref_logprob
    lr = torch.clamp(-d, -20, 20)  # [20, -.5]
    close(kl_penalty(d, torch.zeros(2), "k3"), torch.clamp(torch.exp(lr) - lr - 1, -10, 10))  # [10, e^-.5 - .5]


def test_value_loss_by_hand():
    from plugrl.algorithms import value_loss

    values = torch.tensor([[1.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0]])
    mask = torch.ones(1, 2)
    # token 0: v=1 is clipped to 0.5; (1-2)^2 = 1 vs (0.5-2)^2 = 2.25 -> 2.25 (clipped wins)
    # token 1: v=0 unclipped; (0-1)^2 = 1 both -> 1
    # loss = 0.5 * mean(2.25, 1) = 0.8125
    loss, m = value_loss(values, old, returns, mask, clip_range=0.5)
    assert abs(loss.item() - 0.8125) < 1e-6 and m["critic/vf_clipfrac"] == 0.5
    loss.backward()
    # the clipped token passes no gradient to v; token 1: d/dv 0.5*0.5*(v-1)^2 = 0.5*(v-1) = -0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.5]]))


def test_gspo_sequence_ratio_by_hand():
    from plugrl_advantages.losses import gspo_policy_loss  # plugrl-advantages' loss, on the kernel's agg_loss

    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -2.1, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]])
    # seq 0: mean log-ratio (0.2 + 0.1) / 2 = 0.15 -> s = e^0.15 = 1.161834; clipped to 1 + 0.1 = 1.1 for A > 0
    #        per-token loss max(-1.161834, -1.1) = -1.1 on both tokens -> token mean -1.1
    # seq 1: ratio 1 -> loss -(-1) * 1 = 1
    # seq-mean-token-mean: (-1.1 + 1) / 2 = -0.05
    loss, m = gspo_policy_loss(logp, old, adv, mask, clip_low=0.1, clip_high=0.1)
    assert abs(loss.item() - (-0.05)) < 1e-6
    assert abs(m["actor/pg_clipfrac"] - 2 / 3) < 1e-6  # seq 0's two tokens of three
    loss.backward()
    # clipped sequence: no gradient; seq 1: d/dlogp of -A * exp(logp - sg(logp)) / 2 = 0.5
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]))


def test_overlong_penalty_by_hand():
    from plugrl_dapo.sampling import overlong_penalty

    # max 100, buffer 20 -> expected 80; lengths 50, 80, 90, 100 -> 0, 0, -10/20*0.5, -20/20*0.5
    pen = overlong_penalty(torch.tensor([50, 80, 90, 100]), 100, 20, 0.5)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.25, -0.5]))


def test_adaptive_kl_coef_by_hand():
    from plugrl.algorithms import adaptive_kl_coef

    # kl 0.15 vs target 0.1: error clip(0.5) = 0.2; coef 0.1 * (1 + 0.2 * 64 / 1000) = 0.10128
    assert abs(adaptive_kl_coef(0.1, 0.15, 0.1, 1000, 64) - 0.10128) < 1e-12
    # kl 0.09: error -0.1; 0.1 * (1 - 0.1 * 10 / 100) = 0.099
    assert abs(adaptive_kl_coef(0.1, 0.09, 0.1, 100, 10) - 0.099) < 1e-12


def test_response_mask_marks_each_rows_first_tokens():
    expected = [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert alg.response_mask([2, 0, 3]).tolist() == expected
    assert alg.response_mask([2, 0, 3]).dtype == torch.float32
    assert alg.response_mask([1], width=4).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert alg.response_mask([0, 0]).shape == (2, 1)  # all empty: one column, all zeros
