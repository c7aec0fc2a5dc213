"""Two training steps of multi-turn episodes on the tiny model, as the environment tests run them."""

from __future__ import annotations

import json
from pathlib import Path


def train_two_steps(tmp_path: Path, model: Path, name: str, overrides: list[str]) -> tuple[list[dict], list[dict]]:
    """``plugrl.trainer.train`` for 2 steps of 2 prompts x 2 episodes (HF engine, float32, up to 2 turns of 12
    tokens), then ``overrides``; returns the metrics of both steps and the rollout rows of step 1."""
    from plugrl.config import load_config
    from plugrl.trainer import train

    (tmp_path / "base.yaml").write_text(f"model:\n  path: {model}\n")
    defaults = [
        "model.dtype=float32",
        "data.train_batch_size=2",
        "data.max_prompt_length=256",
        "data.max_response_length=64",
        "rollout.name=hf",
        "rollout.n=2",
        "rollout.max_turns=2",
        "rollout.max_turn_tokens=12",
        "trainer.total_steps=2",
        "trainer.save_freq=0",
        f"trainer.output_dir={tmp_path}",
        f"trainer.experiment_name={name}",
        "trainer.logger=[jsonl]",
    ]
    train(load_config(tmp_path / "base.yaml", [*defaults, *overrides]))
    run = tmp_path / name
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [json.loads(line) for line in (run / "rollouts" / "step_000001.jsonl").read_text().splitlines()]
    return metrics, rows
