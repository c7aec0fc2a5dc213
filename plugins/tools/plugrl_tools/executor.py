"""Running tool calls in worker processes: :class:`ToolExecutor`, the pool every run with tools uses (the
kernel's multi-turn loop hands it each turn's calls: the entry-point group ``plugrl.tool_executors``).

Each worker is a fresh interpreter that loads :mod:`plugrl_tools.worker` by file path (standard library only);
calls are checked against the tool's schema in the trainer first (:func:`plugrl_tools.screening.screen_call`), so a
worker only ever runs a call with well-formed arguments. An episode's own tools (``ToolSpec.in_process``: methods of
its environment) run in the trainer's process instead (:func:`call_in_process`, also ``ToolExecutor.call_in_process``,
which the multi-turn loop reaches through :func:`plugrl.rollout.tools.tool_executor`) and are answered alike.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import multiprocessing.connection as mp_connection
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plugrl.rollout.tools import ERROR_KINDS, ToolCall, ToolResult, ToolSpec
from plugrl_tools import worker
from plugrl_tools.authoring import tool_where
from plugrl_tools.screening import ToolCheck, bad_arguments, screen_call
from plugrl_tools.worker import _as_text, _error_text, _truncate

log = logging.getLogger("plugrl.tools")

_BOOTSTRAP = """\
import importlib.util, sys
_spec = importlib.util.spec_from_file_location("_plugrl_tool_worker", sys.argv[1])
_mod = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _mod
_spec.loader.exec_module(_mod)
_mod._worker_main(int(sys.argv[2]), int(sys.argv[3]))
"""

# Environment variables kept from tools (as plugrl.config recognises secret keys), unless named in keep_env.
_SECRET_ENV_RE = re.compile(
    r"api_?key|access_?key|secret|passw(or)?d|private_?key|credential|token$|(^|_)key$|authorization|cookie",
    re.IGNORECASE,
)


def _worker_env(keep: Sequence[str]) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in keep or not _SECRET_ENV_RE.search(k)}


WORKER_START_S = 60.0  # a worker that has not loaded the tools by then is killed
_START_FAILURE_LIMIT = 3  # workers in a row that die or hang before they are ready: stop trying for this batch


@dataclass
class _Task:
    index: int
    started: float
    deadline: float


class _Worker:
    """One worker process (its own session and process group) and the parent's ends of its two pipes."""

    def __init__(self, setup_blob: bytes, env: dict[str, str]):
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        try:
            argv = [sys.executable, "-c", _BOOTSTRAP, worker.__file__, str(p2c_r), str(c2p_w)]
            self.proc = subprocess.Popen(
                argv, pass_fds=(p2c_r, c2p_w), env=env, stdin=subprocess.DEVNULL, start_new_session=True
            )
        except BaseException:
            for fd in (p2c_w, c2p_r):
                os.close(fd)
            raise
        finally:
            os.close(p2c_r)
            os.close(c2p_w)
        self.tx = mp_connection.Connection(p2c_w, readable=False)
        self.rx = mp_connection.Connection(c2p_r, writable=False)
        self.ready = False
        self.born = time.monotonic()
        self.task: _Task | None = None
        try:
            self.tx.send_bytes(setup_blob)
        except OSError:  # it died at once: the closed pipe tells _collect
            pass

    def kill(self) -> None:
        """Kill the worker and its process group (so the tool's subprocesses too), and reap it."""
        try:  # the group is the worker's own session; its id stays ours until the worker is reaped below
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.wait()
        self.tx.close()
        self.rx.close()


def _stop_workers(workers: list[_Worker]) -> None:
    while workers:
        workers.pop().kill()


