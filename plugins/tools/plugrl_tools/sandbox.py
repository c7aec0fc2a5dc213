"""A sandboxed Python interpreter for tool calls: the policy writes Python, :func:`run_python` runs it.

Model output is untrusted, so the code never runs in the trainer's process. Each call starts a fresh
``python -I -S -B`` (this file, run as a script) in its own session and a throw-away working directory, with an
environment holding only PATH, LANG, HOME and TMPDIR (the last two: the working directory). The code reaches the
child as a file there, never on the command line. Before it runs, the child sets its resource limits and installs
an audit hook (:pep:`578`; once added it cannot be removed), then runs the code like a notebook cell: what it prints
is the result, and the value of a final expression is printed too.

What the sandbox guarantees, against careless and ordinarily hostile code:

* limits: CPU time (RLIMIT_CPU), address space (RLIMIT_AS), file size, open files and no core dumps, set in the
  child; the whole process group is killed at the wall-clock limit; the trainer keeps at most ``output_chars`` of
  stdout and of stderr and drains the rest, so a flood of output cannot fill its memory.
* the audit hook refuses (raises, and the result says ``status == "blocked"``): starting processes (os.system,
  fork, exec, posix_spawn, subprocess), signalling processes, every ``socket`` call except making an AF_UNIX
  socket pair (asyncio needs one), ctypes and native extensions from anywhere but the interpreter's lib-dynload,
  modules that open files or processes in C (sqlite3, dbm, multiprocessing, ...), subinterpreters, changing
  rlimits, tracing and profiling hooks, heap walks (gc.get_objects/referrers), editing the hook's own functions,
  symlinks, hard links and ioctl.
* paths: writing only inside the working directory; reading only there, in the standard library and from
  /dev/null, /dev/zero and /dev/urandom; no ``..``, no symlinks, and only regular files (and the working
  directory's own folders) may be opened. So /proc, /etc, the home directory, other temporary files, the
  repository and the run directory can be neither read nor listed.
* what raises no audit event is taken away before the code runs: ``_posixsubprocess.fork_exec`` (a stub that
  refuses), os.mknod, os.chroot, pidfd signals, priority and scheduling of other processes, and
  ``_imp.create_builtin`` (it would re-create ``posix`` with all of them).

What it does NOT guarantee (it is a defence-in-depth process sandbox, not a VM or a container):

* audit hooks are not a security boundary (:pep:`578` says so). The child runs as the trainer's user (often root,
  where file permissions and RLIMIT_NPROC do not apply), on the same kernel, file system and network namespace,
  without seccomp or cgroups. What no audit event covers still works (``os.stat`` of any path, file descriptor
  tricks, ...), and someone who knows CPython's internals well may find a way around the hook (from 3.13, for
  example, a signal handler could rewrite a running hook's locals).
* only the hook stops fork bombs when the trainer runs as root; for other users RLIMIT_NPROC is 0, which also
  stops the code from starting threads.
* disk use is limited per file, not in total; memory is limited per process, not for the machine.
* only the standard library can be imported (third-party packages would widen what can be read and run).

For adversarial inputs at scale, also run the trainer's tool calls inside a container or VM (gVisor, nsjail,
Firecracker).
"""

from __future__ import annotations

import math
import os
import select
import selectors
import signal
import sys
import time
from dataclasses import dataclass, fields

_CELL_FILE = ".sandbox_cell.py"  # the code, as a file in the working directory (read and removed by the child)
_CELL_NAME = "<cell>"  # the file name that tracebacks show for the code
_TAIL_BYTES = 2048  # of stderr kept apart from the capped head: the traceback's last line is at the end

# -- the policy (immutable: the hook keeps references to these objects, not to the module's names) --

