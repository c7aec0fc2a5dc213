"""Which GPUs the rollout servers that rank 0 starts (``rollout.mode: server``) take.

A pure function of a :class:`plugrl.placement.Topology`, like the kernel's placement, so the tests assert it for a
node of 8 GPUs and for 2 nodes on a machine without any; :func:`plugrl_rollout_servers.remote.server_gpus` reads
the topology and acts on the answer. A server gets GPUs of its own through ``CUDA_VISIBLE_DEVICES`` when the node
has enough that no training rank uses (:func:`plugrl.placement.spare_gpus`), else shares training GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from plugrl.placement import PlacementError, Topology, shown_devices, spare_gpus


@dataclass(frozen=True)
class ServerGPUs:
    """Where one server process runs: ``visible`` (its ``CUDA_VISIBLE_DEVICES``, physical names), whether it shares
    a training rank's GPU, and ``why`` (said in the log at start)."""

    visible: tuple[str, ...]
    shares_training: bool
    why: str

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ",".join(self.visible)}


def rollout_server_gpus(topo: Topology, servers: int, tp: int) -> list[ServerGPUs]:
    """The GPUs of each of the ``servers`` rollout servers (``tp`` GPUs each: rollout.tensor_model_parallel_size) that
    rank 0 starts on its node: GPUs no training rank takes, in order, when there are ``servers x tp`` of them;
    otherwise server i shares training GPUs i x tp .. i x tp + tp - 1 (modulo the node's), as the colocated engines
    do. Empty on a machine without GPUs (CPU servers)."""
    if topo.device_count == 0:
        return []
    if tp > topo.device_count:
        raise PlacementError(
            f"rollout.tensor_model_parallel_size={tp}: a rollout server needs {tp} GPUs, this node shows "
            f"{topo.device_count} ({shown_devices(topo)})"
        )
    spare = spare_gpus(topo)
    if len(spare) >= servers * tp:
        return [
            ServerGPUs(
                tuple(topo.physical(d) for d in spare[i * tp : (i + 1) * tp]),
                False,
                f"its own GPU(s), of the {len(spare)} no training rank uses",
            )
            for i in range(servers)
        ]
    taken = min(topo.local_world_size, topo.device_count)
    out = []
    for i in range(servers):
        devices = [(i * tp + j) % taken for j in range(tp)]
        why = (
            f"shares training GPU(s) {devices}: the node shows {topo.device_count} GPUs, {taken} train, and "
            f"{servers} server(s) x {tp} need {servers * tp} more"
        )
        out.append(ServerGPUs(tuple(topo.physical(d) for d in devices), True, why))
    return out