async def call_in_process(
    call: ToolCall, tool: ToolSpec, *, time_limit_s: float, max_output_chars: int, offered: Sequence[str] = ()
) -> ToolResult:
    """One call of an episode's own tool (:attr:`ToolSpec.in_process`: a method of its environment, whose
    state is the episode's), run in the trainer's process and answered as the worker pool answers.

    A plain function runs in a thread, an ``async def`` one on the episode loop. Past its time limit the
    call is answered with a timeout: an ``async def`` call is cancelled; a plain one cannot be stopped, so
    it finishes in its thread and its result is dropped. Never raises for the call's sake.
    ``offered``: every tool name the episode offers, for the unknown-tool answer."""
    tools = {tool.name: ToolCheck(tool)} if call.name == tool.name else {}
    early, kwargs = screen_call(call, tools, max_output_chars)
    if early is not None:
        if early.error == "unknown_tool" and offered:
            known = ", ".join(sorted(offered))
            early.content = f"Error: unknown tool {call.name!r}; the available tools are: {known}"
        return early
    limit = tool.time_limit_s if tool.time_limit_s is not None else time_limit_s
    started = time.monotonic()
    try:
        if inspect.iscoroutinefunction(tool.fn):
            out = await asyncio.wait_for(tool.fn(**kwargs), limit)
        else:
            out = await asyncio.wait_for(asyncio.to_thread(tool.fn, **kwargs), limit)
            if inspect.isawaitable(out):
                out = await asyncio.wait_for(out, max(0.001, limit - (time.monotonic() - started)))
    except asyncio.TimeoutError:
        content = f"Error: tool {call.name!r} timed out after {limit:g}s"
        return ToolResult(call, content, "timeout", time.monotonic() - started)
    except Exception as e:  # the tool's failure is the model's answer, never the run's
        return ToolResult(call, _truncate(_error_text(e), max_output_chars), "exception", time.monotonic() - started)
    return ToolResult(call, _truncate(_as_text(out), max_output_chars), None, time.monotonic() - started)


