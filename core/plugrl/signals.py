"""Stopping a run on SIGTERM / SIGINT: after the current step with a checkpoint, or at once on the second."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

log = logging.getLogger("plugrl.trainer")


class StopNow(SystemExit):
    """The second signal: stop at once (exit code 128 + its number)."""


class StopOnSignal:
    """SIGTERM / SIGINT ask the loop to stop after the current step (checkpoint saved, exit 0); a second
    SIGTERM or SIGINT stops at once, mid-step, with nothing of that step saved.

    The handler runs in the main thread between two Python bytecodes, so it also runs while vLLM
    generates in process (its engine loop is Python). A flag alone is read only after the step, so
    the second signal raises :class:`StopNow` (a ``SystemExit(128 + signal number)``): the process exits with
    143 (SIGTERM) or 130 (SIGINT), as a shell reports a process killed by that signal, after the cleanup of
    the run on the way out (``plugrl_run_end`` hooks, reward workers) and the atexit handlers; ``plugrl``'s
    command line then skips the interpreter's finalization (seconds of freeing a large heap); no traceback.
    Then the previous handlers are back, so a third signal acts as it would without plugrl (SIGTERM: the
    process dies at once).
    Each signal logs what happens and how to resume.

    Every rank must stop at the same step: :meth:`requested` is a collective.
    """

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame):
        name = signal.Signals(signum).name
        if self.signal_name is None:
            self.signal_name = name
            log.warning(
                "%s: stopping after this step, with a checkpoint. Send it again to stop at once, without "
                "finishing or saving the step.",
                name,
            )
            return
        self._restore()
        log.warning(
            "%s again: stopping now, mid-step, without saving it (exit code %d). Run the same command to "
            "resume from the last checkpoint (trainer.resume=auto).",
            name,
            128 + signum,
        )
        raise StopNow(128 + signum)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def requested(self) -> bool:
        from plugrl.dist import all_reduce  # torch: not for the command line, which only catches StopNow

        asked = all_reduce([1.0 if self.signal_name else 0.0], op="max")[0] > 0
        if asked and not self.signal_name:
            self.signal_name = "a signal on another rank"
        return asked
