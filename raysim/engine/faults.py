"""Fault injection for raysim's own tests: the one place the run loop and the Ray hosts look for
test-only hooks. Each hook is off unless its environment variable is set, which only the test
suite does (the variables reach Ray's worker processes through the environment).

- ``RAYSIM_FAIL_AFTER_ROUND=R``: the driver raises after round R completes (after its
  checkpoint), to prove crash handling (FAILED run, resume command, no checkpoint lost).
- ``RAYSIM_PAUSE_AFTER_ROUND=R[:SECONDS]``: the driver sleeps after round R's checkpoint (for
  ever without SECONDS), for a test to SIGKILL it or take a node away.
- ``RAYSIM_KILL_HOST=ACTION:PHASE:ROUND:HOST:MARKER``: host HOST, when it starts PHASE (train,
  evaluate, gossip_train, gossip_mix) of 0-based round ROUND, once (MARKER is a file it creates
  first), SIGKILLs its own process as the kernel's OOM killer would (ACTION ``kill``) or never
  answers (``hang``). A host actor only: host 0 in the driver's process (``resources.driver_host``)
  ignores it, as killing it is killing the driver.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

FAIL_ENV = "RAYSIM_FAIL_AFTER_ROUND"
PAUSE_ENV = "RAYSIM_PAUSE_AFTER_ROUND"
KILL_ENV = "RAYSIM_KILL_HOST"


def after_round(r: int) -> None:
    """Called by the run loop once round ``r`` is recorded and checkpointed."""
    pause_after, _, pause_s = (os.environ.get(PAUSE_ENV, "") or "0").partition(":")
    if int(pause_after) and r == int(pause_after):
        time.sleep(float(pause_s or 10**6))
    fail_after = int(os.environ.get(FAIL_ENV, "0") or 0)
    if fail_after and r == fail_after:
        raise RuntimeError(f"{FAIL_ENV}={fail_after}: injected failure after round {r}")


def host_fault(phase: str, round_: int, host: int) -> None:
    """Called by a Ray host (with clients) as it starts ``phase`` of 0-based round ``round_``."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    action, want_phase, want_round, want_host, marker = spec.split(":", 4)
    if (want_phase, int(want_round), int(want_host)) == (phase, round_, host) and not Path(marker).exists():
        Path(marker).touch()
        if action == "hang":
            time.sleep(10**6)
        os.kill(os.getpid(), signal.SIGKILL)
