"""Host actors forked from one process that has PyTorch and the host code loaded (a "zygote"),
for the local Ray that ``raysim run`` starts.

Each Python worker of a local Ray is a fresh interpreter: it imports PyTorch and raysim's host
code on its own (about 1.5 CPU-seconds) and holds its own copy of what that import allocates,
about 280 MB of private memory per process with PyTorch's CUDA build (its CUDA libraries'
static tables alone are about 90 MB, even on a machine without a GPU), beside the data and
models it then holds. Forked from a process that has done the import once, a worker shares
those pages with it, copy-on-write, until it writes them.

How: the command that starts the local Ray opens a listening Unix socket (abstract: no file;
only its user's processes are served) and starts the zygote (``start``), which imports PyTorch
and the host code that needs no Ray while Ray starts, then Ray and the rest with the
environment of the first worker that asks (Ray reads its settings, its authentication mode
among them, as it is imported), and forks a child for each request. The raylet starts its Python workers with this file as
their script (``ray_start``'s worker path); the worker it starts, the *launcher*, imports
nothing heavy: it connects to the zygote (``ZYGOTE_ENV`` names the socket), sends its command
line, environment and folder, with its standard input, output and error, and waits. The
zygote's child takes them over and runs Ray's worker script as the launcher would have
(``run_worker``). The launcher then mirrors the child: it exits with the child's status and
passes on the signals it is sent; if the launcher is killed, the zygote kills the child. The
worker registers with Ray under its own process id (the child's), so Ray's own kills reach
it. Where anything is missing (not Linux, no zygote, a refused connection), the launcher runs
Ray's worker in its own process, as a local Ray always did; ``RAYSIM_ZYGOTE=off`` in the
environment does so for every worker.

The zygote dies with the thread that started it (PR_SET_PDEATHSIG; ``ray_start`` starts it
from the thread that starts Ray, which lives as long as the process), and its children die
with it. It runs in a session of its own, as the local Ray's other processes do: a signal sent
to the command's process group (a SIGTERM from ``timeout``) reaches the driver only, which
decides how the run stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
from typing import TYPE_CHECKING

ZYGOTE_ENV = "RAYSIM_ZYGOTE"  # the zygote's socket, in the raylet's and its workers' environment
LAUNCHER_ENV = "RAYSIM_LAUNCHER"  # in a forked worker's environment: its launcher's process id
OFF = "off"  # ZYGOTE_ENV's value that keeps every worker a fresh interpreter
_SERVE = "--raysim-zygote"  # the zygote's own command line: this file, this flag, the socket's fd
_PR_SET_PDEATHSIG = 1
# what the zygote imports as it starts, beside Ray's start: PyTorch and the host code that needs
# no Ray (Ray itself, and what imports it, once the first worker's environment is known)
EARLY = ("torch", "raysim.algorithms", "raysim.engine.host")


def _die_with_parent() -> None:
    """SIGKILL this process when the thread that started it ends (Linux's PR_SET_PDEATHSIG)."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


if TYPE_CHECKING:
    import subprocess


# -- the driver's side ---------------------------------------------------------------------------
def start(preload: tuple[str, ...]) -> tuple[str, subprocess.Popen] | None:
    """Start the zygote: (its socket's name, to be put in ``ZYGOTE_ENV`` before Ray starts,
    its process); None where forking workers is not available (not Linux). Call it from the
    thread that starts the local Ray, which lives as long as the process: the zygote dies
    with it. The socket is in Linux's abstract namespace, under a random name: nothing on the
    file system, so nothing is left behind however the run ends (a killed driver included),
    and it goes when the zygote does. The zygote serves only processes of its own user (their
    credentials as the kernel gives them, ``_same_user``)."""
    import secrets
    import subprocess

    if sys.platform != "linux" or not hasattr(socket, "send_fds"):
        return None
    name = "@raysim-zygote-" + secrets.token_hex(16)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(_address(name))
    listener.listen(64)
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), _SERVE, str(listener.fileno()), str(os.getpid()), *preload],
        pass_fds=[listener.fileno()],
        stdin=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    listener.close()
    return name, proc


