"""TRL's loss_type values train as TRL trains them: each plugrl loss that a TRL config picks gives TRL's loss
value and gradient. TRL's per-token losses and aggregations are written out here from GRPOTrainer._compute_loss
(TRL 1.16), in TRL's variable names, and compared with plugrl's losses (the kernel's vanilla, plugrl-advantages'
others) on the same log-probabilities."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from plugrl import policy_losses
from plugrl.config import ConfigError
from plugrl_advantages import losses
from plugrl_compat.trl_config import translate


def _batch(seed: int = 0):
    """Log-probs far enough off-policy that every clip and gate is exercised, both advantage signs, ragged masks."""
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 7
    old = -torch.rand(b, t, generator=g) * 3
    new = (old + torch.randn(b, t, generator=g) * 0.8).requires_grad_(True)
    advantages = torch.tensor([1.5, -1.2, 0.7, -0.4, 0.0, 2.0]).unsqueeze(1).expand(b, t).contiguous()
    lengths = torch.tensor([7, 5, 3, 6, 2, 4])
    mask = (torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)).float()
    return new, old, advantages, mask


def _actor(**kwargs):
    """The actor section as the loss reads it (plugrl's property names)."""
    base = {"clip_low": 0.2, "clip_high": 0.2, "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean"}
    base.update(kwargs)
    base.setdefault("tau_pos", 1.0)
    base.setdefault("tau_neg", 1.05)
    return SimpleNamespace(**base)


def _trl_grpo_family(per_token_logps, old_per_token_logps, advantages, mask, eps_low, eps_high, delta=None):
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


def _trl_dapo(per_token_loss, mask):
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


def _trl_grpo(per_token_loss, mask):
    return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()


def _same(ours, theirs, new):
    (g_ours,) = torch.autograd.grad(ours, new, retain_graph=True)
    (g_theirs,) = torch.autograd.grad(theirs, new, retain_graph=True)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-6)
    assert torch.allclose(g_ours, g_theirs, rtol=1e-4, atol=1e-6)


def test_cispo_is_trls_cispo():
    """TRL: -clamp(ratio, max=epsilon_high).detach() * A * logp, normalised as dapo. plugrl's cispo with the
    translation's clip_ratio_low 1 (no lower bound) and clip_ratio_high epsilon_high - 1."""
    new, old, adv, mask = _batch()
    epsilon_high = 1.3
    theirs = _trl_dapo(-torch.clamp(torch.exp(new - old), max=epsilon_high).detach() * adv * new, mask)
    tree = translate({"loss_type": "cispo", "epsilon_high": epsilon_high, "num_generations": 8}).tree
    actor = tree["actor"]
    assert (actor["loss_mode"], actor["loss_agg_mode"]) == ("cispo", "token-mean")
    cfg = _actor(clip_low=actor["clip_ratio_low"], clip_high=actor["clip_ratio_high"], loss_agg_mode="token-mean")
    ours, metrics = losses.cispo(new, old, adv, mask, cfg)
    _same(ours, theirs, new)
    assert 0 < metrics["actor/pg_clipfrac"] < 1
    # the plain PPO clip of the same numbers is another loss: the test can tell them apart
    ppo, _ = policy_losses.vanilla(new, old, adv, mask, _actor(clip_high=epsilon_high - 1))
    assert abs(ppo.item() - theirs.item()) > 1e-3


def test_sapo_is_trls_sapo():
    new, old, adv, mask = _batch(1)
    pos, neg = 1.0, 1.05
    coef_1 = torch.exp(new - old)
    temperatures = torch.where(adv > 0, pos, neg)
    theirs = _trl_grpo(-(torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures) * adv, mask)
    tree = translate({"loss_type": "sapo", "sapo_temperature_neg": neg, "num_generations": 8}).tree
    assert tree["actor"]["loss_mode"] == "sapo" and tree["actor"]["tau_neg"] == neg
    ours, _ = losses.sapo(new, old, adv, mask, _actor(tau_pos=tree["actor"]["tau_pos"], tau_neg=neg))
    _same(ours, theirs, new)


