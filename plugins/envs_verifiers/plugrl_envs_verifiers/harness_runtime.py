"""verifiers v1's ``subprocess`` runtime with plugrl's sandbox limits: what a harness runs (its chat program, and
every command the model has it run) under resource limits, with no secrets and no run directory.

verifiers' own :class:`~verifiers.v1.runtimes.SubprocessRuntime` runs a harness on the host in a folder under
``~/.cache/verifiers``, with the trainer's whole environment (less the names holding ``API_KEY``), and prepares
its program with ``uv sync --script``, which downloads the program's dependencies. :class:`HarnessRuntime`
keeps its interface and changes what it starts:

- each process starts through a launcher that sets its limits, then ``exec``s it: CPU seconds (RLIMIT_CPU),
  address space (RLIMIT_AS), file size, open files, no core dumps; a process and what it starts inherit them;
- when the trainer runs as root, the launcher also drops to an unprivileged user (``sandbox.user``, ``nobody``
  by default; at most ``sandbox.max_processes`` processes of it), so the model's commands cannot change what
  root owns; the working directory, and the files the task puts there, belong to that user. That user must be
  able to run the trainer's Python (checked at start: where it cannot, e.g. an interpreter under ``/root``, the
  harness runs as root and the start says so, with the fix);
- its environment holds only PATH, LANG, HOME and TMPDIR (both: the rollout's working directory), PYTHONPATH
  when the trainer has one (modules the environment's tool servers import), MALLOC_ARENA_MAX (glibc's per-thread
  heaps would otherwise count against the address space), and what the task and harness pass explicitly (the
  task's ``runtime_env``, the harness's own settings): no key, token or password of the trainer's;
- its working directory is a fresh temporary folder, removed when the rollout ends: not the run directory;
- a PEP 723 program (the ``null`` and ``bash`` harnesses' chat program, a reward's ``run_uv_script``) runs with
  the trainer's own Python when every dependency it declares is installed there, and is refused, naming what is
  missing, when one is not: nothing is downloaded while training.

The wall clock is bounded by the episode's time limit (``sandbox.episode_s``): past it the episode is cancelled
and verifiers kills the program's whole process group. Like plugrl's Python sandbox
(:mod:`plugrl_tools.sandbox`) this is a process sandbox on the trainer's machine, not a container: the
commands see the same file system (what their user may read) and network. Tasks that need a container are
refused at start.

verifiers picks a rollout's runtime class itself (``verifiers.v1.rollout.make_runtime``, from the runtime
config's ``type``); :func:`install` puts a dispatcher there that gives the rollouts of plugrl's episodes (those
run under :func:`sandbox_for_episode`) this runtime, and every other caller verifiers' own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import importlib.metadata
import logging
import os
import pwd
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field
from verifiers.v1.errors import SandboxError
from verifiers.v1.runtimes import ProgramResult, RuntimeProcess, SubprocessConfig
from verifiers.v1.runtimes.base import register
from verifiers.v1.runtimes.subprocess import SubprocessProcess, SubprocessRuntime, signal_process


class HarnessLimits(BaseModel):
    """``environment_options.sandbox``: the limits of what a v1 harness runs (each process), and of an episode."""

    model_config = ConfigDict(extra="forbid")

    cpu_s: int = Field(120, gt=0, description="CPU seconds per process (RLIMIT_CPU)")
    memory_mb: int = Field(4096, gt=0, description="address space per process, MiB (RLIMIT_AS)")
    file_size_mb: int = Field(64, gt=0, description="largest file a process may write, MiB (RLIMIT_FSIZE)")
    max_open_files: int = Field(256, gt=0, description="open files per process (RLIMIT_NOFILE)")
    episode_s: float = Field(600.0, gt=0, description="wall-clock seconds of one episode, setup and scoring included")
    user: str | None = Field(
        "nobody", min_length=1, description="the user the harness runs as when the trainer is root (null: root)"
    )
    max_processes: int = Field(512, gt=0, description="processes and threads of that user (RLIMIT_NPROC)")


# The launcher: `python -I -S -c LAUNCHER cpu memory_mb file_size_mb open_files processes uid gid argv...` sets the
# limits (never above a hard limit it cannot raise), drops to uid/gid unless they are -1 (then RLIMIT_NPROC applies
# too: it counts the processes of that user) and replaces itself with argv (found on PATH before dropping). -I -S: no
# site-packages, no environment variables of Python's.
_LAUNCHER = """
import os, resource, sys
cpu, memory, size, files, processes, uid, gid = (int(x) for x in sys.argv[1:8])
mb = 1 << 20
limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_AS, memory * mb, memory * mb),
          (resource.RLIMIT_FSIZE, size * mb, size * mb), (resource.RLIMIT_NOFILE, files, files),
          (resource.RLIMIT_CORE, 0, 0)]
