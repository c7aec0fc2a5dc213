"""A real training run whose reward is an LLM verifier on a real server that goes away mid-run and comes back.

The trainer (``plugrl train``, a subprocess; the tiny random model on the HF engine) scores every sample
with the ``tinyv`` reward (``setup: tinyv_only``: one verifier request per sample) against the real
SmolLM2-135M-Instruct behind vLLM's OpenAI API, reached through a TCP relay in this process. The test
watches ``metrics.jsonl``: once step 1 is logged with real verdicts it stops the relay (for the trainer,
the server is gone: connections reset, new ones refused), waits for a step whose every verification
failed and fell back, then starts the relay again on the same port. The same trainer process must
finish every step, and the steps after the outage must be scored by the verifier again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tcp_relay import Relay

pytest_plugins = ["openai_server"]

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data" / "tinyv_tiny.jsonl"  # 16 problems, data_source math_tinyv
STEPS = 6
BATCH, N = 2, 2  # 4 verifications per step
RETRIES = 1  # 2 requests per failed verification


def read_metrics(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            break
    return out


def write_config(tmp_path: Path, model: Path, relay: Relay, served_model: str) -> Path:
    config = tmp_path / "outage.yaml"
    config.write_text(
        json.dumps(  # JSON is YAML
            {
                "plugins": ["tinyv", "advantages"],
                "model": {"path": str(model), "dtype": "float32"},
                "data": {
                    "train_files": [str(DATA)],
                    "question_field": "problem",
                    "answer_field": "answer",
                    "train_batch_size": BATCH,
                    "max_prompt_length": 256,
                    "max_response_length": 16,
                },
                "rollout": {"name": "hf", "n": N},
                "actor": {"optim": {"lr": 1e-4}},
                "reward": {
                    "timeout_s": 60,
                    "options": {
                        "tinyv": {
                            "setup": "tinyv_only",  # every sample asks the verifier
                            "model": served_model,
                            "base_url": relay.base_url,
                            "max_tokens": 8,
                            "request_timeout_s": 30,
                            "retries": RETRIES,
                            "backoff_s": 0.05,
                            "fallback": "rule",
                        }
                    },
                },
                "trainer": {
                    "total_steps": STEPS,
                    "output_dir": str(tmp_path),
                    "experiment_name": "outage",
                    "save_freq": 0,
                    "logger": ["console", "jsonl"],
                },
            }
        )
    )
    return config


def wait_for(predicate, proc: subprocess.Popen, timeout_s: float, what: str, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        if proc.poll() is not None:
            result = predicate()
            if result:
                return result
            pytest.fail(f"the trainer exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}:\n{log.read_text()[-4000:]}")


@pytest.mark.slow
def test_training_survives_the_verifier_going_away_and_coming_back(openai_server, tiny_model, tmp_path):
    relay = Relay(openai_server.port)
    relay.start()
    config = write_config(tmp_path, tiny_model, relay, openai_server.model)
    run_dir = tmp_path / "outage"
    metrics_path = run_dir / "metrics.jsonl"
    log = tmp_path / "train.log"
    served_before = openai_server.requests_served()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "plugrl.cli", "train", str(config)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        t_start = time.monotonic()
        # up: step 1 scored by the verifier
        first = wait_for(lambda: read_metrics(metrics_path)[:1], proc, 240, "step 1", log)[0]
        relay.stop()
        t_down = time.monotonic()
        assert first["reward/tinyv/verifier_failed"] == 0.0, first

        # down: a step where every verification failed, each after RETRIES + 1 requests, scored by the fallback
        def all_failed():
            return [m for m in read_metrics(metrics_path) if m.get("reward/tinyv/verifier_failed") == 1.0]

        down = wait_for(all_failed, proc, 120, "a step scored while the verifier was down", log)[0]
        relay.start()
        t_up = time.monotonic()
        down_step = down["step"]
        # the steps logged so far, and the one under way, may have been scored without the server
        last_unsure = len(read_metrics(metrics_path)) + 1
        assert last_unsure < STEPS, f"the outage lasted until step {last_unsure}: too few steps left to recover"
        assert down["reward/tinyv/requests"] == RETRIES + 1
        assert down["reward/tinyv/mean"] == down["reward/tinyv/rule"]  # fallback: the rule's score
        assert down["reward/errors"] == 0 and down["reward/timeouts"] == 0  # failures are handled, not errors
        assert down["reward/time_s"] < 10, "refused connections should cost milliseconds, not the request timeout"

        # up again: the same process finishes every step; the steps after the outage get real verdicts
        rc = proc.wait(timeout=240)
        t_end = time.monotonic()
        output = log.read_text()
        assert rc == 0, output[-4000:]
    finally:
        relay.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    m = read_metrics(metrics_path)
    assert [x["step"] for x in m] == list(range(1, STEPS + 1)), "a step is missing or was logged twice"
    assert "resumed from" not in output
    failed = {x["step"]: x["reward/tinyv/verifier_failed"] for x in m}
    # why each sample's verification failed: the server unreachable, or a reply without a verdict (a 135M
    # verifier sometimes answers neither True nor False; that is counted too, but it is not the outage)
    down_samples = {s: [d for d in details(run_dir, s) if d["tinyv/verifier_failed"]] for s in failed}
    unreachable = {s: sum(is_connection_failure(d) for d in fails) for s, fails in down_samples.items()}
    assert unreachable[1] == 0 and unreachable[down_step] == BATCH * N, unreachable
    # the plugin's own count (plugrl_step_metrics): every sample of the outage step failed its verification
    counts = {x["step"]: x["verifier/failures"] for x in m}
    assert counts[down_step] == BATCH * N and all(counts[s] == len(down_samples[s]) for s in counts), counts
    # every step begun after the relay came back reached the server
    after = [s for s in failed if s > last_unsure]
    assert after, failed
    assert all(unreachable[s] == 0 for s in after), unreachable
    verdicts = [d["tinyv/verdict"] for s in after for d in details(run_dir, s)]
    assert sum(v is not None for v in verdicts) >= len(verdicts) // 2, verdicts  # real verdicts, not the fallback
    # the server saw the requests of the steps before and after the outage
    served = openai_server.requests_served() - served_before
    assert served >= BATCH * N * (1 + len(after)), served
    print(
        f"\noutage: step 1 logged {t_down - t_start:.1f}s after start; relay down {t_up - t_down:.1f}s; "
        f"run finished {t_end - t_up:.1f}s later; verifier_failed per step {failed}; connection failures "
        f"per step {unreachable}; reward/time_s during the outage {down['reward/time_s']:.3f}s; "
        f"requests served {served}"
    )


def details(run_dir: Path, step: int) -> list[dict]:
    path = run_dir / "rollouts" / f"step_{step:06d}.jsonl"
    return [json.loads(line)["details"] for line in path.read_text().splitlines()]


def is_connection_failure(d: dict) -> bool:
    return "Connection" in (d.get("tinyv/failure") or "")
