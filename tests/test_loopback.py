"""The local Ray that `raysim run` starts is for this machine only: while the run's host actors
are alive, every socket that its processes or the driver listen on is on loopback; Ray's token
file is this user's only (0600 in a 0700 folder, under a temporary HOME here); and no folder of
its session (nor Ray's temporary folder) is writable by every user without the sticky bit. One
run serves the three checks. An early refusal leaving no Ray process behind: tests/test_cluster.py.
"""

import ipaddress
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from tests.conftest import ROOT, TINY
from tests.test_runs import tracked

pytestmark = pytest.mark.ray


def ray_processes(root: psutil.Process, ray_tmp: str) -> list[psutil.Process]:
    """``root`` (the driver) and every process of its Ray: below it, or with its RAY_TMPDIR in
    the arguments (as the module's cluster in tests/test_cluster.py is not)."""
    found = {root, *root.children(recursive=True)}
    for p in psutil.process_iter():
        try:
            if any(ray_tmp in a for a in p.cmdline()):
                found.add(p)
        except psutil.Error:
            pass
    return list(found)


def title(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:100]
    except psutil.Error:
        return "?"


def listening(procs: list[psutil.Process]) -> list[tuple[int, str, str, int]]:
    """(pid, arguments, address, port) of each listening TCP socket of ``procs``."""
    out = []
    for p in procs:
        try:
            conns = p.net_connections(kind="inet")
        except psutil.Error:
            continue
        out += [(p.pid, title(p), c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]
    return out


def loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback  # ::ffff:127.0.0.1 too


@pytest.fixture(scope="module")
def live_run(tmp_path_factory):
    """A `raysim run` (many rounds; 2 hosts, host 0 in the driver's process) whose host actor is
    up: (its process, its Ray's processes with the driver, RAY_TMPDIR, HOME); interrupted
    afterwards."""
    tmp = tmp_path_factory.mktemp("loopback")
    home = tmp / "home"
    home.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths have a limit
    path = tracked(tmp, TINY.replace("rounds: 3", "rounds: 100000"), every=100000)
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "HOME": str(home), "RAY_AUTH_MODE": "token"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "raysim.cli", "run", path, "-q"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        driver = psutil.Process(proc.pid)
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, proc.stderr.read()
            procs = ray_processes(driver, ray_tmp)
            hosts = [p for p in procs if title(p).startswith("ray::RayHost")]
            if len(hosts) == 1 and len(listening(hosts)) == 1:
                break
            assert time.time() < deadline, [title(p) for p in procs]
            time.sleep(0.2)
        yield proc, procs, ray_tmp, home
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stderr.close()


def test_every_process_of_the_local_ray_and_the_driver_listens_on_loopback_only(live_run):
    proc, procs, _, _ = live_run
    sockets = listening(procs)
    names = " ".join(title(p) for p in procs)

    # not vacuous: the GCS, the raylet, the runtime-env agent's stand-in, the host actor and the
    # driver all listen; the dashboard agent's stand-in listens on nothing (both stand-ins are
    # raysim/engine/ray_agent.py, given Ray's agent script as an argument)
    def stand_in(agent: str) -> list[int]:  # a stand-in's pid, given Ray's AGENT script
        return [p.pid for p in procs if "ray_agent.py" in title(p) and any(a.endswith(agent) for a in p.cmdline())]

    for name in ("gcs_server", "raylet", "RayHost"):
        assert name in names, names
    assert "DashboardAgent" not in names and "RuntimeEnvAgent" not in names, names
    dashboard, runtime_env = stand_in("dashboard/agent.py"), stand_in("runtime_env/agent/main.py")
    assert len(dashboard) == 1 and not [s for s in sockets if s[0] in dashboard], sockets
    assert len(runtime_env) == 1 and [s for s in sockets if s[0] in runtime_env], sockets
    assert proc.pid in {pid for pid, *_ in sockets} and len(sockets) >= 6, sockets
    for name in ("gcs_server", "raylet", "RayHost"):  # each of them listens
        assert [s for s in sockets if name in s[1]], (name, sockets)
    assert [s for s in sockets if not loopback(s[2])] == [], sockets


def test_rays_token_file_is_private(live_run):
    _, _, _, home = live_run
    token = home / ".ray" / "auth_token"
    assert token.is_file()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700


def test_no_folder_of_the_session_is_writable_by_everyone_without_the_sticky_bit(live_run):
    _, _, ray_tmp, _ = live_run
    (session,) = [
        e.path
        for e in os.scandir(os.path.join(ray_tmp, "ray"))
        if e.name.startswith("session_") and e.is_dir(follow_symlinks=False)
    ]
    folders = [os.path.join(ray_tmp, "ray")] + [root for root, _, _ in os.walk(session)]
    assert len(folders) > 5, folders
    open_ = [
        (f, oct(os.stat(f).st_mode & 0o7777))
        for f in folders
        if os.stat(f).st_mode & stat.S_IWOTH and not os.stat(f).st_mode & stat.S_ISVTX
    ]
    assert open_ == [], open_
