"""`python -m plugrl.cli ARGS` for the tests, forked from a process that has already imported torch and transformers.

A `plugrl` command spends most of a tiny test run importing torch and transformers (measured: 16 s of a 27 s run on
2 busy cores). Each test process starts one warm process (this file run as a script) that imports them once and
forks a child per command: the child is `python -m plugrl.cli ARGS` from then on (its own arguments, working
directory, environment, stdin from /dev/null, stdout and stderr to files), and imports plugrl itself afresh.

torch, transformers and huggingface_hub read some environment variables when they are imported: where this
process's environment changed since the warm process started (a test set a variable; vLLM in a test sets its
own), a new warm process starts; a command run with another environment (`run_plugrl(env=...)`) starts a new
interpreter as before. PLUGRL_TESTS_COLD=1 starts a new interpreter for every command.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

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
    if warm is None:
        return None
    with tempfile.TemporaryDirectory(prefix="plugrl-warm-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        request = {"argv": argv, "cwd": str(cwd), "stdout": str(out), "stderr": str(err)}
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


# the warm process, and the environment it started with (its children's: it is the test process's at the time)
_started: list[tuple[subprocess.Popen, dict[str, str]]] = []


def _warm_process() -> subprocess.Popen | None:
    if os.environ.get("PLUGRL_TESTS_COLD") == "1":
        return None
    env = dict(os.environ)
    if _started:
        proc, started_env = _started.pop()
        if proc.poll() is None and started_env == env:
            _started.append((proc, env))
            return proc
        _stop(proc)  # it imported torch and transformers in another environment (a test changed it)
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
    _started.append((proc, env))
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


@atexit.register
def _stop_started() -> None:
    for proc, _ in _started:
        _stop(proc)


def _wait_for_status(warm: subprocess.Popen, timeout: float) -> int:
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(warm.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise subprocess.TimeoutExpired("plugrl", timeout)
    return int(warm.stdout.readline())


# -- the warm process --


def _child(request: dict, reply: IO[str], env: dict[str, str]) -> None:
    """In the forked child: become `python -m plugrl.cli ARGV` and exit as it does (atexit handlers included)."""
    import runpy

    reply.close()  # the test process's pipe is the warm process's alone
    write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], write), (2, request["stderr"], write)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # the standard streams live as long as the process
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # line-buffered, as Python's own stderr
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)  # as the warm process started: an import may have set a variable
    sys.path[0] = os.getcwd()  # what `python -m` puts first
    sys.argv = ["plugrl", *request["argv"]]
    runpy.run_module("plugrl.cli", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _serve() -> None:
    import importlib

    reply = os.fdopen(os.dup(1), "w", buffering=1)  # replies on a descriptor of their own ...
    os.dup2(2, 1)  # ... and what an import prints goes to stderr
    env = dict(os.environ)
    for name in PRELOAD:
        importlib.import_module(name)
    reply.write("ready\n")
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, reply, env)  # raises SystemExit: the child's interpreter ends as a plain `python -m` would
        reply.write(f"{pid}\n")
        _, status = os.waitpid(pid, 0)
        reply.write(f"{os.waitstatus_to_exitcode(status)}\n")


if __name__ == "__main__":
    _serve()
