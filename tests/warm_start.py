"""`python -m plugrl.cli ARGS` for the tests, forked from a process that has already imported torch and transformers.

A `plugrl` command spends most of a tiny test run importing torch and transformers (measured: 16 s of a 27 s run on
2 busy cores). Each test process starts one warm process (this file run as a script) that imports them once and
forks a child per command: the child is `python -m plugrl.cli ARGS` from then on (its own arguments, working
directory, environment, stdin from /dev/null, stdout and stderr to files), and imports plugrl itself afresh.

Commands run with another environment than this process's start a new interpreter as before: torch, transformers
and huggingface_hub read some variables when they are imported. PLUGRL_TESTS_COLD=1 starts a new interpreter for
every command.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# what `plugrl train` of a tiny model imports from other packages, most of its start (python -X importtime)
PRELOAD = (
    "torch",
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.fsdp",
    "transformers",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.masking_utils",
    "transformers.modeling_utils",
    "transformers.generation",
    "safetensors.torch",
    "numpy",
    "sympy",
    "pydantic",
    "jinja2",
    "yaml",
)


def run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess | None:
    """Run `python -m plugrl.cli *argv` in a child of the warm process; None where this process cannot use one."""
    warm = _warm_process()
    if warm is None or dict(os.environ) != _started_env[0]:
        return None
    with tempfile.TemporaryDirectory(prefix="plugrl-warm-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {"argv": argv, "cwd": str(cwd), "env": dict(os.environ), "stdout": str(out), "stderr": str(err)}
        warm.stdin.write(json.dumps(request) + "\n")
        warm.stdin.flush()
        pid = int(warm.stdout.readline())
        try:
            code = _wait_for_status(warm, timeout)
        except subprocess.TimeoutExpired:
            os.kill(pid, 9)
            warm.stdout.readline()  # the warm process reaps its child and says so
            raise subprocess.TimeoutExpired(["plugrl", *argv], timeout, out.read_text(), err.read_text()) from None
        return subprocess.CompletedProcess(["plugrl", *argv], code, out.read_text(), err.read_text())


_started: list[subprocess.Popen] = []
_started_env: list[dict[str, str]] = []  # the environment the warm process imported torch and transformers in


def _warm_process() -> subprocess.Popen | None:
    if os.environ.get("PLUGRL_TESTS_COLD") == "1":
        return None
    if _started and _started[0].poll() is None:
        return _started[0]
    _started.clear()
    _started_env[:] = [dict(os.environ)]
    proc = subprocess.Popen(
        [sys.executable, __file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        return None
    _started.append(proc)
    atexit.register(_stop, proc)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


def _wait_for_status(warm: subprocess.Popen, timeout: float) -> int:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(warm.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise subprocess.TimeoutExpired("plugrl", timeout)
    return int(warm.stdout.readline())


# -- the warm process --


def _child(request: dict) -> None:
    """In the forked child: become `python -m plugrl.cli ARGV` and exit as it does (atexit handlers included)."""
    import runpy

    fd_in = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd_in, 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    sys.stdin = open(0, closefd=False)  # the standard streams live as long as the process
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # line-buffered, as Python's own stderr
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    sys.argv = ["plugrl", *request["argv"]]
    runpy.run_module("plugrl.cli", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    reply = sys.stdout
    reply.write("ready\n")
    reply.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            reply.flush()
            _child(request)  # raises SystemExit: the child's interpreter ends as a plain `python -m` would
        reply.write(f"{pid}\n")
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(f"{os.waitstatus_to_exitcode(status)}\n")
        reply.flush()


if __name__ == "__main__":
    _serve()