def stop(zygote: tuple[str, subprocess.Popen] | None) -> None:
    """Stop a zygote ``start`` returned (its workers and its socket go with it)."""
    if zygote is not None:
        _, proc = zygote
        proc.kill()
        proc.wait()


def _address(name: str) -> str:
    """The socket address of a zygote's name ("@..." in the environment, which holds no NUL):
    the abstract namespace's leading NUL."""
    return "\0" + name[1:]


def _same_user(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` runs as this one's user (SO_PEERCRED:
    pid, uid, gid as the kernel recorded them at connect). An abstract socket has no file
    permissions: this is what keeps other users' processes from having workers forked."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


# -- the zygote ----------------------------------------------------------------------------------
def _serve(fd: int, parent: int, preload: list[str]) -> None:
    """The zygote: import, then fork a worker for each launcher that connects."""
    import importlib
    import select
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the whole group: the run decides
    _die_with_parent()
    if os.getppid() != parent:  # the run ended before that took hold
        return
    listener = socket.socket(fileno=fd)
    for name in EARLY:  # what needs no Ray: most of the import, done while Ray starts
        importlib.import_module(name)
    loaded = False  # Ray and the rest imported
    workers: dict[socket.socket, int] = {}  # launcher's connection -> its worker's pid
    while True:
        readable, _, _ = select.select([listener, *workers], [], [], 0.2)
        for conn in readable:
            if conn is not listener:  # the launcher is gone: its worker goes
                _drop(conn, workers)
                continue
            asked = _accept(listener)
            if asked is None:
                continue
            new, request, fds = asked
            if not loaded:
                loaded = True
                _load(request["env"], preload)
            _serve_one(new, request, fds, listener, workers)
        _reap(workers)


def _accept(listener: socket.socket) -> tuple[socket.socket, dict, list[int]] | None:
    """A launcher's connection, its request and its standard streams; None where it is another
    user's process (refused) or its request does not arrive whole."""
    try:
        new, _ = listener.accept()
        if not _same_user(new):
            new.close()
            return None
        data, fds, _, _ = socket.recv_fds(new, 1 << 22, 3)
        request = json.loads(data.decode())
    except (OSError, ValueError):
        return None
    return new, request, fds


def _load(env: dict[str, str], preload: list[str]) -> None:
    """Ray and the rest of ``preload``, imported with the first worker's environment: Ray reads
    its settings from the environment as it is imported (its authentication mode among them)."""
    import gc
    import importlib

    os.environ.clear()
    os.environ.update(env)
    for name in ("ray", *preload):
        importlib.import_module(name)
    gc.collect()
    gc.freeze()  # the imported objects out of the collector's passes: their pages stay shared


def _serve_one(new: socket.socket, request: dict, fds: list[int], listener: socket.socket, workers: dict) -> None:
    """Fork the worker a launcher asked for, and keep its connection (closed where none was forked)."""
    try:
        pid = _fork(new, request, fds, listener, workers)
    except OSError:
        pid = 0
    if pid:
        workers[new] = pid
    else:
        new.close()


def _drop(conn: socket.socket, workers: dict[socket.socket, int]) -> None:
    """A launcher that went away: its worker is killed."""
    import signal

    pid = workers.pop(conn)
    conn.close()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _reap(workers: dict[socket.socket, int]) -> None:
    """Reap the workers that ended; tell each one's launcher its status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        conn = next((c for c, p in workers.items() if p == pid), None)
        if conn is not None:  # (none where its launcher went first)
            del workers[conn]
            with contextlib.suppress(OSError):
                conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            conn.close()


def _fork(conn: socket.socket, request: dict, fds: list[int], listener: socket.socket, others: dict) -> int:
    """Fork the worker a launcher asked for (on ``conn``: its ``request``, its standard
    streams ``fds``); the child never returns."""
    if len(fds) != 3:
        for f in fds:
            os.close(f)
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        for f in fds:
            os.close(f)
        conn.sendall(struct.pack("!i", pid))
        return pid
    code = _run_child(conn, request, fds, listener, others)
    # the interpreter's exit, short of tearing its modules down: the exit functions (Ray's among
    # them), then the streams
    import atexit

    atexit._run_exitfuncs()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _run_child(conn: socket.socket, request: dict, fds: list[int], listener: socket.socket, others: dict) -> int:
    """The forked worker: the launcher's process as it asked (``_become_launcher``), then Ray's
    worker; its exit status, as an interpreter's would be."""
    try:
        _become_launcher(conn, request, fds, listener, others)
        run_worker()
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - as an uncaught error would
        import traceback

        traceback.print_exc()
        code = 1
    return code


def _become_launcher(conn: socket.socket, request: dict, fds: list[int], listener: socket.socket, others: dict) -> None:
    """In the forked child: the zygote's sockets closed, and the launcher's standard streams,
    process group, folder, environment, command line and ``sys.path`` taken over, with what a
    fresh interpreter would have set (SIGINT's handler, a random seed, PyTorch's threads)."""
    _die_with_parent()
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    with contextlib.suppress(OSError):  # the launcher's process group (as a Ctrl-C sees it)
        os.setpgid(0, request["pgid"])
    listener.close()
    for other in others:
        other.close()
    conn.close()
    for i, f in enumerate(fds):
        os.dup2(f, i)
        os.close(f)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"], **{LAUNCHER_ENV: str(request["launcher"])})
    sys.argv = request["argv"]
    for entry in reversed(request["env"].get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    import random

    random.seed()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # what a fresh interpreter's PyTorch would read
        sys.modules["torch"].set_num_threads(int(threads))


# -- the launcher (the worker the raylet starts) ---------------------------------------------------
def launch() -> bool:
    """Have the zygote run this worker; False where there is none to ask (run it here then).
    On success, never returns: exits with the worker's status."""
    name = os.environ.get(ZYGOTE_ENV)
    if not name or name == OFF:
        return False
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(_address(name))
        request = {
            "argv": sys.argv,
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "pgid": os.getpgrp(),
            "launcher": os.getpid(),
        }
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
        pid = struct.unpack("!i", conn.recv(4))[0]
    except (OSError, struct.error):
        conn.close()
        return False
    import signal

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    while True:
        try:
            code = struct.unpack("!i", conn.recv(4))[0]
        except InterruptedError:
            continue
        except (OSError, struct.error):  # the zygote is gone, and its workers with it
            code = 1
        break
    code = 128 - code if code < 0 else code  # died of signal N: the shell's 128 + N
    os._exit(code)


# -- Ray's worker, as this process runs it ---------------------------------------------------------
def default_worker() -> str:
    """The script of Ray's Python workers (``default_worker.py``)."""
    import ray

    return os.path.join(os.path.dirname(ray.__file__), "_private", "workers", "default_worker.py")


def keep_private(path: str) -> None:
    """Ray's ``try_make_directory_shared`` (chmod 0o777, which lets any user of the machine
    remove or replace what is in there) for the folders of raysim's local Ray: its session
    folder and those below are this user's only (0700), so the ones its agents then open to
    everyone are out of reach too; Ray's temporary folder, shared by every Ray on the machine,
    gets the sticky bit as well (0o1777, like /tmp). Another user's folder is left as it is."""
    from ray._common.utils import get_default_ray_temp_dir

    shared = os.path.realpath(path) == os.path.realpath(get_default_ray_temp_dir())
    with contextlib.suppress(PermissionError):
        os.chmod(path, 0o1777 if shared else 0o700)


def run_worker() -> None:
    """A Python worker of raysim's local Ray, in this process: Ray's own (``default_worker.py``,
    run as Ray runs it), whose start makes the session's folders again, here private
    (``keep_private``) instead of 0o777."""
    import runpy

    with contextlib.suppress(ImportError):  # a Ray whose helper is elsewhere: as Ray has it
        from ray._common import utils

        utils.try_make_directory_shared = keep_private
    script = default_worker()
    sys.argv[0] = script
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    sys.path.pop(0)  # this file's folder: no imports from there
    if len(sys.argv) > 3 and sys.argv[1] == _SERVE:
        try:
            _serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
        except Exception as e:  # noqa: BLE001 - the workers start as fresh interpreters then
            print(
                f"raysim: the zygote stopped ({type(e).__name__}: {e}); host actors start as fresh processes",
                file=sys.stderr,
            )
    elif not launch():
        run_worker()
