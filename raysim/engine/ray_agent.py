"""The stand-ins for Ray's two agents on a local Ray that raysim starts (``ray_start``).

**The dashboard agent.**

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

**The runtime-environment agent.** The raylet also starts Ray's runtime-environment agent (an
aiohttp server importing Ray: about 1 CPU-second of the start and 45 MB) and waits for the port
it listens on. It is asked for nothing while no task or actor carries a ``runtime_env``, which a
local raysim run never gives (and ``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` is off). The stand-in
listens on loopback, writes that port, and answers Ray's three requests without creating
anything: a runtime environment is refused (a ``RuntimeEnvSetupError`` naming the reason), and
the two others answer "nothing there". Its replies are Ray's protobuf messages written by hand
(two fields), checked against Ray's own classes before it is used (``ray_start``).

For metrics, the dashboard, job submission or runtime environments, start Ray yourself
(``ray start --head``) and run with ``--address auto``.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

# the ports Ray's agent writes (ray._raylet's METRICS_AGENT_PORT_NAME, METRICS_EXPORT_PORT_NAME,
# DASHBOARD_AGENT_LISTEN_PORT_NAME)
PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")
# the port the runtime-environment agent writes (ray._raylet's RUNTIME_ENV_AGENT_PORT_NAME)
ENV_PORT = "runtime_env_agent_port"
REFUSAL = ("runtime environments are not available on the local Ray that raysim starts; start Ray "
           "with `ray start --head` and run with --address auto")


def _field(number: int, value: int | str) -> bytes:
    """One protobuf field: a varint (wire type 0) for an int, length-delimited (2) for a string."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode()
    return varint(number << 3 | 2) + varint(len(data)) + data


# Ray's replies (runtime_env_agent.proto), by path: get_or_create: status FAILED (1) and the
# reason; delete_if_possible: status OK (0, proto3's default: no bytes); get_runtime_envs_info:
# no environment, total 0 (no bytes)
REPLIES = {"/get_or_create_runtime_env": _field(1, 1) + _field(2, REFUSAL),
           "/delete_runtime_env_if_possible": b"",
           "/get_runtime_envs_info": b""}


class _Refuse(BaseHTTPRequestHandler):
    def do_POST(self) -> None:       # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = REPLIES.get(self.path.split("?", 1)[0])
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, fmt: str, *args) -> None:
        sys.stderr.write(f"runtime-env agent stand-in: {fmt % args}\n")


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
    if "runtime-env-agent-port" in opts:
        host = opts.get("node-ip-address", "127.0.0.1")
        server = HTTPServer((host, int(opts["runtime-env-agent-port"] or 0)), _Refuse, bind_and_activate=False)
        server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.server_bind()
        server.server_activate()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        persist(opts["session-dir"], opts["node-id"], ENV_PORT, server.server_address[1])
    else:
        for name in PORTS:
            persist(opts["session-dir"], opts["node-id"], name, -1)
    while os.getppid() == raylet:        # the raylet stops it with itself; else it ends within a second
        time.sleep(1.0)


if __name__ == "__main__":
    main(sys.argv[1:])
