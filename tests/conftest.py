import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_DEDUP_LOGS", "1")


def write_scenario(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


TINY = """
name: tiny
seed: 0
rounds: 3
data:
  dataset: synthetic
  clients: 12
  dim: 10
  max_samples: 80
model: {name: linear}
algorithm: {name: fedavg, lr: 0.1, batch_size: 16}
sampling: {fraction: 0.5}
eval: {every: 1}
resources: {hosts: 2, cpus_per_host: 0.5}
"""


@pytest.fixture
def tiny_scenario(tmp_path):
    """A 12-client synthetic FedAvg scenario; tracking and checkpoints inside tmp_path."""
    text = (
        TINY + f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\ncheckpoint: {{every: 1, dir: '{tmp_path}/ck'}}\n"
    )
    return write_scenario(tmp_path, text)


def last_record(tmp_path: Path, text: str, *overrides: str) -> dict:
    """The last history record of the scenario ``text`` (with ``overrides``) run by the serial
    engine on 2 hosts through all its rounds: what the methods' learning tests compare."""
    from raysim.engine.serial import serial_driver
    from raysim.scenario import config

    sc = config.load(write_scenario(tmp_path, text), list(overrides))
    d = serial_driver(sc, 2)
    for _ in range(sc.rounds):
        d.step()
    return d.history[-1]
