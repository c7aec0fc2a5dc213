"""Checkpoints at the scale of 7B-70B models: the files are touched by rank 0 alone.

Real processes under torchrun (gloo) run tests/ckpt_worker.py: a sharded policy writes two checkpoints, the
second is damaged, the one to resume is picked, and the first is loaded back. Rank 0 alone hashes the files
and reads the weights and optimizer state (broadcasting them into every rank's shards: FSDP2, tensor-parallel,
and both on a 2-D mesh); the other ranks wait for its file work in plugrl.dist.host_barrier (gloo), never in a
barrier of the default (on GPUs NCCL) group.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from plugrl import checkpoint
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ModelConfig
from test_e2e import ROOT
from test_fsdp import TORCHRUN

# layout -> (processes, actor.tp_size)
LAYOUTS = {"fsdp2": (2, 1), "tp2": (2, 2), "dp2xtp2": (4, 2)}


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory, smollm2_path) -> Path:
    """tiny_model's llama with 2 key/value heads, so that it splits over 2 tensor-parallel ranks."""
    from tiny_models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama_kv2", smollm2_path, arch="llama", kv_heads=2)


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory, tiny_model, tp_model):
    """layout -> (run dir, model, each rank's report); each layout runs once per module."""
    done: dict[str, tuple[Path, Path, list[dict]]] = {}

    def run(layout: str) -> tuple[Path, Path, list[dict]]:
        if layout not in done:
            procs, tp_size = LAYOUTS[layout]
            model = tiny_model if tp_size == 1 else tp_model
            root = tmp_path_factory.mktemp(layout)
            (root / "out").mkdir()
            launcher = [a if a != "--nproc_per_node=2" else f"--nproc_per_node={procs}" for a in TORCHRUN]
            cmd = [*launcher, str(ROOT / "tests" / "ckpt_worker.py"), str(model), str(root / "run"), str(root / "out")]
            env = {**os.environ, "TP_SIZE": str(tp_size)}
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
            reports = [torch.load(root / "out" / f"rank_{r}.pt", weights_only=False) for r in range(procs)]
            done[layout] = (root / "run", model, reports)
        return done[layout]

    return run


def _single_process_load(model: Path, ckpt: Path) -> tuple[dict, dict, list[float]]:
    """Weights, full optimizer state and LR after loading ``ckpt`` into one process's policy."""
    rng = checkpoint.rng_state()  # load_checkpoint restores rank 0's RNG: keep this process's
    actor = ActorConfig(optim={"lr": 1e-3, "eps": 1e-6})
    policy = PolicyModel(str(model), ModelConfig(path=str(model)), actor, torch.device("cpu"))
    try:
        checkpoint.load_checkpoint(ckpt, policy, rank=0)
    finally:
        checkpoint.set_rng_state(rng)
    optim = get_optimizer_state_dict(policy.model, policy.optimizer, options=StateDictOptions(full_state_dict=True))
    return dict(policy.named_full_parameters()), optim, policy.scheduler.get_last_lr()


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resume_reads_the_files_on_rank_0_only_and_every_rank_gets_the_saved_state(worker_run, layout):
    """Loading checkpoint 1 (after a third update moved every rank's weights and optimizer state away from it):
    rank 0 alone opens model.safetensors and optimizer.pt (each rank its own RNG file), and every rank ends with
    the full weights, optimizer state and LR that one process loading the same checkpoint gets: bit for bit,
    whether the shards are FSDP2's, tensor-parallel or both (a 2-D mesh)."""
    run_dir, model, reports = worker_run(layout)
    weights, optim, lr = _single_process_load(model, run_dir / "checkpoints" / "step_000001")
    assert optim["state"] and all(s["exp_avg"].abs().sum() > 0 for s in optim["state"].values())
    for rank, report in enumerate(reports):
        files = ["model.safetensors", "optimizer.pt"] if rank == 0 else []
        assert report["load_reads"] == [*files, f"rank_{rank}.pt"], (layout, rank)
        assert report["step"] == 1 and report["lr"] == lr
        assert report["load_changed_weights"], (layout, rank, "the load had nothing to restore")
        assert report["weights"].keys() == weights.keys()
        for name, w in weights.items():
            assert torch.equal(report["weights"][name], w), (layout, rank, name)
        got = report["optimizer"]
        assert got["param_groups"] == optim["param_groups"], (layout, rank)
        assert got["state"].keys() == optim["state"].keys()
        for name, state in optim["state"].items():
            assert got["state"][name].keys() == state.keys()
            for key, value in state.items():
                assert torch.equal(got["state"][name][key], value), (layout, rank, name, key)


def test_rank_0_alone_hashes_and_every_rank_makes_the_same_pick(worker_run):
    """Checkpoint 2's weights have a flipped byte. trainer.resume=auto: rank 0 hashes checkpoint 2's files up to
    the damaged one, then all of checkpoint 1's; rank 1 hashes nothing, and both resume checkpoint 1, which both
    see checkpoint 2 set aside for. Checkpoint 2 named explicitly (before): both ranks raise the same
    CheckpointError naming it and the damaged file. Writing the checkpoints, too, rank 1 hashed nothing."""
    run_dir, _, (r0, r1) = worker_run("fsdp2")
    manifest = {  # checkpoint 2 was set aside by the auto pick
        step: list(json.loads((run_dir / "checkpoints" / name / "manifest.json").read_text())["files"])
        for step, name in ((1, "step_000001"), (2, "damaged_step_000002"))
    }
    damaged = manifest[2].index("policy/model.safetensors")
    names = {step: [Path(rel).name for rel in files] for step, files in manifest.items()}
    assert r0["auto_hashed"] == names[2][: damaged + 1] + names[1]
    assert r0["named_hashed"] == names[2][: damaged + 1]
    assert r0["save_hashed"] == names[1] + names[2]
    assert r1["auto_hashed"] == r1["named_hashed"] == r1["save_hashed"] == []

    assert r0["auto"] == r1["auto"] == ("step_000001", None)
    assert r0["after_auto"] == r1["after_auto"] == ["damaged_step_000002", "step_000001"]  # set aside once, by rank 0
    assert r0["named"] == r1["named"]
    ckpt, error = r1["named"]
    assert ckpt is None
    assert f"checkpoint {run_dir / 'checkpoints' / 'step_000002'} is unusable" in error
    assert "policy/model.safetensors does not match its checksum" in error


def test_ranks_wait_for_rank_0s_file_work_in_the_host_barrier(worker_run):
    """Every barrier each rank entered while rank 0 wrote, hashed, fsynced and renamed a checkpoint, while it
    picked the checkpoint to resume, and before each broadcast of a load (rank 0 reading the files) was the
    gloo host group's: none of the default group."""
    _, _, reports = worker_run("fsdp2")
    for rank, report in enumerate(reports):
        # after the weights, after the optimizer state, after the RNG files, after the manifest and rename
        assert report["save_1_barriers"] == report["save_2_barriers"] == ["host"] * 4, rank
        assert report["pick_barriers"] == ["host", "host"], rank  # one per pick: auto, then the named one
        assert report["load_barriers"][:2] == ["host", "host"], rank  # weights, then optimizer state
