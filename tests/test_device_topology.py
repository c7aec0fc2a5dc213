"""The device every process and thread of a training rank takes, and the GPU memory a part may use, on a node of 8
GPUs and on 2 nodes (plugrl.placement; the servers' in plugrl_rollout_servers.placement and
plugrl_model_servers.placement, a reward model's child process's in plugrl_reward_model.scoring). No GPU here: the
choices are pure functions of a Topology, and where plugrl acts on them (torch.cuda.set_device in a thread, a
child's options, a server's environment) torch.cuda's calls are recorded by a stand-in."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from plugrl import placement
from plugrl.placement import GiB, PlacementError, Topology

NODE = dict(world_size=8, local_world_size=8, device_count=8)  # torchrun --nproc_per_node=8 on one node


def two_nodes(rank: int) -> Topology:
    """torchrun --nnodes=2 --nproc_per_node=8: global rank ``rank`` of 16."""
    return Topology(rank=rank, world_size=16, local_rank=rank % 8, local_world_size=8, device_count=8)


def test_the_topology_is_read_from_torchruns_environment():
    env = {"RANK": "13", "WORLD_SIZE": "16", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "8"}
    topo = Topology.from_env(env, device_count=8)
    assert (topo.rank, topo.local_rank, topo.nnodes, topo.node_rank, topo.visible_devices) == (13, 5, 2, 1, None)
    assert Topology.from_env({}, device_count=0) == Topology()  # one process, no launcher, no GPU
    masked = Topology.from_env({**env, "CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3"}, device_count=8)
    assert masked.physical(0) == "4" and masked.physical(7) == "3"


def test_each_rank_drives_its_local_gpu_on_one_node_and_on_two():
    assert [placement.rank_gpu(Topology(rank=r, local_rank=r, **NODE)) for r in range(8)] == list(range(8))
    assert [placement.rank_gpu(two_nodes(r)) for r in range(16)] == [*range(8), *range(8)]
    # more processes per node than GPUs: said with the counts, not CUDA's "invalid device ordinal"
    with pytest.raises(PlacementError, match=r"local rank 4 has no GPU: this node runs 8 .* sees 4 GPU"):
        placement.rank_gpu(Topology(rank=4, world_size=8, local_rank=4, local_world_size=8, device_count=4))


def test_init_distributed_makes_the_local_ranks_gpu_current(monkeypatch):
    """dist.init_distributed's choice for local rank 5 of a 2-node job (no process group: WORLD_SIZE unset)."""
    from plugrl import dist

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    info = dist.init_distributed("cuda")
    assert chosen == [5] and info.device == torch.device("cuda", 5)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    with pytest.raises(PlacementError, match="local rank 5 has no GPU"):
        dist.init_distributed("cuda")


def _record_set_device(monkeypatch) -> list[tuple[str, torch.device]]:
    seen: list[tuple[str, torch.device]] = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.append((threading.current_thread().name, d)))
    return seen


def test_the_rollout_thread_generates_on_the_ranks_gpu(monkeypatch):
    """Local rank 3 of an 8-GPU node generating one step ahead: its rollout thread makes cuda:3 current before it
    generates (a new thread starts on device 0; vLLM runs the model in the calling thread)."""
    from plugrl_off_policy import RolloutsAhead

    seen = _record_set_device(monkeypatch)
    device = torch.device("cuda", placement.rank_gpu(two_nodes(11)))
    ahead = RolloutsAhead(lambda step: step * 10, steps_ahead=1, device=device)
    ahead.schedule(0)
    assert ahead.take(0).result == 0
    ahead.close()
    assert seen == [("plugrl-rollouts-ahead", torch.device("cuda", 3))]


def test_the_rollout_thread_takes_the_device_current_where_it_was_built(monkeypatch):
    from plugrl_off_policy import RolloutsAhead

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 6)
    seen = _record_set_device(monkeypatch)
    ahead = RolloutsAhead(lambda step: step, steps_ahead=1)
    ahead.schedule(0)
    ahead.take(0)
    ahead.close()
    assert seen == [("plugrl-rollouts-ahead", torch.device("cuda", 6))]
    # on a CPU the thread touches no CUDA device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    seen.clear()
    ahead = RolloutsAhead(lambda step: step, steps_ahead=1)
    ahead.schedule(0)
    ahead.take(0)
    ahead.close()
    assert ahead.device is None and seen == []


