"""FSDP2 training in two real processes (gloo on CPU), under torchrun and under accelerate launch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_e2e import ROOT, tiny_overrides

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
# `--cpu` would start one process; `--multi_gpu` starts torch.distributed workers, which find no GPU here
ACCELERATE = [
    str(Path(sys.executable).parent / "accelerate"),
    "launch",
    "--multi_gpu",
    "--num_processes=2",
    "--num_machines=1",
    "--mixed_precision=no",
    "--dynamo_backend=no",
]


@pytest.mark.parametrize(
    ("launcher", "engine"),
    [(TORCHRUN, "hf"), (TORCHRUN, "vllm"), (ACCELERATE, "hf")],
    ids=["torchrun-hf", "torchrun-vllm", "accelerate-hf"],
)
def test_two_process_fsdp2_training_run(tiny_model, tmp_path, launcher, engine):
    cmd = [
        *launcher,
        "-m",
        "plugrl.cli",
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, 2),
        "data.train_batch_size=4",
        f"rollout.name={engine}",
        "rollout.cpu_kv_cache_gb=0.25",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    run_dir = tmp_path / "e2e"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]  # rank 0 alone writes
    # 4 prompts x 4 samples over 2 ranks: each rank generated and trained its half, rank 0 gathered them
    rollouts = (run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()
    assert len(rollouts) == 16
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "rng" / "rank_0.pt").is_file() and (ckpt / "rng" / "rank_1.pt").is_file()
    assert (ckpt / "policy" / "model.safetensors").is_file()
    assert lines[-1]["actor/optimizer_steps"] == 1
    assert Path(ckpt / "optimizer.pt").stat().st_size > 0
