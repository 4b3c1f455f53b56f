"""The stand-in for Ray's dashboard agent on a local Ray that raysim starts (``ray_start``).

Ray's raylet starts a dashboard agent beside itself and waits, before the node registers, for
the ports it serves (metrics, metrics export, its HTTP listener) to be written in the
session's folder. The agent serves the dashboard, Prometheus metrics, job submission and the
state API's logs: none of which a local Ray without its API server (``ray_start.LEAN_SKIPS``)
uses. Importing it costs about 1.7 CPU-seconds on the start's critical path and it then holds
about 77 MB. This script does what Ray's own agent does where Ray is installed without its
dashboard (``--minimal``): it writes -1 for each of those ports ("not served": the raylet and
the workers then export no metrics) and lives as long as the raylet that started it, which
stops it with itself. It imports nothing of Ray's; the file format it writes is checked against
Ray's own ``persist_port`` before it is used (``ray_start._agent_stand_in_fits``).

For metrics, the dashboard or job submission, start Ray yourself (``ray start --head``) and run
with ``--address auto``.
"""
from __future__ import annotations

import os
import signal
import sys
import time

# the ports Ray's agent writes (ray._raylet's METRICS_AGENT_PORT_NAME, METRICS_EXPORT_PORT_NAME,
# DASHBOARD_AGENT_LISTEN_PORT_NAME)
PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")


def persist(session_dir: str, node_id: str, name: str, port: int) -> None:
    """Write ``port`` as Ray's ``persist_port`` does: the number, in the file NAME_NODEID of
    the session's folder (written whole, then renamed into place)."""
    path = os.path.join(session_dir, f"{name}_{node_id}")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    """``argv``: Ray's agent command line (its script first, then --key=value options)."""
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # a Ctrl-C is the run's to handle, not the raylet's agent's
    # the raylet that started it (Ray gives its agents its pid): once it is gone this one is
    # reparented, and ends (also when it was gone before this one got here)
    raylet = int(os.environ.get("RAY_RAYLET_PID") or os.getppid())
    for name in PORTS:
        persist(opts["session-dir"], opts["node-id"], name, -1)
    while os.getppid() == raylet:        # the raylet stops it with itself; else it ends within a second
        time.sleep(1.0)


if __name__ == "__main__":
    main(sys.argv[1:])
