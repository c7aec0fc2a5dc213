"""Shared-prefix attention (plugrl/attention.py) against dense masked attention computed in float64."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from plugrl.attention import PrefixGroup, attention_forward, dense_mask, shared_prefix_attention


def _dense_reference(q, k, v, groups, scale):
    """float64 softmax attention with the groups' dense mask (`dense_mask`, the layout of the eager/GPU path: the
    kernel computes the same layout from tiles without it, so agreement checks both)."""
    allowed = dense_mask(groups, q.shape[2])
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    scores = (q.double() @ kk.transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ vv


def _inputs(groups, heads=6, kv_heads=2, dim=16, dtype=torch.float32, seed=0):
    length = sum(g.length for g in groups)
    gen = torch.Generator().manual_seed(seed)
    shapes = [(1, heads, length, dim), (1, kv_heads, length, dim), (1, kv_heads, length, dim)]
    return [torch.randn(s, generator=gen).to(dtype).requires_grad_() for s in shapes]


LAYOUTS = {
    "one group": [PrefixGroup(0, 7, (5, 1, 9, 3))],
    "two groups": [PrefixGroup(0, 4, (6, 2)), PrefixGroup(12, 9, (3, 3, 8))],
    "one response": [PrefixGroup(0, 5, (4,))],
    "prompt only": [PrefixGroup(0, 6, ()), PrefixGroup(6, 3, (2, 5))],
    "one-token prompt": [PrefixGroup(0, 1, (3, 4))],
    "long responses": [PrefixGroup(0, 5, (17, 4, 9, 8)), PrefixGroup(43, 2, (11,))],
}


@pytest.mark.parametrize("tile", [1, 3, 4, 64])
@pytest.mark.parametrize("name", LAYOUTS)
def test_float32_output_and_gradients_equal_dense_float64(name, tile):
    """Tiles of 1 and 3 tokens cut responses into many bands (partial last tiles included); 4 divides some
    lengths exactly; 64 holds every response in one tile."""
    groups = [dataclasses.replace(g, tile=tile) for g in LAYOUTS[name]]
    q, k, v = _inputs(groups)
    scale = 16**-0.5
    out = shared_prefix_attention(q, k, v, groups, scale)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    got = [out.detach(), q.grad, k.grad, v.grad]

    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _dense_reference(q64, k64, v64, groups, scale)
    (ref * weights.double()).sum().backward()
    for a, b, what in zip(got, [ref.detach(), q64.grad, k64.grad, v64.grad], ["out", "dq", "dk", "dv"], strict=True):
        torch.testing.assert_close(a.double(), b, atol=2e-6, rtol=1e-5, msg=what)


def test_bfloat16_inputs_are_as_accurate_as_sdpa_with_the_dense_mask():
    """The same bf16 inputs through SDPA with the dense mask (the path this kernel replaces on CPU). Both
    accumulate in float32 and round the output to bf16 once."""
    groups = [PrefixGroup(0, 122, (128, 40, 60, 80, 128, 100, 30, 128))]
    q, k, v = _inputs(groups, heads=9, kv_heads=3, dim=64, dtype=torch.bfloat16)
    scale = 64**-0.5
    ref = _dense_reference(q.detach(), k.detach(), v.detach(), groups, scale)
    ours = shared_prefix_attention(q, k, v, groups, scale).detach().double()
    mask = dense_mask(groups, q.shape[2])
    dense = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=mask)
    err_ours, err_dense = (ours - ref).abs(), (dense.detach().double() - ref).abs()
    assert err_ours.max() <= err_dense.max() * 1.01
    assert err_ours.mean() <= err_dense.mean() * 1.01


def test_layout_must_cover_the_row():
    groups = [PrefixGroup(0, 3, (2,))]
    q, k, v = _inputs([PrefixGroup(0, 3, (4,))])
    with pytest.raises(ValueError, match="cover 5 tokens, the row has 7"):
        shared_prefix_attention(q, k, v, groups, 0.25)


def test_model_features_the_kernel_lacks_are_refused_not_ignored():
    groups = [PrefixGroup(0, 3, (4,))]
    q, k, v = _inputs(groups)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="softcap.*share_prompt_prefix=false"):
        attention_forward(module, q, k, v, None, prefix_groups=groups, softcap=50.0)
    with pytest.raises(ValueError, match="sliding_window"):
        attention_forward(module, q, k, v, None, prefix_groups=groups, sliding_window=4)
    out, _ = attention_forward(module, q, k, v, None, prefix_groups=groups, sliding_window=4096, scaling=0.25)
    assert out.shape == (1, 7, 6, 16)  # [B, L, H, D], as transformers expects
