"""FSDP2 for a model too large for one rank: build it without weights, shard it, fill its shards from rank 0.

Every rank builds the architecture inside :func:`parameters_on_meta` (no memory), :func:`shard_model` shards it
with FSDP2 over the mesh's "dp" ranks, and :func:`load_full_weights` fills each rank's shards from the full state
dict that rank 0 alone read, broadcast tensor by tensor. The policy, its reference and the critic load so
(:mod:`plugrl.actor`), and so may a plugin's frozen model (a sharded reward model).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any

import torch

from plugrl import parallel
from plugrl.models import is_vision_model

log = logging.getLogger(__name__)


@contextmanager
def parameters_on_meta():
    """Modules built inside get their parameters on the meta device, their buffers as usual (on the host)."""
    register = torch.nn.Module.register_parameter

    def register_on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":  # one already there is shared (tied): keep it
            kind = type(module._parameters[name])
            module._parameters[name] = kind(module._parameters[name].to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def load_full_weights(model, full_state: dict[str, torch.Tensor], device: torch.device, offload: bool) -> None:
    """Fill a sharded model built on the meta device (:func:`parameters_on_meta`) from rank 0's full state dict.

    Rank 0 passes the whole checkpoint (host tensors), every other rank ``{}``: each tensor is broadcast from rank
    0 and every rank keeps its own shard, so no GPU holds more than its shard. Parameters are materialised on
    ``device`` (on the host with CPU offload); buffers, which state dicts leave out when they are not persistent
    (rotary frequencies), keep the values they were built with and move to ``device``.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    buffers = [(module, name, b) for module in model.modules() for name, b in module._buffers.items() if b is not None]
    shards = torch.device("cpu") if offload else device
    model.to_empty(device=shards)
    # the buffers beside the shards while loading: set_model_state_dict refuses a model on two devices
    for module, name, b in buffers:
        module._buffers[name] = b.to(shards)
    set_model_state_dict(
        model, full_state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True)
    )
    for module, name, _ in buffers:  # where the forward computes (with CPU offload only the shards stay home)
        module._buffers[name] = module._buffers[name].to(device)


def decoder_layers(model) -> Any:
    """The language model's decoder layers: ``model.model.layers``, or in a vision-language model those of its
    text model (``model.model.text_model`` in Idefics3/SmolVLM, ``model.model.language_model`` in LLaVA and
    Qwen-VL). FSDP2 shards each; the vision encoder and connector sit in the root unit with the embeddings."""
    inner = getattr(model, "model", model)
    if getattr(inner, "layers", None) is not None:
        return inner.layers
    if is_vision_model(model.config):
        from plugrl.vlm import vision_support

        return vision_support().language_model(model).layers
    raise ValueError(
        f"{type(model).__name__} has no .model.layers (nor a text model's); plugrl shards decoder-only HF models "
        "and vision-language models built on one"
    )


def shard_model(
    model,
    device: torch.device,
    reshard_after_forward: bool = True,
    offload: bool = False,
    tp_size: int = 1,
    *,
    bf16: bool = False,
) -> bool:
    """Tensor parallelism over the mesh's "tp" dimension (when ``tp_size`` > 1: :func:`plugrl.parallel.kit`), then
    FSDP2 over its "dp" dimension: shard every decoder layer, then the root (embeddings, norm, head).

    With ``bf16``, FSDP2's mixed precision: parameters all-gathered and computed in bf16 (half fp32's all-gather
    traffic, no bf16 copies saved for backward as autocast keeps them), gradients reduced in fp32 into the fp32
    master shards. Returns whether FSDP2 sharded the model (tensor parallelism alone: neither mixed precision nor
    offload applies).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mesh = parallel.device_mesh(device.type, tp_size)
    if tp_size > 1:
        parallel.kit(tp_size).parallelize(model, mesh["tp"])
        if mesh["dp"].size() == 1:  # tensor parallelism alone: nothing to shard over
            if offload:
                log.warning("fsdp_config offload is ignored when all ranks form one tensor-parallel group")
            return False
    kwargs = {"mesh": mesh["dp"], "reshard_after_forward": reshard_after_forward}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        # pinned host memory needs an accelerator; on a CPU-only machine the "device" is the host already
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    layers = decoder_layers(model)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return True
