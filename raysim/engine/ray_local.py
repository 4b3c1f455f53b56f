"""raysim's local Ray: what differs from a start as ``ray.init`` has it, put in place while
``ray_start.init`` starts one (``_local_start_patches``, under ``_patched``) and after it
(``_private_files``). The head's processes raysim never uses are not started, the dashboard and
runtime-environment agents are stand-ins (``ray_agent``), the workers' script is the zygote's
launcher (``ray_zygote``) and the raylet boots as many as the run's host actors, each process
runs in a session of its own, the node's address stays loopback (``ray_start.LOOPBACK``), and
the session's folders and the token file are this user's only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

from raysim.engine import ray_zygote

# a local Ray's head processes raysim never uses (the methods of Ray's Node that start them):
# the API server (dashboard, job submission, state API), which Ray's start waits on until it
# has written its address (about 2.5 s of a 6-s start on 2 cores), and the autoscaler's
# monitor (a local Ray cannot grow); the log monitor too unless worker logs are shown (-v)
LEAN_SKIPS = ("start_api_server", "start_monitor")
# what a local Ray raysim starts runs as its dashboard agent (``ray_agent``: the ports Ray waits
# for, written as "not served", as Ray's own agent does without its dashboard's packages)
AGENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ray_agent.py")
# the script a worker of raysim's local Ray runs: the zygote's launcher, which runs Ray's own
# worker script itself where no zygote serves (``ray_zygote.run_worker``)
WORKER = ray_zygote.__file__


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
