"""Attention for a packed row in which n responses share one copy of their prompt (CPU).

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

The model uses it through transformers' attention interface under the name :data:`NAME` (SDPA everywhere
else: masks, decoding, packed rows without groups); :class:`plugrl.actor.PolicyModel` passes the groups as the
``prefix_groups`` keyword of the model's forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F

NAME = "plugrl_sdpa"


# Response tokens are cut into tiles of this many tokens. CPU flash attention does not skip the masked half of a
# causal block, so one causal call over a whole response costs its full square; per tile, only the diagonal
# tiles pay that (see bench/attention.py for the measured choice)
TILE = 64


@dataclass(frozen=True)
class PrefixGroup:
    """One prompt and its responses at ``start`` of the packed row: ``prompt_len`` tokens, then the
    responses back to back (``response_lens``, none empty). ``tile``: tokens per response tile."""

    start: int
    prompt_len: int
    response_lens: tuple[int, ...]
    tile: int = TILE

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


def dense_mask(groups: list[PrefixGroup], length: int) -> torch.Tensor:
    """The same layout as a [L, L] bool mask (True: the query of the row may attend to the key of the
    column), for attention implementations that take a mask."""
    group_of = torch.full((length,), -1)
    branch = torch.zeros(length, dtype=torch.long)  # 0: prompt, i: response i
    for g_i, g in enumerate(groups):
        group_of[g.start : g.start + g.length] = g_i
        pos = g.start + g.prompt_len
        for i, r in enumerate(g.response_lens, 1):
            branch[pos : pos + r] = i
            pos += r
    order = torch.arange(length)
    return (
        (group_of[:, None] == group_of[None, :])
        & (order[None, :] <= order[:, None])
        & ((branch[None, :] == 0) | (branch[None, :] == branch[:, None]))
    )


def shared_prefix_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, groups: list[PrefixGroup], scale: float
) -> torch.Tensor:
    """Attention of a packed row laid out as ``groups`` (which must cover the row, in order).

    query [1, H, L, D]; key, value [1, H_kv, L, D] with H a multiple of H_kv (grouped-query attention:
    query head h reads key head h // (H / H_kv)). Computes in float32; returns [1, H, L, D] in query's dtype.
    """
    if query.shape[0] != 1:
        raise ValueError(f"shared_prefix_attention takes one packed row, got a batch of {query.shape[0]}")
    if sum(g.length for g in groups) != query.shape[2]:
        raise ValueError(f"prefix groups cover {sum(g.length for g in groups)} tokens, the row has {query.shape[2]}")
    repeat = query.shape[1] // key.shape[1]
    # float32 inside: on CPU the flash kernels' backward is faster in float32 than in bf16 at these sizes
    # (7.8 vs 11.7 ms for 8 x 128 causal, 3.6 vs 4.8 ms for 694 x 122, 1.0 vs 1.8 ms for 122 causal,
    # forward + backward), and the output is rounded to the input dtype once
    q = query[0].float()
    k, v = (x[0].float().repeat_interleave(repeat, 0) for x in (key, value))
    parts = []
    for g in groups:
        p, end = g.start + g.prompt_len, g.start + g.length
        kp, vp = k[:, g.start : p], v[:, g.start : p]
        parts.append(F.scaled_dot_product_attention(q[None, :, g.start : p], kp[None], vp[None], is_causal=True)[0])
        if g.response_lens:
            parts.append(_ResponseAttention.apply(q[:, p:end], kp, vp, k[:, p:end], v[:, p:end], g.tiles, scale))
    return torch.cat(parts, dim=1)[None].to(query.dtype)


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _ResponseAttention(torch.autograd.Function):
    """A group's response queries over three key blocks, merged by log-sum-exp: the prompt's keys (one call
    for all queries), their own tile's keys (causal, all tiles in one call) and the earlier tiles of their
    response (one call per band of tiles that are the j-th of their response, j >= 1).

    q_r, k_r, v_r [H, R, D] (float32): the group's response tokens back to back; k_p, v_p [H, P, D]: its
    prompt's; tiles: :attr:`PrefixGroup.tiles`. Returns [H, R, D].
    """

    @staticmethod
    def forward(ctx, q_r, k_p, v_p, k_r, v_r, tiles, scale):
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
        ctx.save_for_backward(q_r, k_p, v_p, k_r, v_r, q, k, v, out, lse)
        ctx.tiles, ctx.scale = tiles, scale
        return _untile(out, tiles.valid)

    @staticmethod
    def backward(ctx, grad_out):
        q_r, k_p, v_p, k_r, v_r, q, k, v, out, lse = ctx.saved_tensors
        tiles, scale = ctx.tiles, ctx.scale
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
        return dq_r[0] + _untile(dq, tiles.valid), dk_p[0], dv_p[0], dk_r, dv_r, None, None


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
    """transformers' attention-function contract: [B, L, H, D] out, no weights. Without ``prefix_groups``
    it is transformers' SDPA attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if prefix_groups is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    unsupported = {k: kwargs[k] for k in ("softcap", "s_aux") if kwargs.get(k) is not None}
    window = kwargs.get("sliding_window")
    if window is not None and window < query.shape[2]:
        unsupported["sliding_window"] = window
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
    dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else query.dtype
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = shared_prefix_attention(query.to(dtype), key.to(dtype), value.to(dtype), prefix_groups, scale)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make :data:`NAME` a transformers attention implementation (masks as SDPA's); returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return NAME
