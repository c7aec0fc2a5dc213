"""torch.distributed set-up and the few collectives the trainer needs.

One process works alone; under torchrun / accelerate launch (RANK, WORLD_SIZE set) a process group is created:
on GPUs one group with two backends, ``cpu:gloo,cuda:nccl`` (CUDA tensors over NCCL; CPU tensors, such as the
shards FSDP2's CPU offload keeps in host memory, over gloo), on CPU gloo alone. A second, gloo-only group carries
:func:`host_barrier`.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

_timeout: timedelta | None = None  # the default group's, for the groups made later


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    tp_size: int = 1  # ranks per tensor-parallel group (neighbours: rank // tp_size is the data-parallel rank)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        """Which share of the data this rank's tensor-parallel group works on."""
        return self.rank // self.tp_size

    @property
    def dp_size(self) -> int:
        """How many shares the data is split into (the number of tensor-parallel groups)."""
        return self.world_size // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def tp_lead(self) -> bool:
        """The first rank of its tensor-parallel group: the one that generates, scores and writes for it."""
        return self.tp_rank == 0


def backend_for(device_type: str) -> str:
    """The process group's backend: NCCL for CUDA tensors plus gloo for CPU ones on GPUs, gloo on CPU."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def resolve_device(device: str) -> str:
    """``trainer.device``: ``auto`` is cuda where a GPU is visible, else cpu."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def launched_world_size() -> int:
    """How many processes the launcher (torchrun, accelerate) started: ``WORLD_SIZE``, 1 without one."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device: str = "auto", tp_size: int = 1, timeout_s: float | None = None) -> DistInfo:
    """This process's place in the job; creates the process group under torchrun (``timeout_s``: how long a
    collective waits for a missing rank before the job fails, ``trainer.dist_timeout_s``)."""
    device = resolve_device(device)
    world = launched_world_size()
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        from plugrl.placement import Topology, rank_gpu

        index = rank_gpu(Topology.from_env())  # LOCAL_RANK, or a clear error when the node has too few GPUs
        torch.cuda.set_device(index)
        dev = torch.device("cuda", index)
    else:
        dev = torch.device("cpu")
    if tp_size != 1:
        from plugrl.parallel import check_world

        check_world(world, tp_size)
    # under torchrun (WORLD_SIZE set) a process group even for one rank: FSDP2 (CPU offload, mixed precision)
    # then runs on a single GPU too
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        global _timeout
        _timeout = timedelta(seconds=timeout_s) if timeout_s else None
        dist.init_process_group(backend=backend_for(dev.type), timeout=_timeout)
        _host_group.cache_clear()
    return DistInfo(rank, world, local_rank, dev, tp_size)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


_thread = threading.local()


@contextmanager
def collectives_on(group) -> Iterator[None]:
    """The collectives of this module called in this thread without a group go to ``group`` (all ranks, made
    with ``dist.new_group`` by every rank). For a thread that runs beside the main one (the rollouts generated
    ahead by plugrl-off-policy): two threads' collectives on one group would pair with each other."""
    before = getattr(_thread, "group", None)
    _thread.group = group
    try:
        yield
    finally:
        _thread.group = before


def _group(group):
    return group if group is not None else getattr(_thread, "group", None)


def all_reduce(values: list[float], op: str = "sum", group=None) -> list[float]:
    """Sum (or max/min) a list of floats over ranks (of ``group``; default all); identity when alone."""
    group = _group(group)
    if not is_distributed() or (group is not None and dist.get_world_size(group) == 1):
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    reduce_op = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
    dist.all_reduce(t, op=reduce_op, group=group)
    return t.cpu().tolist()


def collective_device() -> torch.device:
    """Where a tensor for a collective of the default group lives: the GPU when NCCL carries them (it reduces
    only CUDA tensors), else the host."""
    if "nccl" in str(dist.get_backend(_group(None))) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def mean_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Average each metric over the ranks that logged it (a collective)."""
    if not is_distributed():
        return metrics
    parts = gather_objects(metrics)
    keys = sorted({k for part in parts for k in part})
    return {k: sum(p[k] for p in parts if k in p) / sum(k in p for p in parts) for k in keys}


def gather_objects(obj):
    """Every rank's ``obj``, in rank order (a list of one when alone)."""
    if not is_distributed():
        return [obj]
    group = _group(None)
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def new_host_group():
    """A new gloo group of all ranks, with the default group's timeout (a collective: every rank calls it);
    None when alone."""
    return dist.new_group(backend="gloo", timeout=_timeout) if is_distributed() else None


@functools.cache
def _host_group():
    # a collective: every rank creates it at its first host_barrier (they all reach the same ones)
    return new_host_group()


def host_barrier() -> None:
    """Wait until every rank gets here, over gloo: for waiting on rank 0's long host work (writing or checking a
    checkpoint). An NCCL barrier would hold a GPU collective open for the whole wait, which NCCL's watchdog kills
    past the timeout; a gloo barrier waits on the host and names a rank that never comes (same timeout)."""
    if is_distributed():
        dist.barrier(group=_host_group())


def shutdown() -> None:
    """Leave the process group once this rank's work is done (a collective; no-op when alone). The ranks meet
    first, so none tears down connections a peer still sends over; left to interpreter exit, gloo's threads can
    be destroyed while joinable and the process aborts. Not for error paths: a peer that is not coming would leave
    the barrier waiting."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def exit_worker(code: int = 0) -> NoReturn:
    """End a torchrun worker whose work is done and written: leave the process group, then :func:`exit_now`.

    Finalization frees Python objects that C++ threads may still hold (tensors in gloo's work objects); a thread
    that then needs the GIL is unwound inside a noexcept frame and the process aborts (SIGABRT, "terminate called
    without an active exception", seen in CI even after :func:`shutdown`), so torchrun reports a finished run as
    failed. Only for a worker's last line on success: an error path should raise, so its traceback is printed.
    """
    shutdown()
    exit_now(code)


def exit_now(code: int) -> NoReturn:
    """Run the atexit handlers (they stop child processes), flush the logs and streams, then exit without the
    interpreter's finalization: for a finished worker (:func:`exit_worker`) and a run stopped at once by a second
    signal (:class:`plugrl.signals.StopNow`), which the process group is not left for (a peer may be mid-step)."""
    try:
        atexit._run_exitfuncs()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing left to say on it
                pass
        os._exit(code)


def broadcast_object(obj, group=None):
    """The first rank of ``group``'s ``obj``, on every rank of it (``obj`` itself when alone)."""
    group = _group(group)
    if not is_distributed() or (group is not None and dist.get_world_size(group) == 1):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, group=group, group_src=0)
    return box[0]
