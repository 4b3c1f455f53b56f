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
it listens on. It is asked only for a task or actor that carries a ``runtime_env``: a raysim
run gives none (and ``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` is off), but Ray Tune gives every trial
actor environment variables (``{"env_vars": {"PL_DISABLE_FORK": "1"}}``), so a sweep's runs side
by side ask for one each. The stand-in listens on loopback, writes that port, and answers Ray's
three requests without creating anything: an environment of variables only is served as Ray's
agent serves it (a context naming the variables, which the worker's own start, Ray's
``setup_worker.py``, sets before it runs the worker), any other is refused (a
``RuntimeEnvSetupError`` naming the reason), and the two other calls answer "nothing there".
Its messages are Ray's protobuf, read and written by hand (a few fields), and checked against
Ray's own classes before it is used (``ray_start._env_stand_in_fits``).

For metrics, the dashboard, job submission or runtime environments, start Ray yourself
(``ray start --head``) and run with ``--address auto``.
"""

from __future__ import annotations

import json
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
REFUSAL = (
    "runtime environments other than env_vars are not available on the local Ray that raysim "
    "starts; start Ray with `ray start --head` and run with --address auto"
)
# the fields of a runtime environment the stand-in serves
SERVED = {"env_vars"}


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


def _fields(data: bytes) -> dict[int, list[int | bytes]]:
    """A protobuf message's fields by number: varints as ints, length-delimited ones as bytes
    (fixed-width ones skipped); ValueError where the bytes are not a message."""
    out: dict[int, list[int | bytes]] = {}
    pos = 0

    def varint() -> int:
        nonlocal pos
        value = shift = 0
        while True:
            if pos >= len(data):
                raise ValueError("a truncated varint")
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while pos < len(data):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            value: int | bytes = varint()
        elif wire == 2:
            size = varint()
            value, pos = data[pos : pos + size], pos + size
            if pos > len(data):
                raise ValueError("a truncated field")
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
            continue
        else:
            raise ValueError(f"wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


def created(request: bytes) -> bytes:
    """The reply to GetOrCreateRuntimeEnvRequest ``request`` (its field 1: the environment as
    JSON). Environment variables only (str to str): status OK (0, proto3's default: no bytes)
    and, in field 3, the context Ray's agent makes for them (RuntimeEnvContext's JSON: no command
    prefix, the variables, this interpreter, no entry point of its own, no jars). Anything
    else: status FAILED (1) and the reason."""
    try:
        env = json.loads(_fields(request).get(1, [b"{}"])[0].decode())
    except (ValueError, AttributeError, UnicodeDecodeError):
        env = None
    variables = env.get("env_vars", {}) if isinstance(env, dict) else None
    if (
        isinstance(env, dict)
        and set(env) <= SERVED
        and isinstance(variables, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in variables.items())
    ):
        context = {
            "command_prefix": [],
            "env_vars": variables,
            "py_executable": sys.executable,
            "override_worker_entrypoint": None,
            "java_jars": [],
        }
        return _field(3, json.dumps(context))
    return _field(1, 1) + _field(2, REFUSAL)


# Ray's replies (runtime_env_agent.proto), by path: get_or_create: ``created``;
# delete_if_possible: status OK (no bytes); get_runtime_envs_info: no environment, total 0 (no
# bytes)
REPLIES = {
    "/get_or_create_runtime_env": created,
    "/delete_runtime_env_if_possible": lambda request: b"",
    "/get_runtime_envs_info": lambda request: b"",
}


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        request = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        answer = REPLIES.get(self.path.split("?", 1)[0])
        body = None if answer is None else answer(request)
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the run's to handle, not the raylet's agent's
    # the raylet that started it (Ray gives its agents its pid): once it is gone this one is
    # reparented, and ends (also when it was gone before this one got here)
    raylet = int(os.environ.get("RAY_RAYLET_PID") or os.getppid())
    if "runtime-env-agent-port" in opts:
        host = opts.get("node-ip-address", "127.0.0.1")
        server = HTTPServer((host, int(opts["runtime-env-agent-port"] or 0)), _Answer, bind_and_activate=False)
        server.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.server_bind()
        server.server_activate()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        persist(opts["session-dir"], opts["node-id"], ENV_PORT, server.server_address[1])
    else:
        for name in PORTS:
            persist(opts["session-dir"], opts["node-id"], name, -1)
    while os.getppid() == raylet:  # the raylet stops it with itself; else it ends within a second
        time.sleep(1.0)


if __name__ == "__main__":
    main(sys.argv[1:])
