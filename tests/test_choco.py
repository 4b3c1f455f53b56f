"""Compressed gossip (CHOCO-gossip, the ``communication`` section with a topology): the public
copy's step by hand, plain gossip recovered with the identity compressor and step 1, the same
run on any number of hosts and across a resume, fewer bytes, and what it refuses."""

import math

import pytest
import torch

from raysim.federation import compression
from raysim.scenario.sections import CommunicationCfg
from tests.conftest import write_scenario
from tests.test_bad_inputs import run_refused
from tests.test_gossip import DFEDEM, DSGD, load, run


def test_the_public_copy_moves_by_the_compressed_difference():
    x, hat = torch.tensor([3.0, -1.0, 0.5, 2.0]), torch.ones(4)
    # x − x̂ = (2, −2, −0.5, 1): top-2 keeps (2, −2) -> x̂ = (3, −1, 1, 1)
    topk = CommunicationCfg(compress="topk", ratio=0.5, gossip_step=0.5)
    assert torch.equal(compression.gossip_estimate(x, hat, topk, 0, 3, 7), torch.tensor([3.0, -1.0, 1.0, 1.0]))
    # rand-k unscaled: the 2 coordinates it draws move all the way to x, the others stay
    randk = CommunicationCfg(compress="randk", ratio=0.5, gossip_step=0.5)
    moved = compression.gossip_estimate(x, hat, randk, 0, 3, 7)
    assert int((moved == x).sum()) == 2 and int((moved == hat).sum()) == 2
    # QSGD divided by τ = 1 + min(d/s², √d/s): d = 4, s = 4: τ = 1 + min(0.25, 0.5) = 1.25
    qsgd = CommunicationCfg(compress="qsgd", levels=4, gossip_step=0.5)
    v = torch.tensor([3.0, 0.0, 4.0, 0.0])  # ‖v‖ = 5: levels 2.4 and 3.2 of 4 -> random
    q = compression.gossip_estimate(v, torch.zeros(4), qsgd, 0, 3, 7) * 1.25
    assert float(q[0]) in (5 * 2 / 4, 5 * 3 / 4) and float(q[2]) in (5 * 3 / 4, 5 * 4 / 4)
    assert float(q[1]) == float(q[3]) == 0.0
    none = CommunicationCfg(compress="none", gossip_step=1.0)
    assert torch.equal(compression.gossip_estimate(x, hat, none, 0, 3, 7), hat + (x - hat))


@pytest.mark.parametrize("text", [DSGD, DFEDEM], ids=["dsgd", "dfedem"])
def test_the_identity_compressor_with_step_one_is_plain_gossip(tmp_path, text):
    """x̂ = x after the local step, x + 1·(Σ w x̂ − x̂) = Σ w x: plain gossip, to float32 rounding."""
    plain = run(load(tmp_path, text))
    choco = run(load(tmp_path, text, "communication.compress=none", "communication.gossip_step=1.0"))
    for a, b in zip(plain.history, choco.history):
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-6)
        assert b["consensus_distance"] == pytest.approx(a["consensus_distance"], abs=1e-6)
    assert choco.history[-1]["upload_bytes"] == 12 * 4.0 * 22 * (2 if text is DFEDEM else 1)  # 12 clients, d floats


def test_compressed_gossip_learns_sends_a_fifth_and_mixes_less_the_smaller_its_step(tmp_path):
    plain = run(load(tmp_path, DSGD, "rounds=8"))
    runs = {
        g: run(
            load(
                tmp_path,
                DSGD,
                "rounds=8",
                "communication.compress=topk",
                "communication.ratio=0.2",
                f"communication.gossip_step={g}",
            )
        )
        for g in (0.1, 0.5)
    }
    for d in runs.values():
        last = d.history[-1]
        assert last["accuracy"] > 0.6  # two classes: chance 0.5
        assert last["upload_bytes"] == 12 * 8.0 * math.ceil(0.2 * 22)  # (index, value) pairs
        assert last["upload_bytes_total"] == 8 * last["upload_bytes"]
    # less of each round's mixing goes through: the models stay further apart than plain gossip's
    dist = {g: d.history[-1]["consensus_distance"] for g, d in runs.items()}
    assert plain.history[-1]["consensus_distance"] < dist[0.5] < dist[0.1]


def test_compressed_gossip_is_the_same_on_one_host_or_three_and_across_a_resume(tmp_path):
    from tests.test_runs import raysim, summary_of, tracked

    path = tracked(
        tmp_path,
        DFEDEM.replace("rounds: 4", "rounds: 5") + "communication: {compress: qsgd, levels: 4, gossip_step: 0.4}\n",
    )
    out = {
        h: summary_of(tmp_path, path, "--engine", "serial", "--set", f"resources.hosts={h}", name=f"h{h}.json")
        for h in (1, 3)
    }
    keys = ("train_loss", "consensus_distance", "upload_bytes_total")
    pick = lambda s: [{k: h.get(k) for k in keys} for h in s["history"]]  # noqa: E731
    assert out[1]["final"] == out[3]["final"] and pick(out[1]) == pick(out[3])
    proc = raysim("run", path, "-q", "--engine", "serial", env={"RAYSIM_FAIL_AFTER_ROUND": "2"}, check=False, here=True)
    assert proc.returncode == 1 and "injected failure after round 2" in proc.stderr
    failed = proc.stderr.split("--resume ")[-1].split()[0]
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", failed, name="resumed.json")
    assert resumed["final"] == out[1]["final"] and pick(resumed) == pick(out[1])  # the copies came back


@pytest.mark.parametrize(
    "options,key,says",
    [
        ("{compress: topk}", "communication.gossip_step", "consensus step"),
        ("{compress: topk, gossip_step: 0.3, error_feedback: true}", "communication.error_feedback", "public copies"),
    ],
)
def test_compressed_gossip_is_refused_without_its_step_or_with_error_feedback(tmp_path, capsys, options, key, says):
    path = write_scenario(tmp_path, DSGD + f"communication: {options}\n")
    line = run_refused(capsys, tmp_path, path)
    assert f": {key}: " in line and says in line, line


def test_the_gossip_step_is_refused_without_a_topology(tmp_path, capsys):
    from tests.conftest import TINY

    path = write_scenario(tmp_path, TINY + "communication: {compress: topk, gossip_step: 0.5}\n")
    line = run_refused(capsys, tmp_path, path)
    assert ": communication.gossip_step: " in line and "decentralized" in line, line
