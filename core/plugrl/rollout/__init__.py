"""Rollout engines: generate n samples per prompt, take new policy weights in memory.

Both engines have one small interface (:class:`RolloutEngine`); the trainer never
knows which one it drives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Rollout:
    """One generated response.

    response_ids include the EOS token when generation stopped on it.
    logprobs: the engine's sampling log-probability of each response token (raw
    model distribution), or None when the engine does not report them.
    finish_reason: "stop" (EOS or a stop string) or "length" (hit max tokens).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str


@dataclass(frozen=True)
class SamplingSettings:
    n: int
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    seed: int | None = None  # per call; engines that cannot seed ignore it


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Rollout]]:
        """``sampling.n`` rollouts for each prompt (token ids), in prompt order."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the policy's (HF parameter names), in memory."""

    def sleep(self) -> None:
        """Free generation memory while training (a no-op where it frees nothing)."""

    def wake_up(self) -> None:
        """Undo :meth:`sleep` before the next generation."""

    def close(self) -> None: ...


def make_engine(name: str, **kwargs) -> RolloutEngine:
    """Build the rollout engine called ``name`` ("vllm" or "hf")."""
    if name == "vllm":
        from plugrl.rollout.vllm_engine import VLLMEngine

        return VLLMEngine(**kwargs)
    if name == "hf":
        from plugrl.rollout.hf_engine import HFEngine

        return HFEngine(**kwargs)
    raise ValueError(f"rollout.name {name!r} is not an engine; use 'vllm' or 'hf'")
