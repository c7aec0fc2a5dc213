"""Attention for a packed row in which n responses share one copy of their prompt.

A group sits in the row as ``[prompt, response 1, ..., response k]``. Prompt tokens attend causally within
the prompt; a token of response i attends to the whole prompt and causally within response i. As one dense
``[L, L]`` mask this makes SDPA's CPU kernel visit every tile: its cost grows with ``L**2`` although for 8
responses of ~100 tokens 80% of the mask is empty. Here the response queries attend to three key blocks, each
a flash-attention call, and the partial results are merged by their log-sum-exps:

- the prompt's keys (all of the group's response queries in one call);
- their own tile's keys, causal: responses are cut into tiles of :data:`TILE` tokens, all tiles in one batch;
- the earlier tiles of their response (one call per band: the tiles that are the j-th of their response).

CPU flash attention computes a causal block's masked half as well, so without tiles a 512-token response cost
its full square; with them only the diagonal tiles do. The backward runs the same calls with the merged output
and log-sum-exp, which gives each key block its exact share of the gradient (the flash-attention backward only
needs the final softmax normaliser). Measured by ``bench/attention.py`` (docs/performance.md): one layer forward +
backward, 122-token prompt and 8 responses of 80-512 tokens: dense-mask SDPA 305 ms, untiled 160-172 ms, tiles of
64 tokens 88-117 ms.

That kernel is for the CPU. On other devices (CUDA) the same layout runs through PyTorch's FlexAttention
(:func:`flex_prefix_attention`): a :class:`~torch.nn.attention.flex_attention.BlockMask` marks each 128 x 128
tile of the ``[L, L]`` score matrix empty (skipped), full (no mask evaluated) or partial (the layout's
``mask_mod`` evaluated per element), so cost follows the allowed tiles and no ``[L, L]`` mask is stored (a
dense bool mask of a 16k-token row is 256 MB). The block mask is built once per layout and device and cached
(:func:`prefix_block_mask`); every layer of a forward, and its recomputation under activation checkpointing,
finds it there. On CUDA ``flex_attention`` is compiled (once, lazily): uncompiled it materialises the scores.

The model uses it through transformers' attention interface under the name :data:`NAME` (SDPA everywhere
else: masks, decoding, packed rows without groups); :class:`plugrl.actor.PolicyModel` passes the groups as the
``prefix_groups`` keyword of the model's forward, on every device: :func:`attention_forward` picks the kernel
by the query's device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask

NAME = "plugrl_sdpa"


# Response tokens are cut into tiles of this many tokens. CPU flash attention does not skip the masked half of a
# causal block, so one causal call over a whole response costs its full square; per tile, only the diagonal
# tiles pay that (see bench/attention.py for the measured choice)
TILE = 64


@dataclass(frozen=True)
class PrefixGroup:
    """One prompt and its responses at ``start`` of the packed row: ``prompt_len`` tokens, then the
    responses back to back (``response_lens``, none empty). ``tile``: tokens per response tile.
    ``image_runs``: (start, end) offsets in the prompt of runs of image tokens that attend to themselves both
    ways (Gemma 3; :class:`RowMasks`); only the FlexAttention path and the dense masks take them."""

    start: int
    prompt_len: int
    response_lens: tuple[int, ...]
    tile: int = TILE
    image_runs: tuple[tuple[int, int], ...] = ()

    @property
    def length(self) -> int:
        return self.prompt_len + sum(self.response_lens)

    @cached_property
    def tiles(self) -> Tiles:
        """The responses cut into tiles (built once per forward, on the CPU, read by every layer)."""
        size = min(self.tile, max(self.response_lens))
        steps = torch.arange(size)
        index, valid = [], []
        later: dict[int, list[tuple[int, int]]] = {}  # j >= 1 -> (tile row, its response's offset) per tile
        offset = 0
        for r in self.response_lens:
            for j, a in enumerate(range(0, r, size)):
                n = min(size, r - a)
                if j:
                    later.setdefault(j, []).append((len(index), offset))
                index.append(offset + a + steps.clamp(max=n - 1))  # padding repeats the tile's last token
                valid.append(steps < n)
            offset += r
        bands = []
        for j, members in sorted(later.items()):
            rows, offsets = zip(*members, strict=True)
            bands.append((torch.tensor(rows), torch.tensor(offsets)[:, None] + torch.arange(j * size)[None, :]))
        return Tiles(torch.stack(index), torch.stack(valid), bands)


@dataclass(frozen=True)
class Tiles:
    """A group's response tokens (R of them, back to back) as n tiles of ``c`` tokens.

    index [n, c]: each tile's tokens among the R (a response's last tile is padded with its last token);
    valid [n, c]: False on padding; bands: for j = 1, 2, ... the tiles that are the j-th of their response
    (rows [n_j]) and the earlier tokens of that response they attend to besides the prompt (keys [n_j, j * c]).
    """

    index: torch.Tensor
    valid: torch.Tensor
    bands: list[tuple[torch.Tensor, torch.Tensor]]


def dense_mask(groups: list[PrefixGroup], length: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The same layout as a [L, L] bool mask (True: the query of the row may attend to the key of the
    column), for attention implementations that take a mask; made on ``device`` from [L] vectors built on the
    host (an [L, L] mask never crosses to the device)."""
    group_of = torch.full((length,), -1)
    branch = torch.zeros(length, dtype=torch.long)  # 0: prompt, i: response i
    for g_i, g in enumerate(groups):
        group_of[g.start : g.start + g.length] = g_i
        pos = g.start + g.prompt_len
        for i, r in enumerate(g.response_lens, 1):
            branch[pos : pos + r] = i
            pos += r
    group_of, branch = group_of.to(device), branch.to(device)
    order = torch.arange(length, device=device)
    return (
        (group_of[:, None] == group_of[None, :])
        & (order[None, :] <= order[:, None])
        & ((branch[None, :] == 0) | (branch[None, :] == branch[:, None]))
    )


