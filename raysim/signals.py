"""Ctrl-C and SIGTERM stop a run the same way.

SIGTERM is what Slurm (``scancel``, the end of a job's time), Kubernetes (a pod deleted) and a
preempted cloud node send before they kill. raysim treats it as Ctrl-C: during a run the first
one asks for a stop after the round in progress, which is then checkpointed, the MLflow run is
marked KILLED and its resume command printed; a second one stops at once (the last checkpoint
is kept). The process then exits 143 (128 + SIGTERM) instead of 130.

Outside a run (start-up, a side-by-side sweep's coordinator), SIGTERM is handed to whatever
handles SIGINT there (Python's KeyboardInterrupt, Ray Tune's stop), so every path that cleans up
after Ctrl-C cleans up after SIGTERM too.
"""

from __future__ import annotations

import signal
import sys
import threading

_TERMINATED = False  # a SIGTERM arrived: the exit code is 143, not 130


def terminated() -> bool:
    return _TERMINATED


def _note_sigterm() -> None:
    global _TERMINATED
    _TERMINATED = True


def _forward(signum, frame) -> None:
    """SIGTERM outside a run: as if SIGINT had arrived."""
    _note_sigterm()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler) and handler is not _forward:
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def forward_sigterm() -> None:
    """Handle SIGTERM as SIGINT in this process from now on (main thread only; a SIGTERM
    that is ignored stays ignored). Called by the command at its start, and again after a
    ``ray.init`` in the main thread, which installs Ray's own handler (exit at once)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
        signal.signal(signal.SIGTERM, _forward)


class DeferredInterrupt:
    """Ctrl-C or SIGTERM during a run stops it between rounds: the first asks for a stop after
    the round in progress (which is then checkpointed), a second one stops at once. An
    interrupt landing inside a library call (an MLflow transaction, a Ray call) would otherwise
    surface as that library's error. SIGINT is taken over only where Python's own handler is in
    force (a shell's background job, which ignores SIGINT, keeps ignoring it); SIGTERM unless it
    is ignored."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGTERM:
            _note_sigterm()
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted"
        again = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
        print(f"\nraysim: {what}: stopping after this round ({again} again to stop now)", file=sys.stderr, flush=True)

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}
