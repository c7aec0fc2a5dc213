"""The policy's adapter in vLLM (``rollout.lora_sync=adapter``): what runs in each of the engine's workers, and the
request every generation then passes. The kernel's engine (:meth:`plugrl.rollout.vllm_engine.VLLMEngine.load_adapter`)
calls :func:`load_adapter` through :mod:`plugrl.model_adapters`; vLLM is imported only when these run."""

from __future__ import annotations

from typing import Any

import torch

POLICY_ADAPTER = "plugrl-policy"  # the name and id under which the policy's adapter is served
POLICY_ADAPTER_ID = 1


def adapter_name_mapping(model) -> dict:
    """How vLLM's own adapter loader renames a PEFT adapter's modules for ``model`` (vLLM's model object): its
    ``hf_to_vllm_mapper`` reduced to the renames (0.29+ ``get_rename_mapper``, 0.25-0.28 ``get_unstacked_mapper``,
    as it is before), and the prefixes it skips (``lora_skip_prefixes``): a vision-language model's language layers
    live under another prefix in vLLM than in transformers (Qwen2-VL's ``model.`` -> ``language_model.model.``), and
    an adapter built without the mapping names modules vLLM does not have."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    for reduce in ("get_rename_mapper", "get_unstacked_mapper"):
        if mapper is not None and hasattr(mapper, reduce):
            mapper = getattr(mapper, reduce)()
            break
    return {"weights_mapper": mapper, "skip_prefixes": getattr(model, "lora_skip_prefixes", None)}


def add_policy_adapter(worker, tensors: dict[str, torch.Tensor], peft_config: dict) -> list[str]:
    """Run in each vLLM worker (``collective_rpc``): the policy's adapter, built from host tensors, replaces the
    one served under :data:`POLICY_ADAPTER_ID`. Returns the adapted module names (``q_proj``, ...) vLLM's model
    cannot serve adapters on (then nothing is replaced)."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    models = manager._adapter_manager
    # the module names vLLM adapts, before it packs them (q, k, v into qkv_proj), as its own loader lists them
    servable = set()
    for module in models.supported_lora_modules:
        servable.update(models.packed_modules_mapping.get(module, [module]))
    adapted = {k.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for k in tensors}
    if adapted - servable:
        return sorted(adapted - servable)
    helper = PEFTHelper.from_dict(peft_config)
    helper.validate_legal(manager.lora_config)
    adapter = LoRAModel.from_lora_tensors(
        POLICY_ADAPTER_ID,
        tensors,
        helper,
        device="cpu",  # as vLLM's own loader: activating the adapter copies it into the device's slots
        dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size,
        **adapter_name_mapping(models.model),
    )
    models.remove_adapter(POLICY_ADAPTER_ID)  # vLLM's own in-place reload does the same
    models.add_adapter(adapter)
    return []


def load_adapter(llm: Any, tensors: dict[str, torch.Tensor], peft_config: dict) -> Any:
    """vLLM's ``llm`` serves the policy's adapter (``tensors``: {PEFT name: full tensor on the host}; ``peft_config``:
    its ``adapter_config.json`` as a dict) from now on: each worker builds it in memory (:func:`add_policy_adapter`,
    a collective over the engine's workers). Returns the ``lora_request`` every generation then passes. A
    RuntimeError naming the modules vLLM cannot serve adapters on (nothing is replaced then)."""
    refused = llm.collective_rpc(add_policy_adapter, args=(tensors, peft_config))
    llm.reset_prefix_cache()  # the cache is keyed by adapter id, and the id's weights changed
    if any(refused):
        raise RuntimeError(
            f"vLLM cannot serve LoRA adapters on {sorted({m for r in refused for m in r})} of this model (of "
            f"actor.lora.target_modules={peft_config.get('target_modules')}). Set rollout.lora_sync=merged "
            "(merged weights serve any adapted layer), or leave those modules out of actor.lora.target_modules"
        )
    return policy_request()


def policy_request() -> Any:
    """The ``lora_request`` of a generation with the adapter :func:`add_policy_adapter` serves (the adapter is in
    the workers' memory, no file: vLLM looks it up by id)."""
    from vllm.lora.request import LoRARequest

    return LoRARequest(POLICY_ADAPTER, POLICY_ADAPTER_ID, lora_path="in-memory")
