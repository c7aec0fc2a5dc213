"""Stopping on signals, skipped non-finite updates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import torch

from test_actor import _batch, _policy
from test_e2e import PLUGRL, ROOT, metrics, run_plugrl, tiny_overrides


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


def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(tiny_model, tmp_path):
    """One training job SIGKILLed 5 times at random moments (the first inside a checkpoint write), resumed
    after each kill; every resume continues exactly: the logged steps so far equal an uninterrupted run's,
    and the finished job has the same per-step metrics and bitwise the same weights."""
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
    rng = random.Random(1234)
    for kill in range(5):
        # kill 0: the checkpoint write pauses before its manifest, and the kill lands there
        env = dict(os.environ, PLUGRL_TEST_CHECKPOINT_PAUSE_S="3" if kill == 0 else "0")
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        start, delay = time.time(), rng.uniform(5.0, 9.0)
        mid_write = False
        while proc.poll() is None:
            mid_write = kill == 0 and bool(list((run_dir / "checkpoints").glob(".tmp_step_*")))
            if mid_write or (kill > 0 and time.time() - start > delay):
                break
            time.sleep(0.01)
        proc.kill()
        proc.wait()
        if kill == 0:
            assert mid_write, "the first kill should have landed inside a checkpoint write"
        logged = _comparable(run_dir) if (run_dir / "metrics.jsonl").is_file() else []
        assert logged == reference[: len(logged)], f"kill {kill}: the steps logged so far differ"
    run_plugrl(["train", "examples/countdown_grpo.yaml", *base, "trainer.experiment_name=killed"])
    assert _comparable(run_dir) == reference
    final = load_file(run_dir / "checkpoints" / f"step_{steps:06d}" / "policy" / "model.safetensors")
    expected = load_file(tmp_path / "reference" / "checkpoints" / f"step_{steps:06d}" / "policy" / "model.safetensors")
    assert all(torch.equal(final[k], expected[k]) for k in expected), "weights differ from the uninterrupted run"
