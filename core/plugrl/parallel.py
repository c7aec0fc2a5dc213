"""The device mesh ("dp" x "tp") every run trains on, and where tensor parallelism (``actor.tp_size`` > 1) lives.

Ranks form a 2-D mesh of shape ``(world / tp_size, tp_size)``: rank ``r`` is data-parallel rank ``r // tp_size``
and tensor-parallel rank ``r % tp_size``, so the ranks of one TP group are neighbours (one node); they hold the
same sequences and compute together. FSDP2 shards (and averages gradients) over the "dp" dimension only.

Tensor parallelism proper (the model split by its transformers plan, log-probs and entropy from vocabulary-sharded
logits) is the package plugrl-tensor-parallel: the entry point of group ``plugrl.tensor_parallel``, an object with
:class:`TensorParallelKit`'s functions. A run with ``actor.tp_size`` 1 never imports it; a training run with
``actor.tp_size`` > 1 without it is refused at start, naming the key and the package (:func:`check_installed`).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Protocol

import torch.distributed as dist

from plugrl.config import ConfigError
from plugrl.plugin_errors import implementation, package_hint

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from plugrl.config import Config

GROUP = "plugrl.tensor_parallel"
PACKAGE = "plugrl-tensor-parallel"


def device_mesh(device_type: str, tp_size: int) -> DeviceMesh:
    """The ("dp", "tp") mesh over all ranks (1-D ("dp",) when ``tp_size`` is 1); one per process group."""
    return _mesh(device_type, tp_size, id(dist.distributed_c10d._get_default_group()))


@functools.cache
def _mesh(device_type: str, tp_size: int, _group_id: int) -> DeviceMesh:
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


class NoTensorParallel(ConfigError):
    """No installed package implements tensor parallelism; the message names the key and the package."""


class VocabMath(Protocol):
    """What the actor computes log-probs and entropy with (its ``vocab``): :mod:`plugrl.algorithms`' two functions,
    or their equals for logits whose vocabulary is sharded over a tensor-parallel group (same signatures)."""

    def logprobs_from_logits(
        self, logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
    ) -> torch.Tensor: ...
    def logprobs_and_entropy(
        self, logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class TensorParallelKit(Protocol):
    """The entry point of group ``plugrl.tensor_parallel``.

    - ``parallelize(model, tp_mesh)``: a transformers causal LM (or a token-classification model on the same
      trunk) split over the 1-D mesh ``tp_mesh`` in place, its LM head's logits left sharded by vocabulary; a
      ConfigError naming ``actor.tp_size`` for a model that cannot be split so.
    - ``vocab_parallel(group)``: the :class:`VocabMath` for logits sharded by vocabulary over ``group``.
    """

    def parallelize(self, model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module: ...
    def vocab_parallel(self, group: ProcessGroup) -> VocabMath: ...


def kit(tp_size: int) -> TensorParallelKit:
    """The installed implementation; a :class:`NoTensorParallel` naming ``actor.tp_size`` and the package when there
    is none."""
    missing = f"actor.tp_size={tp_size}: tensor parallelism is in the package {PACKAGE}, which is not installed: "
    return implementation(GROUP, NoTensorParallel(missing + package_hint(PACKAGE)))


def check_installed(cfg: Config) -> None:
    """A training run with ``actor.tp_size`` > 1 and no package that implements tensor parallelism: refused now,
    naming the key, rather than when the model is built."""
    if cfg.actor.tp_size > 1:
        kit(cfg.actor.tp_size)