_DENY_EVENTS = frozenset(
    {
        # new processes, and signals to any process
        "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.startfile",
        "subprocess.Popen", "webbrowser.open", "os.kill", "os.killpg", "signal.pthread_kill",
        # the limits, and ways to reach into the hook or around it
        "resource.setrlimit", "resource.prlimit", "sys.settrace", "sys.setprofile",
        "sys.monitoring.register_callback", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
        "cpython.PyInterpreterState_New", "os.setns", "os.unshare", "fcntl.ioctl",
        "sqlite3.enable_load_extension", "sqlite3.load_extension",
        # a link made now could point a path that was checked somewhere else later
        "os.symlink", "os.link",
    }
)  # fmt: skip
_DENY_PREFIXES = ("socket.", "ctypes.")
_AF_UNIX = 1  # socket.AF_UNIX on every POSIX system (importing socket would slow each child's start)
_WRITE_EVENTS = frozenset(  # path events whose first argument (and os.rename's second) must lie in the workdir
    {
        "os.chdir", "os.chmod", "os.chown", "os.chflags", "os.lchflags", "os.mkdir", "os.mkfifo", "os.mknod",
        "os.remove", "os.rmdir", "os.rename", "os.truncate", "os.utime", "os.setxattr", "os.removexattr",
        "shutil.rmtree",
    }
)  # fmt: skip
_READ_EVENTS = frozenset({"os.listdir", "os.scandir", "os.getxattr", "os.listxattr"})
# modules that load native code or open files and processes in C, where no audit event sees the path
_BLOCKED_MODULES = frozenset(
    {
        "ctypes", "_ctypes", "_ctypes_test", "_posixsubprocess", "_posixshmem", "_multiprocessing", "_sqlite3",
        "_dbm", "_gdbm", "readline", "_curses", "_curses_panel", "_tkinter", "spwd", "syslog", "nis",
        "ossaudiodev", "_xxsubinterpreters", "_xxinterpchannels", "_xxinterpqueues", "_interpreters",
        "_interpchannels", "_interpqueues", "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase",
        "_testsinglephase", "_testimportmultiple", "_testclinic", "_testclinic_limited", "_testlimitedcapi",
        "_testexternalinspection", "_remote_debugging",
    }
)  # fmt: skip
# os functions with no audit event that make device nodes, change the root or act on other processes
_UNAUDITED_OS = (
    "mknod",
    "chroot",
    "pidfd_open",
    "setpriority",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setaffinity",
)
_READ_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"})
_WRITE_DEVICES = frozenset({"/dev/null"})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one :func:`run_python` call."""

    cpu_s: float = 5  # CPU seconds (RLIMIT_CPU, rounded up to whole seconds)
    wall_s: float = 10  # wall-clock seconds; then the whole process group is killed
    memory_mb: int = 512  # address space (RLIMIT_AS)
    output_chars: int = 4000  # kept of stdout and of stderr each; the rest is dropped and flagged
    file_size_mb: int = 16  # largest file the code may write (RLIMIT_FSIZE)
    max_open_files: int = 64  # RLIMIT_NOFILE

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            kinds = (int,) if spec.type == "int" else (int, float)
            if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
                kind = "whole number" if spec.type == "int" else "finite number"
                raise ValueError(f"SandboxLimits.{spec.name} must be a positive {kind}, got {value!r}")


@dataclass
class SandboxResult:
    """What one :func:`run_python` call did.

    ``status`` is ``"ok"``, ``"error"`` (an exception or a non-zero exit), ``"timeout"`` (wall clock),
    ``"cpu_limit"``, ``"memory_limit"`` or ``"blocked"`` (the audit hook refused an operation, even if the code
    caught the error); ``reason`` says why in one line, ``truncated`` that stdout or stderr was cut to
    ``output_chars``. ``exit_code`` is None when the process was killed by a signal.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    status: str
    reason: str = ""
    seconds: float = 0.0
    truncated: bool = False


def run_python(code: str, limits: SandboxLimits | None = None, *, stdin: str = "") -> SandboxResult:
    """Run ``code`` in a fresh sandboxed Python process and return what it printed (see the module docstring).

    Safe to call from many threads at once: each call has its own process, pipes and working directory.
    """
    import subprocess  # here, not at the top: the child runs this file too, and must never load _posixsubprocess
    import tempfile

    limits = limits or SandboxLimits()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="plugrl-sandbox-", ignore_cleanup_errors=True) as tmp:
        workdir = os.path.realpath(tmp)
        with open(os.path.join(workdir, _CELL_FILE), "w", encoding="utf-8") as cell:
            cell.write(code)
        report_r, report_w = os.pipe()  # the child's hook writes "blocked: ..." lines here
        try:
            proc = subprocess.Popen(
                _child_command(workdir, report_w, limits),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir},
                start_new_session=True,  # its own process group, so one killpg takes everything it started
                pass_fds=(report_w,),
            )
        except BaseException:
            os.close(report_r)
            raise
        finally:
            os.close(report_w)
        byte_cap = limits.output_chars * 4 + 4  # enough for output_chars characters of UTF-8
        out, err, report = _Capture(byte_cap), _Capture(byte_cap), _Capture(4096)
        captures = {proc.stdout.fileno(): out, proc.stderr.fileno(): err, report_r: report}
        try:
            timed_out = _communicate(proc, captures, stdin.encode("utf-8"), limits.wall_s)
        finally:
            if proc.poll() is None:  # not reaped yet, so its pid still names its process group
                _kill_group(proc.pid)
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                stream.close()
            os.close(report_r)
    stdout, cut_out = out.text(limits.output_chars)
    stderr, cut_err = err.text(limits.output_chars)
    reports = report.head.decode("utf-8", "replace").splitlines()
    status, reason = _outcome(proc.returncode, timed_out, reports, err.tail.decode("utf-8", "replace"), limits)
    return SandboxResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=proc.returncode if proc.returncode >= 0 else None,
        status=status,
        reason=reason,
        seconds=time.monotonic() - started,
        truncated=cut_out or cut_err,
    )


