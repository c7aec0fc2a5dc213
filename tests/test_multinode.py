"""A two-"node" training run on one machine, and its resume with another world size.

Two ``torchrun --nnodes=2 --nproc_per_node=1`` launches meet at a c10d rendezvous on 127.0.0.1 (gloo
over the loopback interface), exactly as two hosts would meet at the first host's address; each node
runs one rank that generates for its own prompts (HF engine) and trains its FSDP2 shard. The run
checkpoints after step 3; a single process then resumes the same run directory and continues.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest
import torch

from plugrl_rollout_servers.remote import free_port
from test_e2e import ROOT, tiny_overrides


def _overrides(tiny_model, tmp_path, steps: int) -> list[str]:
    return [
        *tiny_overrides(tiny_model, tmp_path, steps),
        "data.train_batch_size=4",  # 2 prompts per node; 4 in the single-process resume
        "trainer.save_freq=3",
    ]


def _adam_steps(ckpt) -> set[int]:
    state = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=False)["state"]
    return {int(s["step"]) for s in state.values()}


def _two_nodes(overrides: list[str], rdzv_id: str) -> None:
    """One training job as two ``torchrun --nnodes=2`` launches meeting at a c10d rendezvous on 127.0.0.1."""
    port = free_port()
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node_rank={node}",  # informational with c10d: the rendezvous assigns ranks
                "--nproc_per_node=1",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={rdzv_id}",
                "-m",
                "plugrl.cli",
                "train",
                "examples/countdown_grpo.yaml",
                *overrides,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for node in (0, 1)
    ]
    outputs = []
    try:
        for p in nodes:
            outputs.append(p.communicate(timeout=300)[0])
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    for node, (p, out) in enumerate(zip(nodes, outputs, strict=True)):
        assert p.returncode == 0, f"node {node} failed:\n{out[-20000:]}"


@pytest.mark.slow
def test_two_node_run_then_resume_with_one_process(tiny_model, tmp_path):
    _two_nodes(_overrides(tiny_model, tmp_path, 3), "plugrl-multinode-test")

    run_dir = tmp_path / "e2e"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    ckpt = run_dir / "checkpoints" / "step_000003"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["step"] == 3
    # both ranks' RNG states are in the checkpoint (each node wrote its own into the shared run dir)
    assert {"rng/rank_0.pt", "rng/rank_1.pt"} <= set(manifest["files"])
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["step"] == 3
    assert state["data"]["position"] == 12  # 3 steps x 4 prompts
    assert _adam_steps(ckpt) == {3}
    # 4 prompts x 4 samples a step, half generated on each node, gathered by rank 0
    assert len((run_dir / "rollouts" / "step_000003.jsonl").read_text().splitlines()) == 16

    # the same run dir, one process (world size 1): resumes at step 3 and continues to 5
    proc = subprocess.run(
        [sys.executable, "-m", "plugrl.cli", "train", "examples/countdown_grpo.yaml"]
        + _overrides(tiny_model, tmp_path, 5),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "resumed from" in proc.stdout + proc.stderr
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5]
    last = run_dir / "checkpoints" / "step_000005"
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["world_size"] == 1 and state["step"] == 5
    assert state["data"]["position"] == 20  # continued after the 12 prompts of steps 1-3
    assert state["policy_scheduler"]["last_epoch"] == 5
    # AdamW's step counter continued from the checkpoint's 3 (a fresh optimizer would be at 2)
    assert _adam_steps(last) == {5}


@pytest.mark.slow
def test_two_training_nodes_and_a_rollout_server_node(tiny_model, tmp_path):
    """The layout of docs/scaling.md, "Rollout servers": two training "nodes" (torchrun --nnodes=2 over the
    loopback) and a third that only generates (`plugrl rollout-serve`, given as rollout.server_urls), the weights
    going to it over HTTP as they would across hosts, and generation running one step ahead of training
    (trainer.off_policy_steps=1). Both ranks share the server; rank 0 pushes each update, which the server counts."""
    import plugrl_model_servers as servers

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "plugrl.cli",
        "rollout-serve",
        str(tiny_model),
        "rollout.name=hf",
        "rollout.dtype=float32",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
    ]
    server = servers.start_command(lambda: command, str(tiny_model), port, log_path=tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        _two_nodes(
            [
                *_overrides(tiny_model, tmp_path, 3),
                "rollout.mode=server",
                f"rollout.server_urls=[{url}]",
                "rollout.weight_transport=http",
                "trainer.off_policy_steps=1",
            ],
            "plugrl-rollout-node-test",
        )
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())
    finally:
        servers.stop(server.port)
    lines = [json.loads(x) for x in (tmp_path / "e2e" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert [m["rollout/policy_lag"] for m in lines] == [0.0, 1.0, 1.0]
    assert health["weights_version"] == 4  # the starting push, then one after each of the 3 updates
    assert len((tmp_path / "e2e" / "rollouts" / "step_000003.jsonl").read_text().splitlines()) == 16
