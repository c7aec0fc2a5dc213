"""The sandboxed Python tool: real child processes, no mocks.

Each test runs the model's kind of code (or an attack on the sandbox) through :func:`run_python` and checks the
status, the output and that the side effect did not happen. The limit tests use small limits to stay fast.
"""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from plugrl_tools.sandbox import SandboxLimits, SandboxResult, format_result, python_tool, run_python

FAST = SandboxLimits(cpu_s=2, wall_s=3)


def _group_alive(pgid: int) -> bool:
    """Whether any process still runs in process group ``pgid`` (field 5 of /proc/PID/stat)."""
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _check_tool_text(result: SandboxResult) -> None:
    text = format_result(result)
    assert isinstance(text, str) and text
    assert result.status == "ok" or result.reason.splitlines()[0] in text


# -- ordinary code --


def test_prints_and_shows_the_last_expression():
    result = run_python("print('hello')\nx = 6 * 7\nx")
    assert (result.status, result.exit_code, result.stdout, result.stderr) == ("ok", 0, "hello\n42\n", "")
    assert not result.truncated and result.reason == "" and result.seconds > 0
    assert run_python("print('once')").stdout == "once\n"  # a final call returning None prints nothing more


def test_stdin_reaches_the_code():
    result = run_python("import sys\nname = input()\nprint(name.upper(), sys.stdin.read().split())", stdin="ada\n1 2\n")
    assert result.status == "ok" and result.stdout == "ADA ['1', '2']\n"


def test_stdlib_imports_work():
    code = (
        "import math, json, fractions, itertools, statistics, re, collections, decimal, random, asyncio\n"
        "async def twice(x):\n    return 2 * x\n"
        "print(math.comb(10, 3), json.dumps({'a': 1}), fractions.Fraction(1, 3) + fractions.Fraction(1, 6))\n"
        "print(list(itertools.permutations('ab')), statistics.mean([1, 2, 4]), asyncio.run(twice(21)))"
    )
    result = run_python(code)
    assert result.status == "ok", result.stderr
    assert result.stdout == "120 {\"a\": 1} 1/2\n[('a', 'b'), ('b', 'a')] 2.3333333333333335 42\n"


def test_an_exception_is_an_error_with_the_traceback():
    result = run_python("def f():\n    return 1 / 0\nf()")
    assert result.status == "error" and result.exit_code == 1
    assert result.reason == "ZeroDivisionError: division by zero"
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert 'File "<cell>", line 2, in f' in result.stderr and "sandbox.py" not in result.stderr
    syntax = run_python("x = (")
    assert syntax.status == "error" and syntax.reason.startswith("SyntaxError")
    assert syntax.stderr.startswith('  File "<cell>", line 1')
    assert run_python("print(1)\nexit(3)").exit_code == 3


def test_files_in_the_working_directory_work_and_it_is_deleted(tmp_path):
    code = (
        "import os, tempfile\nopen('out.txt', 'w').write('data')\nos.makedirs('sub/dir')\n"
        "print(open('out.txt').read(), sorted(os.listdir('.')), tempfile.gettempdir() == os.getcwd())\nos.getcwd()"
    )
    result = run_python(code)
    assert result.status == "ok", result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "data ['out.txt', 'sub'] True"  # the code's own file was removed before it ran
    workdir = lines[1].strip("'")
    assert workdir.startswith("/") and not os.path.exists(workdir)


# -- what the audit hook refuses --


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos.system('echo hacked > {marker}')",
        "import subprocess\nsubprocess.run(['sh', '-c', 'echo hacked > {marker}'])",
        "import os\nif os.fork() == 0:\n    open('{marker}', 'w').write('hacked')",
        "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo hacked > {marker}'])",
        "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'echo hacked > {marker}'], {{}})",
        "import _posixsubprocess\n_posixsubprocess.fork_exec()",
    ],
    ids=["os.system", "subprocess", "fork", "exec", "posix_spawn", "fork_exec"],
)
def test_starting_processes_is_blocked(code, tmp_path):
    marker = tmp_path / "hacked"
    result = run_python(code.format(marker=marker))
    assert result.status == "blocked" and result.reason.startswith("blocked: "), (result.reason, result.stderr)
    assert "not allowed" in result.reason and result.reason in format_result(result)
    assert not marker.exists()


