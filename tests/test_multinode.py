"""A two-"node" training run on one machine, and its resume with another world size.

Two ``torchrun --nnodes=2 --nproc_per_node=1`` launches meet at a c10d rendezvous on 127.0.0.1 (gloo
over the loopback interface), exactly as two hosts would meet at the first host's address; each node
runs one rank that generates for its own prompts (HF engine) and trains its FSDP2 shard. The run
checkpoints after step 3; a single process then resumes the same run directory and continues.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import torch

from test_e2e import ROOT, tiny_overrides


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _overrides(tiny_model, tmp_path, steps: int) -> list[str]:
    return [
        *tiny_overrides(tiny_model, tmp_path, steps),
        "data.train_batch_size=4",  # 2 prompts per node; 4 in the single-process resume
        "trainer.save_freq=3",
    ]


def _adam_steps(ckpt) -> set[int]:
    state = torch.load(ckpt / "optimizer.pt", map_location="cpu", weights_only=False)["state"]
    return {int(s["step"]) for s in state.values()}


def test_two_node_run_then_resume_with_one_process(tiny_model, tmp_path):
    port = _free_port()
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
                "--rdzv-id=plugrl-multinode-test",
                "-m",
                "plugrl.cli",
                "train",
                "examples/countdown_grpo.yaml",
                *_overrides(tiny_model, tmp_path, 3),
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