def format_result(result: SandboxResult) -> str:
    """A short text for the model: what the code printed, then its error or the limit it hit."""
    parts = [text.rstrip("\n") for text in (result.stdout, result.stderr) if text.strip()]
    if result.truncated:
        parts.append("[output truncated]")
    if result.status not in ("ok", "error") and result.reason not in result.stderr:
        parts.append(result.reason)
    return "\n".join(parts) or "(no output: print() what you want to see)"


def python_tool(code: str) -> str:
    """Run Python code in a sandbox and return what it printed.

    The code runs in a fresh, isolated Python process: standard library only, no network, no subprocesses,
    files only in its own temporary directory, and at most 5 s of CPU, 10 s in all and 512 MB of memory. As in
    a notebook cell, the value of a final expression is printed too.

    Args:
        code: Python source to run. Print what you want to see.

    Returns:
        What the code printed, followed by its error or the limit it hit, if any.
    """
    try:
        return format_result(run_python(code))
    except Exception as exc:  # a tool must answer the model, never raise into the rollout
        return f"sandbox error: {type(exc).__name__}: {exc}"


# -- the trainer's side of one call --


def _child_command(workdir: str, report_fd: int, limits: SandboxLimits) -> list[str]:
    """The child's command line: this file as an isolated script (-I: no env, no user site; -S: no site-packages;
    -B: no .pyc writes outside the workdir; -u: output survives a kill), the workdir and the limits."""
    script = os.path.abspath(__file__)
    numbers = (report_fd, math.ceil(limits.cpu_s), limits.memory_mb, limits.file_size_mb, limits.max_open_files)
    return [sys.executable, "-I", "-S", "-B", "-u", "-X", "utf8", script, workdir, *map(str, numbers)]


class _Capture:
    """One pipe of the child: the first ``limit`` bytes, the last few, and whether any were dropped."""

    def __init__(self, limit: int) -> None:
        self.head, self.tail, self.limit = bytearray(), b"", limit
        self.dropped = self.closed = False

    def read(self, fd: int) -> bool:
        """Read one chunk; False at end of file."""
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            self.closed = True
            return False
        room = self.limit - len(self.head)
        self.head += chunk[: max(room, 0)]
        self.dropped = self.dropped or len(chunk) > room
        self.tail = (self.tail + chunk)[-_TAIL_BYTES:]
        return True

    def text(self, chars: int) -> tuple[str, bool]:
        text = self.head.decode("utf-8", "replace")
        return text[:chars], self.dropped or len(text) > chars


def _communicate(proc, captures: dict[int, _Capture], data: bytes, wall_s: float) -> bool:
    """Feed stdin, read the pipes and wait for the child until the wall-clock deadline; True if it passed."""
    import subprocess

    deadline = time.monotonic() + wall_s
    timed_out = _pump(proc, captures, data, deadline)
    if not timed_out:  # all pipes closed: the child is done, or has closed them and runs on
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        _kill_group(proc.pid)
        _pump(proc, captures, b"", time.monotonic() + 1)  # what the pipes still held at the kill
    return timed_out


