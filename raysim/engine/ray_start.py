"""Ray's lifecycle for one raysim process: start a local Ray or join a cluster (in the
background, while the scenario is validated), and leave it at exit. Imports only Ray, so the
start can begin before torch and the engine are imported. What raysim's local Ray does
differently from Ray's own start lives in ``ray_local``, the check of a cluster's token before
joining it in ``ray_join`` (their names are importable from here too, as before).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from typing import Any

import ray

from raysim.engine import ray_zygote
from raysim.engine.ray_join import TOKEN_WHERE, check_join_auth  # noqa: F401 - re-exported
from raysim.engine.ray_local import (  # noqa: F401 - re-exported
    AGENT,
    LEAN_SKIPS,
    WORKER,
    _agent_stand_in_fits,
    _env_stand_in_fits,
    _local_start_patches,
    _patched,
    _private_files,
)

_EMBEDDED = False  # this process started the Ray it uses (a local one: it cannot grow)
_ZYGOTE: tuple | None = None  # the zygote this process started for its local Ray (ray_zygote.start)
# imported by every worker of a local Ray as it starts (the raylet's preload_python_modules):
# the workers Ray starts with itself import torch and the host code while the driver still
# validates and Ray still starts, and the host actors then take those workers, booted
PRELOAD = ("raysim.engine.ray_engine", "raysim.algorithms")
# a local Ray that raysim starts serves this machine only: each of its processes (GCS, raylet,
# object manager, workers, agents, metrics) listens on loopback. Ray binds them so when the
# node's address is 127.0.0.1, as on macOS and Windows, where its ENABLE_RAY_CLUSTER is off;
# elsewhere ray.init turns 127.0.0.1 into the machine's network address, so that constant is
# off while raysim's Ray starts. A reachable head: ``ray start --head``, then --address.
LOOPBACK = "127.0.0.1"
# the niceness of a local Ray's workers (Ray's default: 15, below its daemons and the driver).
# raysim's workers are its host actors, whose round the driver's host 0 waits for: at 15 they
# lost the cores to the MLflow helper (niceness 10, ``tracker_process.NICE``) and to host 0,
# and a round lasts as long as its slowest host
WORKER_NICENESS = 0
# a start begun by ``start_in_background``: (its thread, set when done, its error if any)
_EARLY: tuple[threading.Thread, threading.Event, list[BaseException]] | None = None


def init(address: str | None, verbose: bool = False, prestart: int = 0) -> None:
    """Start an embedded Ray (address None) or join a cluster ("auto" or HOST:PORT); if a
    background start is under way, wait for it (and raise its error). ``prestart``: a local
    Ray's raylet boots this many Python workers as this driver registers (``preflight.host_actors``:
    the host actors the run will ask for), so that they import PyTorch and the host code
    beside this process's own start rather than after the hosts are asked for; 0: a worker
    is started when an actor or task needs one. With ``prestart`` > 0 a zygote forks the
    workers instead (``ray_zygote``), and none is booted ahead."""
    global _EMBEDDED
    _await_background_start()
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    kwargs: dict[str, Any] = dict(
        logging_level=logging.INFO if verbose else logging.ERROR,
        log_to_driver=verbose,
        configure_logging=True,
    )
    # ray.init in the main thread installs Ray's SIGTERM handler (exit at once); the command's
    # own (raysim.signals: SIGTERM stops a run like Ctrl-C) is put back
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    if address is None:
        _start_local(kwargs, verbose, prestart)
    else:
        check_join_auth(address)
        ray.init(address=address, **kwargs)
    if callable(sigterm) and getattr(sigterm, "__module__", "") == "raysim.signals":
        signal.signal(signal.SIGTERM, sigterm)
    _EMBEDDED = address is None


def _await_background_start() -> None:
    """In any thread but its own: wait for the start ``start_in_background`` began, and raise
    its error if it failed."""
    if _EARLY is not None and threading.current_thread() is not _EARLY[0]:
        _EARLY[1].wait()
        if _EARLY[2]:
            raise _EARLY[2][0]


def _start_local(kwargs: dict[str, Any], verbose: bool, prestart: int) -> None:
    """Start raysim's own local Ray (``ray_local``: what differs from Ray's start), its workers
    forked by a zygote where one can serve, with ``ray.init``'s options ``kwargs``."""
    # always a fresh local Ray: Ray would otherwise join one already running on this
    # machine (joining one is what --address auto says)
    # Ray would boot one worker per CPU as the first driver registers; raysim boots as many
    # as its host actors (``prestart``): an idle one, which no actor takes, holds PyTorch
    # all run (about 300 MB)
    if os.environ.get(ray_zygote.ZYGOTE_ENV) != ray_zygote.OFF:
        prestart = _start_zygote(prestart)
    kwargs.update(
        include_dashboard=False,
        dashboard_host=LOOPBACK,
        _node_ip_address=LOOPBACK,
        _system_config={
            "preload_python_modules": list(PRELOAD),
            "prestart_worker_first_driver": prestart > 0,
            "worker_niceness": WORKER_NICENESS,
        },
    )
    with _patched(_local_start_patches(verbose, prestart)):
        ray.init(address="local", **kwargs)
    _private_files(ray._private.worker._global_node)


