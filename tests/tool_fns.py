"""Tool functions for tests/test_tools.py: module level, so the tool worker processes can import them by name."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


def echo(text: str, times: int = 1) -> str:
    """Repeat ``text``."""
    return text * times


def sleepy(seconds: float) -> str:
    """Sleep, then say which process slept."""
    time.sleep(seconds)
    return f"slept in {os.getpid()}"


def hang(seconds: float = 30.0) -> str:
    """Sleep far past any time limit."""
    time.sleep(seconds)
    return "woke up"


def hang_with_child(pid_file: str) -> str:
    """Start a subprocess that sleeps, write its pid to ``pid_file``, then hang."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(pid_file).write_text(str(child.pid))
    time.sleep(60)
    return "woke up"


def boom(message: str) -> str:
    """Always fail."""
    raise ValueError(message)


def leave(code: int) -> str:
    """Call sys.exit: the worker must survive it."""
    sys.exit(code)


def crash() -> str:
    """Kill the worker process outright."""
    os._exit(3)


async def async_add(a: int, b: int) -> int:
    """Add after an await."""
    await asyncio.sleep(0.01)
    return a + b


def big(n: int) -> str:
    """``n`` characters of output."""
    return "x" * n


def as_dict(key: str) -> dict:
    """A dict result."""
    return {"key": key, "values": [1, 2.5, None], "ok": True}


def as_list() -> list:
    """A list result."""
    return ["é", 1]


def as_number() -> float:
    """A float result."""
    return 2.5


def as_none() -> None:
    """No result."""


def env_var(name: str) -> str:
    """An environment variable as the worker sees it."""
    return os.environ.get(name, "<unset>")


def pid() -> int:
    """The worker's process id."""
    return os.getpid()


def noop() -> str:
    """The cheapest tool: measures the executor's overhead."""
    return "ok"


def options(
    mode: Literal["fast", "exact"],
    tags: list[str],
    limit: int | None = None,
    scale: float = 1.5,
    flags: dict[str, bool] | None = None,
) -> dict:
    """Echo the arguments it got."""
    return {"mode": mode, "tags": tags, "limit": limit, "scale": scale, "flags": flags}


def maybe(note: str | None) -> str:
    """Optional without a default: the executor passes None when the model leaves it out."""
    return repr(note)
