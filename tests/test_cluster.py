"""Multi-node behaviour on one machine: a Ray cluster of two raylets (ray.cluster_utils.Cluster).

raysim joins it with --address like a real cluster; hosts must spread over both nodes (the head
has 1 CPU, the worker 2, and 3 hosts of 1 CPU are asked for), results must equal the serial
engine's, and asking for more than the cluster places waits, then stops with what is missing (exit 2).
"""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, TINY
from tests.test_runs import raysim, summary_of, tracked

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_run_on_a_two_node_cluster_matches_serial(tmp_path, cluster):
    path = tracked(tmp_path, TINY)
    serial = summary_of(tmp_path, path, "--engine", "serial", name="serial.json")
    multi = summary_of(
        tmp_path,
        path,
        "--address",
        cluster.address,
        "--set",
        "resources.hosts=3",
        "--set",
        "resources.cpus_per_host=1",
        name="multi.json",
    )
    assert multi["final"] == serial["final"]
    assert [h["train_loss"] for h in multi["history"]] == [h["train_loss"] for h in serial["history"]]
    # where each host ran, in the run's record (this Cluster's nodes all share one address;
    # bench/cluster_netns.py checks nodes with addresses of their own)
    from mlflow.tracking import MlflowClient

    (ip,) = {node.node_ip_address for node in cluster.list_all_nodes()}
    tags = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(multi["mlflow_run_id"]).data.tags
    assert tags["raysim.host_nodes"] == f"0={ip} 1={ip} 2={ip}"


def test_seeds_on_a_cluster_run_side_by_side_each_with_its_hosts_over_the_nodes(tmp_path, cluster):
    # two seeds of 2 hosts x 1 CPU: the 3 CPUs of the cluster hold one run at a time, Tune
    # queues the other; each run's hosts take its trial's bundles; the same metrics as alone
    from mlflow.tracking import MlflowClient

    path = tracked(tmp_path, TINY.replace("cpus_per_host: 0.5", "cpus_per_host: 1") + "seeds: [0, 1]\n")
    proc = raysim("run", path, "-q", "--address", cluster.address)
    assert "2 runs, up to 2 at a time on Ray Tune" in proc.stderr
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    runs = client.search_runs([client.get_experiment_by_name("raysim").experiment_id], "tags.seed = '1'")
    (seed1,) = [r for r in runs if r.data.tags.get("raysim.parent") != "1"]
    assert seed1.info.status == "FINISHED"
    alone = summary_of(tmp_path, path, "--engine", "serial", "--seeds", "1", name="alone.json")
    assert seed1.data.metrics["accuracy"] == alone["final"]["accuracy"]


def test_asking_more_than_the_cluster_places_waits_then_says_what_is_missing(tmp_path, cluster):
    # a cluster may grow (an autoscaler adds nodes): raysim waits for placement, says what it
    # waits for, and after resources.placement_timeout_s stops with what is missing (exit 2)
    path = tracked(tmp_path, TINY)
    proc = raysim(
        "run",
        path,
        "--address",
        cluster.address,
        "--set",
        "resources.hosts=4",
        "--set",
        "resources.cpus_per_host=1",
        "--set",
        "resources.placement_timeout_s=6",
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert any(
        line.startswith("raysim: waiting for the cluster to place 4 hosts of 1 CPU (free now: 3 CPU)") for line in lines
    ), proc.stderr
    assert lines[-1].endswith(
        "resources: the Ray cluster could not place 4 hosts of 1 CPU (free now: 3 CPU) "
        "within 6 s; lower resources.hosts, resources.cpus_per_host or "
        "resources.gpus_per_host, or add nodes"
    ), proc.stderr


@pytest.mark.parametrize("name", ["aws-gpu.yaml", "gcp-gpu.yaml", "onprem.yaml"])
def test_cluster_configs_validate_against_rays_schema_and_turn_token_auth_on(name):
    import json
    import os

    import jsonschema
    import ray
    import yaml

    from tests.conftest import ROOT

    schema = json.loads(open(os.path.join(os.path.dirname(ray.__file__), "autoscaler", "ray-schema.json")).read())
    cfg = yaml.safe_load(open(os.path.join(ROOT, "cluster", name)))
    jsonschema.validate(cfg, schema)
    starts = cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]
    assert all("RAY_AUTH_MODE=token" in c for c in starts if "ray start" in c)
    assert all("--dashboard-host=127.0.0.1" in c for c in cfg["head_start_ray_commands"] if "ray start" in c)
    assert any("pip install" in c and "-e ." in c for c in cfg["setup_commands"])  # installs raysim


