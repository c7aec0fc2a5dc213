"""Shared-prefix attention (plugrl-attention, plugins/attention) against dense masked attention computed in float64:
the CPU kernel, and the FlexAttention path of other devices (eager FlexAttention on the CPU here; compiled on CUDA).
The kernel's layout (plugrl.attention: PrefixGroup, the dense masks) is the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.attention.flex_attention as flex
import torch.nn.functional as F

import plugrl_attention
import plugrl_attention.flex
from plugrl.attention import PrefixGroup, dense_mask
from plugrl_attention import attention_forward, flex_prefix_attention, prefix_block_mask, shared_prefix_attention

# eager FlexAttention (the CPU here) warns once that it is not the compiled kernel: known, and what these tests want
eager_flex = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


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


def _random_layout(seed, groups, max_prompt, max_response):
    """Groups of random sizes, 0-6 responses each: rows of many 16-token blocks."""
    gen = torch.Generator().manual_seed(seed)

    def draw(hi):
        return int(torch.randint(1, hi + 1, (), generator=gen))

    layout, start = [], 0
    for _ in range(groups):
        g = PrefixGroup(start, draw(max_prompt), tuple(draw(max_response) for _ in range(draw(7) - 1)))
        layout.append(g)
        start += g.length
    return layout


def _assert_equals_dense_float64(attend, groups, scale=16**-0.5, device="cpu", dtype=torch.float32, tol=None):
    """``attend(q, k, v, groups, scale)``: output and the gradients of q, k, v against `_dense_reference`."""
    q, k, v = (t.detach().to(device).requires_grad_() for t in _inputs(groups, dtype=dtype))
    out = attend(q, k, v, groups, scale)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
    (out * weights).sum().backward()
    got = [out.detach(), q.grad, k.grad, v.grad]

    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    ref = _dense_reference(q64, k64, v64, groups, scale)
    (ref * weights.cpu().double()).sum().backward()
    atol, rtol = tol or (2e-6, 1e-5)
    for a, b, what in zip(got, [ref.detach(), q64.grad, k64.grad, v64.grad], ["out", "dq", "dk", "dv"], strict=True):
        torch.testing.assert_close(a.cpu().double(), b, atol=atol, rtol=rtol, msg=what)


@pytest.mark.parametrize("tile", [1, 3, 4, 64])
@pytest.mark.parametrize("name", LAYOUTS)
def test_float32_output_and_gradients_equal_dense_float64(name, tile):
    """Tiles of 1 and 3 tokens cut responses into many bands (partial last tiles included); 4 divides some
    lengths exactly; 64 holds every response in one tile."""
    groups = [dataclasses.replace(g, tile=tile) for g in LAYOUTS[name]]
    _assert_equals_dense_float64(shared_prefix_attention, groups)


@eager_flex
@pytest.mark.parametrize("attend", [shared_prefix_attention, flex_prefix_attention], ids=["kernel", "flex"])
def test_a_scale_other_than_the_head_dims_applies_to_every_row(attend, monkeypatch):
    """Models may scale scores by other than 1/sqrt(D) (transformers passes ``scaling``): prompt rows too."""
    monkeypatch.setattr(flex, "_validate_device", lambda *args: None)  # CPU backward: see the flex numerics test
    _assert_equals_dense_float64(attend, LAYOUTS["two groups"], scale=0.1)


def test_the_backward_keeps_the_bf16_inputs_and_the_float32_outputs_only():
    """What the kernel keeps for its backward, on bf16 inputs as under autocast: the inputs themselves (no float32
    copy, no repeated key heads, no response tiles: those are made again in the backward) and, per part, its
    float32 output and log-sum-exp (tiles padded to whole tiles). Before, it kept float32 copies of the inputs
    with the key heads repeated, and tiled copies of them: 7.7 MB here, now 1.4 MB."""
    groups = [PrefixGroup(0, 116, (32, 20, 27, 32, 8, 30, 31, 12)), PrefixGroup(308, 116, (32, 25, 9, 32))]
    q, k, v = _inputs(groups, heads=9, kv_heads=3, dim=64, dtype=torch.bfloat16)
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}
    kept: dict[int, torch.Tensor] = {}

    def pack(t):
        kept.setdefault(t.untyped_storage().data_ptr(), t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = shared_prefix_attention(q, k, v, groups, 0.125)
    assert inputs <= kept.keys()
    others = [t for ptr, t in kept.items() if ptr not in inputs]
    assert all(t.dtype == torch.float32 for t in others)
    tile = groups[0].tile
    padded = sum(g.prompt_len + sum(-(-r // tile) * tile for r in g.response_lens) for g in groups)
    outputs = 9 * padded * (64 + 1) * 4  # [H, rows, D] outputs and [H, rows] log-sum-exps, float32
    assert sum(t.untyped_storage().nbytes() for t in others) <= outputs
    out.float().sum().backward()  # the backward runs from what was kept
    assert q.grad is not None and k.grad.shape == k.shape


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


# ---- the FlexAttention path (devices other than the CPU) ---------------------------------------------------

BLOCK_MASK_FIELDS = [
    "kv_num_blocks",
    "kv_indices",
    "full_kv_num_blocks",
    "full_kv_indices",
    "q_num_blocks",
    "q_indices",
    "full_q_num_blocks",
    "full_q_indices",
]
FLEX_LAYOUTS = {
    **LAYOUTS,
    "random long": _random_layout(0, groups=3, max_prompt=100, max_response=150),
    "random many": _random_layout(1, groups=9, max_prompt=40, max_response=50),
}


def _blocks_as_dense(num_blocks, indices, n_blocks):
    """[1, 1, n] counts and [1, 1, n, n] indices -> [n, n] bool: the listed key blocks of each query block."""
    dense = torch.zeros(n_blocks, n_blocks, dtype=torch.bool)
    for i in range(n_blocks):
        dense[i, indices[0, 0, i, : num_blocks[0, 0, i]].long()] = True
    return dense


@pytest.mark.parametrize("block", [1, 3, 16, 128])
@pytest.mark.parametrize("name", FLEX_LAYOUTS)
def test_block_mask_skips_exactly_the_empty_blocks_and_masks_the_partial_ones(name, block):
    """What the compiled kernel attends to: every key of a full block, the keys of a partial block that the
    mask_mod allows, nothing of an unlisted block. That must be the dense layout, and the block lists must be
    those of ``create_block_mask`` (which evaluates the mask_mod over [L, L]): no allowed block missed or
    called full, no empty one visited. Blocks of 1 and 3 tokens make many full blocks (3 divides few bounds);
    128, the default, cuts the row's end."""
    groups = FLEX_LAYOUTS[name]
    length = sum(g.length for g in groups)
    mask = prefix_block_mask(groups, length, "cpu", block)
    allowed = dense_mask(groups, length)
    assert torch.equal(flex.create_mask(mask.mask_mod, 1, 1, length, length, "cpu")[0, 0], allowed)

    n_blocks = -(-length // block)
    full = _blocks_as_dense(mask.full_kv_num_blocks, mask.full_kv_indices, n_blocks)
    partial = _blocks_as_dense(mask.kv_num_blocks, mask.kv_indices, n_blocks)
    assert not (full & partial).any()
    tokens = n_blocks * block

    def per_token(blocks):
        return blocks.repeat_interleave(block, 0).repeat_interleave(block, 1)[:length, :length]

    padded = F.pad(allowed, (0, tokens - length, 0, tokens - length))
    assert torch.equal(per_token(full) | (per_token(partial) & allowed), allowed)
    assert padded.view(n_blocks, block, n_blocks, block).any(3).any(1).equal(full | partial)

    ref = flex.create_block_mask(mask.mask_mod, 1, 1, length, length, device="cpu", BLOCK_SIZE=block)
    for field in BLOCK_MASK_FIELDS:
        assert torch.equal(getattr(mask, field), getattr(ref, field)), field
    assert mask.seq_lengths == (length, length)


def _with_image_runs(groups, seed=0):
    """The groups with one or two runs of image tokens in each prompt long enough (random places)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in groups:
        runs, at = [], 0
        while g.prompt_len - at >= 3 and len(runs) < 2:
            a = at + int(torch.randint(0, g.prompt_len - at - 2, (), generator=gen))
            b = a + int(torch.randint(2, min(5, g.prompt_len - a) + 1, (), generator=gen))
            runs.append((a, b))
            at = b + 1
        out.append(dataclasses.replace(g, image_runs=tuple(runs)))
    return out


def _layer_masks_of(groups, length, window):
    """:func:`layer_masks` of the groups' row: the dense reference."""
    from plugrl.attention import layer_masks

    positions = []
    for g in groups:
        positions += list(range(g.prompt_len))
        for r in g.response_lens:
            positions += range(g.prompt_len, g.prompt_len + r)
    masks = layer_masks(groups, length, torch.tensor(positions), window)
    return masks["sliding_attention" if window is not None else "full_attention"]


@pytest.mark.parametrize("block", [1, 3, 16, 128])
@pytest.mark.parametrize("window", [None, 1, 4, 9])
@pytest.mark.parametrize("name", FLEX_LAYOUTS)
def test_block_mask_with_a_window_and_image_runs_is_the_dense_layer_mask(name, window, block):
    """The FlexAttention path of a sliding layer (keys at positions > the query's - window) and of prompts whose
    image runs attend to themselves both ways (Gemma 3): its mask_mod is :func:`layer_masks`' dense mask, and its
    block lists are ``create_block_mask``'s."""
    groups = _with_image_runs(FLEX_LAYOUTS[name])
    length = sum(g.length for g in groups)
    mask = prefix_block_mask(groups, length, "cpu", block, window=window)
    allowed = _layer_masks_of(groups, length, window)
    assert torch.equal(flex.create_mask(mask.mask_mod, 1, 1, length, length, "cpu")[0, 0], allowed)
    ref = flex.create_block_mask(mask.mask_mod, 1, 1, length, length, device="cpu", BLOCK_SIZE=block)
    for field in BLOCK_MASK_FIELDS:
        assert torch.equal(getattr(mask, field), getattr(ref, field)), field
    if window is not None and any(g.image_runs for g in groups):  # both parts change the layout
        assert not torch.equal(allowed, dense_mask(groups, length))


@eager_flex
@pytest.mark.parametrize("name", ["two groups", "long responses", "random many"])
def test_flex_with_a_window_and_image_runs_equals_dense_float64_and_the_cpu_kernel_refuses_them(name, monkeypatch):
    """FlexAttention (eager, on the CPU) under a sliding layer's window and both-ways image runs: output and
    gradients equal float64 attention under :func:`layer_masks`' mask. The CPU kernel, which lays out causal rows,
    refuses image runs (the packed forward gives it dense masks instead)."""
    monkeypatch.setattr(flex, "_validate_device", lambda *args: None)
    groups = _with_image_runs(FLEX_LAYOUTS[name])
    length = sum(g.length for g in groups)
    q, k, v = _inputs(groups)
    allowed = _layer_masks_of(groups, length, 4)
    rep = q.shape[1] // k.shape[1]
    qq, kk, vv = q.double(), k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    scores = (qq @ kk.transpose(-1, -2) * 0.25).masked_fill(~allowed, float("-inf"))
    ref = torch.softmax(scores, -1) @ vv
    out = flex_prefix_attention(q, k, v, groups, 0.25, 4)
    torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = torch.autograd.grad(out.double(), (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for x, y in zip(got, want, strict=True):
        torch.testing.assert_close(x.double(), y.double(), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="image runs attending both ways"):
        attention_forward(torch.nn.Module(), q, k, v, None, prefix_groups=groups, scaling=0.25)


@eager_flex
@pytest.mark.parametrize("name", FLEX_LAYOUTS)
def test_flex_float32_output_and_gradients_equal_dense_float64(name, monkeypatch):
    """The FlexAttention path run eagerly on the CPU, with grouped-query attention (6 query heads, 2 key
    heads). torch refuses inputs that require grad in eager FlexAttention on the CPU, but only by a check in
    front of its math implementation, whose backward runs here: lifting the check verifies the layout, heads
    and scale we hand FlexAttention (its compiled kernels are torch's to test; CUDA: the test below)."""
    monkeypatch.setattr(flex, "_validate_device", lambda *args: None)
    _assert_equals_dense_float64(flex_prefix_attention, FLEX_LAYOUTS[name])


@eager_flex
def test_flex_path_without_grad_needs_no_workaround():
    groups = LAYOUTS["two groups"]
    q, k, v = (t.detach() for t in _inputs(groups))
    ref = _dense_reference(q, k, v, groups, 0.25)
    torch.testing.assert_close(flex_prefix_attention(q, k, v, groups, 0.25).double(), ref, atol=2e-6, rtol=1e-5)


@eager_flex
def test_block_mask_is_built_once_per_layout_and_device(monkeypatch):
    """Each layer's attention asks for it: the first builds it, the rest (an equal list, as from a
    recomputation, included) find it."""
    built = []
    monkeypatch.setattr(plugrl_attention.flex, "_block_masks", [])
    monkeypatch.setattr(
        plugrl_attention.flex,
        "prefix_block_mask",
        lambda *args, **kw: built.append(args) or prefix_block_mask(*args, **kw),
    )
    one, other = LAYOUTS["two groups"], LAYOUTS["one group"]
    for groups in [one, one, list(one), other, one, [dataclasses.replace(g) for g in one]]:
        q, k, v = (t.detach() for t in _inputs(groups))
        flex_prefix_attention(q, k, v, groups, 0.25)
    assert [args[0] for args in built] == [one, other]


def test_attention_forward_runs_flex_off_the_cpu_with_that_devices_autocast(monkeypatch):
    """A query on another device (here "meta": any non-CPU type) goes to `flex_prefix_attention`, in its own
    dtype although CPU autocast is on (autocast is per device type); on the CPU, to the kernel, in bf16."""
    calls = []

    def fake(name):
        def attend(query, key, value, groups, scale, *window):
            calls.append((name, query.device.type, query.dtype, key.dtype, groups, scale, *window))
            return torch.empty_like(query)

        return attend

    monkeypatch.setattr(plugrl_attention, "flex_prefix_attention", fake("flex"))
    monkeypatch.setattr(plugrl_attention, "shared_prefix_attention", fake("kernel"))
    groups = [PrefixGroup(0, 3, (4,))]
    module = torch.nn.Module()
    for device in ["meta", "cpu"]:
        q, k, v = (t.detach().to(device) for t in _inputs(groups))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, _ = attention_forward(module, q, k, v, None, prefix_groups=groups, scaling=0.25, sliding_window=9)
        assert out.shape == (1, 7, 6, 16) and out.device.type == device
    # flex gets the layer's window (it builds the sliding layout); on the CPU every sequence fits in it
    assert calls == [
        ("flex", "meta", torch.float32, torch.float32, groups, 0.25, 9),
        ("kernel", "cpu", torch.bfloat16, torch.bfloat16, groups, 0.25),
    ]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the compiled FlexAttention kernels")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["two groups", "long responses", "random long", "random many"])
def test_cuda_compiled_flex_equals_dense_float64(name, dtype):
    """The compiled kernels skip empty blocks and evaluate no mask in full ones: the block lists matter here.
    bf16: rounded inputs, float32 accumulation; its tolerance is bf16's."""
    tol = (2e-5, 1e-4) if dtype == torch.float32 else (3e-2, 3e-2)
    _assert_equals_dense_float64(flex_prefix_attention, FLEX_LAYOUTS[name], device="cuda", dtype=dtype, tol=tol)
