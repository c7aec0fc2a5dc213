"""The CPU kernel: attention of a packed row in which n responses share one copy of their prompt, in flash-attention
calls over the non-empty blocks of its layout.

A group sits in the row as ``[prompt, response 1, ..., response k]`` (:class:`plugrl.attention.PrefixGroup`).
Prompt tokens attend causally within the prompt; a token of response i attends to the whole prompt and causally
within response i. As one dense ``[L, L]`` mask this makes SDPA's CPU kernel visit every tile: its cost grows with
``L**2`` although for 8 responses of ~100 tokens 80% of the mask is empty. Here the response queries attend to three
key blocks, each a flash-attention call, and the partial results are merged by their log-sum-exps:

- the prompt's keys (all of the group's response queries in one call);
- their own tile's keys, causal: responses are cut into tiles of ``PrefixGroup.tile`` tokens, all tiles in one batch;
- the earlier tiles of their response (one call per band: the tiles that are the j-th of their response).

CPU flash attention computes a causal block's masked half as well, so without tiles a 512-token response cost its
full square; with them only the diagonal tiles do. The backward runs the same calls with the merged output and
log-sum-exp, which gives each key block its exact share of the gradient (the flash-attention backward only needs
the final softmax normaliser). Measured by ``bench/attention.py`` (docs/performance.md): one layer forward +
backward, 122-token prompt and 8 responses of 80-512 tokens: dense-mask SDPA 305 ms, untiled 160-172 ms, tiles of
64 tokens 88-117 ms.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from plugrl.attention import PrefixGroup
from plugrl_attention.rows import check_row


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


# each group's tiles while the group lives (the packed row holds it through the forward and the autograd graph through
# the backward); equal groups share them
_tiles_of: weakref.WeakKeyDictionary[PrefixGroup, Tiles] = weakref.WeakKeyDictionary()


def response_tiles(group: PrefixGroup) -> Tiles:
    """``group``'s responses cut into tiles of ``group.tile`` tokens, built once (on the CPU) for every layer of a
    forward and the backward to read."""
    tiles = _tiles_of.get(group)
    if tiles is None:
        tiles = _tiles_of[group] = _cut(group.response_lens, group.tile)
    return tiles


def _cut(response_lens: tuple[int, ...], tile: int) -> Tiles:
    size = min(tile, max(response_lens))
    steps = torch.arange(size)
    index, valid = [], []
    later: dict[int, list[tuple[int, int]]] = {}  # j >= 1 -> (tile row, its response's offset) per tile
    offset = 0
    for r in response_lens:
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
    check_row(query, groups, "shared_prefix_attention")
    return _SharedPrefixAttention.apply(query, key, value, tuple(groups), scale)


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
                out_r, out_t, lse_t = _response_forward(q[:, p:end], kp, vp, kr, vr, response_tiles(g), scale)
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
                    response_tiles(g), scale, out_t, lse_t,
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
    prompt's; tiles: :func:`response_tiles`. Returns (output [H, R, D], and for the backward the merged
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
