"""The layout of a packed row in which n responses share one copy of their prompt, and the seam to the package
whose kernels attend to it without a dense mask.

A group sits in the row as ``[prompt, response 1, ..., response k]`` (:class:`PrefixGroup`). Prompt tokens attend
causally within the prompt; a token of response i attends to the whole prompt and causally within response i. The
kernel lays that out as dense ``[L, L]`` masks (:func:`dense_mask`, :func:`layer_masks`), which any attention
implementation that takes a mask follows. As one dense mask it makes SDPA visit every tile although most are empty
(80% for 8 responses of ~100 tokens), and holds ``L**2`` booleans (256 MB for a 16k-token row): plugrl-attention's
kernels skip the empty tiles (a tiled flash-attention kernel on the CPU, FlexAttention elsewhere). The kernel finds
them through the entry-point group ``plugrl.attention`` (:func:`prefix_kernels`); without the package packed rows
take the dense mask, which is said once.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Protocol

import torch

from plugrl.plugin_errors import implementation, package_hint

log = logging.getLogger(__name__)

GROUP = "plugrl.attention"
PACKAGE = "plugrl-attention"

# Response tokens are cut into tiles of this many tokens by plugrl-attention's CPU kernel, which does not skip the
# masked half of a causal block: per tile, only the diagonal tiles pay that (see bench/attention.py for the
# measured choice)
TILE = 64


class PrefixKernels(Protocol):
    """The entry point of group ``plugrl.attention`` (plugrl-attention's module ``plugrl_attention``)."""

    def register(self) -> str:
        """Make the kernels a transformers attention implementation (SDPA for rows without prefix groups, masks as
        SDPA's); returns its name. The model's forward then takes the row's groups as ``prefix_groups``."""

    def uses_flex(self, device_type: str) -> bool:
        """Whether shared-prefix rows on this device type go to FlexAttention, which lays out sliding windows and
        image runs itself (the CPU kernel lays out causal rows: a row that needs more takes dense masks)."""


class _NotInstalled(LookupError):
    """No installed package implements the group (caught: the kernel then takes the dense mask)."""


@functools.cache
def prefix_kernels() -> PrefixKernels | None:
    """The installed kernels (the entry point of group ``plugrl.attention``: plugrl-attention), loaded once per
    process; None, said once, when none is installed: packed rows then use the dense mask."""
    try:
        return implementation(GROUP, _NotInstalled())
    except _NotInstalled:
        log.warning(
            "shared-prefix attention kernels are in the package %s, which is not installed: packed rows use a dense "
            "mask (slower, and L x L memory per row); %s",
            PACKAGE,
            package_hint(PACKAGE),
        )
        return None


@dataclass(frozen=True)
class PrefixGroup:
    """One prompt and its responses at ``start`` of the packed row: ``prompt_len`` tokens, then the
    responses back to back (``response_lens``, none empty). ``tile``: tokens per response tile (the CPU kernel's).
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