def test_a_child_process_of_a_rank_gets_the_ranks_gpu_by_name():
    from plugrl_reward_model.scoring import child_device

    for rank in range(16):
        topo = two_nodes(rank)
        assert child_device("auto", topo) == f"cuda:{rank % 8}"
        assert child_device("cuda", topo) == f"cuda:{rank % 8}"
        assert child_device("cuda:2", topo) == "cuda:2"  # named by the user: kept
        assert child_device("cpu", topo) == "cpu"
    assert child_device("auto", Topology(world_size=2, local_world_size=2, rank=1, local_rank=1)) == "cpu"


def test_a_separate_reward_model_loads_on_its_ranks_gpu(tiny_rm):
    """plugins/rewards_model, process: separate: the child is told the rank's GPU (a fresh process resolving auto
    would take cuda:0 on every rank)."""
    from plugrl_reward_model.options import Options
    from plugrl_reward_model.scoring import child_options

    opts = Options(path=str(tiny_rm), process="separate")
    assert opts.device == "auto"
    assert [child_options(opts, Topology(rank=r, local_rank=r, **NODE)).device for r in range(8)] == [
        f"cuda:{r}" for r in range(8)
    ]
    assert child_options(opts, two_nodes(13)).device == "cuda:5"
    assert child_options(opts, Topology()).device == "cpu"


def test_rollout_servers_take_the_gpus_no_rank_trains_on_else_share_the_training_gpus():
    from plugrl_rollout_servers.placement import rollout_server_gpus

    # 6 training processes on an 8-GPU node: two 1-GPU servers take GPUs 6 and 7
    six = Topology(world_size=6, local_world_size=6, device_count=8)
    assert [s.visible for s in rollout_server_gpus(six, 2, 1)] == [("6",), ("7",)]
    assert not any(s.shares_training for s in rollout_server_gpus(six, 2, 1))
    # the names follow CUDA_VISIBLE_DEVICES: the child sees the machine's GPUs, not this process's numbering
    masked = Topology(world_size=6, local_world_size=6, device_count=8, visible_devices=tuple("23456701"))
    assert [s.env for s in rollout_server_gpus(masked, 2, 1)] == [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]
    # 4 training processes, two servers of rollout TP 2: GPUs 4,5 and 6,7
    four = Topology(world_size=4, local_world_size=4, device_count=8)
    assert [s.visible for s in rollout_server_gpus(four, 2, 2)] == [("4", "5"), ("6", "7")]
    # every GPU trains (8 per node, one node or rank 0's node of two): each server shares a different training GPU
    for topo in (Topology(**NODE), two_nodes(0)):
        shared = rollout_server_gpus(topo, 2, 1)
        assert [s.visible for s in shared] == [("0",), ("1",)] and all(s.shares_training for s in shared)
        assert "shares training GPU(s) [0]" in shared[0].why
    assert rollout_server_gpus(Topology(), 2, 1) == []  # CPU: no GPU to give
    with pytest.raises(PlacementError, match="needs 4 GPUs, this node shows 2"):
        rollout_server_gpus(Topology(device_count=2), 1, 4)


def test_a_launched_vllm_server_takes_a_spare_gpu_else_the_ranks_own():
    from plugrl_model_servers.placement import launched_server_gpu

    seven = Topology(world_size=7, local_world_size=7, device_count=8)
    assert launched_server_gpu(seven) == (7, False)
    assert launched_server_gpu(seven, taken={"7"}) == (7, False)  # shares the spare GPU with a server
    assert launched_server_gpu(Topology(**NODE)) == (0, True)  # rank 0 launches: its own GPU
    assert launched_server_gpu(two_nodes(0)) == (0, True)
    assert launched_server_gpu(Topology(device_count=8)) == (1, False)  # one process, 8 GPUs


