"""What both kernels check of a packed row before attending: one row, covered by its layout."""

from __future__ import annotations

import torch

from plugrl.attention import PrefixGroup


def check_row(query: torch.Tensor, groups: list[PrefixGroup], what: str) -> None:
    """A ValueError naming ``what`` unless ``query`` [1, H, L, D] is one row whose L tokens ``groups`` cover."""
    if query.shape[0] != 1:
        raise ValueError(f"{what} takes one packed row, got a batch of {query.shape[0]}")
    if sum(g.length for g in groups) != query.shape[2]:
        raise ValueError(f"prefix groups cover {sum(g.length for g in groups)} tokens, the row has {query.shape[2]}")
