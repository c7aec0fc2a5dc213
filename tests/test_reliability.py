"""Stopping on signals, skipped non-finite updates."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import torch

from test_actor import _batch, _policy
from test_e2e import ROOT, metrics, run_plugrl, tiny_overrides


def test_sigterm_finishes_the_step_checkpoints_and_exits_0_then_resumes(tiny_model, tmp_path):
    args = [
        sys.executable,
        "-m",
        "plugrl.cli",
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, 50),
        "trainer.save_freq=100",
    ]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "e2e" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (log.is_file() and log.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "stopped by SIGTERM" in err and "resume" in err
    done = [m["step"] for m in metrics(tmp_path / "e2e")]
    assert 2 <= len(done) < 50 and done == list(range(1, len(done) + 1))
    ckpt = tmp_path / "e2e" / "checkpoints" / f"step_{done[-1]:06d}"
    assert (ckpt / "manifest.json").is_file()
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["step"] == done[-1]

    proc = run_plugrl(["train", "examples/countdown_grpo.yaml", *tiny_overrides(tiny_model, tmp_path, done[-1] + 1)])
    assert f"at step {done[-1]}" in proc.stderr
    assert [m["step"] for m in metrics(tmp_path / "e2e")] == list(range(1, done[-1] + 2))


def test_non_finite_gradient_skips_the_update_and_keeps_weights(tiny_model):
    policy = _policy(tiny_model, optim={"lr": 1e-3})
    batch = _batch([[10, 11, 12, 40, 41], [10, 11, 12, 50, 51]], [3, 3])
    batch.advantages = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    # poison one layer's output: the loss and every gradient become NaN
    hook = policy.model.model.layers[0].register_forward_hook(lambda mod, inp, out: out * float("nan"))
    m = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=2)
    hook.remove()
    assert m["actor/skipped_updates"] == 1 and m["actor/optimizer_steps"] == 0
    for n, p in policy.model.named_parameters():
        assert torch.equal(p, before[n]), n
    m = policy.update(batch, num_mini_batches=1, temperature=1.0, norm_length=2)  # healthy again
    assert m["actor/optimizer_steps"] == 1