class ToolExecutor:
    """Runs batches of tool calls concurrently in ``max_workers`` persistent worker processes.

    ``tools`` maps each name to its :class:`ToolSpec` (the functions are pickled by reference: define them at
    module level). Each call runs within its tool's ``time_limit_s`` (else ``time_limit_s``); a call past it
    has its worker (and that worker's process group) killed and replaced, so a hung tool blocks neither
    the pool nor the other calls. Output beyond ``max_output_chars`` is cut with a note.

    Each worker is a fresh interpreter (``sys.executable``, started with subprocess's fork-exec: never a fork of
    a process that may hold CUDA or threads) in its own session, with the parent's ``sys.path`` and an
    environment without the variables whose names look like secrets (API_KEY, TOKEN, SECRET, PASSWORD, ...;
    names in ``keep_env`` are passed on): they never reach the worker process. It loads only the standard
    library and the tools' modules (no torch, unlike a multiprocessing child, which re-runs the trainer's main
    module): a worker is ready in tens of milliseconds. Workers ignore SIGINT (the trainer stops them); a
    tool may start subprocesses, which die with its worker on a timeout or at :meth:`close` (and with the
    trainer, should it be killed). Calls of one episode may land on different workers: tools keep no state.

    ``run`` is serialised by a lock (one batch at a time). ``counts``: the last batch's tallies.
    ``call_in_process``: :func:`call_in_process`, which runs an episode's own tool in the trainer's process (the
    multi-turn loop finds it here, through :func:`plugrl.rollout.tools.tool_executor`).
    """

    call_in_process = staticmethod(call_in_process)

    def __init__(
        self,
        tools: Mapping[str, ToolSpec],
        *,
        max_workers: int = 4,
        time_limit_s: float = 10.0,
        max_output_chars: int = 4000,
        keep_env: Sequence[str] = (),
    ):
        if not (isinstance(max_workers, int) and max_workers >= 1):
            raise ValueError(f"ToolExecutor: max_workers must be an int >= 1, got {max_workers!r}")
        if not (isinstance(time_limit_s, (int, float)) and time_limit_s > 0):
            raise ValueError(f"ToolExecutor: time_limit_s must be a positive number, got {time_limit_s!r}")
        if not (isinstance(max_output_chars, int) and max_output_chars >= 1):
            raise ValueError(f"ToolExecutor: max_output_chars must be an int >= 1, got {max_output_chars!r}")
        self.max_workers = max_workers
        self.time_limit_s = float(time_limit_s)
        self.max_output_chars = max_output_chars
        self._tools = {name: ToolCheck(_check_entry(name, spec)) for name, spec in tools.items()}
        blobs = {name: _pickle_tool(t.spec) for name, t in self._tools.items()}
        main = _main_ref(t.spec for t in self._tools.values())
        setup = {"tools": blobs, "sys_path": list(sys.path), "main": main, "max_output_chars": max_output_chars}
        self._setup = pickle.dumps(setup, protocol=pickle.HIGHEST_PROTOCOL)
        self.keep_env = tuple(keep_env)
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)
        self._lock = threading.Lock()
        self._closed = False
        self._start_failures = 0
        self._start_error = ""
        self._reported_broken: set[str] = set()
        self._restarts = 0
        self.counts: dict[str, int] = _tally([], 0)
        if self._tools:
            self._fill_pool()

    # ------------------------------------------------------------- public

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run ``calls`` (from any number of episodes) concurrently; their results, in the same order.

        Never raises for a call: malformed calls, unknown tools, bad arguments, exceptions, crashes and
        timeouts are results with ``error`` set. Raises RuntimeError only after :meth:`close`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("ToolExecutor.run after close()")
            results: list[ToolResult | None] = [None] * len(calls)
            pending: deque[tuple[int, bytes]] = deque()
            for i, call in enumerate(calls):
                early, message = self._screen(call)
                if early is None:
                    pending.append((i, message))
                results[i] = early
            self._restarts = 0
            if pending:
                self._drive(list(calls), results, pending)
            done = [
                r or ToolResult(c, "Error: the tool call got no result", "exception")
                for r, c in zip(results, calls, strict=True)
            ]
            self.counts = _tally(done, self._restarts)
            return done

    def close(self) -> None:
        """Kill the worker processes (idempotent); :meth:`run` raises afterwards."""
        with self._lock:
            self._closed = True
            _stop_workers(self._workers)

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def tools(self) -> dict[str, ToolSpec]:
        return {name: t.spec for name, t in self._tools.items()}

    # ------------------------------------------------------------- screening

    def _screen(self, call: ToolCall) -> tuple[ToolResult | None, bytes]:
        """A result for a call that needs no worker (malformed, unknown tool, bad arguments), else the message
        for the worker (the tool's name and keyword arguments, pickled)."""
        early, kwargs = screen_call(call, self._tools, self.max_output_chars)
        if early is not None:
            return early, b""
        try:
            return None, pickle.dumps((call.name, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # not from JSON: a caller passed an object that cannot be sent
            problem = f"the arguments cannot be sent to a worker process ({type(e).__name__}: {e})"
            return bad_arguments(call, self._tools[call.name], [problem], self.max_output_chars), b""

    # ------------------------------------------------------------- the pool

    def _fill_pool(self) -> None:
        while len(self._workers) < self.max_workers and self._start_failures < _START_FAILURE_LIMIT:
            try:
                self._workers.append(_Worker(self._setup, _worker_env(self.keep_env)))
            except OSError as e:  # no interpreter, no processes or file descriptors left
                self._start_failures += 1
                self._start_error = f"{type(e).__name__}: {e}"

    def _drive(
        self, calls: list[ToolCall], results: list[ToolResult | None], pending: deque[tuple[int, bytes]]
    ) -> None:
        self._start_failures = 0  # a new batch tries starting workers again
        while pending or any(w.task for w in self._workers):
            self._fill_pool()
            if not self._workers:
                why = f"Error: the tool worker processes could not start ({self._start_error})"
                for i, _ in pending:
                    results[i] = ToolResult(calls[i], why, "exception")
                log.error("%s", why)
                return
            self._dispatch(calls, pending)
            self._collect(calls, results)
            self._expire(calls, results)

    def _dispatch(self, calls: list[ToolCall], pending: deque[tuple[int, bytes]]) -> None:
        for w in self._workers:
            if not pending:
                return
            if w.ready and w.task is None:
                i, message = pending.popleft()
                spec = self._tools[calls[i].name].spec
                limit = spec.time_limit_s if spec.time_limit_s is not None else self.time_limit_s
                now = time.monotonic()
                w.task = _Task(i, now, now + limit)
                try:
                    w.tx.send_bytes(message)
                except (OSError, ValueError):  # it died since; _collect sees its pipe closed
                    pass

    def _collect(self, calls: list[ToolCall], results: list[ToolResult | None]) -> None:
        """Wait until a worker answers (or dies) or the nearest deadline, and take what came."""
        deadlines = [w.task.deadline for w in self._workers if w.task] + [
            w.born + WORKER_START_S for w in self._workers if not w.ready
        ]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.0
        by_conn = {w.rx: w for w in self._workers}
        for conn in mp_connection.wait(list(by_conn), timeout):
            w = by_conn[conn]
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self._lost(w, calls, results)
                continue
            if msg[0] == "ready":
                w.ready, self._start_failures = True, 0
                self._report_broken(msg[1])
                continue
            task, w.task = w.task, None
            if task is not None:
                kind, content = msg
                error = None if kind == "ok" else "exception"
                results[task.index] = ToolResult(calls[task.index], content, error, time.monotonic() - task.started)

    def _lost(self, w: _Worker, calls: list[ToolCall], results: list[ToolResult | None]) -> None:
        """``w``'s pipe closed: it died (a crash, os._exit, the OOM killer). Fail its call; replace it."""
        self._workers.remove(w)
        w.kill()
        code = w.proc.returncode
        if w.task is not None:
            i = w.task.index
            content = f"Error: the tool's worker process died while running it (exit code {code})"
            results[i] = ToolResult(calls[i], content, "exception", time.monotonic() - w.task.started)
            self._restarts += 1
        elif not w.ready:
            self._start_failures += 1
            self._start_error = f"a worker exited with code {code} while loading the tools"
        else:
            self._restarts += 1

    def _expire(self, calls: list[ToolCall], results: list[ToolResult | None]) -> None:
        """Kill the workers whose call ran past its limit (or which never got ready); they are replaced."""
        now = time.monotonic()
        for w in list(self._workers):
            if w.task is not None and now >= w.task.deadline:
                i = w.task.index
                limit = w.task.deadline - w.task.started
                content = f"Error: tool {calls[i].name!r} timed out after {limit:g}s and was stopped"
                results[i] = ToolResult(calls[i], content, "timeout", now - w.task.started)
                self._workers.remove(w)
                w.kill()
                self._restarts += 1
            elif not w.ready and now >= w.born + WORKER_START_S:
                self._workers.remove(w)
                w.kill()
                self._start_failures += 1
                self._start_error = f"a worker did not load the tools within {WORKER_START_S:g}s"

    def _report_broken(self, broken: dict[str, str]) -> None:
        for name, why in broken.items():
            if name not in self._reported_broken:
                self._reported_broken.add(name)
                log.error(
                    "%s cannot be loaded in the tool workers: %s", tool_where(name, self._tools[name].spec.plugin), why
                )


def _check_entry(name: Any, spec: Any) -> ToolSpec:
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"ToolExecutor: tools[{name!r}] must be a ToolSpec (see make_tool), got {type(spec).__name__}")
    if name != spec.name:
        raise ValueError(f"ToolExecutor: tools[{name!r}] holds the tool named {spec.name!r}; key it by its name")
    return spec


def _pickle_tool(spec: ToolSpec) -> bytes:
    """``spec.fn`` pickled for the workers; a ValueError naming the tool if it cannot be sent there."""
    where = tool_where(spec.name, spec.plugin)
    module = getattr(spec.fn, "__module__", None)
    if module == "__main__" and getattr(sys.modules.get("__main__"), "__file__", None) is None:
        raise ValueError(
            f"{where}: its function is defined in an interactive __main__, which worker processes cannot import; "
            "define it at module level in an importable module"
        )
    try:
        return pickle.dumps(spec.fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise ValueError(
            f"{where}: its function cannot be sent to the tool worker processes ({type(e).__name__}: {e}); "
            "define it at module level (not a lambda, a nested function or a closure)"
        ) from None


def _main_ref(specs: Any) -> tuple[str, str] | None:
    """How a worker finds the parent's ``__main__`` (("name", module) or ("path", file)), if a tool lives there."""
    if not any(getattr(spec.fn, "__module__", None) == "__main__" for spec in specs):
        return None
    main = sys.modules["__main__"]
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name:
        return ("name", name)
    return ("path", os.path.abspath(main.__file__))  # _pickle_tool made sure it has one


def _tally(results: Sequence[ToolResult], restarts: int) -> dict[str, int]:
    """``{"calls", "errors", <one count per error kind>, "worker_restarts"}`` for one batch."""
    counts = {"calls": len(results), "errors": 0, **dict.fromkeys(ERROR_KINDS, 0), "worker_restarts": restarts}
    for r in results:
        if r.error is not None:
            counts["errors"] += 1
            counts[r.error] = counts.get(r.error, 0) + 1
    return counts