@dataclass(frozen=True)
class RowMasks:
    """What a model's packed row needs beyond the causal layout of its sequences, built as dense ``[L, L]`` masks
    (:func:`layer_masks`) where the shared-prefix kernel cannot follow.

    image_token_id: a run of these tokens in a prompt (an image) attends to itself both ways (Gemma 3), or None;
    sliding_window: the local layers see keys at positions > the query's - window, or None;
    by_layer_type: the model takes ``{layer type: mask}`` (its config's ``layer_types``, full and sliding layers
    mixed), else one mask for every layer (every layer sliding, as Mistral's)."""

    image_token_id: int | None
    sliding_window: int | None
    by_layer_type: bool


def row_masks(text_config: object, image_token_id: int | None = None) -> RowMasks | None:
    """The :class:`RowMasks` of a model from its (text) config, or None when causal packing is all it needs.
    ``image_token_id``: the image token of a model whose images attend both ways."""
    types = list(getattr(text_config, "layer_types", None) or [])
    window = getattr(text_config, "sliding_window", None)
    if types and "sliding_attention" not in types:
        window = None  # a window in the config that no layer uses (Qwen2 without use_sliding_window)
    if image_token_id is None and window is None:
        return None
    return RowMasks(image_token_id, window, by_layer_type=bool(types))


def layer_masks(
    groups: list[PrefixGroup], length: int, positions: torch.Tensor, sliding_window: int | None
) -> dict[str, torch.Tensor]:
    """The attention masks [L, L] (True: query row may attend to key column) of a row laid out as ``groups``, by
    layer type, as transformers builds them for one sequence (``create_masks_for_vision_model``,
    ``create_sliding_window_causal_mask``), on ``positions``' device.

    positions [L]: each token's position in its sequence. Returns ``full_attention`` = the causal layout
    (:func:`dense_mask`) OR the same image run (``PrefixGroup.image_runs``: an image's tokens attend to each
    other both ways), and ``sliding_attention`` = that AND key position > query position - ``sliding_window``
    (None: no window).
    """
    device = positions.device
    full = dense_mask(groups, length, device)
    if any(g.image_runs for g in groups):
        block = torch.zeros(length, dtype=torch.long)  # 0: no image; k: the row's k-th image run
        runs = [(g.start + a, g.start + b) for g in groups for a, b in g.image_runs]
        for k, (a, b) in enumerate(runs, 1):
            block[a:b] = k
        block = block.to(device)
        full = full | ((block[:, None] == block[None, :]) & (block[:, None] > 0))
    masks = {"full_attention": full, "sliding_attention": full}
    if sliding_window is not None:
        masks["sliding_attention"] = full & (positions[None, :] > positions[:, None] - sliding_window)
    return masks


