"""A tool worker process: loads the tools' functions, then answers each call with its text, until its pipe closes.

:class:`plugrl_tools.executor.ToolExecutor` starts it as a fresh interpreter (``python -c BOOTSTRAP``) that loads
this file by path as ``_plugrl_tool_worker``: only the standard library is imported before the tools' own modules
(not ``plugrl``, nor the trainer's main module, which multiprocessing's spawn and forkserver re-run in every
child), so a worker is ready in tens of milliseconds. Messages on its pipes hold builtins only. The text helpers
at the end (a tool's output or exception as the model reads it, cut to the limit) are plugrl-tools' only copy:
this file may import nothing of plugrl, so :mod:`plugrl_tools.screening` and an episode's own tools
(:func:`plugrl_tools.executor.call_in_process`) take them from here and answer alike.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import multiprocessing.connection as mp_connection
import os
import pickle
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any


def _load_main(ref: tuple[str, str] | None) -> None:
    """Run the parent's main module as ``__mp_main__`` (as multiprocessing's spawn does), when a tool lives there."""
    if ref is None:
        return
    import runpy

    kind, where = ref
    if kind == "name":
        namespace = runpy.run_module(where, run_name="__mp_main__", alter_sys=True)
    else:
        namespace = runpy.run_path(where, run_name="__mp_main__")
    main = types.ModuleType("__mp_main__")
    main.__dict__.update(namespace)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main


def _watch_parent(parent: int) -> None:
    """If the trainer dies (even by SIGKILL), kill this worker's process group: no tool outlives it."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _worker_main(rx_fd: int, tx_fd: int) -> None:
    """A tool worker: load the tools, then answer each ``(name, kwargs)`` with ``(kind, content)`` until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="parent-watch", daemon=True).start()
    rx = mp_connection.Connection(rx_fd, writable=False)
    tx = mp_connection.Connection(tx_fd, readable=False)
    setup = pickle.loads(rx.recv_bytes())
    sys.path[:] = setup["sys_path"]
    fns: dict[str, Any] = {}
    broken: dict[str, str] = {}
    try:
        _load_main(setup["main"])
    except BaseException as e:
        broken = dict.fromkeys(setup["tools"], f"running the main module failed: {type(e).__name__}: {e}")
    for name, blob in setup["tools"].items():
        if name in broken:
            continue
        try:
            fns[name] = pickle.loads(blob)
        except BaseException as e:
            broken[name] = f"{type(e).__name__}: {e}"
    tx.send(("ready", broken))
    limit = setup["max_output_chars"]
    while True:
        try:
            name, kwargs = pickle.loads(rx.recv_bytes())
        except (EOFError, OSError):
            return
        if name in broken:
            tx.send(("exception", f"Error: tool {name!r} could not be loaded in the tool worker: {broken[name]}"))
            continue
        tx.send(_run_tool(fns[name], kwargs, limit))


def _run_tool(fn: Callable[..., Any], kwargs: dict, limit: int) -> tuple[str, str]:
    try:
        out = fn(**kwargs)
        if inspect.isawaitable(out):
            out = asyncio.run(_awaited(out))
        return "ok", _truncate(_as_text(out), limit)
    except BaseException as e:  # SystemExit too: a tool calling sys.exit() must not take its worker down
        return "exception", _truncate(_error_text(e), limit)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _error_text(e: BaseException) -> str:
    try:
        return f"Error: {type(e).__name__}: {e}"
    except Exception:  # an exception whose str() fails
        return f"Error: {type(e).__name__}"


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, ensure_ascii=False, default=str)
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[output truncated: {len(text) - limit} more characters; tools show at most {limit}]"
