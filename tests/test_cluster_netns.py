"""A real cluster on this machine: bench/cluster_netns.py's `all` (network-namespace nodes with
their own addresses, `ray up` over SSH from cluster/onprem.yaml, a run across the nodes equal to
the serial engine's, a worker's raylet killed mid-run survived with identical metrics, a node
without the token refused, `ray down` and the namespaces removed). Root, sshd and rsync needed;
about 3 minutes on 2 cores: python -m pytest -m slow tests/test_cluster_netns.py"""

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
    assert "namespaces left: [], links left: []" in out
    assert not subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.strip()
