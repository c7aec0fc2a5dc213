"""Rollouts: the engines that generate (``make_engine``: vLLM or HF, one small interface,
:class:`RolloutEngine`), and the episodes they play, single-turn or multi-turn with environments and tools.

Names are imported on first use: plugins and reward workers import :mod:`plugrl.rollout.tools` and
:mod:`plugrl.rollout.environment`, which must not pull in torch through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plugrl.rollout.types import (
        Rollout,
        RolloutEngine,
        SamplingSettings,
        first_stop,
        response_texts,
        sampling_settings,
    )

__all__ = [
    "Rollout",
    "RolloutEngine",
    "SamplingSettings",
    "first_stop",
    "make_engine",
    "response_texts",
    "sampling_settings",
]

_FROM_TYPES = {"Rollout", "RolloutEngine", "SamplingSettings", "first_stop", "response_texts", "sampling_settings"}


def __getattr__(name: str) -> Any:
    if name in _FROM_TYPES:
        from plugrl.rollout import types

        return getattr(types, name)
    raise AttributeError(f"module 'plugrl.rollout' has no attribute {name!r}")


def make_engine(name: str, **kwargs) -> RolloutEngine:
    """Build the rollout engine called ``name`` ("vllm" or "hf")."""
    if name == "vllm":
        from plugrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(**kwargs)
    if name == "hf":
        from plugrl.rollout.hf_engine import HFEngine

        return HFEngine(**kwargs)
    raise ValueError(f"rollout.name {name!r} is not an engine; use 'vllm' or 'hf'")
