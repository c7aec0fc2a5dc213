"""Attention for a packed row in which n responses share one copy of their prompt (CPU).

A group sits in the row as ``[prompt, response 1, ..., response k]``. Prompt tokens attend causally within
the prompt; a token of response i attends to the whole prompt and causally within response i. As one dense
``[L, L]`` mask this makes SDPA's CPU kernel visit every tile: its cost grows with ``L**2`` although for 8
responses of ~100 tokens 80% of the mask is empty. Here the response queries run two flash-attention calls,
one over the prompt's keys (a dense block) and one over their own keys (causal, the responses padded into a
batch), and the two partial results are merged by their log-sum-exps; the cost grows with
``sum_i r_i * (p + r_i)``. The backward runs the same two kernels with the merged output and log-sum-exp, which
gives each key block its exact share of the gradient (the flash-attention backward only needs the final
softmax normaliser). Measured in docs/performance.md: 48 -> 25 ms per layer forward + backward for a 122-token
prompt with 8 responses of 90-128 tokens.

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


@dataclass(frozen=True)
class PrefixGroup:
    """One prompt and its responses at ``start`` of the packed row: ``prompt_len`` tokens, then the
    responses back to back (``response_lens``, none empty)."""

    start: int
    prompt_len: int
    response_lens: tuple[int, ...]

    @property
    def length(self) -> int:
        return self.prompt_len + sum(self.response_lens)

    @cached_property
    def padding(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(index [k, r_max] of each response's tokens among the group's response tokens, 0 where padded;
        valid [k, r_max] bool), on the CPU. Built once per forward, read by every layer."""
        r_max = max(self.response_lens)
        index = torch.zeros(len(self.response_lens), r_max, dtype=torch.long)
        offset = 0
        for i, r in enumerate(self.response_lens):
            index[i, :r] = torch.arange(offset, offset + r)
            offset += r
        valid = torch.arange(r_max)[None, :] < torch.tensor(self.response_lens)[:, None]
        return index, valid


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
            index, valid = g.padding
            parts.append(_ResponseAttention.apply(q[:, p:end], kp, vp, k[:, p:end], v[:, p:end], index, valid, scale))
    return torch.cat(parts, dim=1)[None].to(query.dtype)


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _ResponseAttention(torch.autograd.Function):
    """Responses' queries over [prompt keys] + [their own keys, causal], merged by log-sum-exp.

    q_r, k_r, v_r [H, R, D] (float32): the group's response tokens back to back; k_p, v_p [H, P, D]: its prompt's;
    index, valid [k, r_max]: :meth:`PrefixGroup.padding`. Returns [H, R, D].
    """

    @staticmethod
    def forward(ctx, q_r, k_p, v_p, k_r, v_r, index, valid, scale):
        out_p, lse_p = _flash(q_r[None], k_p[None], v_p[None], 0.0, False, scale=scale)  # [1, H, R, D], [1, H, R]
        q_pad, k_pad, v_pad = (_pad_rows(x, index) for x in (q_r, k_r, v_r))  # [k, H, r_max, D]
        out_s, lse_s = _flash(q_pad, k_pad, v_pad, 0.0, True, scale=scale)
        out_s, lse_self = _unpad_rows(out_s, valid), _unpad_rows(lse_s, valid)  # [H, R, D], [H, R]
        lse = torch.logaddexp(lse_p[0], lse_self)
        out = out_p[0] * torch.exp(lse_p[0] - lse)[..., None] + out_s * torch.exp(lse_self - lse)[..., None]
        # padded rows keep their own normaliser: the backward's softmax there stays finite (and gets no gradient)
        lse_pad = lse_s.clone()
        lse_pad.transpose(0, 1)[:, valid] = lse
        ctx.save_for_backward(q_r, k_p, v_p, q_pad, k_pad, v_pad, out, lse, lse_pad, valid)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q_r, k_p, v_p, q_pad, k_pad, v_pad, out, lse, lse_pad, valid = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq_p, dk_p, dv_p = _flash_backward(
            grad_out[None], q_r[None], k_p[None], v_p[None], out[None], lse[None], 0.0, False, scale=ctx.scale
        )
        dq_s, dk_s, dv_s = _flash_backward(
            _repad(grad_out, valid), q_pad, k_pad, v_pad, _repad(out, valid), lse_pad, 0.0, True, scale=ctx.scale
        )
        dq = dq_p[0] + _unpad_rows(dq_s, valid)
        return dq, dk_p[0], dv_p[0], _unpad_rows(dk_s, valid), _unpad_rows(dv_s, valid), None, None, None


def _pad_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[H, R, D] -> [k, H, r_max, D] (padded rows repeat token 0: finite, and masked out or discarded)."""
    return x[:, index].transpose(0, 1).contiguous()


def _unpad_rows(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[k, H, r_max, ...] -> [H, R, ...]: the valid rows, responses back to back."""
    return x.transpose(0, 1)[:, valid]


def _repad(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """[H, R, D] -> [k, H, r_max, D] with zeros in the padded rows."""
    padded = x.new_zeros(x.shape[0], *valid.shape, x.shape[-1])
    padded[:, valid] = x
    return padded.transpose(0, 1).contiguous()


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
