"""Which GPU a vLLM server a plugin launches takes, and how much of it (``--gpu-memory-utilization``).

Pure functions of a :class:`plugrl.placement.Topology` and of measured sizes passed in, like the kernel's
placement, so the tests assert them for a node of 8 GPUs and for 2 nodes on a machine without any;
:func:`plugrl_model_servers.gpu_placement` reads the topology and the free memory and acts on the answer. A server
gets a GPU of its own through ``CUDA_VISIBLE_DEVICES`` when the node has GPUs no training rank uses
(:func:`plugrl.placement.spare_gpus`), else shares the launching rank's GPU with a memory fraction that fits beside
training (:func:`shared_gpu_fraction`), or is refused (:class:`plugrl.placement.PlacementError`).
"""

from __future__ import annotations

import math
from collections.abc import Collection

from plugrl.placement import GiB, PlacementError, Topology, rank_gpu, spare_gpus


def launched_server_gpu(topo: Topology, taken: Collection[str] = ()) -> tuple[int, bool]:
    """(CUDA index, whether it is a training rank's GPU) for a vLLM server a plugin launches from this process:
    the first GPU no training rank and no server already started by this process (``taken``: physical names)
    uses; else the first spare one (shared with another server); else this rank's own GPU."""
    spare = spare_gpus(topo)
    for d in spare:
        if topo.physical(d) not in taken:
            return d, False
    if spare:
        return spare[0], False
    return rank_gpu(topo), True


# a server beside training: what it holds besides its weights (KV cache, activations, CUDA graphs) is taken as much
# again as the weights, plus its CUDA context; and a tenth of the GPU stays free for the update's growth (optimizer
# state at the first step, gradients, activations), which is not allocated yet when the server starts
SERVER_CONTEXT_BYTES = 1 * GiB
TRAINING_HEADROOM = 0.10
OWN_GPU_FRACTION = 0.90  # vLLM's default is 0.92; a little is left for a second server's context


def _fraction_up(nbytes: float, total: int) -> float:
    return math.ceil(100 * nbytes / total) / 100


def own_gpu_fraction(free_bytes: int, total_bytes: int) -> float:
    """``--gpu-memory-utilization`` for a server on a GPU no training rank uses: 0.9, or what is free there now
    (another server took the rest; vLLM refuses a fraction above the free share at start)."""
    return max(0.01, min(OWN_GPU_FRACTION, math.floor(100 * (free_bytes / total_bytes - 0.02)) / 100))


def shared_gpu_fraction(*, free_bytes: int, total_bytes: int, model_bytes: int | None, where: str, gpu: str) -> float:
    """``--gpu-memory-utilization`` for a server that shares a training rank's GPU: its weights
    (``model_bytes``, the files' size), as much again for its KV cache and activations, and its CUDA context, as a
    fraction of the GPU rounded up; refused (:class:`PlacementError`, naming ``where``'s options) when that does not
    fit in what is free now less :data:`TRAINING_HEADROOM`, or when the model's size is unknown."""
    own_gpu = (
        "give the server a GPU of its own (make one more GPU visible than torchrun's --nproc_per_node: it then goes "
        "there)"
    )
    if model_bytes is None:
        raise PlacementError(
            f"{where}: the launched server would share training GPU {gpu}, and the size of its model is unknown "
            f"here (not a local folder nor in the Hugging Face cache), so no memory share can be chosen for it: "
            f"{own_gpu}, or set {where}.launch_args: [--gpu-memory-utilization, <fraction>]"
        )
    need = 2 * model_bytes + SERVER_CONTEXT_BYTES
    room = free_bytes - TRAINING_HEADROOM * total_bytes
    if need > room:
        raise PlacementError(
            f"{where}: the launched server needs ~{need / GiB:.1f} GiB of GPU {gpu} (weights {model_bytes / GiB:.1f} "
            f"GiB, as much again for its KV cache, and its CUDA context), which it shares with training; "
            f"{free_bytes / GiB:.1f} of {total_bytes / GiB:.1f} GiB are free now and {TRAINING_HEADROOM:.0%} stays "
            f"for the update. {own_gpu}, lower rollout.gpu_memory_utilization, or set {where}.launch: false and "
            "serve the model elsewhere"
        )
    return _fraction_up(need, total_bytes)
