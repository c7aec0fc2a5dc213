"""plugrl-attention: attention for packed rows in which n responses share one copy of their prompt, without the dense
``[L, L]`` mask (the kernel's fallback, :func:`plugrl.attention.dense_mask`).

The kernel finds this module through the entry-point group ``plugrl.attention``
(:func:`plugrl.attention.prefix_kernels`) and calls :func:`register` and :func:`uses_flex`. The model then runs it
through transformers' attention interface under the name :data:`NAME` (SDPA everywhere else: masks, decoding,
packed rows without groups); :class:`plugrl.actor.PolicyModel` passes the groups as the ``prefix_groups`` keyword of
the model's forward, on every device: :func:`attention_forward` picks the kernel by the query's device, the tiled
flash-attention kernel on the CPU (:mod:`plugrl_attention.tiled`), FlexAttention elsewhere
(:mod:`plugrl_attention.flex`).
"""

from __future__ import annotations

import torch

from plugrl.attention import PrefixGroup, longest_sequence
from plugrl_attention.flex import FLEX_BLOCK, flex_prefix_attention, prefix_block_mask
from plugrl_attention.tiled import Tiles, response_tiles, shared_prefix_attention

__all__ = [
    "FLEX_BLOCK",
    "NAME",
    "Tiles",
    "attention_forward",
    "flex_prefix_attention",
    "prefix_block_mask",
    "register",
    "response_tiles",
    "shared_prefix_attention",
    "uses_flex",
]

NAME = "plugrl_sdpa"


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
