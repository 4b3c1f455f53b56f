"""Ray's lifecycle for one raysim process: start a local Ray or join a cluster (in the
background, while the scenario is validated), and leave it at exit. Imports only Ray, so the
start can begin before torch and the engine are imported.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from raysim.engine import ray_zygote

_EMBEDDED = False  # this process started the Ray it uses (a local one: it cannot grow)
_ZYGOTE: tuple | None = None  # the zygote this process started for its local Ray (ray_zygote.start)
# imported by every worker of a local Ray as it starts (the raylet's preload_python_modules):
# the workers Ray starts with itself import torch and the host code while the driver still
# validates and Ray still starts, and the host actors then take those workers, booted
PRELOAD = ("raysim.engine.ray_engine", "raysim.algorithms")
# a local Ray's head processes raysim never uses (the methods of Ray's Node that start them):
# the API server (dashboard, job submission, state API), which Ray's start waits on until it
# has written its address (about 2.5 s of a 6-s start on 2 cores), and the autoscaler's
# monitor (a local Ray cannot grow); the log monitor too unless worker logs are shown (-v)
LEAN_SKIPS = ("start_api_server", "start_monitor")
# a local Ray that raysim starts serves this machine only: each of its processes (GCS, raylet,
# object manager, workers, agents, metrics) listens on loopback. Ray binds them so when the
# node's address is 127.0.0.1, as on macOS and Windows, where its ENABLE_RAY_CLUSTER is off;
# elsewhere ray.init turns 127.0.0.1 into the machine's network address, so that constant is
# off while raysim's Ray starts. A reachable head: ``ray start --head``, then --address.
LOOPBACK = "127.0.0.1"
# what a local Ray raysim starts runs as its dashboard agent (``ray_agent``: the ports Ray waits
# for, written as "not served", as Ray's own agent does without its dashboard's packages)
AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_agent.py")
# the script a worker of raysim's local Ray runs: the zygote's launcher, which runs Ray's own
# worker script itself where no zygote serves (``ray_zygote.run_worker``)
WORKER = ray_zygote.__file__
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
    global _EMBEDDED, _ZYGOTE
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
    # ray.init in the main thread installs Ray's SIGTERM handler (exit at once); the command's
    # own (raysim.signals: SIGTERM stops a run like Ctrl-C) is put back
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    if address is None:
        # always a fresh local Ray: Ray would otherwise join one already running on this
        # machine (joining one is what --address auto says)
        # Ray would boot one worker per CPU as the first driver registers; raysim boots as many
        # as its host actors (``prestart``): an idle one, which no actor takes, holds PyTorch
        # all run (about 300 MB)
        if os.environ.get(ray_zygote.ZYGOTE_ENV) != ray_zygote.OFF:
            # host actors forked from one process with PyTorch and the host code loaded
            # (ray_zygote.py), for a run that will ask for host actors: one zygote per local Ray
            # (it imports Ray with that Ray's settings), its socket in the environment the raylet
            # and its workers inherit (never a zygote inherited from another process)
            ray_zygote.stop(_ZYGOTE)
            _ZYGOTE = ray_zygote.start(PRELOAD) if prestart > 0 else None
            if _ZYGOTE:
                os.environ[ray_zygote.ZYGOTE_ENV] = _ZYGOTE[0]
                # and no worker booted ahead: ``ray.init`` waits for such a worker to register,
                # which a forked one does only once the zygote has imported everything (Ray's
                # start took 3.1 to 3.4 s instead of 2.0); asked for with the hosts, it is forked
                # at once
                prestart = 0
            else:
                os.environ.pop(ray_zygote.ZYGOTE_ENV, None)
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
    else:
        check_join_auth(address)
        ray.init(address=address, **kwargs)
    if callable(sigterm) and getattr(sigterm, "__module__", "") == "raysim.signals":
        signal.signal(signal.SIGTERM, sigterm)
    _EMBEDDED = address is None


TOKEN_WHERE = "~/.ray/auth_token (or RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)"


def check_join_auth(address: str, timeout_s: float = 10.0) -> None:
    """Before joining the cluster at ``address``: ask its GCS for the cluster's id as Ray's own
    client will (with the token header Ray's interceptor adds when this process uses token
    authentication); when it answers UNAUTHENTICATED, raise a ScenarioError (exit 2: a setting
    to fix before any run can start) whose one line says what to set. Ray itself would
    retry for about 20 s, printing an InvalidAuthToken warning a second, then raise a bare
    ConnectionError (exit 1). Anything else (no answer, an unknown address, a Ray without
    token authentication) is left to ``ray.init`` to report."""
    from raysim.scenario.schema import ScenarioError

    try:
        import grpc
        from ray._private import services
        from ray._private.authentication import authentication_token_setup as setup
        from ray._private.authentication.grpc_authentication_client_interceptor import (
            SyncAuthenticationMetadataClientInterceptor,
        )
        from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, get_authentication_mode
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:
        return
    try:
        target = services.canonicalize_bootstrap_address(address)
    except Exception:  # noqa: BLE001 - no cluster there: ray.init says so
        return
    if not target:
        return
    if address == "auto":  # Ray's rule for "auto" (ray.init applies it next): an existing token
        setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)  # turns token mode on
    channel = grpc.intercept_channel(grpc.insecure_channel(target), SyncAuthenticationMetadataClientInterceptor())
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s
        )
        return
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.UNAUTHENTICATED:
            return
    finally:
        channel.close()
    where = f"--address {address}: the Ray cluster at {target}"
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        raise ScenarioError(
            f"{where} requires token authentication; set RAY_AUTH_MODE=token for raysim too "
            f"(export RAY_AUTH_MODE=token), with the cluster's token in {TOKEN_WHERE}"
        )
    if not AuthenticationTokenLoader.instance().has_token():
        raise ScenarioError(
            f"{where} requires token authentication and raysim found no token; put the cluster's token in {TOKEN_WHERE}"
        )
    raise ScenarioError(
        f"{where} refused raysim's token (RAY_AUTH_TOKEN, else the file at RAY_AUTH_TOKEN_PATH, "
        f"else ~/.ray/auth_token); give raysim the cluster's token (the head's ~/.ray/auth_token)"
    )


def _local_start_patches(verbose: bool, prestart: int = 0) -> list[tuple[Any, str, Any]]:
    """What differs while raysim starts a local Ray, as (owner, name, stand-in). The head-node
    processes raysim never uses (methods of Ray's private ``Node``; ``ray.init`` has no option
    for them: it always starts the API server, the autoscaler's monitor and the log monitor;
    without the API server there is no dashboard, state API (``ray list``) or job submission:
    for those, start one with ``ray start --head`` and run with ``--address auto``); Ray's
    ENABLE_RAY_CLUSTER, off (the node's address stays 127.0.0.1: see ``LOOPBACK``); the chmod
    0o777 Ray gives each folder it makes (``ray_zygote.keep_private``), here and in each Python
    worker, which makes the session's folders again as it starts (its script is
    ``ray_zygote.py``); the number of workers the raylet boots for the first driver (one per CPU
    in Ray, ``prestart`` here: ``_with_prestart``); the writing of a new token file
    (``_write_token_privately``); the dashboard agent, which serves what the API server would
    show and the metrics: its stand-in (``ray_agent``) only says it serves nothing; and the
    runtime-environment agent, asked only for a ``runtime_env``: its stand-in serves one of
    environment variables (Ray Tune's trials carry one) and refuses any other; the session its
    processes run in: one of their own (``_in_own_session``), not the command's; with the
    dashboard agent's stand-in, Ray's check of its dashboard's packages
    (``_agent_options_unread``)."""
    import importlib

    from ray._private.node import Node

    def module(name: str) -> Any:  # None where this Ray lacks it
        with contextlib.suppress(ImportError):
            return importlib.import_module(name)

    skips = LEAN_SKIPS + (() if verbose else ("start_log_monitor",))
    patches = [
        *((Node, name, _not_started) for name in skips),
        (module("ray._private.ray_constants"), "ENABLE_RAY_CLUSTER", False),
        (module("ray._common.utils"), "try_make_directory_shared", ray_zygote.keep_private),
        (
            module("ray._private.authentication.authentication_token_setup"),
            "generate_and_save_token",
            _write_token_privately,
        ),
    ]
    if os.path.isfile(ray_zygote.default_worker()):
        patches.append((Node, "__init__", _with_worker_path(vars(Node)["__init__"])))
    services = module("ray._private.services")
    if services is not None and prestart > 0 and "start_ray_process" in vars(services):
        patches.append((services, "start_ray_process", _with_prestart(vars(services)["start_ray_process"], prestart)))
    if services is not None and isinstance(vars(services).get("ConsolePopen"), type):
        patches.append((services, "ConsolePopen", _in_own_session(vars(services)["ConsolePopen"])))
    build = "_build_python_executable_command_memory_profileable"
    if services is not None and build in vars(services) and _agent_stand_in_fits():
        from ray._private import ray_constants

        agents = {ray_constants.PROCESS_TYPE_DASHBOARD_AGENT}
        if _env_stand_in_fits():
            agents.add(ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT)
        patches.append((services, build, _with_agent_stand_in(vars(services)[build], agents)))
        patches.append((module("ray._private.utils"), "get_dashboard_dependency_error", _agent_options_unread))
    return [(owner, name, new) for owner, name, new in patches if owner is not None]


def _in_own_session(popen: type) -> type:
    """Ray's class for starting its processes (``services.ConsolePopen``), each started in a
    session (and process group) of its own. In the command's process group, a SIGTERM sent to
    the group (``timeout``, ``kill -TERM -- -PGID``, a job runner stopping a process group) killed
    the GCS and the raylet beside the driver, which was finishing its round: it then waited 60 s
    for the GCS and died of Ray's fatal error, its MLflow run left RUNNING and no resume command
    printed. Now the driver alone gets it and stops as for its own SIGTERM. (A Ctrl-C was never
    the problem: Ray's processes block SIGINT.) They still die with the process that started
    them (Ray's PR_SET_PDEATHSIG) and with ``stop_for_exit``."""

    class InOwnSession(popen):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)

    InOwnSession.__name__ = InOwnSession.__qualname__ = popen.__name__
    return InOwnSession


def _agent_options_unread() -> None:
    """Ray's check of its dashboard's packages while it starts the dashboard agent ("none
    missing"). Ray's own check imports them all (aiohttp, gRPC, OpenCensus, Prometheus' client:
    about 20 MB and 0.3 s of CPU in the driver, as Ray starts) to choose one option of its agent's
    command line (``--minimal``), which the stand-in does not read."""
    return None


def _agent_stand_in_fits() -> bool:
    """Whether this Ray reads its dashboard agent's ports as ``ray_agent`` writes them: the same
    port names, and Ray's own ``persist_port`` writing the same file as the stand-in's. Where
    not (another Ray), Ray's agent is started as Ray has it."""
    import tempfile

    from raysim.engine import ray_agent

    try:
        from ray import _raylet

        names = (
            _raylet.METRICS_AGENT_PORT_NAME,
            _raylet.METRICS_EXPORT_PORT_NAME,
            _raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME,
        )
        persist_port = _raylet.persist_port
    except (ImportError, AttributeError):
        return False
    if names != ray_agent.PORTS:
        return False
    with tempfile.TemporaryDirectory() as ray_dir, tempfile.TemporaryDirectory() as ours:
        try:
            persist_port(ray_dir, "5e" * 28, names[0], -1)
        except Exception:  # noqa: BLE001 - a Ray whose persist_port differs: its own agent
            return False
        ray_agent.persist(ours, "5e" * 28, names[0], -1)

        def files(d: str) -> dict[str, bytes]:
            return {f: Path(d, f).read_bytes() for f in os.listdir(d)}

        return files(ray_dir) == files(ours)


# the raylet's option for how many Python workers it boots as the first driver registers
PRESTART_OPTION = "--num_prestart_python_workers="


def _with_prestart(start: Any, count: int) -> Any:
    """Ray's launcher of its processes, the raylet's being told to boot ``count`` Python workers
    for the first driver (Ray gives it the node's CPU count)."""

    def start_ray_process(command: list[str], *args, **kwargs) -> Any:
        command = [f"{PRESTART_OPTION}{count}" if str(c).startswith(PRESTART_OPTION) else c for c in command]
        return start(command, *args, **kwargs)

    return start_ray_process


def _env_stand_in_fits() -> bool:
    """Whether this Ray's runtime-environment agent is what ``ray_agent`` stands in for: the
    same port name, the same three request paths in Ray's agent, and the stand-in's answers
    read, with Ray's own protobuf classes, as the messages meant: to a request written by Ray's
    classes for environment variables (as Ray Tune's trials carry), status OK and a context that
    Ray's own RuntimeEnvContext reads back whole, as its agent would make it; to one for a
    package, a refusal naming its reason; an empty answer to the two other calls. Where not
    (another Ray), Ray's agent is started."""
    from raysim.engine import ray_agent

    try:
        from ray import _raylet
        from ray._private.runtime_env.context import RuntimeEnvContext
        from ray.core.generated import runtime_env_agent_pb2 as pb
        from ray.runtime_env import RuntimeEnv

        name = _raylet.RUNTIME_ENV_AGENT_PORT_NAME
        # read, not imported (its import puts its own folders on sys.path)
        source = Path(ray.__file__).parent.joinpath("_private", "runtime_env", "agent", "main.py").read_text()

        def ask(env: RuntimeEnv) -> Any:
            request = pb.GetOrCreateRuntimeEnvRequest(
                serialized_runtime_env=env.serialize(), job_id=b"\x01", source_process="raylet"
            )
            return pb.GetOrCreateRuntimeEnvReply.FromString(
                ray_agent.REPLIES["/get_or_create_runtime_env"](request.SerializeToString())
            )

        variables = {"PL_DISABLE_FORK": "1", "RAYSIM_CHECK": "a b"}
        served, refused = ask(RuntimeEnv(env_vars=variables)), ask(RuntimeEnv(pip=["numpy"]))
        context = RuntimeEnvContext.deserialize(served.serialized_runtime_env_context)
        delete = pb.DeleteRuntimeEnvIfPossibleReply.FromString(
            ray_agent.REPLIES["/delete_runtime_env_if_possible"](b"")
        )
        info = pb.GetRuntimeEnvsInfoReply.FromString(ray_agent.REPLIES["/get_runtime_envs_info"](b""))
        failed, ok = pb.AGENT_RPC_STATUS_FAILED, pb.AGENT_RPC_STATUS_OK
    except Exception:  # noqa: BLE001 - a Ray without these (or a reply it cannot read): its own agent
        return False
    return (
        name == ray_agent.ENV_PORT
        and all(f'"{path}"' in source for path in ray_agent.REPLIES)
        and served.status == ok
        and not served.error_message
        and vars(context) == vars(RuntimeEnvContext(env_vars=variables))
        and refused.status == failed
        and refused.error_message == ray_agent.REFUSAL
        and not refused.serialized_runtime_env_context
        and delete.status == ok
        and not info.runtime_env_states
        and info.total == 0
    )


def _with_agent_stand_in(build: Any, agents: set[str]) -> Any:
    """Ray's builder of its Python processes' command lines, each of ``agents`` (Ray's process
    types) running ``ray_agent`` (which gets Ray's agent script and options as its arguments)
    instead."""

    def command(component: str, *args, **kwargs) -> list[str]:
        cmd = build(component, *args, **kwargs)
        if component in agents:
            cmd = [*cmd, AGENT]
        return cmd

    return command


@contextlib.contextmanager
def _patched(patches: list[tuple[Any, str, Any]]) -> Iterator[None]:
    """While a local Ray starts here, each (owner, name) is its stand-in; one that this Ray
    lacks is left alone (a method: that process is simply started); all are restored after."""
    present = [(owner, name, new, vars(owner)[name]) for owner, name, new in patches if name in vars(owner)]
    for owner, name, new, _ in present:
        setattr(owner, name, new)
    try:
        yield
    finally:
        for owner, name, _, old in present:
            setattr(owner, name, old)


def _not_started(self, *args, **kwargs) -> None:
    return None


def _with_worker_path(init: Any) -> Any:
    """Ray's ``Node.__init__``, the script of its Python workers being this file."""

    def __init__(self, ray_params, *args, **kwargs) -> None:
        ray_params.update_if_absent(worker_path=WORKER)
        init(self, ray_params, *args, **kwargs)

    return __init__


def _write_token_privately() -> None:
    """Ray's ``generate_and_save_token`` for raysim's local Ray: the same new token in the
    same file (~/.ray/auth_token), created readable by this user only (0600, its folder 0700);
    Ray's own is created 0644."""
    from ray._private.authentication import authentication_token_setup as setup

    path = setup._get_default_token_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(setup.generate_new_authentication_token())


def _private_files(node: Any) -> None:
    """After raysim's local Ray has started: no folder of its session is writable by others
    (its agents make theirs 0o777, in their own processes), and Ray's token file, wherever it
    came from, is this user's only (0600 in a 0700 folder)."""

    def tighten(path: str | Path, keep: int) -> None:
        with contextlib.suppress(OSError):  # gone, or another user's
            st = os.stat(path)
            if st.st_mode & 0o7777 & ~keep and st.st_uid == os.getuid():
                os.chmod(path, st.st_mode & 0o7777 & keep)

    for folder, _, _ in os.walk(node.get_session_dir_path()):
        tighten(folder, ~0o022)
    token = Path.home() / ".ray" / "auth_token"  # Ray's default; RAY_AUTH_TOKEN_PATH is the user's
    if token.exists():
        tighten(token.parent, 0o700)
        tighten(token, 0o600)


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