def longest_sequence(groups: list[PrefixGroup]) -> int:
    """The longest sequence (a prompt and one of its responses) of a row laid out as ``groups``."""
    return max((g.prompt_len + max(g.response_lens, default=0) for g in groups), default=0)


def shared_prefix_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, groups: list[PrefixGroup], scale: float
) -> torch.Tensor:
    """Attention of a packed row laid out as ``groups`` (which must cover the row, in order).

    query [1, H, L, D]; key, value [1, H_kv, L, D] with H a multiple of H_kv (grouped-query attention:
    query head h reads key head h // (H / H_kv)). Computes in float32; returns [1, H, L, D] in query's dtype.
    For the backward it keeps the inputs as given (bf16 under autocast) and each part's float32 output and
    log-sum-exp, nothing more: the float32 copies, the repeated key heads and the response tiles are made again
    (memory passes, cheap beside the attention itself).
    """
    _check_row(query, groups, "shared_prefix_attention")
    return _SharedPrefixAttention.apply(query, key, value, tuple(groups), scale)


def _check_row(query: torch.Tensor, groups: list[PrefixGroup], what: str) -> None:
    if query.shape[0] != 1:
        raise ValueError(f"{what} takes one packed row, got a batch of {query.shape[0]}")
    if sum(g.length for g in groups) != query.shape[2]:
        raise ValueError(f"prefix groups cover {sum(g.length for g in groups)} tokens, the row has {query.shape[2]}")


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _float_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """[H, L, D] float32 copies of the row's query, key and value, the key and value heads repeated to H."""
    # float32 inside: on CPU the flash kernels' backward is faster in float32 than in bf16 at these sizes
    # (7.8 vs 11.7 ms for 8 x 128 causal, 3.6 vs 4.8 ms for 694 x 122, 1.0 vs 1.8 ms for 122 causal,
    # forward + backward), and the output is rounded to the input dtype once
    repeat = query.shape[1] // key.shape[1]
    k, v = (x[0].float().repeat_interleave(repeat, 0) for x in (key, value))
    return query[0].float(), k, v


