"""A real Ray cluster on one machine: network-namespace nodes with their own addresses, `ray up`
over SSH, runs across the nodes, a node lost mid-run, `ray down`.

    sudo .venv/bin/python bench/cluster_netns.py all --nodes 3    # up, run, faults, down (~8 min)
    sudo .venv/bin/python bench/cluster_netns.py up --nodes 3     # or step by step:
    sudo .venv/bin/python bench/cluster_netns.py run               # a run across the nodes vs serial
    sudo .venv/bin/python bench/cluster_netns.py lose-node         # a worker's raylet killed mid-run
    sudo .venv/bin/python bench/cluster_netns.py no-token          # a node without the token is refused
    sudo .venv/bin/python bench/cluster_netns.py down-resume       # `ray down` mid-run; resumed on a new
                                                                   # cluster at other addresses
    sudo .venv/bin/python bench/cluster_netns.py bench             # across the workers vs one node
    sudo .venv/bin/python bench/cluster_netns.py down              # everything it made, removed

What `up` makes (all of it undone by `down`, which also cleans after a failed `up`):

- a bridge (``rsbr0``) holding 10.77.0.1/24 on this machine, and one network namespace per node
  (``rsns-head``, ``rsns-w1``...) on it, each with its own address (head 10.77.0.10, workers .11,
  .12...; ``--first`` moves them) and a spare one without the token (``rsns-rogue``, .99);
- in each namespace an sshd listening on that namespace's address only, accepting one key made
  for this cluster (root, key only), in a mount namespace of its own where ``/root`` is the
  node's own home (``STATE/nodes/NAME/home``, with this machine's Python bind-mounted in) and
  ``/tmp`` its own: the nodes share this machine's files but not their homes, so `ray up`'s
  file_mounts and setup_commands do not race, and Ray's session folders (/tmp/ray) stay apart;
- ``STATE/cluster.yaml``, generated from cluster/onprem.yaml (its start commands verbatim; the
  addresses, the key, the mounts' sources and the install line replaced: ``derive``), then
  ``ray up -y`` on it.

The nodes reuse this machine's installed packages: each node's setup makes ``~/raysim/.venv``
with ``--without-pip`` and a .pth naming this interpreter's site-packages, then installs the
copied checkout (``pip install --no-deps -e .``) and the run's plugin into it: 2 s a node
instead of downloading PyTorch on each.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "cluster" / "onprem.yaml"
STATE = Path(os.environ.get("RAYSIM_NETNS_STATE", "/var/lib/raysim-netns"))
SUBNET, BRIDGE, PREFIX = "10.77.0", "rsbr0", "rsns-"
PORT = 6379
RAY = str(Path(sys.executable).parent / "ray")
# the install line of the template's setup_commands and what replaces it here (see the docstring)
INSTALL = "python3 -m venv .venv && .venv/bin/pip install -q -e ."
SITE = sysconfig.get_paths()["purelib"]  # this venv's; its .pth names the shared site-packages
BASE = sys.base_prefix  # the interpreter the nodes use (the same Python on every node)
CLUSTER = "raysim-netns"
T0 = time.monotonic()


def say(step: str, result: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {step}: {result}", flush=True)


def sh(cmd: str | list, check: bool = True, timeout: float | None = None, **kw) -> subprocess.CompletedProcess:
    args = cmd if isinstance(cmd, list) else ["bash", "-c", cmd]
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode:
        raise SystemExit(f"failed ({p.returncode}): {cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def deps_site() -> str:
    """The site-packages holding torch, ray, mlflow (this venv's own, or the one its .pth names)."""
    import importlib.util

    return str(Path(importlib.util.find_spec("ray").origin).parents[1])


# ---------------------------------------------------------------- the cluster's YAML


def derive(template: dict, head: str, workers: list[str], key: str, token: str, run_dir: str) -> dict:
    """cluster/onprem.yaml with this machine's nodes: everything the template says is kept
    (start commands included, so what runs here is what the file ships) except the
    placeholders (addresses, user, key), the mounts' local sources, and the install line."""
    cfg = json.loads(json.dumps(template))
    cfg["cluster_name"] = CLUSTER
    cfg["provider"].update(head_ip=head, worker_ips=workers)
    cfg["auth"] = {"ssh_user": "root", "ssh_private_key": key}
    cfg["max_workers"] = len(workers)
    mounts = {}
    for remote, local in cfg["file_mounts"].items():
        if local == ".":
            local = str(ROOT)
        elif "auth_token" in remote:
            local = token
        mounts[remote] = local
    mounts["~/rsrun"] = run_dir  # the scenario, the plugin and its data file
    cfg["file_mounts"] = mounts
    setup = []
    for c in cfg["setup_commands"]:
        if INSTALL in c:
            c = c.replace(
                INSTALL,
                f"{BASE}/bin/python3 -m venv --without-pip .venv"
                f" && echo {deps_site()} > .venv/lib/python3.11/site-packages/zz_deps.pth"
                " && .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e ."
                " && printf '#!/bin/sh\\nexec ~/raysim/.venv/bin/python -m ray.scripts.scripts \"$@\"\\n'"
                " > .venv/bin/ray && chmod +x .venv/bin/ray",
            )
        setup.append(c)
    assert setup != cfg["setup_commands"], f"{TEMPLATE}: no setup command has `{INSTALL}` to replace"
    setup.append("~/raysim/.venv/bin/python -m pip install -q --no-deps --no-build-isolation ~/rsrun/rsplugin")
    cfg["setup_commands"] = setup
    # the head takes no hosts (num-cpus 0: the server and MLflow stay there), workers 2 CPUs each
    # and its address said (a namespace has no default route: Ray's guess, through 8.8.8.8, falls
    # back to 127.0.0.1; workers find theirs from the head's address)
    cfg["head_start_ray_commands"] = [
        c + f" --num-cpus=0 --node-ip-address={head}" if "ray start" in c else c for c in cfg["head_start_ray_commands"]
    ]
    return cfg


PLUGIN = '''
"""digits_file: scikit-learn's digits read from an .npz on the node (a dataset plugin); each
load appends "NODE_IP PID" to ~/rsloads.log, which shows where hosts ran and read their data."""
import os, socket
from dataclasses import dataclass, field
import numpy as np
from raysim.data import DatasetSpec, PooledSource


@dataclass(frozen=True)
class Params:
    file: str = field(default="~/rsrun/data/digits.npz", metadata={"help": "the .npz (x, y) on every node"})


class DigitsFile(PooledSource):
    name = "digits_file"

    def __init__(self, params, clients, partition, splits, seed):
        self.input_shape, self.num_classes, self.params = (64,), 10, params
        super().__init__(clients, partition, splits, seed)

    def load(self):
        d = np.load(os.path.expanduser(self.params.file))
        try:
            import ray
            ip = ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostname()
        except Exception:
            ip = "?"
        with open(os.path.expanduser("~/rsloads.log"), "a") as f:
            f.write(f"{ip} {os.getpid()}\\n")
        return d["x"].astype(np.float32), d["y"].astype(np.int64)


DIGITS_FILE = DatasetSpec("digits_file", "digits from an .npz on each node", Params, pooled=True, build=DigitsFile)
'''

SCENARIO = """\
name: netns
seed: 0
rounds: {rounds}
data:
  dataset: digits_file
  clients: {clients}
  partition: {{kind: dirichlet, alpha: 0.5}}
  splits: {{train: 0.8, test: 0.2}}
model: {{name: mlp, hidden: [64]}}
algorithm: {{name: fedavg, lr: 0.1, batch_size: 16, local_epochs: 2}}
sampling: {{fraction: {fraction}}}
eval: {{every: 5}}
resources: {{hosts: {hosts}, cpus_per_host: 0.5}}
checkpoint: {{every: 5, dir: /root/rsrun/ck}}
tracking: {{uri: "http://127.0.0.1:5000", experiment: netns}}
"""


def write_run_dir(run_dir: Path) -> None:
    from sklearn.datasets import load_digits

    (run_dir / "data").mkdir(parents=True)
    d = load_digits()
    import numpy as np

    np.savez(run_dir / "data" / "digits.npz", x=(d.data / 16.0).astype(np.float32), y=d.target)
    p = run_dir / "rsplugin"
    p.mkdir()
    (p / "rsplugin.py").write_text(PLUGIN)
    (p / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "rsplugin"
        version = "0.1"
        [project.entry-points."raysim.datasets"]
        digits_file = "rsplugin:DIGITS_FILE"
        [tool.setuptools]
        py-modules = ["rsplugin"]
        """)
    )
    (run_dir / "netns.yaml").write_text(SCENARIO.format(rounds=30, clients=50, fraction=0.5, hosts=3))
    (run_dir / "out").mkdir()


# ---------------------------------------------------------------- nodes


def nodes() -> list[dict]:
    return json.loads((STATE / "nodes.json").read_text())


def ssh(node: dict, cmd: str, check: bool = True, timeout: float = 300, env: str = "") -> subprocess.CompletedProcess:
    """``cmd`` on ``node`` over SSH, in a login shell (the node's ~/.bashrc: its PATH)."""
    return sh(
        [
            "ssh", "-i", str(STATE / "key"), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{node['ip']}",
            "bash --login -c " + shlex.quote(f"{env} {cmd}"),
        ],
        check=check,
        timeout=timeout,
    )  # fmt: skip


def make_node(name: str, ip: str, i: int) -> dict:
    ns, host_if = PREFIX + name, f"rsv{i}"
    home, tmp = STATE / "nodes" / name / "home", STATE / "nodes" / name / "tmp"
    sh(f"ip netns add {ns}")
    sh(f"ip link add {host_if} type veth peer name rsp{i} && ip link set rsp{i} netns {ns}")
    sh(f"ip -n {ns} link set rsp{i} name eth0 && ip -n {ns} addr add {ip}/24 dev eth0")
    sh(f"ip -n {ns} link set eth0 up && ip -n {ns} link set lo up")
    sh(f"ip link set {host_if} master {BRIDGE} up")
    (home / ".ssh").mkdir(parents=True, exist_ok=True)  # a kept home (down --keep-homes) is reused
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o700)
    os.chmod(tmp, 0o1777)
    shutil.copy(STATE / "key.pub", home / ".ssh" / "authorized_keys")
    (home / ".bashrc").write_text(f'export PATH="{BASE}/bin:$PATH"\n')
    (home / ".profile").write_text(". ~/.bashrc\n")
    pybase = home / Path(BASE).relative_to("/root") if BASE.startswith("/root/") else None
    cfg = STATE / "nodes" / name / "sshd_config"
    cfg.write_text(
        f"ListenAddress {ip}\nPort 22\nHostKey {STATE}/hostkey\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        f"PidFile {STATE}/nodes/{name}/sshd.pid\nAuthorizedKeysFile .ssh/authorized_keys\nX11Forwarding no\n"
        "MaxSessions 50\nMaxStartups 50\n"
    )
    mounts = []
    if pybase:
        pybase.mkdir(parents=True, exist_ok=True)
        mounts.append(f"mount --rbind {BASE} {pybase}")
    mounts += [f"mount --rbind {home} /root", f"mount --bind {tmp} /tmp", "mkdir -p /run/sshd"]
    script = " && ".join(mounts + [f"exec /usr/sbin/sshd -D -e -f {cfg}"])
    log = open(STATE / "nodes" / name / "sshd.log", "w")
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    return {"name": name, "ns": ns, "ip": ip, "if": host_if, "sshd": proc.pid, "home": str(home)}


def wait_port(ip: str, port: int, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"nothing answers on {ip}:{port}")


def cmd_up(a) -> None:
    if (STATE / "nodes.json").exists() or sh(f"ip link show {BRIDGE}", check=False).returncode == 0:
        raise SystemExit(f"a cluster is up (or left over): `{sys.argv[0]} down` first")
    for tool in ("rsync", "ssh", "/usr/sbin/sshd"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing: apt-get install -y rsync openssh-server openssh-client")
    t = time.monotonic()
    clear_state(keep_homes=getattr(a, "keep_homes", False))
    STATE.mkdir(parents=True, mode=0o700, exist_ok=True)
    sh(f"ssh-keygen -q -t ed25519 -N '' -C raysim-netns -f {STATE}/key")
    sh(f"ssh-keygen -q -t ed25519 -N '' -C raysim-netns-host -f {STATE}/hostkey")
    (STATE / "auth_token").write_text(secrets.token_hex(32))
    os.chmod(STATE / "auth_token", 0o600)
    sh(f"ip link add {BRIDGE} type bridge && ip addr add {SUBNET}.1/24 dev {BRIDGE} && ip link set {BRIDGE} up")
    names = ["head"] + [f"w{i}" for i in range(1, a.nodes)] + ["rogue"]
    made = []
    for i, name in enumerate(names):
        ip = f"{SUBNET}.{99 if name == 'rogue' else a.first + i}"
        made.append(make_node(name, ip, i))
        (STATE / "nodes.json").write_text(json.dumps(made))  # what down removes, even mid-way
    for n in made:
        wait_port(n["ip"], 22)
    say("namespaces", ", ".join(f"{n['name']}={n['ip']}" for n in made) + f" (sshd up in {time.monotonic() - t:.1f} s)")
    run_dir = STATE / "run"
    write_run_dir(run_dir)
    head, workers = made[0], [n for n in made[1:] if n["name"] != "rogue"]
    cfg = derive(
        yaml.safe_load(TEMPLATE.read_text()),
        head["ip"],
        [w["ip"] for w in workers],
        str(STATE / "key"),
        str(STATE / "auth_token"),
        str(run_dir),
    )
    (STATE / "cluster.yaml").write_text(
        f"# generated by bench/cluster_netns.py from {TEMPLATE}\n" + yaml.safe_dump(cfg)
    )
    t = time.monotonic()
    p = sh([RAY, "up", "-y", "--no-config-cache", str(STATE / "cluster.yaml")], check=False, cwd=ROOT, timeout=600)
    (STATE / "ray-up.log").write_text(p.stdout + p.stderr)
    if p.returncode:
        raise SystemExit(
            f"ray up failed ({p.returncode}); its log: {STATE}/ray-up.log\n{(p.stdout + p.stderr)[-3000:]}"
        )
    say("ray up", f"head {head['ip']} started in {time.monotonic() - t:.1f} s")
    alive = wait_nodes(len(workers) + 1, a.join_timeout)
    say("cluster", f"{len(alive)} nodes alive after {time.monotonic() - t:.1f} s: {alive}")


ALIVE = (
    "import json, ray; ray.init('auto', logging_level='ERROR', log_to_driver=False); "
    "print('ALIVE', json.dumps(sorted((n['NodeManagerAddress'], n['Resources'].get('CPU', 0)) "
    "for n in ray.nodes() if n['Alive'])))"
)


def wait_nodes(count: int, timeout: float) -> list:
    head, end, alive = nodes()[0], time.monotonic() + timeout, []
    while time.monotonic() < end:
        try:
            p = ssh(head, f"python -c {shlex.quote(ALIVE)}", check=False, env="RAY_AUTH_MODE=token", timeout=60)
        except subprocess.TimeoutExpired:
            continue
        if p.returncode == 0:
            alive = [json.loads(x[6:]) for x in p.stdout.splitlines() if x.startswith("ALIVE ")][-1]
            if len(alive) >= count:
                return alive
        time.sleep(5)
    raise SystemExit(f"only {alive} joined within {timeout} s")


# ---------------------------------------------------------------- runs


def start_mlflow() -> None:
    head = nodes()[0]
    if ssh(head, "curl -sf http://127.0.0.1:5000/health", check=False, timeout=30).returncode == 0:
        return
    # in an SSH session that is never waited for (sshd keeps a session open while its children run)
    k = ["-i", str(STATE / "key"), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    subprocess.Popen(
        ["ssh", *k, "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{head['ip']}", "bash --login -c " + shlex.quote(
        "mkdir -p ~/mlflow && cd ~/mlflow && setsid nohup ~/raysim/.venv/bin/python -m mlflow server"
        " --host 127.0.0.1 --port 5000 --workers 1 --backend-store-uri sqlite:////root/mlflow/mlflow.db"
        " --artifacts-destination /root/mlflow/artifacts > server.log 2>&1 < /dev/null")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    end = time.monotonic() + 120
    while ssh(head, "curl -sf http://127.0.0.1:5000/health", check=False, timeout=30).returncode:
        if time.monotonic() > end:
            raise SystemExit("the MLflow server on the head did not answer within 120 s")
        time.sleep(2)


def raysim_on_head(args: str, background: bool = False):
    """``raysim ARGS`` on the head through ``ray exec`` (what a user types after `ray up`)."""
    cmd = f"cd ~/raysim && RAY_AUTH_MODE=token .venv/bin/raysim {args}"
    argv = [RAY, "exec", str(STATE / "cluster.yaml"), cmd]
    if background:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    return sh(argv, check=False, cwd=ROOT, timeout=900)


def head_file(rel: str) -> Path:
    return Path(nodes()[0]["home"]) / rel


def summary(name: str) -> dict:
    return json.loads(head_file(f"rsrun/out/{name}").read_text())


def same(a: dict, b: dict) -> bool:
    return a["final"] == b["final"] and [h.get("train_loss") for h in a["history"]] == [
        h.get("train_loss") for h in b["history"]
    ]


def short(s: dict) -> str:
    f = s["final"]
    return f"{f['accuracy']:.4f}, bottom_decile_accuracy {f['bottom_decile_accuracy']:.4f}"


def loads_by_node() -> dict:
    """ip -> how many processes read the data there (from each node's own ~/rsloads.log)."""
    out = {}
    for n in nodes():
        f = Path(n["home"]) / "rsloads.log"
        if f.exists():
            out[n["ip"]] = len({line.split()[1] for line in f.read_text().split("\n") if line.strip()})
            f.unlink()
    return out


def serial_reference(rounds: int | None = None) -> dict:
    """The serial engine's run of the scenario (``rounds`` of it), on the head; computed once."""
    name = f"serial-{rounds}.json" if rounds else "serial.json"
    if not head_file(f"rsrun/out/{name}").exists():
        t = time.monotonic()
        more = f" --set rounds={rounds}" if rounds else ""
        p = raysim_on_head(f"run ~/rsrun/netns.yaml -q --engine serial --summary ~/rsrun/out/{name}{more}")
        if p.returncode:
            raise SystemExit(f"the serial run failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        loads_by_node()
        say("serial engine (on the head)", f"{time.monotonic() - t:.1f} s, accuracy {short(summary(name))}")
    return summary(name)


def cmd_run(a) -> None:
    t = time.monotonic()
    start_mlflow()
    say("MLflow server", f"on the head's 127.0.0.1:5000 in {time.monotonic() - t:.1f} s")
    ref = serial_reference()
    loads_by_node()
    t = time.monotonic()
    p = raysim_on_head("run ~/rsrun/netns.yaml -q --address auto --summary ~/rsrun/out/multi.json")
    took = time.monotonic() - t
    if p.returncode:
        raise SystemExit(f"the run across nodes failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    got = summary("multi.json")
    hosts = mlflow_run(got["mlflow_run_id"])["tags"].get("raysim.host_nodes", "")
    say(
        "run across nodes",
        f"{took:.1f} s, accuracy {short(got)}, equal to serial: {same(got, ref)}; "
        f"processes that read the data, by node: {loads_by_node()}; the hosts' nodes (MLflow tag raysim.host_nodes): {hosts}",
    )
    workers = {n["ip"] for n in nodes()[1:-1]}
    placed = {kv.split("=")[1] for kv in hosts.split()}
    if not placed <= workers or len(placed) < 2:
        raise SystemExit(f"the hosts did not run on two workers or more: {hosts}")
    if not same(got, ref):
        raise SystemExit("the run across nodes differs from the serial engine's")


def raylet_pid(ns: str) -> int | None:
    for pid in sh(f"ip netns pids {ns}", check=False).stdout.split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                return int(pid)
        except OSError:
            pass
    return None


def newest_manifest_round() -> int:
    best = 0
    for m in glob.glob(str(head_file("rsrun/ck")) + "/*/manifest.json"):
        try:
            best = max(best, json.loads(Path(m).read_text())["round"])
        except (OSError, ValueError, KeyError):
            pass
    return best


def cmd_lose_node(a) -> None:
    start_mlflow()
    ref = serial_reference()
    shutil.rmtree(head_file("rsrun/ck"), ignore_errors=True)
    victim = [n for n in nodes() if n["name"] not in ("head", "rogue")][-1]
    t = time.monotonic()
    proc = raysim_on_head("run ~/rsrun/netns.yaml --address auto --summary ~/rsrun/out/lost.json", background=True)
    while newest_manifest_round() < a.at_round:
        if proc.poll() is not None:
            raise SystemExit("the run ended before the node could be lost:\n" + proc.stdout.read()[-3000:])
        time.sleep(0.3)
    pid = raylet_pid(victim["ns"])
    if a.how == "link":
        sh(f"ip link set {victim['if']} down")
    elif pid:
        os.kill(pid, signal.SIGKILL)
    say(
        "node lost",
        f"{victim['name']} ({victim['ip']}): {'link down' if a.how == 'link' else f'raylet {pid} killed'} "
        f"after checkpoint round {a.at_round}, {time.monotonic() - t:.1f} s into the run",
    )
    out = proc.communicate(timeout=900)[0]
    took = time.monotonic() - t
    if a.how == "link":
        sh(f"ip link set {victim['if']} up")
    if proc.returncode:
        raise SystemExit(f"the run did not survive ({proc.returncode}):\n{out[-3000:]}")
    got = summary("lost.json")
    notes = [line for line in out.splitlines() if line.startswith("raysim:")]
    say(
        "run with a node lost",
        f"{took:.1f} s, accuracy {short(got)}, equal to serial: {same(got, ref)}; raysim said: {notes[:3]}",
    )
    if not same(got, ref):
        raise SystemExit("the run that lost a node differs from the serial engine's")


def mlflow_run(run_id: str | None = None) -> dict:
    """The netns experiment's newest run (or ``run_id``) as the head's tracking server gives it."""
    if run_id is None:
        q = "curl -sf -X POST -H 'Content-Type: application/json' http://127.0.0.1:5000/api/2.0/mlflow/runs/search"
        body = json.dumps({"experiment_ids": ["1"], "max_results": 1, "order_by": ["attributes.start_time DESC"]})
        p = ssh(nodes()[0], f"{q} -d {shlex.quote(body)}", timeout=60)
        run = json.loads(p.stdout)["runs"][0]
    else:
        p = ssh(nodes()[0], f"curl -sf 'http://127.0.0.1:5000/api/2.0/mlflow/runs/get?run_id={run_id}'", timeout=60)
        run = json.loads(p.stdout)["run"]
    tags = {t["key"]: t["value"] for t in run["data"].get("tags", [])}
    return {"id": run["info"]["run_id"], "status": run["info"]["status"], "tags": tags}


def same_by_round(resumed: dict, ref: dict) -> bool:
    """A resumed run's summary equals the uninterrupted run's: the final metrics, and the
    training loss of every round the summary holds."""
    by_round = {h["round"]: h.get("train_loss") for h in ref["history"]}
    held = [h for h in resumed["history"] if "round" in h]
    return (
        resumed["final"] == ref["final"]
        and bool(held)
        and all(by_round[h["round"]] == h.get("train_loss") for h in held)
    )


def cmd_down_resume(a) -> None:
    """`ray down` mid-run: the MLflow run is left KILLED with its resume command; a new cluster
    comes up at other addresses (the nodes keep their disks: the head's checkpoints and MLflow
    store), and the resume there ends identical to the serial engine's uninterrupted run."""
    start_mlflow()
    ref = serial_reference(a.resume_rounds)
    shutil.rmtree(head_file("rsrun/ck"), ignore_errors=True)
    t = time.monotonic()
    proc = raysim_on_head(f"run ~/rsrun/netns.yaml -q --address auto --set rounds={a.resume_rounds}", background=True)
    while newest_manifest_round() < a.at_round:
        if proc.poll() is not None:
            raise SystemExit("the run ended before `ray down`:\n" + proc.stdout.read()[-3000:])
        time.sleep(0.3)
    at = newest_manifest_round()
    p = sh([RAY, "down", "-y", str(STATE / "cluster.yaml")], check=False, cwd=ROOT, timeout=300)
    out = proc.communicate(timeout=300)[0]
    run = mlflow_run()
    say(
        "ray down mid-run",
        f"after checkpoint round {at} ({time.monotonic() - t:.1f} s into the run): ray down exit {p.returncode}, "
        f"the run's command exit {proc.returncode}; MLflow run {run['id']} {run['status']} "
        f"(last checkpoint round {newest_manifest_round()}), why: {run['tags'].get('raysim.failure')!r}",
    )
    command = run["tags"].get("raysim.resume", "")
    if run["status"] != "KILLED" or "--resume" not in command:
        raise SystemExit(f"the run was left {run['status']} with resume command {command!r}:\n{out[-3000:]}")
    old = nodes()[0]["ip"]
    a.keep_homes, a.keep = True, False
    cmd_down(a)
    a.first += 10
    cmd_up(a)
    a.keep_homes = False  # the last `down` removes everything
    say("new cluster", f"head {old} -> {nodes()[0]['ip']}, workers {[n['ip'] for n in nodes()[1:-1]]}, a new token")
    start_mlflow()
    t = time.monotonic()
    p = raysim_on_head(command.removeprefix("raysim ") + " -q --summary ~/rsrun/out/resumed.json")
    if p.returncode:
        raise SystemExit(f"the resume failed ({p.returncode}):\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    got, after = summary("resumed.json"), mlflow_run(run["id"])
    say(
        "resumed on the new cluster",
        f"{time.monotonic() - t:.1f} s, `{command}`: MLflow run {after['status']}, accuracy {short(got)}, "
        f"equal to the uninterrupted serial run: {same_by_round(got, ref)}",
    )
    if not same_by_round(got, ref) or after["status"] != "FINISHED":
        raise SystemExit("the resumed run differs from the uninterrupted one")


# the benchmark's workloads: the default scenario, bench/tiny.yaml (1 000 clients) and the
# 10 000-client case of bench/scale.py (1 % sampled a round)
WORKLOADS = {
    "quickstart": ("scenarios/quickstart.yaml", []),
    "tiny-1000": ("bench/tiny.yaml", []),
    "scale-10000": (
        "bench/tiny.yaml",
        ["name=scale-10000", "data.clients=10000", "data.samples=16", "data.features=[20]",
         "algorithm.batch_size=8", "sampling.fraction=0.01", "eval.every=10", "eval.clients=1000"],
    ),
}  # fmt: skip
TIMED = (
    "import json, subprocess, sys, time; t = time.perf_counter(); r = subprocess.run(sys.argv[1:]); "
    "print('WALL', time.perf_counter() - t); sys.exit(r.returncode)"
)


def timed_run(node: dict, checkout: str, file: str, sets: list[str], address: str | None) -> dict:
    """``raysim run`` on ``node`` as its user types it, timed as a whole process; start-up is
    the whole less the rounds (the summary's round_seconds), and s/round the median round."""
    out = f"/tmp/bench-{secrets.token_hex(4)}"
    args = [".venv/bin/raysim", "run", file, "-q", "--summary", f"{out}.json"]
    args += [x for kv in [*sets, f"tracking.uri=sqlite:///{out}.db", f"checkpoint.dir={out}-ck"] for x in ("--set", kv)]
    args += ["--address", address] if address else []
    cmd = f"cd {checkout} && RAY_AUTH_MODE=token python3 -c {shlex.quote(TIMED)} {shlex.join(args)}"
    p = ssh(node, cmd, check=False, timeout=900)
    if p.returncode:
        raise SystemExit(f"{file} on {node['name']} failed:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    whole = float([x for x in p.stdout.splitlines() if x.startswith("WALL ")][-1].split()[1])
    summ = json.loads(ssh(node, f"cat {out}.json", timeout=60).stdout)
    rounds = [h["round_seconds"] - h.get("eval_seconds", 0.0) for h in summ["history"]]
    return {
        "whole": whole,
        "startup": whole - sum(h["round_seconds"] for h in summ["history"]),
        "per_round": sorted(rounds)[len(rounds) // 2],
        "final": summ["final"],
    }


def cmd_bench(a) -> None:
    """Each workload across the worker nodes (a host a worker, from the head with --address
    auto) against the same hosts on one node (the spare node's own local Ray). Every node is a namespace of this machine: they share its cores, so the ratio is what
    the cluster costs (TCP between nodes, remote placement), not a speed-up."""
    head, workers, lone = nodes()[0], [n for n in nodes()[1:] if n["name"] != "rogue"], nodes()[-1]
    w = len(workers)
    print(
        f"{'workload':<12} {'where':<28} {'process s':>9} {'start-up s':>10} {'s/round':>8}   ratio (process, start-up, s/round)",
        flush=True,
    )
    for name in a.workloads:
        file, sets = WORKLOADS[name]
        # one thread a host on both sides: a host's threads follow cpus_per_host (at least 1),
        # and PyTorch's CPU kernels on two threads are not bit for bit the same from one run to
        # the next; the one node's 2 CPUs shared by its w hosts
        hosts = [*sets, f"resources.hosts={w}"]
        across = timed_run(head, "~/raysim", file, [*hosts, "resources.cpus_per_host=1"], "auto")  # a host a worker
        share = min(1.0, int(2 / w * 1e4) / 1e4)  # rounded down: w shares fit in 2 CPUs
        one = timed_run(lone, str(ROOT), file, [*hosts, f"resources.cpus_per_host={share:.4f}"], None)
        if across["final"] != one["final"]:
            raise SystemExit(
                f"{name}: the metrics across nodes differ from one node's: {across['final']} vs {one['final']}"
            )
        for where, r in ((f"{w} workers ({w} hosts)", across), (f"one node ({w} hosts)", one)):
            print(f"{name:<12} {where:<28} {r['whole']:9.1f} {r['startup']:10.1f} {r['per_round']:8.3f}", end="")
            print(
                f"   {across['whole'] / one['whole']:.2f}x, {across['startup'] / one['startup']:.2f}x, "
                f"{across['per_round'] / one['per_round']:.2f}x (same metrics)"
                if r is one
                else "",
                flush=True,
            )


def cmd_no_token(a) -> None:
    rogue, head = nodes()[-1], nodes()[0]
    addr = f"{head['ip']}:{PORT}"
    ray = f"{ROOT}/.venv/bin/ray"
    p = ssh(rogue, f"timeout 120 {ray} start --address={addr} --num-cpus=1", check=False, timeout=200)
    tail = (p.stdout + p.stderr).strip().splitlines()
    say("node without the token: ray start", f"exit {p.returncode}: {tail[-1] if tail else ''}")
    p = ssh(
        rogue,
        f"timeout 120 {ray} start --address={addr} --num-cpus=1",
        check=False,
        timeout=200,
        env=f"RAY_AUTH_MODE=token RAY_AUTH_TOKEN={secrets.token_hex(32)}",
    )
    tail = (p.stdout + p.stderr).strip().splitlines()
    say("node with a wrong token: ray start", f"exit {p.returncode}: {tail[-1] if tail else ''}")
    p = ssh(
        rogue,
        f"cd {ROOT} && timeout 120 .venv/bin/raysim run scenarios/quickstart.yaml --address {addr} --set rounds=1",
        check=False,
        timeout=200,
    )
    tail = (p.stdout + p.stderr).strip().splitlines()
    say("raysim without the token", f"exit {p.returncode}: {tail[-1] if tail else ''}")
    ssh(rogue, f"{ray} stop --force", check=False)
    alive = wait_nodes(0, 60)
    if any(ip == rogue["ip"] for ip, _ in alive):
        raise SystemExit(f"the node without the token joined: {alive}")


# ---------------------------------------------------------------- down


def cmd_down(a) -> None:
    t = time.monotonic()
    if (STATE / "cluster.yaml").exists() and (STATE / "nodes.json").exists():
        p = sh([RAY, "down", "-y", str(STATE / "cluster.yaml")], check=False, cwd=ROOT, timeout=180)
        left = {n["name"]: len(ray_procs(n["ns"])) for n in nodes()}
        say("ray down", f"exit {p.returncode} in {time.monotonic() - t:.1f} s; Ray processes left per node: {left}")
    killed = 0
    ns_list = sh("ip netns list", check=False).stdout.split()
    for ns in [n for n in ns_list if n.startswith(PREFIX)]:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [int(x) for x in sh(f"ip netns pids {ns}", check=False).stdout.split()]
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    killed += sig == signal.SIGTERM
                except ProcessLookupError:
                    pass
            if pids and sig == signal.SIGTERM:
                time.sleep(2)
        sh(f"ip netns delete {ns}", check=False)
    for line in sh("ip -o link show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("rsv") or name == BRIDGE:
            sh(f"ip link delete {name}", check=False)
    for f in glob.glob(f"/tmp/ray/cluster-{CLUSTER}.*"):
        os.remove(f)
    if not a.keep:
        clear_state(keep_homes=getattr(a, "keep_homes", False))
    left_ns = [n for n in sh("ip netns list", check=False).stdout.split() if n.startswith(PREFIX)]
    left_if = [x for x in sh("ip -o link show", check=False).stdout.split() if x.startswith(("rsv", BRIDGE))]
    say("down", f"{killed} processes ended; namespaces left: {left_ns}, links left: {left_if}")


def clear_state(keep_homes: bool) -> None:
    """STATE removed; with ``keep_homes`` the nodes' homes stay (what a node keeps on its own
    disk across clusters: the head's checkpoints and MLflow store), and nothing else."""
    if not keep_homes:
        shutil.rmtree(STATE, ignore_errors=True)
        return
    for p in STATE.glob("*") if STATE.exists() else []:
        if p.name != "nodes":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    for node in (STATE / "nodes").glob("*") if (STATE / "nodes").exists() else []:
        for p in node.glob("*"):
            if p.name != "home":
                shutil.rmtree(p) if p.is_dir() else p.unlink()


def ray_procs(ns: str) -> list[int]:
    out = []
    for pid in sh(f"ip netns pids {ns}", check=False).stdout.split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "ray" in cmd and "sshd" not in cmd and "mlflow" not in cmd:
            out.append(int(pid))
    return out


def cmd_all(a) -> None:
    try:
        cmd_up(a)
        cmd_run(a)
        cmd_lose_node(a)
        cmd_no_token(a)
        if a.down_resume:
            cmd_down_resume(a)
    finally:
        cmd_down(a)
    say("all", f"done in {time.monotonic() - T0:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["up", "run", "lose-node", "no-token", "down-resume", "bench", "down", "all"])
    ap.add_argument("--nodes", type=int, default=3, help="nodes: the head and N-1 workers")
    ap.add_argument("--first", type=int, default=10, help="the head's last address byte; workers follow")
    ap.add_argument("--join-timeout", type=float, default=300)
    ap.add_argument("--at-round", type=int, default=10, help="lose-node: after this checkpoint round")
    ap.add_argument("--how", choices=["raylet", "link"], default="raylet")
    ap.add_argument("--keep", action="store_true", help="down: keep STATE (homes, logs)")
    ap.add_argument("--keep-homes", action="store_true", help="down: keep the nodes' homes only; up: reuse them")
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS), choices=list(WORKLOADS), help="bench")
    ap.add_argument("--resume-rounds", type=int, default=600, help="down-resume: the run's rounds")
    ap.add_argument("--no-down-resume", dest="down_resume", action="store_false", help="all: skip down-resume")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (namespaces, links, sshd)")
    {
        "up": cmd_up,
        "run": cmd_run,
        "lose-node": cmd_lose_node,
        "no-token": cmd_no_token,
        "down-resume": cmd_down_resume,
        "bench": cmd_bench,
        "down": cmd_down,
        "all": cmd_all,
    }[a.step](a)


if __name__ == "__main__":
    main()
