"""Rollout engines: generate n samples per prompt, take new policy weights in memory.

Both engines have one small interface (:class:`RolloutEngine`); the trainer never
knows which one it drives.
"""

from __future__ import annotations

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


def make_engine(name: str, **kwargs) -> RolloutEngine:
    """Build the rollout engine called ``name`` ("vllm" or "hf")."""
    if name == "vllm":
        from plugrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(**kwargs)
    if name == "hf":
        from plugrl.rollout.hf_engine import HFEngine

        return HFEngine(**kwargs)
    raise ValueError(f"rollout.name {name!r} is not an engine; use 'vllm' or 'hf'")
