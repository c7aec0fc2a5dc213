"""Stopping on signals, skipped non-finite updates."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time

import pytest
import torch

from plugrl import checkpoint
from test_actor import _batch, _policy
from test_e2e import PLUGRL, ROOT, metrics, run_plugrl, tiny_overrides


@pytest.mark.slow
def test_sigterm_finishes_the_step_checkpoints_and_exits_0_then_resumes(tiny_model, tmp_path):
    args = [
        *PLUGRL,
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


@pytest.mark.slow
def test_a_single_sigint_finishes_the_step_checkpoints_and_exits_0_then_resumes(
    tiny_model, tmp_path, monkeypatch, caplog
):
    """In process: SIGINT (Ctrl-C) arrives at the start of step 1; the step still finishes, is checkpointed and
    logged, the run exits 0 with the resume hint, the handler restored; the same command resumes at step 1."""
    from plugrl import cli
    from plugrl.trainer import Trainer

    train_step = Trainer.train_step
    sent = []

    def interrupted(self, step):
        if not sent:
            sent.append(step)
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs at once, in this (the main) thread
        return train_step(self, step)

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    caplog.set_level(logging.INFO)
    handler_before = signal.getsignal(signal.SIGINT)
    args = ["train", str(ROOT / "examples/countdown_grpo.yaml"), *tiny_overrides(tiny_model, tmp_path, 3)]
    assert cli.main([*args, "trainer.save_freq=100"]) == 0
    assert sent == [0]
    logs = caplog.text
    assert "SIGINT: stopping after this step, with a checkpoint" in logs
    assert "stopped by SIGINT after step 1; checkpoint saved. Run the same command again to resume" in logs
    run_dir = tmp_path / "e2e"
    assert [m["step"] for m in metrics(run_dir)] == [1]
    ckpt = run_dir / "checkpoints" / "step_000001"
    assert checkpoint.verify(ckpt) is None and checkpoint.list_checkpoints(run_dir) == [ckpt]
    assert signal.getsignal(signal.SIGINT) is handler_before, "the SIGINT handler was not restored"

    monkeypatch.setattr(Trainer, "train_step", train_step)
    caplog.clear()
    # the same command with total_steps=1: resumes at step 1, the job is done (step 1 is not run again)
    assert cli.main([*args[:2], *tiny_overrides(tiny_model, tmp_path, 1)]) == 0
    assert f"resumed from {ckpt} at step 1" in caplog.text
    assert [m["step"] for m in metrics(run_dir)] == [1]


@pytest.mark.slow
def test_a_second_sigterm_during_vllm_generation_stops_at_once(tiny_model, tmp_path):
    """The first SIGTERM asks for a stop after the step; a second one, while the in-process vLLM engine
    is still generating that step (1,700 tokens a sample take ~18 s here), ends the process in seconds:
    exit code 143, a message saying how to resume, no traceback, no step logged."""
    args = [
        *PLUGRL,
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, 3),
        "rollout.name=vllm",
        "rollout.cpu_kv_cache_gb=0.25",
        "data.max_response_length=1700",  # a random model never stops early: every sample runs 1,700 tokens
    ]
    out = tmp_path / "out.log"

    def wait_for(text: str, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        while text not in out.read_text():
            assert proc.poll() is None, f"exited ({proc.returncode}) before {text!r}:\n{out.read_text()[-3000:]}"
            assert time.time() < deadline, f"no {text!r} after {timeout_s}s:\n{out.read_text()[-3000:]}"
            time.sleep(0.1)

    with open(out, "w") as sink:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for("plugrl.trainer: training", 120)  # the engine is built: step 1's generation starts now
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        wait_for("SIGTERM: stopping after this step", 10)  # the handler runs while vLLM generates
        proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        proc.wait(timeout=15)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = out.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, log[-3000:]
    assert took < 10, f"the second SIGTERM took {took:.1f}s to stop the run"
    assert "SIGTERM again: stopping now" in log and "resume from the last checkpoint" in log
    assert "Traceback" not in log, log[-3000:]
    metrics_file = tmp_path / "e2e" / "metrics.jsonl"
    assert not metrics_file.is_file() or not metrics_file.read_text().strip(), "step 1 finished: not mid-generation"


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


def _comparable(run_dir):
    skip = ("timing/", "perf/", "reward/time_s")
    return [{k: v for k, v in m.items() if not k.startswith(skip)} for m in metrics(run_dir)]


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(tiny_model, tmp_path):
    """One training job SIGKILLed 5 times at random moments (the first inside a checkpoint write), resumed
    after each kill; every resume continues exactly: the logged steps so far equal an uninterrupted run's,
    and the finished job has the same per-step metrics and bitwise the same weights.

    Kills 1-4 are timed from training progress, not from the launch, so a slow start under load cannot turn
    the test into a comparison of two uninterrupted runs: each waits for the relaunch's first new complete
    checkpoint, then a random 0-1 s (mid-step, mid-generation or mid-write; at the latest when a second
    new checkpoint appears). Each launch's output goes to a file, and every launch that found a complete
    checkpoint must log that it resumed from it."""
    import random

    from safetensors.torch import load_file

    steps = 8
    base = [*tiny_overrides(tiny_model, tmp_path, steps), "trainer.save_freq=1"]
    run_plugrl(["train", "examples/countdown_grpo.yaml", *base, "trainer.experiment_name=reference"])
    reference = _comparable(tmp_path / "reference")
    run_dir = tmp_path / "killed"
    args = [
        *PLUGRL,
        "train",
        "examples/countdown_grpo.yaml",
        *base,
        "trainer.experiment_name=killed",
    ]

    def newest_step() -> int:
        found = checkpoint.list_checkpoints(run_dir)
        return int(found[-1].name.removeprefix("step_")) if found else 0

    rng = random.Random(1234)
    resumed_at = []  # per relaunch after kill 0: the step it resumed from (None: started fresh)
    for kill in range(5):
        ready = checkpoint.latest_checkpoint(run_dir)  # what this launch must resume from
        launched_at = newest_step()
        # kill 0: the checkpoint write pauses before its manifest, and the kill lands there
        env = dict(os.environ, PLUGRL_TEST_CHECKPOINT_PAUSE_S="3" if kill == 0 else "0")
        out = tmp_path / f"launch_{kill}.log"
        with open(out, "w") as sink:
            proc = subprocess.Popen(args, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env)
        deadline, delay, progress_at = time.time() + 300, rng.uniform(0.0, 1.0), None
        mid_write = False
        while proc.poll() is None and time.time() < deadline:
            if kill == 0:
                mid_write = bool(list((run_dir / "checkpoints").glob(".tmp_step_*")))
                if mid_write:
                    break
            elif progress_at is None:
                if newest_step() > launched_at:
                    progress_at = time.time()
            elif time.time() - progress_at > delay or newest_step() > launched_at + 1:
                break  # at most 2 new checkpoints per launch: the job cannot finish before its last kill
            time.sleep(0.01)
        proc.kill()
        proc.wait()
        log = out.read_text()
        if kill == 0:
            assert mid_write, f"the first kill should have landed inside a checkpoint write:\n{log[-3000:]}"
            assert ready is None and "resumed from" not in log
        else:
            assert progress_at is not None, f"launch {kill} wrote no checkpoint in 300 s:\n{log[-3000:]}"
            if ready is None:
                assert "resumed from" not in log, log[-3000:]
                resumed_at.append(None)
            else:
                step = int(ready.name.removeprefix("step_"))
                assert f"resumed from {ready} at step {step}" in log, f"launch {kill} did not resume:\n{log[-3000:]}"
                resumed_at.append(step)
        logged = _comparable(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
        assert logged == reference[: len(logged)], f"kill {kill}: the steps logged so far differ"
    # kill 0 left no complete checkpoint; every later launch wrote one before its kill: launches 2-4 resumed,
    # each from a later step than the one before
    assert resumed_at[0] is None and all(s is not None for s in resumed_at[1:]), resumed_at
    assert resumed_at[1:] == sorted(set(resumed_at[1:])), resumed_at
    ready = checkpoint.latest_checkpoint(run_dir)
    assert ready is not None and int(ready.name.removeprefix("step_")) > resumed_at[-1]
    proc = run_plugrl(["train", "examples/countdown_grpo.yaml", *base, "trainer.experiment_name=killed"])
    assert f"resumed from {ready} at step" in proc.stderr
    assert _comparable(run_dir) == reference
    final = load_file(run_dir / "checkpoints" / f"step_{steps:06d}" / "policy" / "model.safetensors")
    expected = load_file(tmp_path / "reference" / "checkpoints" / f"step_{steps:06d}" / "policy" / "model.safetensors")
    assert all(torch.equal(final[k], expected[k]) for k in expected), "weights differ from the uninterrupted run"
