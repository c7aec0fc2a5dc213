"""Helpers shared by the estimators: token broadcasting and the metrics every estimator logs."""

from __future__ import annotations

import torch

from plugrl.algorithms import group_mean_std, masked_mean


def outcome_to_tokens(seq_values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast one value per sequence over its response tokens.

    ``seq_values`` [B], ``response_mask`` [B, T] -> [B, T] float32: ``seq_values[:, None] * mask``,
    so padding gets 0.
    """
    return seq_values.float().unsqueeze(-1) * response_mask.float()


def advantage_metrics(advantages: torch.Tensor, response_mask: torch.Tensor) -> dict[str, float]:
    """``adv/mean``, ``adv/max``, ``adv/min`` over response tokens (0 when there are none)."""
    with torch.no_grad():
        valid = response_mask.bool()
        if not bool(valid.any()):
            return {"adv/mean": 0.0, "adv/max": 0.0, "adv/min": 0.0}
        picked = advantages.float()[valid]
        return {
            "adv/mean": masked_mean(advantages, response_mask).item(),
            "adv/max": picked.max().item(),
            "adv/min": picked.min().item(),
        }


def zero_std_group_frac(scores: torch.Tensor, group_ids: torch.Tensor) -> float:
    """Fraction of groups of two or more samples whose scores all agree (no group-relative signal).

    Single-sample groups are counted in the denominator but never as agreeing (GRPO gives
    them std 1, not 0). An empty batch gives 0.0.
    """
    with torch.no_grad():
        ids = torch.as_tensor(group_ids)
        if ids.numel() == 0:
            return 0.0
        _, std, size = group_mean_std(scores, ids)
        flat = (std == 0) & (size > 1)
        return torch.unique(ids[flat]).numel() / torch.unique(ids).numel()