def _pump(proc, captures: dict[int, _Capture], data: bytes, deadline: float) -> bool:
    """Write ``data`` to stdin and read the open pipes until all close; True if ``deadline`` came first."""
    sent = 0
    with selectors.DefaultSelector() as selector:
        for fd, capture in captures.items():
            if not capture.closed:
                selector.register(fd, selectors.EVENT_READ)
        if data and not proc.stdin.closed:
            selector.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
        while selector.get_map():
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return True
            for key, _ in selector.select(timeout):
                if key.fileobj is proc.stdin:
                    try:  # at most PIPE_BUF bytes: the pipe was ready for that much, so the write cannot block
                        sent += os.write(proc.stdin.fileno(), data[sent : sent + select.PIPE_BUF])
                    except BrokenPipeError:  # the child exited or closed stdin: the rest is not wanted
                        sent = len(data)
                    if sent >= len(data):
                        selector.unregister(proc.stdin)
                        proc.stdin.close()
                elif not captures[key.fd].read(key.fd):
                    selector.unregister(key.fd)
    return False


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _outcome(rc: int, timed_out: bool, reports: list[str], err_tail: str, limits: SandboxLimits) -> tuple[str, str]:
    """(status, reason) from how the child ended and what its hook reported."""
    lines = [line for line in err_tail.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if timed_out:
        return "timeout", f"timeout: the code ran longer than the wall-clock limit of {limits.wall_s:g} s"
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # SIGXCPU at the soft CPU limit, SIGKILL at the hard one
        return "cpu_limit", f"cpu_limit: the code used more than {limits.cpu_s:g} s of CPU time"
    if rc != 0 and ("memory_limit" in reports or last.startswith("MemoryError")):
        return "memory_limit", f"memory_limit: the code needed more than the {limits.memory_mb} MB memory limit"
    blocked = [line for line in reports if line.startswith("blocked: ")]
    if blocked:
        return "blocked", blocked[0]
    if rc < 0:
        return "error", f"killed by signal {signal.Signals(-rc).name}"
    if rc > 0:
        return "error", last or f"exit code {rc}"
    return "ok", ""


# -- the child: everything below runs in the sandboxed process --


def _child_main(argv: list[str]) -> int:
    """Read the cell, set the limits, disarm what no audit event covers, install the hook, run the cell."""
    import builtins
    import functools

    workdir, report_fd = argv[0], int(argv[1])
    cpu_s, memory_mb, file_size_mb, max_open_files = map(int, argv[2:6])
    with open(_CELL_FILE, encoding="utf-8-sig") as cell:  # the cwd is the workdir
        source = cell.read()
    os.unlink(_CELL_FILE)
    _disarm_unaudited()
    context = _hook_context(workdir, report_fd)
    _set_limits(cpu_s, memory_mb, file_size_mb, max_open_files)
    sys.addaudithook(functools.partial(_audit_hook, ctx=context))
    sys.argv = [_CELL_NAME]
    builtins.exit = builtins.quit = sys.exit  # -S leaves these out, and models call them
    return _run_cell(source, report_fd)


def _set_limits(cpu_s: int, memory_mb: int, file_size_mb: int, max_open_files: int) -> None:
    import resource

    mb = 1 << 20
    limits = {
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),  # SIGXCPU at the soft limit, SIGKILL if the code ignores that
        resource.RLIMIT_AS: (memory_mb * mb, memory_mb * mb),
        resource.RLIMIT_FSIZE: (file_size_mb * mb, file_size_mb * mb),
        resource.RLIMIT_NOFILE: (max_open_files, max_open_files),
        resource.RLIMIT_CORE: (0, 0),
    }
    if os.geteuid() != 0:  # root ignores RLIMIT_NPROC; for other users 0 stops fork bombs (and threads)
        limits[resource.RLIMIT_NPROC] = (0, 0)
    for which, (soft, hard) in limits.items():
        ceiling = resource.getrlimit(which)[1]
        if ceiling != resource.RLIM_INFINITY:  # only root may raise a hard limit
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(which, (soft, hard))


def _no_fork_exec(*args, **kwargs):
    sys.audit("subprocess.Popen", None, None, None, None)  # the hook refuses this, and reports it
    raise PermissionError("blocked: starting processes is not allowed in the sandbox")


def _disarm_unaudited() -> None:
    """Take away powers that raise no audit event: fork_exec, making device nodes, chroot, acting on other
    processes (pidfd signals, priorities, scheduling), and ``_imp.create_builtin``, which would re-create a
    builtin module (posix) with all of them."""
    import _imp
    import _signal
    import importlib
    import posix
    import types

    if "subprocess" in sys.modules or "_posixsubprocess" in sys.modules:  # they would keep the real fork_exec
        raise RuntimeError("sandbox: _posixsubprocess was imported before the audit hook")
    stub = types.ModuleType("_posixsubprocess")
    stub.fork_exec = _no_fork_exec  # `import subprocess` still works; Popen is refused by its audit event
    sys.modules["_posixsubprocess"] = stub
    for name in sys.builtin_module_names:  # all loaded now, create_builtin is never needed again
        importlib.import_module(name)
    _imp.__dict__.pop("create_builtin", None)
    for module in (os, posix):
        for name in _UNAUDITED_OS:
            module.__dict__.pop(name, None)
    for module in (signal, _signal):
        module.__dict__.pop("pidfd_send_signal", None)