if uid != -1:
    limits.append((resource.RLIMIT_NPROC, processes, processes))
for which, soft, hard in limits:
    ceiling = resource.getrlimit(which)[1]
    if ceiling != resource.RLIM_INFINITY:
        soft, hard = min(soft, ceiling), min(hard, ceiling)
    resource.setrlimit(which, (soft, hard))
program = sys.argv[8]
if "/" not in program:  # found on PATH now: after dropping to uid the interpreter's own files may be out of reach
    found = (os.path.join(d, program) for d in os.environ.get("PATH", "").split(os.pathsep))
    program = next((p for p in found if os.path.isfile(p) and os.access(p, os.X_OK)), program)
if uid != -1:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
os.execv(program, sys.argv[8:])
"""
_PATH = "/usr/local/bin:/usr/bin:/bin"
_SCRIPT = re.compile(r"^# /// script\s*$(.*?)^# ///\s*$", re.MULTILINE | re.DOTALL)
log = logging.getLogger("plugrl.envs.verifiers")


@dataclass(frozen=True)
class Sandbox:
    """What a harness runs under: its ``limits``, and the (uid, gid) it runs as (None: the trainer's own)."""

    limits: HarnessLimits
    owner: tuple[int, int] | None = None

    @classmethod
    def checked(cls, limits: HarnessLimits) -> Sandbox:
        """The sandbox of ``limits`` on this machine: a root trainer's harness runs as ``limits.user`` when that
        user can run the trainer's Python (tried once, here), else as root, said here with the fix."""
        if os.geteuid() != 0 or limits.user is None:
            return cls(limits)
        try:
            entry = pwd.getpwnam(limits.user)
        except KeyError:
            raise ValueError(
                f"environment_options.sandbox.user={limits.user!r}: no such user; name an existing unprivileged user "
                "for the harness to run as, or null to run it as root"
            ) from None
        owner = (entry.pw_uid, entry.pw_gid)
        why = _cannot_run_python(limits.model_dump_json(), owner)
        if why is None:
            return cls(limits, owner)
        log.warning(
            "the verifiers harness runs as root, not as %r: that user cannot run plugrl's Python %s (%s); make the "
            "interpreter and its environment readable for it, or set environment_options.sandbox.user: null to run "
            "as root knowingly",
            limits.user,
            sys.executable,
            why,
        )
        return cls(limits)


@functools.cache
def _cannot_run_python(limits_json: str, owner: tuple[int, int]) -> str | None:
    """Why ``owner`` cannot start the trainer's Python under those limits and import what the harness needs (its
    last line of error), or None when it can; tried once per run and limits."""
    limits = HarnessLimits.model_validate_json(limits_json)
    probe = [*launcher(limits, owner), sys.executable, "-c", "import openai, mcp"]
    tried = subprocess.run(probe, env=_base_env(tempfile.gettempdir()), capture_output=True, text=True, timeout=300)
    if tried.returncode == 0:
        return None
    return (tried.stderr.strip().splitlines() or [f"exit code {tried.returncode}"])[-1]


_SANDBOX: contextvars.ContextVar[Sandbox | None] = contextvars.ContextVar("plugrl_harness_sandbox", default=None)


@contextlib.contextmanager
def sandbox_for_episode(sandbox: Sandbox) -> Iterator[None]:
    """Within this context (and the asyncio tasks it starts), the rollouts verifiers makes run in a
    :class:`HarnessRuntime` under ``sandbox``."""
    token = _SANDBOX.set(sandbox)
    try:
        yield
    finally:
        _SANDBOX.reset(token)


def launcher(limits: HarnessLimits, owner: tuple[int, int] | None) -> list[str]:
    """The argv prefix that starts a program under ``limits``, as ``owner`` (uid, gid) when given."""
    uid, gid = owner or (-1, -1)
    numbers = (limits.cpu_s, limits.memory_mb, limits.file_size_mb, limits.max_open_files, limits.max_processes)
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, *map(str, (*numbers, uid, gid))]


