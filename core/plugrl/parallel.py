"""The device mesh ("dp" x "tp") and tensor parallelism (TP) of the trained models.

Ranks form a 2-D mesh of shape ``(world / tp_size, tp_size)``: rank ``r`` is data-parallel rank
``r // tp_size`` and tensor-parallel rank ``r % tp_size``, so the ranks of one TP group are
neighbours (one node). The ranks of a TP group hold the same sequences and compute together;
FSDP2 shards (and averages gradients) over the "dp" dimension only.

Tensor parallelism follows the model's own transformers plan (``config.base_model_tp_plan``:
``colwise`` q/k/v/gate/up, ``rowwise`` o/down, Qwen3's per-head ``q_norm``/``k_norm`` as
``replicated_with_grad_allreduce``), translated to torch DTensor styles. The attention modules need
no change: they reshape the projections with ``-1`` heads, so each rank runs its own
``heads / tp`` query and ``kv_heads / tp`` key/value heads. The input embedding and the LM head are
vocabulary-sharded (a tied pair stays tied: both are sharded on the vocabulary rows); the LM head's
output stays sharded, [N, V / tp] on each rank, and :func:`vocab_parallel_logprobs` /
:func:`vocab_parallel_entropy` work on those shards without gathering the logits. Every other
parameter (the norms, a critic's value head) is a replicated DTensor used as a local tensor in
its module's forward, so all parameters are DTensors on the same mesh (one optimizer and
gradient-clipping path for all of them).
"""

from __future__ import annotations

import fnmatch
import functools

import torch
import torch.distributed as dist
from torch import nn

from plugrl.config import ConfigError
from plugrl.models import is_vision_model

# transformers' style names -> what they mean here; the LM head is vocabulary-parallel whatever its style says
_COLWISE = {"colwise"}
_ROWWISE = {"rowwise"}
_GRAD_ALLREDUCE = {"replicated_with_grad_allreduce"}
_EMBEDDING = {"embedding_rowwise"}  # the input embedding is vocabulary-sharded below, whatever the plan says


def device_mesh(device_type: str, tp_size: int):
    """The ("dp", "tp") mesh over all ranks (1-D ("dp",) when ``tp_size`` is 1); one per process group."""
    return _mesh(device_type, tp_size, id(dist.distributed_c10d._get_default_group()))


