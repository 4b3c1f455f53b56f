"""Host actors of raysim's local Ray forked from the zygote (raysim/engine/ray_zygote.py): they
share PyTorch's pages with it, run as Ray workers, and die with their launcher, their zygote
and the driver; they serve their own user only and leave no file behind."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from raysim.engine import ray_zygote
from tests.conftest import ROOT

pytestmark = pytest.mark.ray

# a driver that starts raysim's local Ray as ``raysim run`` does for one host actor, asks an
# actor for its process, then waits for a line on standard input (each line: a call; EOF: leave)
DRIVER = r"""
import json, os, sys
from raysim.engine import ray_start
import ray
ray_start.init(None, prestart=1)

@ray.remote
class Host:
    def where(self):
        import torch
        a = torch.randn(64, 64)
        return {"pid": os.getpid(), "sum": float((a @ a).sum() * 0 + 1), "threads": torch.get_num_threads(),
                "launcher": int(os.environ.get("RAYSIM_LAUNCHER", 0)), "zygote": os.environ.get("RAYSIM_ZYGOTE"),
                "nice": os.getpriority(os.PRIO_PROCESS, 0)}

@ray.remote
def variables(name):
    return {"value": os.environ.get(name), "launcher": int(os.environ.get("RAYSIM_LAUNCHER", 0))}

h = Host.remote()
print(json.dumps({"driver": os.getpid(), **ray.get(h.where.remote(), timeout=120)}), flush=True)
for line in sys.stdin:
    try:
        if line.startswith("env "):       # a task with a runtime environment (JSON), as Tune's trials have
            env = json.loads(line[4:])
            print(json.dumps(ray.get(variables.options(runtime_env=env).remote("RAYSIM_T"), timeout=60)), flush=True)
        else:
            print(json.dumps(ray.get(h.where.remote(), timeout=60)), flush=True)
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
"""


def reply(proc):
    """The driver's next answer (Ray's own lines on its output passed over)."""
    while True:
        line = proc.stdout.readline()
        assert line, "the driver ended"
        if line.startswith("{"):
            return json.loads(line)


@contextlib.contextmanager
def driver(env_extra=None):
    """The driver above, running: (its process, its first answer); ended on leaving."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        yield proc, reply(proc)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def zygote_of(pid):
    parent = psutil.Process(pid).parent()
    return parent if parent is not None and "--raysim-zygote" in parent.cmdline() else None


def launchers(driver_pid):
    return [
        p
        for p in psutil.Process(driver_pid).children(recursive=True)
        if any(a.endswith("zygote.py") for a in p.cmdline()[:2]) and "--raysim-zygote" not in p.cmdline()
    ]


def gone(pid, within=15.0):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_a_host_actor_is_forked_from_the_zygote_and_shares_pytorch_with_it():
    with driver() as (proc, first):
        zygote = zygote_of(first["pid"])
        assert zygote is not None, psutil.Process(first["pid"]).parent().cmdline()
        assert first["sum"] == 1.0  # it computes
        # PyTorch's import alone is about 280 MB of private memory in a fresh interpreter (CUDA
        # build); forked, the actor holds only what it has written since
        assert psutil.Process(first["pid"]).memory_full_info().uss < 150 * 2**20
        fresh = subprocess.run(
            [sys.executable, "-c", "import torch, psutil; print(psutil.Process().memory_full_info().uss)"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert int(fresh.stdout) > 200 * 2**20


def test_a_host_actor_runs_at_the_drivers_priority():
    # Ray's workers default to niceness 15, below the MLflow helper (10) and host 0 in the driver (0)
    with driver() as (proc, first):
        assert first["nice"] == os.getpriority(os.PRIO_PROCESS, first["driver"]) == 0


def test_a_task_with_environment_variables_gets_them_and_one_with_packages_is_refused_with_the_reason():
    # Ray Tune gives every trial actor {"env_vars": {...}}: the runtime-environment agent's
    # stand-in serves it (the worker, forked by the zygote too, sees the variable); a package
    # it cannot install is refused, naming what to do instead
    with driver() as (proc, first):
        proc.stdin.write('env {"env_vars": {"RAYSIM_T": "x y"}}\n')
        proc.stdin.flush()
        got = reply(proc)
        assert got["value"] == "x y" and got["launcher"] > 0, got
        proc.stdin.write('env {"pip": ["raysim-no-such-package"]}\n')
        proc.stdin.flush()
        got = reply(proc)
        assert got["error"] == "RuntimeEnvSetupError" and "ray start --head" in got["message"], got


def test_without_the_zygote_a_host_actor_is_a_fresh_interpreter():
    with driver({"RAYSIM_ZYGOTE": "off"}) as (proc, first):
        assert zygote_of(first["pid"]) is None and first["launcher"] == 0
        assert first["sum"] == 1.0
        assert not [
            p for p in psutil.Process(first["driver"]).children(recursive=True) if "--raysim-zygote" in p.cmdline()
        ]


def test_a_launcher_killed_takes_its_worker_with_it_and_ray_sees_the_actor_die():
    with driver() as (proc, first):
        for p in launchers(first["driver"]):
            p.kill()
        assert gone(first["pid"])
        proc.stdin.write("again\n")
        proc.stdin.flush()
        assert reply(proc)["error"] == "ActorDiedError"


def test_a_worker_killed_ends_its_launcher():
    with driver() as (proc, first):
        launcher = first["launcher"]
        assert launcher in [p.pid for p in launchers(first["driver"])]
        os.kill(first["pid"], signal.SIGKILL)
        assert gone(launcher)


def test_the_driver_killed_takes_the_zygote_and_its_workers_with_it():
    with driver() as (proc, first):
        zygote = zygote_of(first["pid"])
        assert zygote is not None
        proc.kill()
        proc.wait(timeout=30)
        assert gone(zygote.pid)
        assert gone(first["pid"])
        # its socket went with it, and no file of it is left (an abstract socket has none)
        assert first["zygote"].startswith("@raysim-zygote-")
        with pytest.raises(ConnectionRefusedError):
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET).connect(ray_zygote._address(first["zygote"]))


def as_other_user(name):
    """In a child turned user 65534: connect to the zygote ``name``, send a request as a
    launcher does and read the reply: "closed" where the zygote hangs up (before the request
    is sent or after), "forked" where it answers with a worker's pid."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only sockets, then leave
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            c.connect(ray_zygote._address(name))
            request = {"argv": ["x"], "env": {}, "cwd": "/", "pgid": os.getpgrp(), "launcher": os.getpid()}
            c.settimeout(30)
            try:
                socket.send_fds(c, [json.dumps(request).encode()], [0, 1, 2])
                answer = c.recv(4)
            except (BrokenPipeError, ConnectionResetError):  # hung up before or after the request came
                answer = b""
            os.write(write, b"closed" if answer == b"" else b"forked")
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(write, repr(e).encode()[:200])
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as f:
        return f.read().decode()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to act as another user")
def test_the_zygote_forks_nothing_for_another_user():
    with driver() as (proc, first):
        zygote = zygote_of(first["pid"])
        before = {p.pid for p in zygote.children()}
        assert as_other_user(first["zygote"]) == "closed"
        assert {p.pid for p in zygote.children()} == before
        proc.stdin.write("again\n")  # and it still serves its own user's
        proc.stdin.flush()
        assert reply(proc)["pid"] == first["pid"]
