"""Ray's lifecycle for one raysim process: start a local Ray or join a cluster (in the
background, while the scenario is validated), and leave it at exit. Imports only Ray, so the
start can begin before torch and the engine are imported.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import Any, Iterator

import ray

_EMBEDDED = False      # this process started the Ray it uses (a local one: it cannot grow)
# imported by every worker of a local Ray as it starts (the raylet's preload_python_modules):
# the workers Ray starts with itself import torch and the host code while the driver still
# validates and Ray still starts, and the host actors then take those workers, booted
PRELOAD = ("raysim.engine.ray_engine", "algorithms")
# a local Ray's head processes raysim never uses (the methods of Ray's Node that start them):
# the API server (dashboard, job submission, state API), which Ray's start waits on until it
# has written its address (about 2.5 s of a 6-s start on 2 cores), and the autoscaler's
# monitor (a local Ray cannot grow); the log monitor too unless worker logs are shown (-v)
LEAN_SKIPS = ("start_api_server", "start_monitor")
# a start begun by ``start_in_background``: (its thread, set when done, its error if any)
_EARLY: tuple[threading.Thread, threading.Event, list[BaseException]] | None = None


def init(address: str | None, verbose: bool = False) -> None:
    """Start an embedded Ray (address None) or join a cluster ("auto" or HOST:PORT); if a
    background start is under way, wait for it (and raise its error)."""
    global _EMBEDDED
    if _EARLY is not None and threading.current_thread() is not _EARLY[0]:
        _EARLY[1].wait()
        if _EARLY[2]:
            raise _EARLY[2][0]
    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    kwargs: dict[str, Any] = dict(
        logging_level=logging.INFO if verbose else logging.ERROR,
        log_to_driver=verbose,
        configure_logging=True,
    )
    if address is None:
        # always a fresh local Ray: Ray would otherwise join one already running on this
        # machine (joining one is what --address auto says)
        kwargs.update(include_dashboard=False, dashboard_host="127.0.0.1",
                      _system_config={"preload_python_modules": list(PRELOAD)})
        with _lean_head(LEAN_SKIPS + (() if verbose else ("start_log_monitor",))):
            ray.init(address="local", **kwargs)
    else:
        ray.init(address=address, **kwargs)
    _EMBEDDED = address is None


@contextlib.contextmanager
def _lean_head(skips: tuple[str, ...]) -> Iterator[None]:
    """While a local Ray starts here, the head-node processes named by ``skips`` (methods of
    Ray's private ``Node``) are not started. ``ray.init`` has no option for them: it always
    starts the API server, the autoscaler's monitor and the log monitor. On a Ray without one
    of those methods that one is simply started; the class is restored afterwards. Without
    the API server, a local Ray that raysim starts has no dashboard, state API (``ray list``)
    or job submission: for those, start one with ``ray start --head`` and run with
    ``--address auto``."""
    from ray._private.node import Node
    saved = {name: Node.__dict__[name] for name in skips if name in Node.__dict__}
    for name in saved:
        setattr(Node, name, _not_started)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)


def _not_started(self, *args, **kwargs) -> None:
    return None


def start_in_background(address: str | None, verbose: bool = False) -> None:
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
            init(address, verbose)
        except BaseException as e:          # noqa: BLE001 - raised by the next init()
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
    is not shown (standard error is closed first). A start still under way is left to die
    with the process (its processes are bound to its thread)."""
    if not ray.is_initialized():
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
