"""The trained model split over a tensor-parallel group: the model's own transformers plan
(``config.base_model_tp_plan``: ``colwise`` q/k/v/gate/up, ``rowwise`` o/down, Qwen3's per-head ``q_norm``/``k_norm``
as ``replicated_with_grad_allreduce``) translated to torch DTensor styles.

The attention modules reshape the projections with ``-1`` heads, so each rank runs its own ``heads / tp`` query and
``kv_heads / tp`` key/value heads unchanged. The input embedding and the LM head are vocabulary-sharded (a tied pair
stays tied); the head's output stays sharded, [N, V / tp] on each rank, for :mod:`plugrl_tensor_parallel.vocab`.
Every other parameter (the norms, a critic's value head) is a replicated DTensor used as a local tensor in its
module's forward, so all parameters are DTensors on one mesh (one optimizer and gradient-clipping path for all).
"""

from __future__ import annotations

import fnmatch
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from plugrl.config import ConfigError
from plugrl.models import is_vision_model

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

# transformers' style names -> what they mean here; the LM head is vocabulary-parallel whatever its style says
_COLWISE = {"colwise"}
_ROWWISE = {"rowwise"}
_GRAD_ALLREDUCE = {"replicated_with_grad_allreduce"}
_EMBEDDING = {"embedding_rowwise"}  # the input embedding is vocabulary-sharded below, whatever the plan says


def check_model(config, tp_size: int) -> None:
    """Raise a ConfigError naming ``actor.tp_size`` when the model cannot be split ``tp_size`` ways."""
    if tp_size == 1:
        return
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if not getattr(config, "base_model_tp_plan", None):
        raise ConfigError(
            f"actor.tp_size={tp_size}: transformers has no tensor-parallel plan for {config.model_type!r} "
            "(config.base_model_tp_plan); use actor.tp_size=1 (FSDP only) for this model"
        )
    for key in ("num_attention_heads", "num_key_value_heads", "vocab_size", "intermediate_size"):
        value = getattr(config, key, None)
        if value is not None and value % tp_size:
            raise ConfigError(
                f"actor.tp_size={tp_size} must divide the model's {key} ({value}); pick a tp_size that divides it"
            )


def parallelize(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Apply tensor parallelism over the 1-D mesh ``tp_mesh`` to a transformers causal LM (or a
    token-classification model on the same trunk), in place."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    check_model(config, tp_mesh.size())
    # the plan's names are relative to the decoder's model: "model", or a vision-language model's language model
    # (its vision encoder and connector stay whole: replicated below)
    if is_vision_model(model.config):
        from plugrl.vlm import vision_support

        base = vision_support().language_model(model)
    else:
        base = getattr(model, model.base_model_prefix, model)
    base_prefix = next(n for n, m in model.named_modules() if m is base) if base is not model else ""
    plan: dict[str, object] = {}  # module name -> torch ParallelStyle
    grad_allreduce: set[str] = set()
    names = [n for n, _ in base.named_modules() if n]
    for pattern, style in config.base_model_tp_plan.items():
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if style in _COLWISE:
            plan.update({n: ColwiseParallel() for n in matched})
        elif style in _ROWWISE:
            plan.update({n: RowwiseParallel() for n in matched})
        elif style in _GRAD_ALLREDUCE:
            grad_allreduce.update(matched)
        elif style in _EMBEDDING:
            continue
        else:
            raise ConfigError(
                f"actor.tp_size={tp_mesh.size()}: tensor-parallel style {style!r} of {pattern!r} "
                f"({config.model_type}) is not supported by plugrl; use actor.tp_size=1"
            )
    full = {f"{base_prefix}.{n}" if base_prefix else n: s for n, s in plan.items()}
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    modules = {m: n for n, m in model.named_modules()}
    # vocabulary rows: the lookup's partial sums are all-reduced; the head's logits stay sharded
    full[modules[embed]] = RowwiseParallel(input_layouts=Replicate())
    if head is not None:
        full[modules[head]] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=True)
    parallelize_module(model, tp_mesh, full)
    if tied:  # both were sharded on dim 0 (the vocabulary): share the one DTensor again
        head.weight = embed.weight
    group = tp_mesh.get_group()
    allreduce_modules = {base.get_submodule(n) for n in grad_allreduce}
    for module in model.modules():
        local = [n for n, p in module.named_parameters(recurse=False) if not isinstance(p, DTensor)]
        if local:
            _replicate(module, local, tp_mesh, group if module in allreduce_modules else None)
    return model


def _replicate(module: nn.Module, names: list[str], mesh: DeviceMesh, grad_group: ProcessGroup | None) -> None:
    """Make ``module``'s parameters ``names`` replicated DTensors, used as local tensors in its forward; with
    ``grad_group`` their gradients are summed over it (a per-head norm sees only this rank's heads)."""
    from torch.distributed.tensor import DTensor, Replicate

    for n in names:
        p = module._parameters[n]
        module._parameters[n] = nn.Parameter(
            DTensor.from_local(p.data, mesh, [Replicate()], run_check=False), requires_grad=p.requires_grad
        )
    inner = module.forward

    def forward(*args, **kwargs):
        saved = {n: module._parameters[n] for n in names}  # FSDP2 may have swapped in its unsharded ones
        try:
            for n, p in saved.items():
                local = p.to_local() if isinstance(p, DTensor) else p
                module._parameters[n] = _AllReduceGrad.apply(local, grad_group) if grad_group else local
            return inner(*args, **kwargs)
        finally:
            module._parameters.update(saved)

    module.forward = forward


class _AllReduceGrad(torch.autograd.Function):
    """Identity forward; the backward sums the gradient over ``group``."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
