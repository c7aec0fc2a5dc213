"""The kernel's own rollout engines, registered like any plugin's (``@plugrl.rollout_engine``, plugin ``plugrl``):
``vllm`` (vLLM in the training process) and ``hf`` (transformers' generate). Each is imported when a run builds it,
so a run that never generates with vLLM never imports it."""

from __future__ import annotations

from typing import Any

from plugrl.specs import rollout_engine


@rollout_engine("vllm")
def vllm_engine(**kwargs: Any) -> Any:
    """vLLM in this process (:class:`plugrl.rollout.vllm_engine.VLLMEngine`): sleeps while the policy trains on a
    GPU, takes the new weights in memory after each update."""
    from plugrl.rollout.vllm_engine import VLLMEngine

    return VLLMEngine(**kwargs)


@rollout_engine("hf")
def hf_engine(**kwargs: Any) -> Any:
    """transformers' ``generate`` (:class:`plugrl.rollout.hf_engine.HFEngine`): no vLLM needed."""
    from plugrl.rollout.hf_engine import HFEngine

    return HFEngine(**kwargs)
