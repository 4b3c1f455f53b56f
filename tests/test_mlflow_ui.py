"""The MLflow UI shows a run's metrics and its report figures: `mlflow ui` on loopback, the run's
pages rendered by headless Chromium (Debian's `chromium`; the test is skipped without it), their
DOM checked, and a screenshot of the report figure written (``RAYSIM_SCREENSHOTS=DIR`` keeps it)."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT

from raysim.experiment.runner import run as run_scenario
from raysim.results import report
from raysim.scenario import config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--virtual-time-budget=20000",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs headless Chromium: apt-get install chromium"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium(tmp_path, *args) -> str:
    profile = tmp_path / f"profile{time.monotonic_ns()}"
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=120
    )
    return out.stdout


@pytest.fixture
def ui(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    sc = config.load(
        ROOT / "scenarios" / "synthetic_fedem.yaml",
        ["rounds=4", "eval.every=2", "data.clients=20", f"tracking.uri={uri}", f"checkpoint.dir={tmp_path}/ck"],
    )
    summary = run_scenario(sc, engine="serial", progress=False)
    report.report([summary["mlflow_run_id"]], uri, tmp_path / "rep")
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "ui",
            "--backend-store-uri",
            uri,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if urllib.request.urlopen(f"{base}/health", timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow ui did not answer on loopback within 2 minutes")
        _, client = report.client_for(uri)
        exp = client.get_run(summary["mlflow_run_id"]).info.experiment_id
        yield base, exp, summary
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_mlflow_ui_run_page_shows_metrics_and_the_report_figures(ui, tmp_path):
    base, exp, summary = ui
    rid = summary["mlflow_run_id"]
    page = f"{base}/#/experiments/{exp}/runs/{rid}"
    dom = chromium(tmp_path, "--dump-dom", page)
    assert summary["name"] in dom  # the run's page, rendered
    for metric in ("bottom_decile_accuracy", "pi_entropy", "accuracy"):
        assert metric in dom, metric
    figure = f"{page}/artifacts/report/accuracy.png"
    dom = chromium(tmp_path, "--dump-dom", figure)
    for name in ("report", "summary.json", "accuracy.png", "clients.png", "mixture_weights.png"):
        assert name in dom, name
    assert (
        "get-artifact" in dom and "report%2Faccuracy.png" in dom.replace("/", "%2F") or "report/accuracy.png" in dom
    )  # the image itself is requested
    shots = os.environ.get("RAYSIM_SCREENSHOTS") or str(tmp_path)
    os.makedirs(shots, exist_ok=True)
    png = os.path.join(shots, "mlflow_run_report.png")
    chromium(tmp_path, f"--screenshot={png}", "--window-size=1400,1000", figure)
    import numpy as np
    from PIL import Image

    img = Image.open(png)
    assert img.size == (1400, 1000) and np.asarray(img.convert("L")).std() > 15
