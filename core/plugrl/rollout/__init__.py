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


def make_engine(name: str, engines: dict[str, Any] | None = None, **kwargs) -> RolloutEngine:
    """Build the rollout engine called ``name`` (``rollout.name``) from the registered ones (``registry.engines``:
    the kernel's ``vllm`` and ``hf``, and the plugins'; None: the kernel's alone); the keywords:
    :class:`plugrl.specs.EngineSpec`."""
    if engines is None:
        from plugrl.rollout import engines as kernel
        from plugrl.specs import specs_of

        engines = {s.name: s for fn in (kernel.vllm_engine, kernel.hf_engine) for s in specs_of(fn)}
    spec = engines.get(name)
    if spec is None:  # check_engine reports this at start; here for callers that skip it
        raise ValueError(f"rollout.name {name!r} is not a registered engine ({', '.join(sorted(engines))})")
    return spec.factory(**kwargs)
