"""Linear layers that read one float32 tensor under autocast share its bf16 cast (plugrl/autocast_inputs.py): the
backward keeps one copy instead of one per reader, and every number stays the same, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dp_worker import global_batch
from plugrl import autocast_inputs
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ModelConfig


def _readers(seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList([nn.Linear(64, 32), nn.Linear(64, 16), nn.Linear(64, 16)])  # q, k, v of one input


def _run(layers: nn.ModuleList, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
    """Outputs, gradients (input, then every weight and bias) and the bf16 bytes kept for the backward."""
    kept: dict[int, int] = {}

    def pack(t):
        if t.dtype == torch.bfloat16:
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    leaf = x.detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        # not a leaf, as a norm's output is: autocast caches the cast of a leaf that requires grad (meant for
        # weights), so a leaf would be cast once anyway
        hidden = leaf * 1.0
        outs = [layer(hidden) for layer in layers]
    sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    # the bf16 weight casts are kept in both runs alike; the input's copies are what differ
    return outs, [leaf.grad, *(p.grad for p in layers.parameters())], sum(kept.values())


def test_three_readers_keep_one_cast_and_compute_the_same_numbers():
    x = torch.randn(40, 64, generator=torch.Generator().manual_seed(1))
    plain, shared = _readers(), _readers()
    assert autocast_inputs.share_input_casts(shared) == 3
    outs_p, grads_p, kept_p = _run(plain, x)
    outs_s, grads_s, kept_s = _run(shared, x)
    assert all(torch.equal(a, b) for a, b in zip(outs_p, outs_s, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(grads_p, grads_s, strict=True))
    assert grads_s[0].dtype == torch.float32
    one_input = 40 * 64 * 2
    assert kept_p - kept_s == 2 * one_input  # three copies of the input before, one now


def test_nothing_changes_outside_autocast_or_without_gradients():
    layers = _readers()
    autocast_inputs.share_input_casts(layers)
    x = torch.randn(8, 64)
    assert layers[0](x).dtype == torch.float32  # no autocast: float32 through
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = layers[0](x)
    assert out.dtype == torch.bfloat16 and out.grad_fn is None


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "gradient-checkpointing"])
def test_a_bf16_policy_update_is_bit_for_bit_the_same(tiny_model, monkeypatch, checkpointing):
    """The policy (bf16 autocast in one process, full fine-tuning) with and without shared casts: the old
    log-probs, the update's loss and grad norm and every weight after it equal exactly; with gradient
    checkpointing too (the recomputed forward shares its casts as well)."""

    def policy(share: bool) -> PolicyModel:
        if not share:
            monkeypatch.setattr(autocast_inputs, "share_input_casts", lambda model: 0)
        torch.manual_seed(0)
        model = ModelConfig(path=str(tiny_model), dtype="bfloat16", enable_gradient_checkpointing=checkpointing)
        out = PolicyModel(str(tiny_model), model, ActorConfig(optim={"lr": 1e-3}), "cpu")
        monkeypatch.undo()
        return out

    results = []
    for p in (policy(True), policy(False)):
        batch = global_batch()
        batch.old_logprobs = p.compute_logprobs(batch, 1.0, 64)
        metrics = p.update(batch, num_mini_batches=1, temperature=1.0, norm_length=16)
        results.append((batch.old_logprobs, metrics, {n: t.detach().clone() for n, t in p.model.named_parameters()}))
    (old_s, m_s, w_s), (old_p, m_p, w_p) = results
    assert torch.equal(old_s, old_p)
    assert m_s["actor/grad_norm"] == m_p["actor/grad_norm"] > 0 and m_s["actor/pg_loss"] == m_p["actor/pg_loss"]
    assert all(torch.equal(w_s[n], w_p[n]) for n in w_s)
