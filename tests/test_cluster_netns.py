"""A real cluster on this machine: bench/cluster_netns.py's `all` (network-namespace nodes with
their own addresses, `ray up` over SSH from cluster/onprem.yaml, a run across the nodes equal to
the serial engine's, a worker's raylet killed mid-run survived with identical metrics, a node
without the token refused, `ray down` mid-run leaving the run KILLED and its resume on a new
cluster at other addresses identical, `ray down` and the namespaces removed). Root, sshd and rsync
needed; about 7 minutes on 2 cores: python -m pytest -m slow tests/test_cluster_netns.py"""

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.skipif(
    os.geteuid() != 0 or not (shutil.which("rsync") and os.path.exists("/usr/sbin/sshd")),
    reason="needs root, rsync and openssh-server",
)
def test_cluster_of_namespaces_up_run_lose_a_node_down():
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "cluster_netns.py"), "all", "--nodes", "3"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "cluster: 3 nodes alive" in out
    assert "run across nodes:" in out and "equal to serial: True" in out.split("run across nodes:")[1]
    assert "run with a node lost:" in out and "equal to serial: True" in out.split("run with a node lost:")[1]
    assert "raysim without the token: exit 2" in out
    assert "the hosts' nodes (MLflow tag raysim.host_nodes): 0=10.77.0.1" in out
    # `ray down` mid-run: KILLED, and resumed on a new cluster at other addresses, identical
    assert "ray down mid-run:" in out and " KILLED " in out.split("ray down mid-run:")[1].splitlines()[0]
    assert "new cluster: head 10.77.0.10 -> 10.77.0.20" in out
    resumed = out.split("resumed on the new cluster:")[1].splitlines()[0]
    assert "MLflow run FINISHED" in resumed and "equal to the uninterrupted serial run: True" in resumed
    assert "namespaces left: [], links left: []" in out
    assert not subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip()
