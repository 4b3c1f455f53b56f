"""A node leaving a 3-node ray.cluster_utils.Cluster mid-run (its own module: the cluster of
test_cluster.py is gone by then, so the two never share the machine)."""

import pytest

from tests.test_runs import summary_of, tracked

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_node_leaving_mid_run_moves_its_host_and_the_result_is_unchanged(tmp_path):
    """A 3-node cluster (the head runs no host); round 2 checkpointed, a worker
    node with a host on it is removed; the host is re-placed on the remaining worker and the
    run ends as the serial engine's."""
    import json
    import os
    import subprocess
    import sys
    import time

    from ray.cluster_utils import Cluster

    from tests.conftest import ROOT
    from tests.test_faults import LOCAL, same_run

    path = tracked(tmp_path, LOCAL, every=1)
    serial = summary_of(tmp_path, path, "--engine", "serial", name="serial.json")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    workers = [c.add_node(num_cpus=2) for _ in range(2)]
    c.wait_for_nodes()
    try:
        out = tmp_path / "ray.json"
        proc = subprocess.Popen(
            [sys.executable, "-m", "raysim.cli", "run", str(path), "-q", "--address", c.address, "--summary", str(out)],
            cwd=ROOT,
            text=True,
            env={**os.environ, "RAYSIM_PAUSE_AFTER_ROUND": "2:15"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 300
        ck = None
        while time.time() < deadline and ck is None and proc.poll() is None:
            for f in (tmp_path / "ck").glob("*/manifest.json") if (tmp_path / "ck").exists() else []:
                if f.parent.name != serial["mlflow_run_id"] and json.loads(f.read_text())["round"] >= 2:
                    ck = f
            time.sleep(0.3)
        assert ck is not None, (
            f"the Ray run never checkpointed round 2: {proc.poll()} {proc.stderr.read() if proc.poll() is not None else ''}"
        )
        c.remove_node(workers[1])  # one of the two hosts was on it (SPREAD)
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        assert "lost: its node left the cluster" in err
        assert "new hosts started; going on from the checkpoint of round 2 (round 3 is redone)" in err
        same_run(json.loads(out.read_text()), serial)
    finally:
        c.shutdown()