@functools.cache
def _mesh(device_type: str, tp_size: int, _group_id: int):
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    check_world(world, tp_size)
    if tp_size == 1:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("dp",))
    return init_device_mesh(device_type, (world // tp_size, tp_size), mesh_dim_names=("dp", "tp"))


def check_world(world_size: int, tp_size: int) -> None:
    if tp_size < 1 or world_size % tp_size:
        raise ConfigError(
            f"actor.tp_size={tp_size} must divide the number of processes ({world_size}); "
            "launch a multiple of it (torchrun --nproc_per_node=...) or change actor.tp_size"
        )


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


def parallelize(model: nn.Module, tp_mesh) -> nn.Module:
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


def _replicate(module: nn.Module, names: list[str], mesh, grad_group) -> None:
    """Make ``module``'s parameters ``names`` replicated DTensors, used as local tensors in its forward.

    With ``grad_group`` their gradients are summed over it (a per-head norm sees only this rank's heads).
    """
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


# ---- vocabulary-parallel log-probs and entropy -----------------------------------------------
#
# Each rank of the TP group holds logits [N, V / tp] for its contiguous vocabulary shard (rank t:
# ids [t * V / tp, (t + 1) * V / tp)). The forwards all-reduce three [N] vectors (max, sum of exps,
# the target logit or the sum of p * z); their results are the same on every rank of the group, as is
# everything computed from them after, so each rank receives the full upstream gradient and the
# backwards are local: d log p(y) / dz_v = [v = y] - p_v and dH / dz_v = -p_v (z_v - E_p[z]).
# (The gradient of the hidden states is completed by the LM head's own all-reduce.)


def _max_and_sumexp(x: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(shifted logits z - max z [N, Vl], global max [N], global sum of exp(shifted) [N])."""
    m = x.max(dim=-1).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shifted = x - m.unsqueeze(-1)
    sumexp = shifted.exp().sum(dim=-1)
    dist.all_reduce(sumexp, group=group)
    return shifted, m, sumexp


class _VocabParallelLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, group):
        x = logits.float()
        shifted, _, sumexp = _max_and_sumexp(x, group)
        width = x.shape[-1]
        local = labels.long() - dist.get_rank(group) * width
        owned = (local >= 0) & (local < width)
        local = local.clamp(0, width - 1)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1)
        picked = torch.where(owned, picked, torch.zeros_like(picked))  # not * owned: -inf * 0 is NaN
        dist.all_reduce(picked, group=group)
        ctx.save_for_backward(shifted, sumexp, local, owned)
        ctx.dtype = logits.dtype
        return picked - sumexp.log()

    @staticmethod
    def backward(ctx, grad):
        shifted, sumexp, local, owned = ctx.saved_tensors
        out = shifted.exp().div_(sumexp.unsqueeze(-1)).mul_(-grad.unsqueeze(-1))
        out.scatter_add_(-1, local.unsqueeze(-1), (grad * owned).unsqueeze(-1))
        return out.to(ctx.dtype), None, None


class _VocabParallelEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, group):
        x = logits.float()
        shifted, _, sumexp = _max_and_sumexp(x, group)
        e = shifted.exp()
        # exp(-inf) * -inf is NaN: a -inf logit contributes 0
        weighted = torch.where(e > 0, e * shifted, torch.zeros_like(e)).sum(dim=-1)
        dist.all_reduce(weighted, group=group)
        mean_shifted = weighted / sumexp  # E_p[z] - max z
        ctx.save_for_backward(shifted, sumexp, mean_shifted)
        ctx.dtype = logits.dtype
        return sumexp.log() - mean_shifted

    @staticmethod
    def backward(ctx, grad):
        shifted, sumexp, mean_shifted = ctx.saved_tensors
        p = shifted.exp().div_(sumexp.unsqueeze(-1))
        centred = torch.where(p > 0, shifted - mean_shifted.unsqueeze(-1), torch.zeros_like(p))
        return (-p * centred * grad.unsqueeze(-1)).to(ctx.dtype), None


def vocab_parallel_logprobs(logits: torch.Tensor, labels: torch.Tensor, group) -> torch.Tensor:
    """log p(label) under softmax over the full vocabulary, from this rank's vocabulary shard.

    Shapes: ``logits`` [N, V / tp] (this rank's contiguous shard, any float dtype), ``labels`` [N]
    global token ids; returns [N] float32, equal on every rank of ``group``.

    Formula: ``z_y - max - log sum_v exp(z_v - max)`` with the max and the sum all-reduced over the
    group and ``z_y`` taken on the rank that owns ``y`` (then all-reduced). Differentiable.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} does not match logits shape {tuple(logits.shape)} "
            "without its last (vocabulary) dimension"
        )
    return _VocabParallelLogprob.apply(logits, labels, group)


def vocab_parallel_entropy(logits: torch.Tensor, group) -> torch.Tensor:
    """Entropy of softmax over the full vocabulary, from this rank's vocabulary shard.

    Shapes: ``logits`` [N, V / tp]; returns [N] float32, equal on every rank of ``group``.

    Formula: ``H = logsumexp(z) - sum_v p_v z_v`` on ``z - max`` (all-reduced max, sum of exps and
    sum of ``exp * z``); ``-inf`` logits contribute 0. Differentiable.
    """
    return _VocabParallelEntropy.apply(logits, group)


class VocabParallel:
    """:mod:`plugrl.algorithms`' ``logprobs_from_logits`` / ``logprobs_and_entropy`` for logits whose
    vocabulary is sharded over the TP ``group`` (same signatures, same results)."""

    def __init__(self, group):
        self.group = group

    def logprobs_from_logits(self, logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0):
        if temperature != 1.0:
            logits = logits / temperature
        return vocab_parallel_logprobs(logits, labels, self.group)

    def logprobs_and_entropy(
        self, logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if temperature != 1.0:
            logits = logits / temperature
        logp = vocab_parallel_logprobs(logits, labels, self.group)
        if entropy_grad:
            return logp, vocab_parallel_entropy(logits, self.group)
        with torch.no_grad():
            return logp, vocab_parallel_entropy(logits.detach(), self.group)
