"""A first run is quiet: vLLM's start-up report (its engine config, ~30 INFO lines before step 1) is hidden unless
asked for, and a warning vLLM repeats is shown once (issue 18, point 9). Real runs with the real vLLM engine."""

from __future__ import annotations

import os
import re

import pytest

from test_e2e import run_plugrl, tiny_overrides

VLLM_INFO = re.compile(r"\bINFO \d\d-\d\d [\d:]+ \[[\w.]+\.py:\d+\]")  # vLLM's own format: INFO 11-26 15:33:45 [x.py:1]
REPEATED = "CPU backend doesn't allow to use `torch.set_num_threads`"  # vLLM's CPU worker says it at every call


def _train(tiny_model, tmp_path, *extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}  # the user's variable would win
    proc = run_plugrl(
        [
            "train",
            "examples/countdown_grpo.yaml",
            *tiny_overrides(tiny_model, tmp_path, 2),
            "rollout.name=vllm",
            *extra,
        ],
        env=env,
    )
    return proc.stdout + proc.stderr


@pytest.mark.slow  # a real vLLM run, ~30 s: CI runs it (make test-all)
def test_a_vllm_run_hides_the_engine_report_and_says_a_repeated_warning_once(tiny_model, tmp_path):
    out = _train(tiny_model, tmp_path, "rollout.cpu_kv_cache_gb=0.25")
    assert "step 2/2" in out
    assert not VLLM_INFO.search(out), VLLM_INFO.search(out).group(0)
    assert "non-default args" not in out and "Initializing a V1 LLM engine" not in out
    assert out.count(REPEATED) <= 1


@pytest.mark.slow
def test_the_engine_report_comes_back_with_verbose(tiny_model, tmp_path):
    out = _train(tiny_model, tmp_path, "rollout.cpu_kv_cache_gb=0.25", "--verbose")  # = rollout.engine_log_level=info
    assert VLLM_INFO.search(out) and "non-default args" in out