def _hook_context(workdir: str, report_fd: int) -> tuple:
    """The hook's whole world, captured before any user code runs; see :func:`_audit_hook` for the layout."""
    import stat

    stdlib = []
    for entry in sys.path:  # under -I -S: the stdlib zip, the stdlib and lib-dynload, nothing user-made
        for path in (os.path.abspath(entry), os.path.realpath(entry)):
            if entry and os.path.exists(path) and path != "/" and path not in stdlib:
                stdlib.append(path)
    native = tuple(path for path in stdlib if os.path.basename(path) == "lib-dynload")
    loaded_builtins = frozenset(sys.builtin_module_names) & frozenset(sys.modules)  # re-creating one is refused
    protected = (_audit_hook, _deny, _check_path, _check_import, _resolve)
    return (
        (type, str, bytes, int, PermissionError, ImportError),
        (os.getcwd, os.lstat, stat.S_ISLNK, stat.S_ISREG, stat.S_ISDIR),
        ((workdir,), (workdir, *stdlib), native, _READ_DEVICES, _WRITE_DEVICES),
        (_DENY_EVENTS, _DENY_PREFIXES, _WRITE_EVENTS, _READ_EVENTS, _BLOCKED_MODULES, loaded_builtins),
        (os.write, report_fd, _WRITE_FLAGS, protected, _AF_UNIX),
        (_deny, _check_path, _check_import, _resolve),
    )


def _audit_hook(event, args, *, ctx):
    """The sandbox's audit hook: refuse an event by raising, which aborts the operation before it happens.

    User code can rebind builtins, module attributes and this module's globals, so the hook and its helpers use
    only ``ctx`` (tuples of values and functions captured before user code ran: builtin types, file-system
    functions, places, rules, the report pipe, helpers) and operations on exact builtin types; changing these
    functions is refused too. An unexpected error inside raises, which also refuses: the hook fails closed.
    """
    (type_, str_, _, int_, permission_error, import_error), _, places, rules, extra, helpers = ctx
    deny_events, deny_prefixes, write_events, read_events = rules[:4]
    writable, readable, (_, _, write_flags, protected, af_unix) = places[0], places[1], extra
    deny, check_path, check_import, _ = helpers
    if type_(event) is not str_:
        return  # only user code raises events with odd names, and such events do nothing
    reason = None
    if event == "socket.__new__" and type_(args[1]) is int_ and args[1] == af_unix:
        pass  # a local socket (asyncio's self-pipe is a socketpair); connect, bind and sendto stay refused
    elif event in deny_events or event.startswith(deny_prefixes):
        reason = f"{event} is not allowed in the sandbox"
    elif event == "open":  # (path, mode, flags) from open(), os.open() and io.open_code()
        writing = type_(args[2]) is not int_ or args[2] & write_flags != 0
        reason = check_path(ctx, args[0], writable if writing else readable, writing, opening=True)
    elif event == "import":  # (name, filename, ...): filename is set when a native extension is loaded
        reason = check_import(ctx, args[0], args[1])
    elif event in write_events:  # by path only: a descriptor may be a stdlib file opened for reading
        reason = f"{event} on a file descriptor is not allowed: pass a path" if type_(args[0]) is int_ else None
        reason = reason or check_path(ctx, args[0], writable, True)
        if reason is None and event == "os.rename":
            reason = check_path(ctx, args[1], writable, True)
    elif event in read_events:
        reason = check_path(ctx, args[0], readable, False)
    elif event in ("object.__setattr__", "object.__delattr__"):  # e.g. a function's __code__ or __defaults__
        for function in protected:
            if args[0] is function:
                reason = "changing the sandbox's audit hook is not allowed"
    if reason is not None:
        deny(ctx, reason, import_error if event == "import" else permission_error)


def _deny(ctx, reason, error):
    write, report_fd = ctx[4][0], ctx[4][1]
    message = "blocked: " + reason
    try:
        write(report_fd, (message + "\n").encode("utf-8", "replace"))
    except BaseException:  # the code may have closed the report pipe: refusing matters, reporting does not
        pass
    raise error(message)