class _SharedPrefixAttention(torch.autograd.Function):
    """Each group: its prompt causal (one flash call), its responses over the prompt and their own tokens
    (:func:`_response_forward`); the backward runs the flash kernels' backward on the same parts."""

    @staticmethod
    def forward(ctx, query, key, value, groups, scale):
        q, k, v = _float_heads(query, key, value)
        parts, stats = [], []  # stats: per part its float32 output and log-sum-exp, as the flash backward takes them
        for g in groups:
            p, end = g.start + g.prompt_len, g.start + g.length
            out_p, lse_p = _flash(*(x[None, :, g.start : p] for x in (q, k, v)), 0.0, True, scale=scale)
            parts.append(out_p[0])
            stats += [out_p, lse_p]
            if g.response_lens:
                kp, vp, kr, vr = k[:, g.start : p], v[:, g.start : p], k[:, p:end], v[:, p:end]
                out_r, out_t, lse_t = _response_forward(q[:, p:end], kp, vp, kr, vr, g.tiles, scale)
                parts.append(out_r)
                stats += [out_t, lse_t]
        ctx.save_for_backward(query, key, value, *stats)
        ctx.groups, ctx.scale = groups, scale
        return torch.cat(parts, dim=1)[None].to(query.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, *stats = ctx.saved_tensors
        scale = ctx.scale
        q, k, v = _float_heads(query, key, value)
        grad = grad_out[0].float()
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        parts = iter(stats)
        for g in ctx.groups:
            p, end = g.start + g.prompt_len, g.start + g.length
            prompt = slice(g.start, p)
            out_p, lse_p = next(parts), next(parts)
            dq_p, dk_p, dv_p = _flash_backward(
                grad[None, :, prompt].contiguous(), q[None, :, prompt], k[None, :, prompt], v[None, :, prompt],
                out_p, lse_p, 0.0, True, scale=scale,
            )  # fmt: skip
            dq[:, prompt] += dq_p[0]
            dk[:, prompt] += dk_p[0]
            dv[:, prompt] += dv_p[0]
            if g.response_lens:
                out_t, lse_t = next(parts), next(parts)
                grads = _response_backward(
                    grad[:, p:end], q[:, p:end], k[:, prompt], v[:, prompt], k[:, p:end], v[:, p:end],
                    g.tiles, scale, out_t, lse_t,
                )  # fmt: skip
                dq[:, p:end] += grads[0]
                dk[:, prompt] += grads[1]
                dv[:, prompt] += grads[2]
                dk[:, p:end] += grads[3]
                dv[:, p:end] += grads[4]
        # a repeated key head's gradient is the sum over the query heads that read it
        kv_heads = key.shape[1]
        dk, dv = (x.view(kv_heads, -1, *x.shape[1:]).sum(1) for x in (dk, dv))
        return dq[None].to(query.dtype), dk[None].to(key.dtype), dv[None].to(value.dtype), None, None


def _response_forward(q_r, k_p, v_p, k_r, v_r, tiles, scale):
    """A group's response queries over three key blocks, merged by log-sum-exp: the prompt's keys (one call
    for all queries), their own tile's keys (causal, all tiles in one call) and the earlier tiles of their
    response (one call per band of tiles that are the j-th of their response, j >= 1).

    q_r, k_r, v_r [H, R, D] (float32): the group's response tokens back to back; k_p, v_p [H, P, D]: its
    prompt's; tiles: :attr:`PrefixGroup.tiles`. Returns (output [H, R, D], and for the backward the merged
    output [n, H, c, D] and log-sum-exp [n, H, c] of the n tiles of c rows).
    """
    out_p, lse_p = _flash(q_r[None], k_p[None], v_p[None], 0.0, False, scale=scale)  # [1, H, R, D], [1, H, R]
    q, k, v = (_tile(x, tiles.index) for x in (q_r, k_r, v_r))  # [n, H, c, D]
    out_d, lse_d = _flash(q, k, v, 0.0, True, scale=scale)  # [n, H, c, D], [n, H, c]
    parts = [(_tile(out_p[0], tiles.index), _tile(lse_p[0], tiles.index)), (out_d, lse_d)]
    if tiles.bands:
        out_e, lse_e = torch.zeros_like(out_d), torch.full_like(lse_d, -torch.inf)
        for rows, keys in tiles.bands:
            out_e[rows], lse_e[rows] = _flash(q[rows], _tile(k_r, keys), _tile(v_r, keys), 0.0, False, scale=scale)
        parts.append((out_e, lse_e))
    # padded rows are merged too: every row's normaliser stays finite for the backward
    lse = torch.logsumexp(torch.stack([part[1] for part in parts]), 0)
    out = sum(o * torch.exp(part_lse - lse)[..., None] for o, part_lse in parts)
    return _untile(out, tiles.valid), out, lse


def _response_backward(grad_out, q_r, k_p, v_p, k_r, v_r, tiles, scale, out, lse):
    """Gradients (dq_r, dk_p, dv_p, dk_r, dv_r) of :func:`_response_forward` for ``grad_out`` [H, R, D]; ``out``
    and ``lse``: what it returned for the backward."""
    q, k, v = (_tile(x, tiles.index) for x in (q_r, k_r, v_r))
    grad_out = grad_out.contiguous()
    out_r, lse_r = _untile(out, tiles.valid), _untile(lse, tiles.valid)
    dq_r, dk_p, dv_p = _flash_backward(
        grad_out[None], q_r[None], k_p[None], v_p[None], out_r[None], lse_r[None], 0.0, False, scale=scale
    )
    grad = _retile(grad_out, tiles.valid)  # zero on padding: padded rows add no gradient anywhere
    dq, dk, dv = _flash_backward(grad, q, k, v, out, lse, 0.0, True, scale=scale)
    dk_r, dv_r = _untile(dk, tiles.valid), _untile(dv, tiles.valid)
    for rows, keys in tiles.bands:
        dq_e, dk_e, dv_e = _flash_backward(
            grad[rows], q[rows], _tile(k_r, keys), _tile(v_r, keys), out[rows], lse[rows], 0.0, False, scale=scale
        )
        dq.index_add_(0, rows, dq_e)
        dk_r.index_add_(1, keys.flatten(), dk_e.transpose(0, 1).flatten(1, 2))
        dv_r.index_add_(1, keys.flatten(), dv_e.transpose(0, 1).flatten(1, 2))
    return dq_r[0] + _untile(dq, tiles.valid), dk_p[0], dv_p[0], dk_r, dv_r


def _tile(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[H, R, ...] -> [n, H, c, ...]: the tokens ``index`` [n, c] of each head."""
    return x[:, index].transpose(0, 1).contiguous()


def _untile(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[n, H, c, ...] -> [H, R, ...]: the valid rows, responses back to back."""
    return x.transpose(0, 1)[:, valid]


def _retile(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[H, R, D] -> [n, H, c, D] with zeros in the padded rows."""
    tiled = x.new_zeros(x.shape[0], *valid.shape, x.shape[-1])
    tiled[:, valid] = x
    return tiled.transpose(0, 1).contiguous()


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
    response for a response token, up to itself), as :func:`layer_masks` lays them out.

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
    attending to themselves both ways: :func:`layer_masks`' masks.

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
    :func:`shared_prefix_attention`). Returns [1, H, L, D] in query's dtype (the kernels accumulate in float32).
    The block mask comes from the cache of :func:`prefix_block_mask`. Compiled on CUDA (inside a model that
    is compiled as a whole, that compilation covers it); elsewhere eager FlexAttention, which computes the
    dense scores (and on CPU refuses inputs that require grad, in torch 2.13).
    """
    from torch.nn.attention.flex_attention import flex_attention

    _check_row(query, groups, "flex_prefix_attention")
    mask = _cached_block_mask(groups, query.shape[2], query.device, window)
    # in a model compiled as a whole, Dynamo traces the plain function into that graph
    compiled = query.device.type == "cuda" and not torch.compiler.is_compiling()
    attend = _compiled_flex_attention() if compiled else flex_attention
    return attend(query, key, value, block_mask=mask, scale=scale, enable_gqa=query.shape[1] != key.shape[1])


def uses_flex(device_type: str) -> bool:
    """Whether shared-prefix rows on this device type go to FlexAttention (every device but the CPU, which has
    :func:`shared_prefix_attention`). One place: the packed forward asks it too (FlexAttention lays out sliding
    windows and image runs; the CPU kernel takes neither)."""
    return device_type != "cpu"


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    prefix_groups: list[PrefixGroup] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query [B, H, L, D], key and value [B, H_kv, L, D] in,
    [B, L, H, D] out, no weights. Without ``prefix_groups`` it is transformers' SDPA attention; with them, a
    query on the CPU runs :func:`shared_prefix_attention`, on any other device :func:`flex_prefix_attention`
    (its block mask built by the first layer, cached for the others), which also takes the layer's sliding
    window and the groups' both-ways image runs."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if prefix_groups is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    device = query.device.type
    flex = uses_flex(device)
    unsupported = {k: kwargs[k] for k in ("softcap", "s_aux") if kwargs.get(k) is not None}
    window = kwargs.get("sliding_window")
    if not flex:  # the CPU kernel lays out causal rows: within the window a sliding layer is causal
        if window is not None and longest_sequence(prefix_groups) > window:
            unsupported["sliding_window"] = window
        if any(g.image_runs for g in prefix_groups):
            unsupported["image runs attending both ways"] = True
        window = None
    if unsupported:
        raise ValueError(
            f"shared-prefix attention does not implement {unsupported} of this model: set "
            "actor.share_prompt_prefix=false (or model.attn_implementation to one that does)"
        )
    if dropout:
        raise ValueError(
            f"shared-prefix attention has no attention dropout (got {dropout}): set the model's "
            "attention_dropout to 0 or actor.share_prompt_prefix=false"
        )
    autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if autocast else query.dtype
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = query.to(dtype), key.to(dtype), value.to(dtype)
    if flex:
        out = flex_prefix_attention(q, k, v, prefix_groups, scale, window)
    else:
        out = shared_prefix_attention(q, k, v, prefix_groups, scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make :data:`NAME` a transformers attention implementation (masks as SDPA's); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return NAME
