"""Which GPU each training rank takes, and how many tokens a micro-batch of the update may hold.

Every choice is a pure function of a :class:`Topology` and of measured sizes passed in, so the tests assert them
for a node of 8 GPUs and for 2 nodes on a machine without any. The callers read the topology from the environment
(:meth:`Topology.from_env`) and act on the answer:

- a training rank drives CUDA device ``LOCAL_RANK`` (:func:`rank_gpu`), on its main thread
  (:func:`plugrl.dist.init_distributed`) and on the thread that generates ahead
  (plugrl-off-policy: CUDA's current device is per thread, and vLLM launches its kernels on it);
- the GPUs of a node no training rank takes (:func:`spare_gpus`) are where servers go. The packages that start
  processes beside training place them, with functions of a :class:`Topology` of their own: the rollout servers
  the trainer starts, plugrl-rollout-servers (``plugrl_rollout_servers.placement``); the vLLM servers a plugin
  launches and their memory share, plugrl-model-servers (``plugrl_model_servers.placement``); a reward model's
  child process, plugrl-rewards-model (``plugrl_reward_model.scoring.child_device``);
- ``actor.ppo_max_token_len_per_gpu`` left unset is picked from the device's memory and the model's shape
  (:func:`token_budget`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("plugrl.placement")

GiB = 1 << 30


class PlacementError(RuntimeError):
    """A process cannot be given a device or the memory it needs; the message says what to change."""


@dataclass(frozen=True)
class Topology:
    """This process's place in the job and the CUDA devices it sees.

    ``local_world_size``: the training processes on this node (torchrun's ``--nproc_per_node``), which take CUDA
    devices 0 .. local_world_size - 1 of those visible; ``device_count``: the CUDA devices this process sees (0 on a
    CPU machine); ``visible_devices``: ``CUDA_VISIBLE_DEVICES`` split at commas (None when unset: device i is the
    machine's GPU i)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device_count: int = 0
    visible_devices: tuple[str, ...] | None = None

    @property
    def nnodes(self) -> int:
        return math.ceil(self.world_size / self.local_world_size)

    @property
    def node_rank(self) -> int:
        return self.rank // self.local_world_size

    def physical(self, index: int) -> str:
        """The name of CUDA device ``index`` (of this process) as a child's ``CUDA_VISIBLE_DEVICES`` takes it."""
        return str(index) if self.visible_devices is None else self.visible_devices[index]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, device_count: int | None = None) -> Topology:
        """The topology torchrun / accelerate launch describe in ``env`` (default: this process's environment);
        ``device_count`` default: what torch sees."""
        env = os.environ if env is None else env
        if device_count is None:
            import torch

            device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        world = int(env.get("WORLD_SIZE", "1"))
        visible = env.get("CUDA_VISIBLE_DEVICES")
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=world,
            local_rank=int(env.get("LOCAL_RANK", "0")),
            # torchrun and accelerate set it; a launcher that does not is taken as one node
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
            device_count=device_count,
            visible_devices=None if visible is None else tuple(v.strip() for v in visible.split(",") if v.strip()),
        )


def shown_devices(topo: Topology) -> str:
    """``CUDA_VISIBLE_DEVICES=<value>`` as this process has it (``unset``; ``''`` when empty), for messages."""
    shown = "unset" if topo.visible_devices is None else ",".join(topo.visible_devices) or "''"
    return f"CUDA_VISIBLE_DEVICES={shown}"


def rank_gpu(topo: Topology) -> int:
    """The CUDA device (index among those visible) this training rank drives: its local rank. Raises
    :class:`PlacementError` when the node starts more training processes than it shows GPUs."""
    if topo.local_rank >= topo.device_count:
        raise PlacementError(
            f"local rank {topo.local_rank} has no GPU: this node runs {topo.local_world_size} training processes "
            f"(torchrun --nproc_per_node) but this process sees {topo.device_count} GPU(s) ({shown_devices(topo)}). "
            f"Start at most {topo.device_count} processes per node, or make more GPUs visible"
        )
    return topo.local_rank


def spare_gpus(topo: Topology) -> list[int]:
    """The CUDA devices of this node that no training rank takes (those past the first ``local_world_size``)."""
    return list(range(min(topo.local_world_size, topo.device_count), topo.device_count))


# --------------------------------------------------------------------------- micro-batch token budget

CPU_TOKEN_BUDGET = 1024  # CPU attention is dense over the packed row; 4096 measured no faster on a 2-core CPU
MIN_GPU_TOKEN_BUDGET, MAX_GPU_TOKEN_BUDGET = 1024, 32768
ACTIVATION_SHARE = 0.80  # of a GPU's memory, for the update phase (the rest: CUDA context, fragmentation, NCCL)


@dataclass(frozen=True)
class ModelShape:
    """What the update's memory depends on (a decoder's text part): ``params`` counted on the meta device."""

    params: int
    hidden: int
    intermediate: int
    kv_dim: int
    layers: int
    vocab: int