def _start_zygote(prestart: int) -> int:
    """Host actors forked from one process with PyTorch and the host code loaded
    (ray_zygote.py), for a run that will ask for host actors: one zygote per local Ray (it
    imports Ray with that Ray's settings), its socket in the environment the raylet and its
    workers inherit (never a zygote inherited from another process). Returns the workers the
    raylet is to boot ahead: none where a zygote serves."""
    global _ZYGOTE
    ray_zygote.stop(_ZYGOTE)
    _ZYGOTE = ray_zygote.start(PRELOAD) if prestart > 0 else None
    if _ZYGOTE:
        os.environ[ray_zygote.ZYGOTE_ENV] = _ZYGOTE[0]
        # and no worker booted ahead: ``ray.init`` waits for such a worker to register,
        # which a forked one does only once the zygote has imported everything (Ray's
        # start took 3.1 to 3.4 s instead of 2.0); asked for with the hosts, it is forked
        # at once
        return 0
    os.environ.pop(ray_zygote.ZYGOTE_ENV, None)
    return prestart


def start_in_background(address: str | None, verbose: bool = False, prestart: int = 0) -> None:
    """Begin ``init`` in a thread, for a process that validates its scenario meanwhile (Ray's
    start is mostly waiting on its own processes: about 4 s of a 2-core machine's 15-s
    quickstart, now spent beside the imports). The thread then stays alive, never returning:
    a local Ray's processes are started with PR_SET_PDEATHSIG, which kills them when the
    *thread* that started them ends. They still end with the process (it exits; its threads
    go with it), as they do after a start in the main thread. For the ``raysim`` command only:
    a process that goes on after a refused scenario (a test calling ``cli.main``) must not be
    left with a Ray it did not ask for."""
    global _EARLY
    if _EARLY is not None or ray.is_initialized():
        return
    done, errors = threading.Event(), []

    def target() -> None:
        try:
            init(address, verbose, prestart)
        except BaseException as e:  # noqa: BLE001 - raised by the next init()
            errors.append(e)
        finally:
            done.set()
        threading.Event().wait()

    thread = threading.Thread(target=target, name="raysim-ray-start", daemon=True)
    _EARLY = (thread, done, errors)
    thread.start()


def embedded() -> bool:
    """True when this process started the local Ray it uses (it cannot grow)."""
    return _EMBEDDED


def initialized() -> bool:
    """True once Ray is up in this process (a background start finished, or a foreign ray.init)."""
    return ray.is_initialized()


def running() -> bool:
    """True once this process has started or joined Ray, or begun to (later sweep variants
    reuse it)."""
    return _EARLY is not None or ray.is_initialized()


def shutdown() -> None:
    """Leave Ray (and stop it, if this process started it)."""
    if ray.is_initialized():
        ray.shutdown()


def stop_for_exit() -> None:
    """For a process about to exit with every result written: leave Ray at once. A local Ray
    this process started is stopped by SIGKILL to each of its processes and their children
    (workers, agents) together, where ``ray.shutdown`` stops them one after another, giving
    each up to a second (about 1.4 s on 2 cores). Ray's own complaint about its raylet dying
    is not shown (standard error is closed first). A start still under way (a scenario
    refused meanwhile) is stopped the same way: its GCS and raylet would die with the process
    (they are bound to its thread), but the agents the raylet has started would not, for
    about 10 s."""
    if not ray.is_initialized():
        if _EARLY is not None and not _EARLY[1].is_set():
            _kill_descendants()
        return
    node = ray._private.worker._global_node
    if not _EMBEDDED or node is None:
        ray.shutdown()
        return
    import psutil

    victims = []
    for infos in node.all_processes.values():
        for info in infos:
            try:
                p = psutil.Process(info.process.pid)
                victims += [p, *p.children(recursive=True)]
            except psutil.Error:
                pass
    sys.stderr.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    for p in victims:
        try:
            p.kill()
        except psutil.Error:
            pass


def _kill_descendants() -> None:
    """SIGKILL to every process below this one (a Ray start under way: a refused scenario
    starts nothing else). Each is stopped (SIGSTOP) as it is found, so none starts another
    (or leaves an orphan) meanwhile, then all go together."""
    import psutil

    found: set[psutil.Process] = set()
    while fresh := {p for p in psutil.Process().children(recursive=True) if p not in found}:
        for p in fresh:
            with contextlib.suppress(psutil.Error):
                p.suspend()
        found |= fresh
    sys.stderr.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the start's complaints, if any
    for p in found:
        with contextlib.suppress(psutil.Error):
            p.kill()
