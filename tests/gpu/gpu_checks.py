"""Assertions the GPU tests share: a finished step, its checkpoint, a resume. Imports torch/safetensors/yaml
lazily (inside the functions) so the modules importing this still collect where those are missing."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_runs import PROMPTS_PER_STEP, ROLLOUT_N, check_step_metrics, metrics


def expected_dtype() -> str:
    """What model.dtype=auto must become on this GPU: bf16 from Ampere (compute capability 8.0) on."""
    import torch

    return "bfloat16" if torch.cuda.get_device_capability(0) >= (8, 0) else "float32"


def check_resolved_dtype(run_dir: Path) -> None:
    import yaml

    ran = yaml.safe_load((run_dir / "config.yaml").read_text())
    want = expected_dtype()
    assert ran["model"]["dtype"] == want, f"model.dtype=auto resolved to {ran['model']['dtype']}, want {want}"
    assert ran["rollout"]["dtype"] == want, ran["rollout"]


def load_policy(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(ckpt / "policy" / "model.safetensors")


def changed(before: dict, after: dict) -> list[str]:
    import torch

    return [k for k in before if k in after and not torch.equal(before[k].float(), after[k].float())]


def check_first_step(run_dir: Path, base_model: Path, *, world_size: int = 1, extra_metrics=()) -> dict:
    """Step 1 ran: finite metrics, every sample logged, checkpoint step_000001 complete and holding weights that
    are finite and differ from the base model's. Returns the checkpoint's policy weights."""
    import torch
    from safetensors.torch import load_file

    logged = metrics(run_dir)
    assert [m["step"] for m in logged] == [1], logged
    check_step_metrics(logged[0], extra_metrics)
    rollouts = (run_dir / "rollouts" / "step_000001.jsonl").read_text().splitlines()
    assert len(rollouts) == PROMPTS_PER_STEP * ROLLOUT_N  # rank 0 gathered every rank's samples
    ckpt = run_dir / "checkpoints" / "step_000001"
    assert (ckpt / "manifest.json").is_file(), f"no complete checkpoint in {ckpt}"
    assert (ckpt / "optimizer.pt").stat().st_size > 0
    for rank in range(world_size):
        assert (ckpt / "rng" / f"rank_{rank}.pt").is_file(), rank
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] == 1
    weights = load_policy(ckpt)
    bad = [k for k, v in weights.items() if not torch.isfinite(v).all()]
    assert not bad, f"non-finite weights after step 1: {bad[:5]}"
    base = load_file(base_model / "model.safetensors")
    assert changed(base, weights), "no weight changed in the first training step"
    return weights


def check_resumed_to_step_2(run_dir: Path, log: str, step1_weights: dict) -> None:
    """The second invocation (total_steps=2) resumed from step 1 and trained step 2."""
    assert "resumed from" in log and "at step 1" in log, "the second run did not resume from step 1"
    logged = metrics(run_dir)
    assert [m["step"] for m in logged] == [1, 2], [m["step"] for m in logged]
    check_step_metrics(logged[1])
    ckpt = run_dir / "checkpoints" / "step_000002"
    assert (ckpt / "manifest.json").is_file(), f"no complete checkpoint in {ckpt}"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["data"]["position"] == 2 * PROMPTS_PER_STEP, state  # global, all ranks
    assert changed(step1_weights, load_policy(ckpt)), "step 2 changed no weight"