def bytes_per_token(shape: ModelShape, *, checkpointing: bool, value_head: bool = False) -> int:
    """Activation bytes one token of a micro-batch costs in the update (bf16, docs/scaling.md's breakdown): a
    layer saves about 24 h + 4 kv + 8 i bytes a token (autocast's share; FSDP2's mixed precision 20 h); with
    checkpointing each layer keeps its input (4 h) and one layer is recomputed at a time. A policy adds its logits
    (bf16 and their gradient, fp32 log-prob chunks: ~8 bytes a vocabulary entry); a critic has one output."""
    h, kv, i = shape.hidden, shape.kv_dim, shape.intermediate
    layer = 24 * h + 4 * kv + 8 * i
    acts = (4 * h * shape.layers + layer) if checkpointing else layer * shape.layers
    return acts + (0 if value_head else 8 * shape.vocab)


def token_budget(*, device_memory_bytes: int, resident_bytes: int, per_token_bytes: int) -> int:
    """A micro-batch's tokens on a GPU: the largest power of two whose activations fit in
    :data:`ACTIVATION_SHARE` of the device less what the update keeps resident (``resident_bytes``: sharded fp32
    weights, gradients and AdamW state), between 1024 and 32768."""
    room = ACTIVATION_SHARE * device_memory_bytes - resident_bytes
    if room < MIN_GPU_TOKEN_BUDGET * per_token_bytes:
        return MIN_GPU_TOKEN_BUDGET
    return min(MAX_GPU_TOKEN_BUDGET, 1 << int(math.log2(room / per_token_bytes)))


def resident_update_bytes(params: int, *, data_parallel: int, offload: bool, sharded: bool) -> int:
    """GPU bytes the update holds besides activations: fp32 weights, gradients and AdamW's two moments (16 bytes a
    parameter) over the data-parallel ranks, plus autocast's bf16 weight copies where FSDP2 does not shard (one
    process); none with CPU offload."""
    if offload:
        return 0
    return (16 * params) // max(1, data_parallel) + (0 if sharded else 2 * params)


def model_shape(path: str, trust_remote_code: bool = False, overrides: Mapping | None = None) -> ModelShape:
    """:class:`ModelShape` from the model's config (no weights read; parameters counted on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, **dict(overrides or {}))
    text = config.get_text_config()
    heads = getattr(text, "num_attention_heads", 1) or 1
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
        params = sum(p.numel() for p in model.parameters())
    except ValueError:  # an architecture AutoModelForCausalLM does not build (a VLM): its decoder's count
        params = text.num_hidden_layers * (4 * text.hidden_size**2 + 3 * text.hidden_size * text.intermediate_size)
    return ModelShape(
        params=params,
        hidden=text.hidden_size,
        intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size),
        kv_dim=(getattr(text, "num_key_value_heads", None) or heads) * head_dim,
        layers=text.num_hidden_layers,
        vocab=text.vocab_size,
    )


BUDGET_KEY = "ppo_max_token_len_per_gpu"


def resolve_token_budgets(cfg: Any, device: Any, *, data_parallel: int, sharded: bool) -> None:
    """Set ``actor.ppo_max_token_len_per_gpu`` and ``critic.ppo_max_token_len_per_gpu`` where the run leaves them
    unset: :data:`CPU_TOKEN_BUDGET` on the CPU; on a GPU :func:`token_budget` for its memory, the model's shape and
    the run's sharding (``data_parallel`` ranks; ``sharded``: FSDP2, i.e. under torchrun), said once at start. The
    run's config.yaml then records what ran."""
    import torch

    device = torch.device(device)
    for section, value_head in (("actor", False), ("critic", True)):
        sec = getattr(cfg, section)
        if BUDGET_KEY in sec.model_fields_set:
            continue
        if device.type != "cuda":
            setattr(sec, BUDGET_KEY, CPU_TOKEN_BUDGET)
            continue
        total = torch.cuda.get_device_properties(device).total_memory
        path = (getattr(sec, "model", None) and sec.model.path) or cfg.model.path
        overrides = getattr(cfg.model, "override_config", None)
        shape = model_shape(path, cfg.model.trust_remote_code, overrides)
        checkpointing = (sec.model if value_head else cfg.model).enable_gradient_checkpointing
        per_token = bytes_per_token(shape, checkpointing=checkpointing, value_head=value_head)
        resident = resident_update_bytes(
            shape.params, data_parallel=data_parallel, offload=sec.fsdp_config.param_offload, sharded=sharded
        )
        budget = token_budget(device_memory_bytes=total, resident_bytes=resident, per_token_bytes=per_token)
        setattr(sec, BUDGET_KEY, budget)
        log.info(
            "%s.%s unset: %d tokens a micro-batch on this GPU (%.0f GiB; ~%.2f MiB of activations a token for this "
            "model, %.1f GiB of training state); set it to choose another",
            section,
            BUDGET_KEY,
            budget,
            total / GiB,
            per_token / (1 << 20),
            resident / GiB,
        )