# what only Ray's local node provider needs: its default autoscaler (v2) never starts worker_ips
LOCAL_ONLY = "RAY_enable_autoscaler_v2=0 "
NODE_KEYS = ("file_mounts", "rsync_exclude", "rsync_filter", "setup_commands", "head_start_ray_commands",
             "worker_start_ray_commands")  # fmt: skip


@pytest.mark.parametrize("name", ["aws-gpu.yaml", "gcp-gpu.yaml"])
def test_cloud_configs_run_on_every_node_what_the_on_premises_one_runs(name):
    """The cloud configs cannot be run here: what their nodes run (the files copied, the set-up,
    the start and stop commands) is held to cluster/onprem.yaml's, which bench/cluster_netns.py
    runs for real, so a fix found there cannot be missing from them."""
    import yaml

    from tests.conftest import ROOT

    onprem = yaml.safe_load((ROOT / "cluster" / "onprem.yaml").read_text())
    cloud = yaml.safe_load((ROOT / "cluster" / name).read_text())
    assert any(LOCAL_ONLY in c for c in onprem["head_start_ray_commands"])
    for key in NODE_KEYS:
        want = onprem[key]
        if key.endswith("_ray_commands"):
            want = [c.replace(LOCAL_ONLY, "") for c in want]
        assert cloud[key] == want, key
    assert not any(
        "ray stop" == c.strip() for c in cloud["head_start_ray_commands"] + cloud["worker_start_ray_commands"]
    )