def _base_env(home: str) -> dict[str, str]:
    env = {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": home, "TMPDIR": home, "MALLOC_ARENA_MAX": "2"}
    if os.environ.get("PYTHONPATH"):  # where the environment's own modules are, for its tool servers
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def install() -> None:
    """Have verifiers' rollouts make their runtime through :func:`_make_runtime` (idempotent)."""
    import verifiers.v1.rollout as rollout

    own = rollout.make_runtime
    if getattr(own, "plugrl_dispatch", False):
        return

    def make_runtime(config: Any, name: str | None = None) -> Any:
        sandbox = _SANDBOX.get()
        if sandbox is None:  # not one of plugrl's episodes
            return own(config, name)
        if not isinstance(config, SubprocessConfig):  # refused at start; a task cannot ask for another here
            raise SandboxError(
                f"plugrl runs verifiers harnesses in the subprocess runtime only, not {config.type!r} "
                "(containers and hosted sandboxes cannot start here)"
            )
        runtime = HarnessRuntime(config, name, sandbox)
        register(runtime)
        return runtime

    make_runtime.plugrl_dispatch = True  # type: ignore[attr-defined]
    rollout.make_runtime = make_runtime


def missing_dependencies(script: bytes) -> list[str]:
    """The requirements a PEP 723 script declares that the trainer's Python does not satisfy (by installed
    distribution and version)."""
    block = _SCRIPT.search(script.decode("utf-8", "replace"))
    if block is None:
        return []
    lines = [line.removeprefix("#").strip() for line in block.group(1).splitlines()]
    text = "\n".join(lines)
    found = re.search(r"dependencies\s*=\s*\[(.*?)\]", text, re.DOTALL)
    names = re.findall(r"""["']([^"']+)["']""", found.group(1)) if found else []
    missing = []
    for name in names:
        try:
            requirement = Requirement(name)
        except InvalidRequirement:
            missing.append(name)
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{name} (installed: {version})")
    return missing


class HarnessRuntime(SubprocessRuntime):
    """verifiers' subprocess runtime, each process started under ``sandbox`` (see the module docstring)."""

    def __init__(self, config: SubprocessConfig, name: str | None, sandbox: Sandbox) -> None:
        super().__init__(config, name)
        self.sandbox = sandbox
        self.owner = sandbox.owner

    async def start(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="plugrl-harness-"))
        self._own(self.workdir)
        self.info.id = str(self.workdir)

    def _own(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner)

    def _command(self, argv: list[str]) -> list[str]:
        return [*launcher(self.sandbox.limits, self.owner), *argv]

    def _environment(self, env: dict[str, str]) -> dict[str, str]:
        return {**_base_env(str(self.workdir)), **self.process_env(env)}

    async def _spawn(self, argv: list[str], env: dict[str, str], **streams: Any) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self._command(argv),
            env=self._environment(env),
            cwd=self.workdir,
            start_new_session=True,  # its own process group: one killpg ends what it started
            **streams,
        )

    async def run(self, argv: list[str], env: dict[str, str]) -> ProgramResult:
        pipe = asyncio.subprocess.PIPE
        proc = await self._spawn(argv, env, stdout=pipe, stderr=pipe)
        try:
            stdout, stderr = await proc.communicate()
        finally:  # cancelled (the episode's time limit): the whole group goes
            if proc.returncode is None:
                signal_process(proc, signal.SIGKILL)
        return ProgramResult(
            exit_code=proc.returncode or 0,
            stdout=stdout.decode(errors="replace"),
            stderr=stderr.decode(errors="replace"),
        )

    async def open_process(self, argv: list[str], env: dict[str, str]) -> RuntimeProcess:
        pipe = asyncio.subprocess.PIPE
        proc = await self._spawn(argv, env, stdin=pipe, stdout=pipe, stderr=pipe)
        self._background.append(proc)
        return SubprocessProcess(proc)

    async def run_background(self, argv: list[str], env: dict[str, str], log: str) -> None:
        with (self.workdir / log).open("wb") as out:  # the child keeps its own copy of the descriptor
            proc = await self._spawn(argv, env, stdout=out, stderr=asyncio.subprocess.STDOUT)
        self._background.append(proc)

    async def write(self, path: str, data: bytes) -> None:
        """Write a file into the working directory (task setup, the harness's first messages), owned by the
        sandbox's user."""
        target = self.workdir / path
        await super().write(path, data)
        for made in [target, *target.parents]:
            if made == self.workdir or self.workdir not in made.parents:
                break
            self._own(made)

    async def prepare_uv_script(
        self, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        """The argv that runs ``script`` with the trainer's Python (its dependencies installed there), from a copy
        in the working directory; a :class:`SandboxError` naming the missing ones otherwise."""
        data = script.encode() if isinstance(script, str) else script
        missing = missing_dependencies(data)
        if missing:
            raise SandboxError(
                f"the harness program needs {', '.join(missing)}, not installed in plugrl's environment "
                f"({sys.prefix}); nothing is downloaded while training: pip install them there"
            )
        path = self.workdir / f".vf-script-{hashlib.sha256(data).hexdigest()[:16]}.py"
        if not path.exists():
            path.write_bytes(data)
        return [sys.executable, str(path)]
