"""bf16 training with fp32 master weights (``model.dtype: bfloat16``, autocast) against fp32 on a tiny model.

The bf16 run must compute in bf16 (its numbers differ from fp32: the test would catch autocast being off),
keep fp32 weights and optimizer state, and stay close to the fp32 run in what training depends on: the
log-probs, the direction of the gradient and the update it makes. Same code path on GPU (autocast on cuda).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from plugrl.actor import PolicyModel, TrainBatch
from plugrl.config import ActorConfig, ModelConfig


def _batch() -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    seqs, plens, groups = [], [], []
    for prompt_id in range(3):
        prompt = torch.randint(5, 2000, (6 + prompt_id,), generator=g).tolist()
        for k in range(4):
            seqs.append(prompt + torch.randint(5, 2000, (5 + 3 * k,), generator=g).tolist())
            plens.append(len(prompt))
            groups.append(prompt_id)
    batch = TrainBatch.from_sequences(seqs, plens, group_ids=groups)
    batch.advantages = torch.randn(len(seqs), 1, generator=g) * batch.response_mask
    return batch


def _policy(path, dtype: str) -> PolicyModel:
    return PolicyModel(
        str(path),
        ModelConfig(path=str(path), dtype=dtype),
        ActorConfig(optim={"lr": 1e-3, "eps": 1e-6}),
        torch.device("cpu"),
    )


def _update(policy: PolicyModel, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(flattened gradient of the first optimizer step, flattened weight change)."""
    before = torch.cat([p.detach().flatten().clone() for p in policy.model.parameters()])
    grads = []
    policy.optimizer.register_step_pre_hook(
        lambda *_: grads.append(torch.cat([p.grad.flatten().clone() for p in policy.model.parameters()]))
    )
    policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
    after = torch.cat([p.detach().flatten() for p in policy.model.parameters()])
    return grads[0], after - before


def test_bf16_autocast_with_fp32_master_weights_matches_fp32(tiny_model):
    batch = _batch()
    fp32, bf16 = _policy(tiny_model, "float32"), _policy(tiny_model, "bfloat16")
    # master weights (and so AdamW's state) stay fp32 in the bf16 run
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}

    lp32 = fp32.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    lp16 = bf16.compute_logprobs(batch, temperature=1.0, token_budget=4096)
    mask = batch.response_mask.bool()
    diff = (lp16 - lp32)[mask].abs()
    # bf16 keeps 8 mantissa bits; log-probs of ~-10.9 nats moved by 3.7e-3 at most, 1.1e-3 on average (measured)
    assert diff.max() > 0, "bf16 run gave fp32's exact log-probs: autocast did not run"
    assert diff.max() < 0.02 and diff.mean() < 0.005, (diff.max(), diff.mean())

    g32, d32 = _update(fp32, batch)
    g16, d16 = _update(bf16, batch)
    assert {s["exp_avg"].dtype for s in bf16.optimizer.state.values()} == {torch.float32}
    # the gradient points the same way, with the same size (measured: cosine 1.0000, norm ratio 1.000002)
    assert F.cosine_similarity(g16, g32, dim=0) > 0.999
    assert abs(g16.norm() / g32.norm() - 1) < 0.01
    # and so does Adam's update (lr 1e-3, ~1e-3 per weight). Elements whose gradient is ~0 may move by
    # up to 2 lr apart (Adam divides by |g|): measured 0.012% of them differ by more than lr / 2
    assert F.cosine_similarity(d16, d32, dim=0) > 0.999
    assert ((d16 - d32).abs() > 5e-4).float().mean() < 1e-3


# ---- model.dtype: auto ------------------------------------------------------------------------------------------
# Whether a CPU has bf16 kernels is the hardware's answer: these tests substitute it both ways (one machine has
# one); test_auto_follows_this_machines_onednn checks the real probe on whatever machine runs the suite.


def test_auto_picks_bfloat16_only_where_the_cpu_has_bf16_kernels(monkeypatch, caplog):
    from plugrl import precision

    for fast, expected in ((True, "bfloat16"), (False, "float32")):
        monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert precision.resolve_dtype("auto", "cpu") == expected
        assert precision.resolve_dtype("float32", "cpu") == "float32"
    # an explicit bfloat16 is kept (correct, only slow) and warned about once, naming the key and the fix
    precision._warn_slow_bf16.cache_clear()
    with caplog.at_level("WARNING", logger="plugrl.precision"):
        assert precision.resolve_dtype("bfloat16", "cpu") == "bfloat16"
        assert precision.resolve_dtype("bfloat16", "cpu") == "bfloat16"
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "model.dtype=bfloat16" in warnings[0] and "model.dtype=auto" in warnings[0]
    with pytest.raises(ValueError, match="model.dtype='fp8'"):
        precision.resolve_dtype("fp8", "cpu")


def test_auto_follows_this_machines_onednn():
    from plugrl import precision

    onednn = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert precision.cpu_has_fast_bf16() == onednn
    assert precision.resolve_dtype("auto", "cpu") == ("bfloat16" if onednn else "float32")


def test_a_config_resolves_model_and_rollout_dtypes(monkeypatch):
    from plugrl import precision
    from plugrl.config import Config

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: False)
    data = {"dataset": "countdown"}
    cfg = Config.model_validate({"model": {"path": "m", "dtype": "auto"}, "data": data})
    precision.resolve_config_dtypes(cfg, "cpu")
    assert (cfg.model.dtype, cfg.rollout.dtype) == ("float32", "float32")  # rollout auto follows the model
    cfg = Config.model_validate(
        {"model": {"path": "m", "dtype": "auto"}, "data": data, "rollout": {"dtype": "bfloat16"}}
    )
    precision.resolve_config_dtypes(cfg, "cpu")
    assert (cfg.model.dtype, cfg.rollout.dtype) == ("float32", "bfloat16")


def test_policy_with_auto_dtype_computes_in_what_auto_resolves_to(tiny_model, monkeypatch):
    """A PolicyModel built with dtype auto (no trainer in between) autocasts exactly when auto means bf16."""
    from plugrl import precision

    for fast in (True, False):
        monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda fast=fast: fast)
        assert _policy(tiny_model, "auto").bf16 is fast