def test_asking_a_local_ray_for_more_than_it_has_is_an_input_error(tmp_path):
    # a Ray raysim starts itself cannot grow: refused at once, before any MLflow run
    import os

    path = tracked(tmp_path, TINY)
    cpus = os.cpu_count()
    proc = raysim(
        "run", path, "--set", f"resources.hosts={cpus + 1}", "--set", "resources.cpus_per_host=1", check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"resources.cpus_per_host: {cpus + 1} hosts x 1 CPU = {cpus + 1} CPU, but the local Ray has {cpus}; "
            "lower resources.hosts or resources.cpus_per_host"
        )
    )
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.parametrize("case", ["refused", "finished"])
def test_the_command_leaves_no_ray_process_behind_whether_its_scenario_is_refused_or_run(tmp_path, case):
    """`raysim run` starts Ray in a background thread while it validates the scenario: a
    scenario refused meanwhile (exit 2, one line) and a finished run both leave no Ray process
    a second after the command's exit (the processes of this command's Ray, workers and agents
    included, carry its RAY_TMPDIR; those seen below the command are followed too: an agent's
    title hides it). The refusal comes while Ray's start is under way, its
    agents started: the scenario is a pipe, written once they run, and the GCS holds the
    raylet's registration for 4 s (a start under way ends with its thread, the GCS and the
    raylet with it, but not the agents, which outlived the command by about 10 s)."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time

    import psutil

    from tests.conftest import ROOT

    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths have a limit
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    seen = []

    def args(p):
        try:
            return " ".join(p.cmdline()) if p.status() != psutil.STATUS_ZOMBIE else None
        except psutil.Error:
            return None

    def ours(p):  # alive, and of this command's Ray
        try:
            return args(p) is not None and (ray_tmp in args(p) or p.environ().get("RAY_TMPDIR") == ray_tmp)
        except psutil.Error:
            return False

    if case == "refused":
        path, err = str(tmp_path / "pipe.yaml"), tmp_path / "stderr"
        os.mkfifo(path)
        text = open(tracked(tmp_path, TINY)).read()
        env["RAY_testing_asio_delay_us"] = "NodeInfoGcsService.grpc_server.RegisterNode=4000000:4000000"
        with open(err, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "raysim.cli", "run", path, "-q"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        agents = ("dashboard/agent.py", "runtime_env/agent/main.py", "ray::DashboardAgent", "ray::RuntimeEnvAgent")
        try:
            deadline = time.time() + 60
            while True:  # the scenario is read whole before Ray starts, then once its agents run, not
                assert time.time() < deadline and proc.poll() is None, (err.read_text(), [args(p) for p in seen])
                seen = psutil.Process(proc.pid).children(recursive=True)
                starting = "starting a local Ray" in err.read_text()
                started = len([p for p in seen if any(a in (args(p) or "") for a in agents)]) >= 2
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK) if started or not starting else None
                except OSError:  # no read waits
                    fd = None
                if fd is None:
                    time.sleep(0.05)
                    continue
                with open(fd, "w") as f:
                    f.write(text + ("bogus_key: [\n" if started else ""))
                if started:
                    break
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        stderr = err.read_text()
        assert proc.returncode == 2 and "Traceback" not in stderr
        assert "invalid YAML" in stderr.strip().splitlines()[-1], stderr
        assert not (tmp_path / "mlflow.db").exists()
    else:
        proc = raysim("run", tracked(tmp_path, TINY), "-q", env={"RAY_TMPDIR": ray_tmp}, check=False)
        assert proc.returncode == 0, proc.stderr
    deadline = time.time() + 1.0

    def left():  # what is alive of the command's processes seen, or of its Ray's found now
        return [args(p).strip()[:120] for p in {*seen, *psutil.process_iter()} if args(p) and (p in seen or ours(p))]

    while left() and time.time() < deadline:
        time.sleep(0.05)
    assert not left(), left()


def test_a_local_ray_raysim_starts_runs_without_api_server_monitor_or_log_monitor(monkeypatch):
    """Ray's start waits on its API server (dashboard, state API) until it has written its
    address; raysim's local Ray has none, nor the autoscaler's monitor (it cannot grow) nor,
    without -v, the log monitor; its dashboard agent is raysim's stand-in (no Prometheus
    metrics, about 75 MB and 1.7 CPU-seconds less), and so is its runtime-environment agent
    (about 35 MB and 1 CPU-second less; a runtime environment is refused). The raylet boots
    the workers asked for (``prestart``) as the driver registers, where no zygote forks them
    (``RAYSIM_ZYGOTE=off``; tests/test_zygote.py has the zygote's). It runs tasks and actors all the same, and
    Ray's Node and command builder are restored after the start (a cluster started later in
    the process is whole)."""
    import contextlib
    import os
    import tempfile
    import time

    import psutil
    import ray
    from ray._private import services
    from ray._private.node import Node

    from raysim.engine import ray_start

    before = {name: Node.__dict__[name] for name in (*ray_start.LEAN_SKIPS, "start_log_monitor")}
    build, launch = services._build_python_executable_command_memory_profileable, services.start_ray_process
    # this Ray's own folder: another Ray of this process (the module's cluster) is not looked at
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths have a limit
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    monkeypatch.setenv("RAYSIM_ZYGOTE", "off")
    ray_start.init(None, prestart=1)
    try:
        # one worker booted as the driver registered (``prestart``), before anything asked for
        # one: the first task runs in it
        def idle_workers() -> list:
            found = []
            for p in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if p.name() == "ray::IDLE":
                        found.append(p)
            return found

        deadline = time.time() + 30
        while not (idle := idle_workers()):
            assert time.time() < deadline, "no worker was booted ahead"
            time.sleep(0.1)

        @ray.remote
        def pid():
            return os.getpid()

        assert ray.get(pid.remote()) == idle[0].pid

        @ray.remote
        def square(x):
            return x * x

        assert ray.get([square.remote(i) for i in range(4)]) == [0, 1, 4, 9]

        @ray.remote
        class Counter:
            def __init__(self):
                self.n = 0

            def add(self, k):
                self.n += k
                return self.n

        counter = Counter.remote()
        assert ray.get([counter.add.remote(2), counter.add.remote(3)]) == [2, 5]
        started = []  # what this process started for this Ray (its folder in the arguments)
        agents, daemons = [], []
        for p in psutil.Process().children(recursive=True):
            try:
                args = p.cmdline()
            except psutil.Error:
                continue
            if any(ray_tmp in a for a in args):
                started += [a.rsplit("/", 1)[-1] for a in args]
                if p.name() in ("gcs_server", "raylet"):
                    daemons.append(p)
                if any(a.endswith(("dashboard/agent.py", "runtime_env/agent/main.py")) for a in args):
                    agents.append(p)
        assert "gcs_server" in started and "raylet" in started, started
        for skipped in ("dashboard.py", "monitor.py", "log_monitor.py"):
            assert skipped not in started, started
        # each agent's place: the stand-in, given Ray's agent script as an argument
        assert len(agents) == 2 and {a.cmdline()[2] for a in agents} == {ray_start.AGENT}, [a.cmdline() for a in agents]
        assert all(a.memory_full_info().uss < 30 * 2**20 for a in agents)
        # environment variables are served (Ray Tune's trials carry some); any other runtime
        # environment is refused, with the reason
        assert ray.get(square.options(runtime_env={"env_vars": {"A": "1"}}).remote(3), timeout=60) == 9
        with pytest.raises(ray.exceptions.RuntimeEnvSetupError, match="not available on the local Ray"):
            ray.get(square.options(runtime_env={"pip": ["raysim-no-such-package"]}).remote(3), timeout=60)
        # each of its processes in a session of its own: a signal to the command's process
        # group (a SIGTERM from ``timeout``) reaches none of them
        assert len(daemons) == 2 and all(os.getsid(p.pid) == p.pid != os.getsid(0) for p in daemons)
        assert all(os.getsid(a.pid) != os.getsid(0) for a in agents)  # the raylet's children
    finally:
        ray_start.shutdown()
    assert {name: Node.__dict__[name] for name in before} == before
    assert services._build_python_executable_command_memory_profileable is build
    assert services.start_ray_process is launch


def test_a_local_ray_raysim_starts_leaves_the_dashboards_packages_unimported_in_the_driver():
    """Ray checks that its dashboard's packages import (aiohttp, gRPC, OpenCensus, Prometheus'
    client) to choose an option of its dashboard agent, which the stand-in does not read: while
    raysim starts a local Ray the check says "none missing" without importing them, and Ray's
    check is back once Ray has started."""
    code = (
        "import json, sys; import ray._private.utils as u; check = u.get_dashboard_dependency_error; "
        "from raysim.engine import ray_start; ray_start.init(None); "
        "found = [m for m in ('aiohttp', 'grpc', 'opencensus', 'prometheus_client') if m in sys.modules]; "
        "print(json.dumps([found, u.get_dashboard_dependency_error is check])); ray_start.shutdown()"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    found, restored = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == [] and restored


def test_the_agent_stand_in_writes_the_ports_as_rays_own_agent_does_and_ends_with_its_raylet(tmp_path):
    """Ray's raylet waits for its dashboard agent's three ports in the session's folder; the
    stand-in writes each as -1 (not served), in the file Ray's persist_port writes (checked
    against this Ray, which is what lets a local Ray use it), and ends once its parent (the
    raylet) is gone."""
    import subprocess
    import sys
    import time

    from ray import _raylet

    from raysim.engine import ray_agent, ray_start

    assert ray_start._agent_stand_in_fits()
    node = "7c" * 28
    ours, rays = tmp_path / "ours", tmp_path / "rays"
    ours.mkdir()
    rays.mkdir()
    for name in ray_agent.PORTS:
        _raylet.persist_port(str(rays), node, name, -1)
    # the stand-in's parent: a shell that starts it and exits at once
    script = (
        f"RAY_RAYLET_PID=$$ {sys.executable} {ray_start.AGENT} /ray/dashboard/agent.py --node-id={node} "
        f"--session-dir={ours} --grpc-port=0"
    )
    pid = int(
        subprocess.run(
            ["sh", "-c", script + " >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
        ).stdout
    )
    deadline = time.time() + 10

    def written():  # each port file renamed into place (a .tmp is one still being written)
        names = [f.name for f in ours.iterdir()]
        return len(names) >= 3 and not any(n.endswith(".tmp") for n in names)

    while not written() and time.time() < deadline:
        time.sleep(0.05)
    assert {f.name: f.read_bytes() for f in ours.iterdir()} == {f.name: f.read_bytes() for f in rays.iterdir()}
    assert (ours / f"metrics_agent_port_{node}").read_text() == "-1"
    import psutil

    while time.time() < deadline:  # its parent is gone: it ends within about a second
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the stand-in outlived its parent")


def test_the_runtime_env_agent_stand_in_listens_on_loopback_serves_variables_refuses_packages_and_answers_the_rest(
    tmp_path,
):
    """The raylet waits for its runtime-environment agent's port, then asks it over HTTP, in
    protobuf, for a task's runtime environment. The stand-in writes the port it listens on (as
    Ray's persist_port writes it), serves an environment of variables with the context Ray's
    agent makes (read back by Ray's RuntimeEnvContext: the variables, this interpreter),
    refuses one with packages with its reason and answers the two other calls "nothing there":
    each reply read with Ray's own classes."""
    import subprocess
    import sys
    import time
    import urllib.request

    from ray import _raylet
    from ray.core.generated import runtime_env_agent_pb2 as pb

    from raysim.engine import ray_agent, ray_start

    assert ray_start._env_stand_in_fits()
    node = "3d" * 28
    proc = subprocess.Popen(
        [
            sys.executable,
            ray_start.AGENT,
            "/ray/_private/runtime_env/agent/main.py",
            f"--node-id={node}",
            "--node-ip-address=127.0.0.1",
            "--runtime-env-agent-port=0",
            f"--session-dir={tmp_path}",
            "--gcs-address=127.0.0.1:1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = tmp_path / f"{_raylet.RUNTIME_ENV_AGENT_PORT_NAME}_{node}"
        deadline = time.time() + 10
        while not port_file.exists() and time.time() < deadline:
            time.sleep(0.05)
        port = int(port_file.read_text())
        assert port > 0

        def post(path: str, message) -> bytes:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}", data=message.SerializeToString(), method="POST"
            )
            with urllib.request.urlopen(request, timeout=10) as reply:
                assert reply.status == 200
                return reply.read()

        from ray._private.runtime_env.context import RuntimeEnvContext

        ask = pb.GetOrCreateRuntimeEnvRequest(
            serialized_runtime_env='{"env_vars": {"A": "1", "B": "x y"}}', job_id=b"\x01", source_process="raylet"
        )
        served = pb.GetOrCreateRuntimeEnvReply.FromString(post("/get_or_create_runtime_env", ask))
        assert served.status == pb.AGENT_RPC_STATUS_OK and served.error_message == ""
        context = RuntimeEnvContext.deserialize(served.serialized_runtime_env_context)
        assert context.env_vars == {"A": "1", "B": "x y"} and context.command_prefix == []
        assert context.py_executable == sys.executable and context.override_worker_entrypoint is None
        for env in ('{"pip": ["numpy"]}', '{"env_vars": {"A": "1"}, "working_dir": "/tmp"}', '{"env_vars": {"A": 1}}'):
            ask = pb.GetOrCreateRuntimeEnvRequest(serialized_runtime_env=env, job_id=b"\x01")
            refused = pb.GetOrCreateRuntimeEnvReply.FromString(post("/get_or_create_runtime_env", ask))
            assert refused.status == pb.AGENT_RPC_STATUS_FAILED, env
            assert refused.error_message == ray_agent.REFUSAL and "ray start --head" in refused.error_message
            assert refused.serialized_runtime_env_context == ""
        deleted = pb.DeleteRuntimeEnvIfPossibleReply.FromString(
            post("/delete_runtime_env_if_possible", pb.DeleteRuntimeEnvIfPossibleRequest())
        )
        assert deleted.status == pb.AGENT_RPC_STATUS_OK
        info = pb.GetRuntimeEnvsInfoReply.FromString(post("/get_runtime_envs_info", pb.GetRuntimeEnvsInfoRequest()))
        assert len(info.runtime_env_states) == 0 and info.total == 0
        import psutil

        listens = [
            c.laddr for c in psutil.Process(proc.pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
        ]
        assert [(a.ip, a.port) for a in listens] == [("127.0.0.1", port)]
    finally:
        proc.kill()
        proc.wait()


def test_a_protobuf_message_is_read_as_the_wire_format_says():
    """By hand: 08 96 01 is field 1 = 150 (the varint 0x96 0x01 = 22 + 1·128); 12 02 'ab' is
    field 2 = b"ab"; 1d and four bytes, a fixed32 field 3, is skipped; a field given twice is
    kept twice; a length past the end is an error."""
    from raysim.engine.ray_agent import _fields

    assert _fields(b"\x08\x96\x01\x12\x02ab\x1d\x00\x00\x80\x3f\x12\x00") == {1: [150], 2: [b"ab", b""]}
    with pytest.raises(ValueError, match="truncated"):
        _fields(b"\x12\x05ab")


def test_a_protobuf_field_is_written_as_the_wire_format_says():
    """By hand: field 1 = 1 is the key (1 << 3 | 0) then the varint 1; field 2 = "ab" is the key
    (2 << 3 | 2), the length 2, the bytes; a 300-byte string's length is the two-byte varint
    0xAC 0x02 (300 = 0b10_0101100)."""
    from raysim.engine.ray_agent import _field

    assert _field(1, 1) == b"\x08\x01"
    assert _field(2, "ab") == b"\x12\x02ab"
    assert _field(2, "x" * 300)[:3] == b"\x12\xac\x02"


TOKEN_HEAD = """
import sys
from ray.cluster_utils import Cluster
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
print(c.address, flush=True)
sys.stdin.read()
c.shutdown()
"""


def test_joining_a_token_cluster_says_in_one_line_what_to_set_and_joins_with_the_token(tmp_path):
    """A Ray started with RAY_AUTH_MODE=token (as cluster/*.yaml start theirs): raysim joining
    it without a token, with token mode turned off, or with another token, stops before the run
    (exit 2) with one line saying what to set, without Ray's 20 s of InvalidAuthToken retries;
    with the cluster's token in ~/.ray/auth_token alone (token mode turns on), or with the mode
    and the token, it runs."""
    import os
    import subprocess
    import sys
    import tempfile
    import time

    from tests.conftest import ROOT

    token = "5f" * 32
    plain = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths have a limit
    head = subprocess.Popen(
        [sys.executable, "-c", TOKEN_HEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
        env={**plain, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_TMPDIR": ray_tmp},
    )
    try:
        address = head.stdout.readline().strip()
        assert address, "the token-authenticated Ray did not start"
        path = tracked(tmp_path, TINY)

        def join(**auth):
            t0 = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "raysim.cli",
                    "run",
                    path,
                    "-q",
                    "--address",
                    address,
                    "--summary",
                    str(tmp_path / "s.json"),
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env={**plain, **auth},
                timeout=300,
            )
            return proc, time.perf_counter() - t0

        home = tmp_path / "home"  # no ~/.ray/auth_token
        home.mkdir()
        proc, _ = join(HOME=str(home))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr
        assert lines[-1] == (
            f"raysim: --address {address}: the Ray cluster at {address} requires token "
            "authentication and raysim found no token; put the cluster's token in ~/.ray/auth_token "
            "(or RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN) (token mode then turns on by itself)"
        )
        assert "InvalidAuthToken" not in proc.stderr and "Traceback" not in proc.stderr
        assert not (tmp_path / "mlflow.db").exists()  # refused before any MLflow run
        proc, _ = join(HOME=str(home), RAY_AUTH_MODE="disabled")  # token mode turned off by hand
        assert proc.returncode == 2, proc.stderr
        assert "set RAY_AUTH_MODE=token for raysim too (export RAY_AUTH_MODE=token)" in proc.stderr.splitlines()[-1]
        # the token file alone (what a cluster YAML's file_mounts copies): token mode turns on
        (home / ".ray").mkdir()
        (home / ".ray" / "auth_token").write_text(token)
        proc, _ = join(HOME=str(home))
        assert proc.returncode == 0, proc.stderr
        (tmp_path / "s.json").unlink()
        proc, _ = join(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="a0" * 32)
        assert proc.returncode == 2, proc.stderr
        assert (
            proc.stderr.strip()
            .splitlines()[-1]
            .startswith(f"raysim: --address {address}: the Ray cluster at {address} refused raysim's token")
        ), proc.stderr
        proc, _ = join(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        assert proc.returncode == 0, proc.stderr
        import json

        assert [h["round"] for h in json.loads((tmp_path / "s.json").read_text())["history"]] == [1, 2, 3]
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, 9)
            head.wait()