def _resolve(path, cwd):
    """``path`` made absolute and normal without touching the disk; None if it holds ``..`` or NUL."""
    if "\0" in path:
        return None
    if not path.startswith("/"):
        path = cwd + "/" + path
    parts = [part for part in path.split("/") if part and part != "."]
    if ".." in parts:  # a folder renamed between the check and the open could make ".." lead elsewhere
        return None
    return "/" + "/".join(parts)


def _check_path(ctx, path, roots, writing, *, opening=False):
    """Why ``path`` may not be used (None if it may): it must lie in one of ``roots`` with no symlink below the
    root, and a file to open must be a regular file (or a folder in the workdir)."""
    (type_, str_, bytes_, int_, _, _), (getcwd, lstat, is_link, is_file, is_dir), places = ctx[:3]
    workdir, devices, resolve = places[0][0], places[4 if writing else 3], ctx[5][3]
    if path is None or type_(path) is int_:
        return None  # the cwd (always in the workdir) or a descriptor, which was checked when it was opened
    if type_(path) is bytes_:
        path = path.decode("utf-8", "surrogateescape")
    if type_(path) is not str_:  # a path-like object could name another file the second time it is asked
        return "paths must be str or bytes in the sandbox: use str(path)"
    full = resolve(path, getcwd())
    if full is None:
        return f"'..' and NUL are not allowed in sandbox paths: {path!r}"
    if full in devices:
        return None
    root = None
    for candidate in roots:
        if full == candidate or full.startswith(candidate + "/"):
            root = candidate
            break
    if root is None:
        return f"{'writing' if writing else 'reading'} {full} is not allowed in the sandbox"
    current, mode = root, None
    for part in full[len(root) :].split("/")[1:]:  # the components below the root
        current = current + "/" + part
        try:
            mode = lstat(current).st_mode
        except BaseException:  # nothing there (yet): no link to follow, and the kernel fails the same path
            return None
        if is_link(mode):
            return f"symlinks are not followed in the sandbox: {current}"
    if opening:
        try:
            mode = lstat(full).st_mode if mode is None else mode
        except BaseException:
            return None
        if not (is_file(mode) or (is_dir(mode) and root == workdir)):
            return f"only regular files can be opened in the sandbox: {full}"
    return None


def _check_import(ctx, name, filename):
    """Why importing ``name`` (a native extension when ``filename`` is set) is refused, or None."""
    type_, str_ = ctx[0][0], ctx[0][1]
    native, blocked, loaded_builtins, check_path = ctx[2][2], ctx[3][4], ctx[3][5], ctx[5][1]
    if type_(name) is not str_:
        return "module names must be str in the sandbox"
    if name.partition(".")[0] in blocked:
        return f"importing {name} is not allowed in the sandbox"
    if name in loaded_builtins:
        return f"re-creating the builtin module {name} is not allowed in the sandbox"
    if filename is None:
        return None
    reason = check_path(ctx, filename, native, False, opening=True)
    return None if reason is None else "native extensions load only from the interpreter's lib-dynload: " + reason


def _run_cell(source: str, report_fd: int) -> int:
    """Run the code as ``__main__``, print a final expression's value (like a notebook cell), and print a
    traceback without this file's frames on an error."""
    import ast
    import builtins
    import linecache
    import traceback
    import types

    linecache.cache[_CELL_NAME] = (len(source), None, source.splitlines(True), _CELL_NAME)
    linecache.cache[__file__] = (0, None, [], __file__)  # tracebacks must not try to read this file (the repo)
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    try:
        tree = ast.parse(source, _CELL_NAME)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, _CELL_NAME, "exec"), main.__dict__)
        if last is not None:
            sys.displayhook(eval(compile(ast.Expression(last.value), _CELL_NAME, "eval"), main.__dict__))
    except SystemExit:
        raise
    except BaseException as exc:
        if isinstance(exc, MemoryError):
            os.write(report_fd, b"memory_limit\n")
        shown = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
        frames = [frame for frame in shown.stack if frame.filename != __file__]
        while frames and frames[0].filename != _CELL_NAME:  # ast.parse's frames before a SyntaxError
            frames.pop(0)
        shown.stack = traceback.StackSummary.from_list(frames)
        sys.stderr.write("".join(shown.format()))
        return 1
    return 0


if __name__ == "__main__":  # the sandboxed child: `python -I -S -B -u -X utf8 sandbox.py WORKDIR FD LIMITS...`
    sys.exit(_child_main(sys.argv[1:]))
