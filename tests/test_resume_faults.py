"""Resume faults: damaged checkpoints are skipped, only the last K are kept, and the stop after
``trainer.max_bad_steps`` non-finite steps in a row keeps the last good weights."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from plugrl import checkpoint
from plugrl.trainer import Trainer
from test_actor import _policy
from test_e2e import ROOT, metrics, tiny_overrides


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_file(ckpt / "policy" / "model.safetensors")


def test_damaged_checkpoints_are_skipped_and_only_the_last_k_are_kept(tiny_model, smol_tokenizer, tmp_path, caplog):
    """5 real checkpoints (weights changed between saves) with keep=3: steps 3, 4, 5 remain. A flipped byte in
    step 5's weights, then step 4's manifest deleted: `latest_checkpoint` falls back to 4, then to 3, warning
    about each skipped one by name; the fallback loads step 3's weights; `trainer.resume=<path>` refuses 5. A 6th
    save sets the damaged 4 and 5 aside and keeps step 3 (tests/test_checkpoint_retention.py tests the rule)."""
    policy = _policy(tiny_model)
    run_dir = tmp_path / "run"
    saved = {}
    param = policy.model.model.layers[0].mlp.down_proj.weight
    for step in range(1, 6):
        with torch.no_grad():
            param.add_(0.01 * step)  # each checkpoint holds different weights
        saved[step] = param.detach().clone()
        checkpoint.save_checkpoint(run_dir, step, policy, smol_tokenizer, {"data": {}}, keep=3, rank=0)
    ckpts = checkpoint.list_checkpoints(run_dir)
    assert [p.name for p in ckpts] == ["step_000003", "step_000004", "step_000005"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [p.name for p in ckpts], "leftovers"
    assert all(checkpoint.verify(p) is None for p in ckpts)
    assert checkpoint.latest_checkpoint(run_dir) == ckpts[-1]

    # one flipped byte in the middle of the newest checkpoint's weights: same size, wrong sha256
    weights = ckpts[-1] / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="plugrl.checkpoint")
    caplog.clear()
    assert checkpoint.latest_checkpoint(run_dir) == ckpts[1]
    skipped = [r.getMessage() for r in caplog.records if r.name == "plugrl.checkpoint"]
    assert len(skipped) == 1, skipped
    assert "step_000005" in skipped[0] and "policy/model.safetensors does not match its checksum" in skipped[0]

    # the manifest of step 4 gone as well (a write that never finished): both skipped, step 3 used
    (ckpts[1] / "manifest.json").unlink()
    caplog.clear()
    assert checkpoint.latest_checkpoint(run_dir) == ckpts[0]
    skipped = [r.getMessage() for r in caplog.records if r.name == "plugrl.checkpoint"]
    assert len(skipped) == 2, skipped
    assert "step_000005" in skipped[0] and "checksum" in skipped[0]
    assert "step_000004" in skipped[1] and "no manifest.json" in skipped[1]

    # the fallback is usable: loading it restores step 3's weights
    state = checkpoint.load_checkpoint(ckpts[0], policy, rank=0)
    assert state["step"] == 3
    assert torch.equal(param, saved[3]) and not torch.equal(saved[3], saved[5])

    # a damaged checkpoint named explicitly is refused before anything is loaded
    for name, problem in (("step_000005", "does not match its checksum"), ("step_000004", "no manifest.json")):
        fake = SimpleNamespace(cfg=SimpleNamespace(trainer=SimpleNamespace(resume=str(run_dir / "checkpoints" / name))))
        with pytest.raises(checkpoint.CheckpointError, match=problem):
            Trainer._maybe_resume(fake)

    # a sixth save keeps the newest 3 *good* ones: 5 and 4 are damaged, set aside (not deleted, not counted), so
    # step 3 stays and nothing is deleted
    checkpoint.save_checkpoint(run_dir, 6, policy, smol_tokenizer, {"data": {}}, keep=3, rank=0)
    assert [p.name for p in checkpoint.list_checkpoints(run_dir)] == ["step_000003", "step_000006"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "damaged_step_000004",
        "damaged_step_000005",
        "step_000003",
        "step_000006",
    ]
    assert checkpoint.latest_checkpoint(run_dir).name == "step_000006"

    # a file of the newest one gone: step 3, which the pruning kept, is still there to resume
    (run_dir / "checkpoints" / "step_000006" / "trainer_state.json").unlink()
    caplog.clear()
    assert checkpoint.latest_checkpoint(run_dir) == ckpts[0]
    skipped = [r.getMessage() for r in caplog.records if r.name == "plugrl.checkpoint"]
    assert len(skipped) == 1 and "step_000006" in skipped[0] and "trainer_state.json is missing" in skipped[0]


def test_max_bad_steps_in_a_row_stop_with_the_last_good_weights(tiny_model, tmp_path, monkeypatch, capsys):
    """Gradient norms forced to NaN in steps 1, 3 and 4 of 6 (trainer.max_bad_steps=2): the good step 2
    resets the count, so the run stops after step 4 with exit code 3 and the message; the step-4
    checkpoint holds exactly step 2's weights (steps 3 and 4 applied no update), which differ from the
    starting weights (step 2 did update)."""
    from plugrl import cli
    from plugrl.trainer import Trainer as T

    current = {"step": 0}
    train_step = T.train_step

    def tracked(self, step):
        current["step"] = step + 1  # 1-based, as logged
        return train_step(self, step)

    real_clip = torch.nn.utils.clip_grad_norm_

    def clip(params, max_norm, *a, **kw):
        norm = real_clip(params, max_norm, *a, **kw)
        return torch.tensor(float("nan")) if current["step"] in (1, 3, 4) else norm

    monkeypatch.setattr(T, "train_step", tracked)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    overrides = [*tiny_overrides(tiny_model, tmp_path, 6), "trainer.max_bad_steps=2", "actor.optim.lr=1e-2"]
    code = cli.main(["train", str(ROOT / "examples/countdown_grpo.yaml"), *overrides])
    err = capsys.readouterr().err
    assert code == 3, err[-3000:]
    run_dir = tmp_path / "e2e"
    assert "plugrl: training stopped: 2 steps in a row had non-finite gradients" in err
    assert f"last good weights in {run_dir / 'checkpoints' / 'step_000004'}" in err
    logged = metrics(run_dir)
    assert [m["step"] for m in logged] == [1, 2, 3, 4]
    assert [m["actor/skipped_updates"] for m in logged] == [1.0, 0.0, 1.0, 1.0]

    start = load_file(tiny_model / "model.safetensors")
    stopped, good = _weights(run_dir / "checkpoints" / "step_000004"), _weights(run_dir / "checkpoints" / "step_000002")
    assert stopped.keys() == good.keys()
    assert all(torch.equal(stopped[k], good[k]) for k in good), "an update was applied in a bad step"
    assert any(not torch.equal(good[k], start[k].to(good[k].dtype)) for k in start if k in good), (
        "step 2 learned nothing"
    )
    state = json.loads((run_dir / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert state["step"] == 4 and state["data"]["position"] == 8
