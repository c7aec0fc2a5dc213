"""Shared-prefix rows off the CPU (CUDA): PyTorch's FlexAttention over a block mask of the row's layout.

A :class:`~torch.nn.attention.flex_attention.BlockMask` marks each 128 x 128 tile of the ``[L, L]`` score matrix
empty (skipped), full (no mask evaluated) or partial (the layout's ``mask_mod`` evaluated per element), so cost
follows the allowed tiles and no ``[L, L]`` mask is stored (a dense bool mask of a 16k-token row is 256 MB). The
block mask is built once per layout and device and cached (:func:`prefix_block_mask`); every layer of a forward,
and its recomputation under activation checkpointing, finds it there. On CUDA ``flex_attention`` is compiled (once,
lazily): uncompiled it materialises the scores.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from plugrl.attention import PrefixGroup
from plugrl_attention.rows import check_row

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

# FlexAttention's tile (queries x keys) in the block mask: the CUDA kernels' default, and the size whose
# emptiness the layout decides
FLEX_BLOCK = 128

# block masks kept (most recently used first): one is enough for a forward and its checkpointed recomputation;
# a few more cover passes that alternate between micro-batches
_BLOCK_MASK_CACHE_SIZE = 4
_block_masks: list[tuple[tuple[tuple[PrefixGroup, ...], int | None], torch.device, int, BlockMask]] = []


def _token_intervals(groups: list[PrefixGroup], window: int | None = None) -> torch.Tensor:
    """[4, L] int32, per query token of the row: the two intervals of keys it attends to, ``[lo_a, hi_a)`` (in its
    group's prompt, for a response token) and ``[lo_b, hi_b)`` (its own branch: the prompt for a prompt token, its
    response for a response token, up to itself), as :func:`plugrl.attention.layer_masks` lays them out.

    A prompt token in an image run (``PrefixGroup.image_runs``) sees on to the run's end. With ``window`` a query
    at position P (in its sequence) sees keys at positions > P - window only: positions grow by one along the
    prompt and along each response, so that is a raised lower bound in each interval."""
    rows = []
    for g in groups:
        gs, pe = g.start, g.start + g.prompt_len
        t = torch.arange(g.prompt_len)
        hi = t + 1
        for a, b in g.image_runs:
            hi[a:b] = torch.clamp(hi[a:b], min=b)
        pos = t
        lo_b = gs + (pos - window + 1).clamp(min=0) if window is not None else torch.full_like(t, gs)
        rows.append(torch.stack([torch.full_like(t, gs), torch.full_like(t, gs), lo_b, gs + hi]))
        bs = pe
        for r in g.response_lens:
            j = torch.arange(r)
            pos = g.prompt_len + j
            lo_a = gs + (pos - window + 1).clamp(min=0) if window is not None else torch.full_like(j, gs)
            lo_a = torch.minimum(lo_a, torch.full_like(j, pe))  # past the prompt: the interval is empty
            lo_b = bs + (j - window + 1).clamp(min=0) if window is not None else torch.full_like(j, bs)
            rows.append(torch.stack([lo_a, torch.full_like(j, pe), lo_b, bs + j + 1]))
            bs += r
    return torch.cat(rows, 1).to(torch.int32) if rows else torch.zeros(4, 0, dtype=torch.int32)


def prefix_block_mask(
    groups: list[PrefixGroup],
    length: int,
    device: torch.device | str,
    block: int = FLEX_BLOCK,
    window: int | None = None,
) -> BlockMask:
    """The layout of ``groups`` (covering a row of ``length`` tokens) as a FlexAttention block mask on ``device``;
    with ``window``, a sliding layer's (keys at positions > the query's - window), and the groups' image runs
    attending to themselves both ways: :func:`plugrl.attention.layer_masks`' masks.

    Its ``mask_mod`` reads the layout off per-token intervals (:func:`_token_intervals`): key ``kv`` is allowed
    to query ``q`` when it lies in ``[lo_a, hi_a)`` (``q``'s prompt, for a response token) or ``[lo_b, hi_b)``
    (``q``'s branch up to ``q``, or to its image run's end). The tiles are classified without evaluating it over
    ``[L, L]``: the count of allowed keys of each query in each key tile is a difference of clamped bounds
    ([L, L / block] int32). A tile is full when every query row of it allows the whole tile (tiles cut by the
    row's end are never full, as in ``create_block_mask``), partial when some allow some: the same block mask as
    ``create_block_mask`` with that ``mask_mod``, which materialises ``[L, L]`` (and int64 gathers of it) on the
    way.
    """
    from torch.nn.attention.flex_attention import BlockMask

    bounds = _token_intervals(groups, window).to(device)
    if bounds.shape[1] != length:
        raise ValueError(f"prefix groups cover {bounds.shape[1]} tokens, the row has {length}")
    lo_a, hi_a, lo_b, hi_b = bounds

    def mask_mod(b, h, q_idx, kv_idx):
        in_a = (kv_idx >= lo_a[q_idx]) & (kv_idx < hi_a[q_idx])
        return in_a | ((kv_idx >= lo_b[q_idx]) & (kv_idx < hi_b[q_idx]))

    n_blocks = -(-length // block)
    tile_start = torch.arange(n_blocks, device=device, dtype=torch.int32) * block
    tile_end = (tile_start + block).clamp(max=length)

    def overlap(lo, hi):  # [L] x [n] -> [L, n]: allowed keys [lo, hi) of each query within each key tile
        return (torch.minimum(hi[:, None], tile_end) - torch.maximum(lo[:, None], tile_start)).clamp(min=0)

    count = overlap(lo_a, hi_a) + overlap(lo_b, hi_b)  # the two intervals never overlap
    count = F.pad(count, (0, 0, 0, n_blocks * block - length)).view(n_blocks, block, n_blocks)  # padded rows: 0
    full = (count == block).all(1)
    partial = (count > 0).any(1) & ~full

    def ordered(tiles):  # [n, n] bool -> [1, 1, n] counts and [1, 1, n, n] key tile indices, allowed first
        tiles = tiles.to(torch.int32)[None, None]
        return tiles.sum(-1, dtype=torch.int32), torch.argsort(tiles, dim=-1, descending=True, stable=True).int()

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(length, length)
    )


def _cached_block_mask(
    groups: list[PrefixGroup], length: int, device: torch.device, window: int | None = None
) -> BlockMask:
    """:func:`prefix_block_mask`, built once per layout (compared by contents), window and device: every layer
    asks (a model with sliding layers keeps two, the global layers' and the sliding ones')."""
    key = (tuple(groups), window)  # PrefixGroups are frozen; comparing the same objects is an identity check
    for i, (cached, cached_device, cached_length, mask) in enumerate(_block_masks):
        if cached_device == device and cached_length == length and cached == key:
            if i:
                _block_masks.insert(0, _block_masks.pop(i))
            return mask
    mask = prefix_block_mask(groups, length, device, window=window)
    _block_masks.insert(0, (key, device, length, mask))
    del _block_masks[_BLOCK_MASK_CACHE_SIZE:]
    return mask


@functools.cache
def _compiled_flex_attention():
    """``torch.compile(flex_attention)``, compiled on first use (CUDA only): the fused block-sparse kernel.
    Rows of a new length recompile once, after which Dynamo treats the length as dynamic."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    groups: list[PrefixGroup],
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Attention of a packed row laid out as ``groups`` (covering the row, in order) with FlexAttention.

    query [1, H, L, D]; key, value [1, H_kv, L, D] with H a multiple of H_kv (grouped-query attention, as
    :func:`plugrl_attention.tiled.shared_prefix_attention`). Returns [1, H, L, D] in query's dtype (the kernels
    accumulate in float32). The block mask comes from the cache of :func:`prefix_block_mask`. Compiled on CUDA
    (inside a model that is compiled as a whole, that compilation covers it); elsewhere eager FlexAttention, which
    computes the dense scores (and on CPU refuses inputs that require grad, in torch 2.13).
    """
    from torch.nn.attention.flex_attention import flex_attention

    check_row(query, groups, "flex_prefix_attention")
    mask = _cached_block_mask(groups, query.shape[2], query.device, window)
    # in a model compiled as a whole, Dynamo traces the plain function into that graph
    compiled = query.device.type == "cuda" and not torch.compiler.is_compiling()
    attend = _compiled_flex_attention() if compiled else flex_attention
    return attend(query, key, value, block_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1])