def test_luspo_is_trls_sequence_level_luspo():
    new, old, adv, mask = _batch(2)
    eps, eps_high = 2e-1, 2.5e-1
    log_ratio = new - old
    log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv[:, :1], coef_2 * adv[:, :1])
    theirs = (per_token_loss * mask).sum(-1).mean()
    trl = {"loss_type": "luspo", "importance_sampling_level": "sequence", "epsilon": eps, "epsilon_high": eps_high}
    actor = translate({**trl, "num_generations": 8}).tree["actor"]
    assert actor["loss_mode"] == "luspo"
    ours, _ = losses.luspo(new, old, adv, mask, _actor(clip_low=eps, clip_high=eps_high))
    _same(ours, theirs, new)


def test_token_level_luspo_is_the_ppo_clip_summed_per_sequence():
    new, old, adv, mask = _batch(3)
    theirs = (_trl_grpo_family(new, old, adv, mask, 0.2, 0.2) * mask).sum(-1).mean()
    actor = translate({"loss_type": "luspo", "num_generations": 8}).tree["actor"]
    assert actor.get("loss_mode", "vanilla") == "vanilla" and actor["loss_agg_mode"] == "seq-mean-token-sum"
    cfg = _actor(clip_ratio_c=actor["clip_ratio_c"], loss_agg_mode="seq-mean-token-sum")
    ours, _ = policy_losses.vanilla(new, old, adv, mask, cfg)
    _same(ours, theirs, new)


@pytest.mark.parametrize("delta", [None, 1.5])
def test_trls_clip_has_no_dual_clip_and_delta_is_one(delta):
    """TRL's grpo-family loss bounds nothing for A < 0 unless `delta` is set, and `delta` caps the ratio of every
    token: for A < 0 that is verl's dual clip at delta, for A > 0 it changes nothing (the clip is below delta)."""
    new, old, adv, mask = _batch(4)
    with torch.no_grad():
        new[1, 0] = old[1, 0] + 2.0  # a negative-advantage token with a ratio of e^2 > 1.5 and > 3
        new[1, 1] = old[1, 1] + 1.3
    theirs = _trl_dapo(_trl_grpo_family(new, old, adv, mask, 0.2, 0.28, delta), mask)
    trl = {"epsilon_high": 0.28, "num_generations": 8, **({"delta": delta} if delta else {})}
    actor = translate(trl).tree["actor"]
    assert actor["clip_ratio_c"] == delta  # None: no dual clip
    cfg = _actor(clip_high=0.28, clip_ratio_c=actor["clip_ratio_c"])
    ours, _ = policy_losses.vanilla(new, old, adv, mask, cfg)
    _same(ours, theirs, new)
    assert torch.isfinite(torch.autograd.grad(ours, new)[0]).all()  # A = 0 rows: no NaN from -0 * inf


def test_vespo_is_refused_with_the_nearest_loss():
    with pytest.raises(ConfigError, match=r"'loss_type' 'vespo'.*nearest is loss_type cispo"):
        translate({"loss_type": "vespo", "num_generations": 8})


def test_trls_losses_are_the_kernels_vanilla_and_plugrl_advantages_others():
    from plugrl.plugins import load_plugins

    assert set(load_plugins([]).policy_losses) == {"vanilla"}
    registry = load_plugins(["advantages"])
    owners = {n: s.plugin for n, s in registry.policy_losses.items()}
    assert owners == {"vanilla": "plugrl", **dict.fromkeys(("gspo", "luspo", "cispo", "sapo"), "advantages")}
    assert registry.policy_losses["sapo"].fn is losses.sapo
    with pytest.raises(ConfigError, match="not one of the kernel's policy losses"):
        policy_losses.builtin_loss("sapo")