def test_a_server_beside_training_gets_the_memory_its_model_needs_or_is_refused():
    from plugrl_model_servers.placement import own_gpu_fraction, shared_gpu_fraction

    total = 80 * GiB
    # a 1 GiB model: weights + as much again + 1 GiB of context = 3 GiB = 0.0375 -> 0.04 of the GPU
    assert shared_gpu_fraction(
        free_bytes=30 * GiB, total_bytes=total, model_bytes=GiB, where="reward.options.judge", gpu="0"
    ) == pytest.approx(0.04)
    # 15 GiB of weights need 31 GiB; 30 are free and 8 (a tenth) stay for the update
    with pytest.raises(PlacementError, match=r"reward.options.judge: the launched server needs ~31.0 GiB of GPU 0"):
        shared_gpu_fraction(
            free_bytes=30 * GiB, total_bytes=total, model_bytes=15 * GiB, where="reward.options.judge", gpu="0"
        )
    with pytest.raises(PlacementError, match=r"reward.options.judge.launch_args: \[--gpu-memory-utilization"):
        shared_gpu_fraction(
            free_bytes=30 * GiB, total_bytes=total, model_bytes=None, where="reward.options.judge", gpu="0"
        )
    assert own_gpu_fraction(total, total) == 0.9
    assert own_gpu_fraction(40 * GiB, total) == 0.48  # another server holds the rest


QWEN_7B = placement.ModelShape(
    params=7_615_616_512, hidden=3584, intermediate=18944, kv_dim=512, layers=28, vocab=152064
)


def test_the_token_budget_follows_the_gpus_memory_and_the_model():
    smol = placement.ModelShape(params=134_515_008, hidden=576, intermediate=1536, kv_dim=192, layers=30, vocab=49152)
    per_token = placement.bytes_per_token(smol, checkpointing=False)
    assert per_token == (24 * 576 + 4 * 192 + 8 * 1536) * 30 + 8 * 49152
    budget = placement.token_budget
    one = placement.resident_update_bytes(smol.params, data_parallel=1, offload=False, sharded=False)
    assert budget(device_memory_bytes=80 * GiB, resident_bytes=one, per_token_bytes=per_token) == 32768
    assert budget(device_memory_bytes=24 * GiB, resident_bytes=one, per_token_bytes=per_token) == 8192
    # 7B on 8 x 80 GB (FSDP2 over 8): docs/scaling.md's table takes 6144 without checkpointing; this picks 4096
    q = placement.bytes_per_token(QWEN_7B, checkpointing=False)
    shards = placement.resident_update_bytes(QWEN_7B.params, data_parallel=8, offload=False, sharded=True)
    assert budget(device_memory_bytes=80 * GiB, resident_bytes=shards, per_token_bytes=q) == 4096
    ckpt = placement.bytes_per_token(QWEN_7B, checkpointing=True)
    assert budget(device_memory_bytes=80 * GiB, resident_bytes=shards, per_token_bytes=ckpt) == 16384
    # the states alone leave no room: the floor (an OOM then halves it, docs/reliability.md)
    assert budget(device_memory_bytes=16 * GiB, resident_bytes=16 * QWEN_7B.params, per_token_bytes=q) == 1024


def test_an_unset_budget_is_1024_on_the_cpu_and_from_the_gpus_memory_on_a_gpu(tiny_model, monkeypatch):
    from plugrl.config import build_config

    def config(**actor):
        return build_config({"model": {"path": str(tiny_model)}, "data": {"dataset": "countdown"}, "actor": actor})

    cfg = config()
    placement.resolve_token_budgets(cfg, "cpu", data_parallel=1, sharded=False)
    assert (cfg.actor.ppo_max_token_len_per_gpu, cfg.critic.ppo_max_token_len_per_gpu) == (1024, 1024)
    cfg = config(ppo_max_token_len_per_gpu=4096)  # set by the run: kept
    placement.resolve_token_budgets(cfg, "cpu", data_parallel=1, sharded=False)
    assert cfg.actor.ppo_max_token_len_per_gpu == 4096
    # a 24 GiB GPU, as torch.cuda would report it
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=24 * GiB))
    cfg = config()
    placement.resolve_token_budgets(cfg, torch.device("cuda", 0), data_parallel=1, sharded=False)
    shape = placement.model_shape(str(tiny_model))
    want = placement.token_budget(
        device_memory_bytes=24 * GiB,
        resident_bytes=placement.resident_update_bytes(shape.params, data_parallel=1, offload=False, sharded=False),
        per_token_bytes=placement.bytes_per_token(shape, checkpointing=False),
    )
    assert cfg.actor.ppo_max_token_len_per_gpu == want == 32768  # a tiny model: the cap
    assert "ppo_max_token_len_per_gpu" in cfg.actor.model_fields_set  # the run's config.yaml records it