def test_a_fork_bomb_is_stopped_and_leaves_nothing_running():
    started = time.monotonic()
    result = run_python("import os\nprint(os.getpgid(0), flush=True)\nwhile True:\n    os.fork()", FAST)
    assert result.status == "blocked" and "os.fork" in result.reason
    assert time.monotonic() - started < FAST.wall_s
    assert not _group_alive(int(result.stdout))


@pytest.mark.parametrize(
    "code",
    [
        "print(open('/proc/self/environ').read())",
        "print(open('/etc/passwd').read())",
        "print(open('{secret}').read())",
        "print(open(b'{secret}').read())",
        "import os\nprint(os.listdir('{run_dir}'))",
        "import os\nos.chdir('{run_dir}')\nprint(open('secret.txt').read())",
        "print(open('../../{secret}').read())",
        "import os\nos.symlink('{secret}', 'link')\nprint(open('link').read())",
        "import os\nprint(os.listdir('/tmp'))",
    ],
    ids=["proc-environ", "etc-passwd", "secret", "secret-bytes", "list-run-dir", "chdir", "dotdot", "symlink", "tmp"],
)
def test_reading_outside_the_sandbox_is_blocked(code, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    secret = run_dir / "secret.txt"
    secret.write_text("TOPSECRET")
    result = run_python(code.format(secret=secret, run_dir=run_dir))
    assert result.status == "blocked", (result.reason, result.stderr)
    assert "TOPSECRET" not in result.stdout and "secret.txt" not in result.stdout


@pytest.mark.parametrize(
    "code",
    [
        "open('{target}', 'w').write('x')",
        "import os\nos.close(os.open('{target}', os.O_WRONLY | os.O_CREAT))",
        "import os\nopen('local', 'w').close()\nos.rename('local', '{target}')",
        "import shutil\nopen('local', 'w').write('x')\nshutil.copy('local', '{target}')",
        "import os\nos.remove('{existing}')",
    ],
    ids=["open", "os.open", "rename", "shutil.copy", "remove"],
)
def test_writing_outside_the_working_directory_is_blocked(code, tmp_path):
    existing = tmp_path / "keep.txt"
    existing.write_text("keep")
    target = tmp_path / "evil.txt"
    result = run_python(code.format(target=target, existing=existing))
    assert result.status == "blocked", (result.reason, result.stderr)
    assert not target.exists() and existing.read_text() == "keep"


def test_no_secret_reaches_the_child(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    result = run_python("import os\nprint(sorted(os.environ))\nprint(os.environ.get('OPENAI_API_KEY'))")
    assert result.status == "ok"
    assert "sk-test" not in result.stdout and "OPENAI" not in result.stdout
    assert result.stdout.splitlines() == ["['HOME', 'LANG', 'PATH', 'TMPDIR']", "None"]


def test_network_is_blocked():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        result = run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing ever connected
    assert result.status == "blocked" and "socket." in result.reason
    unix = run_python("import socket\nsocket.socket(socket.AF_UNIX).connect('/run/anything.sock')")
    assert unix.status == "blocked" and "socket.connect" in unix.reason


@pytest.mark.parametrize(
    "code",
    [
        "import ctypes",
        "import sys\nopen('evil.cpython-311-x86_64-linux-gnu.so', 'wb').write(b'\\x7fELF')\n"
        "sys.path.insert(0, '.')\nimport evil",
        "import sys\nsys.settrace(lambda *args: None)",
        "import gc\ngc.get_objects()",
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (100, 100))",
        "import os\nos.kill(os.getppid(), 9)",
        # the hook's own functions are reachable from the child's frames: editing them is refused
        "import sys\nhook = sys._getframe(1).f_globals['_audit_hook']\nhook.__code__ = (lambda *a, **k: None).__code__",
        # rebinding the module's names or the builtins the hook might look up changes nothing
        "import sys, builtins\nsys._getframe(1).f_globals['_check_path'] = lambda *a, **k: None\n"
        "builtins.type = lambda obj: str\nprint(open('/etc/passwd').read())",
    ],
    ids=["ctypes", "native-extension", "settrace", "gc", "setrlimit", "kill", "edit-hook", "rebind-names"],
)
def test_ways_around_the_hook_are_blocked(code):
    result = run_python(code)
    assert result.status == "blocked", (result.reason, result.stderr)
    assert "root:" not in result.stdout


# -- the limits --


def test_an_infinite_loop_is_stopped_by_the_cpu_or_wall_limit():
    result = run_python("while True:\n    pass", FAST)
    assert result.status in ("cpu_limit", "timeout") and result.exit_code is None
    assert result.seconds < FAST.wall_s + 2
    _check_tool_text(result)


def test_sleeping_past_the_wall_clock_limit_is_a_timeout():
    limits = SandboxLimits(cpu_s=2, wall_s=2)
    result = run_python("import os, time\nprint(os.getpgid(0), flush=True)\ntime.sleep(100)", limits)
    assert result.status == "timeout" and "wall-clock" in result.reason
    assert limits.wall_s <= result.seconds < limits.wall_s + 2
    assert not _group_alive(int(result.stdout))  # the output before the kill is kept, and the group is gone
    _check_tool_text(result)


@pytest.mark.parametrize("code", ["b = bytearray(10 * 2**30)", "x = [0] * (2 * 10**9)"], ids=["bytearray", "list"])
def test_a_huge_allocation_hits_the_memory_limit(code):
    result = run_python(code)
    assert result.status == "memory_limit" and "MemoryError" in result.stderr
    _check_tool_text(result)
    assert run_python("print(sum(range(10)))").stdout == "45\n"  # the trainer's side is unaffected


def test_huge_output_is_truncated_and_flagged():
    result = run_python("print('x' * 10**7)")
    assert result.status == "ok" and result.truncated
    assert result.stdout == "x" * SandboxLimits().output_chars
    assert "[output truncated]" in format_result(result)


def test_endless_output_is_drained_without_keeping_it():
    limits = SandboxLimits(cpu_s=1, wall_s=2, output_chars=100)
    result = run_python("while True:\n    print('y' * 10**6)", limits)
    assert result.status in ("cpu_limit", "timeout") and result.truncated
    assert result.stdout == "y" * 100 and result.seconds < limits.wall_s + 2


@pytest.mark.parametrize("field", ["cpu_s", "wall_s", "memory_mb", "output_chars", "file_size_mb", "max_open_files"])
def test_limits_must_be_positive(field):
    for bad in (0, -1, "5"):
        with pytest.raises(ValueError, match=f"SandboxLimits.{field}"):
            SandboxLimits(**{field: bad})


# -- concurrency and the tool --


def test_concurrent_calls_keep_their_outputs_apart():
    codes = [f"import time\ntime.sleep(0.{i % 3})\nprint(input() * {i})" for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda i: run_python(codes[i], stdin=f"{i}\n"), range(8)))
    assert [r.stdout for r in results] == [f"{str(i) * i}\n" for i in range(8)]
    assert all(r.status == "ok" for r in results)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("print(2 ** 10)", "1024"),
        ("sum(range(5))", "10"),
        ("pass", "(no output"),
        ("1 / 0", "ZeroDivisionError: division by zero"),
        ("x = (", "SyntaxError"),
        ("import os\nos.system('true')", "blocked: os.system is not allowed"),
        ("print(open('/proc/self/environ').read())", "blocked: reading /proc/self/environ"),
        ("import socket\nsocket.socket().connect(('127.0.0.1', 9))", "blocked: socket.__new__"),
        ("b = bytearray(10 * 2**30)", "memory_limit"),
        ("print('x' * 10**7)", "[output truncated]"),
        (None, "sandbox error"),
    ],
)
def test_python_tool_answers_with_text(code, expected):
    text = python_tool(code)
    assert isinstance(text, str) and expected in text
    assert python_tool.__doc__ and "code: Python source to run. Print what you want to see." in python_tool.__doc__
