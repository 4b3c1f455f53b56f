"""`raysim data info`: every client's split sizes and train label counts, printed and drawn."""

import numpy as np
from conftest import write_scenario
from PIL import Image

from raysim import cli

SCENARIO = """
name: info
rounds: 1
data:
  dataset: digits
  clients: 4
  partition: {kind: shards, classes_per_client: 1}
  splits: {train: 0.5, test: 0.5}
model: {name: linear}
algorithm: {name: fedavg}
"""


def test_data_info_counts_every_sample_and_each_clients_labels(tmp_path, capsys):
    path = write_scenario(tmp_path, SCENARIO)
    png = tmp_path / "d.png"
    assert cli.main(["data", "info", path, "--plot", str(png), "--show", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    # 1 797 digits; label-sorted shards, one per client: each client holds 1 or 2 classes
    assert out[0] == "digits: 4 clients, inputs (64,) (features), 10 classes (classification)"
    total = out[1]
    assert total.startswith("samples: 1797 (train ") and "val 0" in total
    n_train = int(total.split("train ")[1].split(",")[0])
    assert 1797 // 2 - 4 <= n_train <= 1797 // 2 + 4  # half of each client, rounded
    assert "train labels: 10 of 10 classes present" in out[3]
    rows = [line for line in out if line[:6].strip().isdigit()]
    assert len(rows) == 4
    for row in rows:
        classes = int(row.split("classes (")[0].split()[-1])
        assert classes <= 4  # a 449-sample shard spans few classes
    img = Image.open(png)
    assert img.size[0] >= 1000 and img.size[1] >= 300
    pixels = np.asarray(img.convert("L"))
    assert pixels.std() > 10  # not blank


def test_data_info_bad_input_exits_2_with_one_line(tmp_path, capsys):
    path = write_scenario(tmp_path, SCENARIO.replace("digits", "fashion_mnist"))
    assert cli.main(["data", "info", path, "--set", "data.root=/nonexistent"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no IDX files under /nonexistent" in err[0]
