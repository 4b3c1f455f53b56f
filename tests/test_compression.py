"""Compressed uploads (raysim/federation/compression.py): each compressor on vectors checked by hand, its
bytes, error feedback's remainder, unbiasedness where the compressor claims it, the same run on
any number of hosts and across a resume, the virtual clock's shorter uploads, and what learns."""

import json
import math

import pytest
import torch

from raysim import cli
from raysim.core.replies import Weighted
from raysim.experiment.runner import run as run_scenario
from raysim.federation import compression
from raysim.scenario import config
from raysim.scenario.sections import CommunicationCfg
from tests.conftest import ROOT, TINY, write_scenario
from tests.test_bad_inputs import run_refused


def gen(i=0):
    g = torch.Generator()
    g.manual_seed(i)
    return g


def test_qsgd_keeps_a_vector_on_its_levels_exactly_and_rounds_the_rest_to_neighbouring_levels():
    v = torch.tensor([3.0, -4.0])  # ‖v‖ = 5: with s = 5, |v_i|·s/‖v‖ = 3 and 4, levels already
    assert torch.equal(compression.compress(v, "qsgd", 5, 0.0, gen()), v)
    # s = 1: |v_i|/‖v‖ = 0.6 and 0.8, so each coordinate is ±5 with that probability, else 0
    draws = torch.stack([compression.compress(v, "qsgd", 1, 0.0, gen(i)) for i in range(4000)])
    assert set(draws[:, 0].tolist()) == {0.0, 5.0} and set(draws[:, 1].tolist()) == {0.0, -5.0}
    assert torch.allclose(draws.mean(0), v, atol=0.12)  # unbiased: E = (3, -4)
    assert torch.equal(compression.compress(torch.zeros(3), "qsgd", 4, 0.0, gen()), torch.zeros(3))


def test_qsgd_gives_each_bucket_its_own_norm():
    # bucket 2 over (3, -4 | 0, 2 | 1): norms 5, 2 and 1 (the last bucket shorter)
    v = torch.tensor([3.0, -4.0, 0.0, 2.0, 1.0])
    assert torch.equal(compression.compress(v, "qsgd", 5, 0.0, gen(), bucket=2), v)  # 3, 4 of 5; 0, 1; 1 of 1
    # s = 1: |v_i|/‖u‖ = 0.6, 0.8 (±5 or 0), then 0, 1 (exactly 0 and 2), then 1 (exactly 1)
    draws = torch.stack([compression.compress(v, "qsgd", 1, 0.0, gen(i), bucket=2) for i in range(400)])
    assert set(draws[:, 0].tolist()) == {0.0, 5.0} and set(draws[:, 1].tolist()) == {0.0, -5.0}
    assert torch.equal(draws[:, 2:], torch.tensor([0.0, 2.0, 1.0]).expand(400, 3))
    # one norm for the whole vector (‖v‖ = √30) instead: 2 is no longer a level, so it is rounded at random
    whole = torch.stack([compression.compress(v, "qsgd", 1, 0.0, gen(i), bucket=0) for i in range(400)])
    assert sorted(set(whole[:, 3].tolist())) == [0.0, pytest.approx(math.sqrt(30))]
    assert torch.equal(compression.compress(torch.zeros(5), "qsgd", 1, 0.0, gen(), bucket=2), torch.zeros(5))


def test_bucketed_qsgd_is_unbiased_and_the_same_for_the_same_seed():
    v = torch.tensor([3.0, -4.0, 1.0, 2.0, 0.5, -0.5, 2.0, -1.0])  # bucket 4: ‖u‖² = 30 and 5.5
    n = 4000
    draws = torch.stack([compression.compress(v, "qsgd", 1, 0.0, gen(i), bucket=4) for i in range(n)])
    # Lemma 3.1 per bucket: E‖Q(v) − v‖² ≤ min(4/1, √4/1)·35.5 = 71, so E‖mean − v‖² ≤ 71/n and, by
    # Markov, ‖mean − v‖² > 4·71/n for at most a quarter of seed sets (this one: 0.0046, against 0.071)
    assert float(((draws.mean(0) - v) ** 2).sum()) <= 4 * 71 / n
    again = compression.compress(v, "qsgd", 1, 0.0, gen(7), bucket=4)
    assert torch.equal(again, draws[7]) and not torch.equal(again, draws[8])


def test_bucketed_qsgd_variance_is_within_the_per_bucket_bound_and_below_the_whole_vectors():
    v, n = torch.ones(1024), 200  # ‖v‖² = 1024; s = 1
    # bucket 16: ‖u‖ = 4, each coordinate 4 with probability 1/4, else 0: variance 16·(1/4)(3/4) = 3 a
    # coordinate, 3‖v‖² in all, within Lemma 3.1's min(16, √16)‖v‖² = 4‖v‖² (the sample mean's sd: 0.25 %)
    b16 = torch.stack([compression.compress(v, "qsgd", 1, 0.0, gen(i), bucket=16) for i in range(n)])
    err16 = float(((b16 - v) ** 2).sum(1).mean())
    assert err16 == pytest.approx(3 * 1024, rel=0.02) and err16 < 4 * 1024
    # one norm, ‖v‖ = 32: each coordinate 32 with probability 1/32: 1024·(1/32)(31/32) = 31‖v‖² (bound 32; sd 1.2 %)
    whole = torch.stack([compression.compress(v, "qsgd", 1, 0.0, gen(i), bucket=0) for i in range(n)])
    assert float(((whole - v) ** 2).sum(1).mean()) == pytest.approx(31 * 1024, rel=0.05)


def test_topk_keeps_the_largest_magnitudes_and_randk_a_scaled_random_share_unbiased():
    v = torch.tensor([0.1, -3.0, 2.0, 0.5])
    assert torch.equal(compression.compress(v, "topk", 0, 0.5, gen()), torch.tensor([0.0, -3.0, 2.0, 0.0]))
    one = compression.compress(v, "randk", 0, 0.25, gen())  # k = 1 of 4, scaled by 4
    (i,) = one.nonzero().flatten().tolist()
    assert one[i] == 4 * v[i]
    draws = torch.stack([compression.compress(v, "randk", 0, 0.25, gen(s)) for s in range(4000)])
    assert torch.allclose(draws.mean(0), v, atol=0.15)
    # for error feedback, unscaled: what it keeps back is never longer than v (contractive)
    kept = compression.compress(v, "randk", 0, 0.25, gen(), unbiased=False)
    assert torch.equal(kept, one / 4)


def test_bytes_sent_depend_on_the_update_size_and_the_compressor():
    assert compression.sent_bytes(10, "none", 16, 0.1) == 40  # float32 each
    assert compression.sent_bytes(10, "qsgd", 16, 0.1) == 4 + 8  # norm + 10·(1 + 5) bits
    assert compression.sent_bytes(10, "qsgd", 1, 0.1) == 4 + 3  # 10·(1 + 1) bits
    assert compression.sent_bytes(1000, "topk", 16, 0.01) == 8 * 10  # (index, value) pairs
    assert compression.sent_bytes(1000, "randk", 16, 0.01) == 4 * 10  # values; indices from a seed
    assert compression.kept(3, 0.01) == 1 and compression.kept(3, 1.0) == 3


def test_qsgd_bytes_count_one_norm_per_bucket():
    # 1000 numbers, s = 16: 1 + ⌈log2 17⌉ = 6 bits each, 6000 bits = 750 bytes; bucket 512: ⌈1000/512⌉ = 2 norms
    assert compression.sent_bytes(1000, "qsgd", 16, 0.1, 512) == 2 * 4 + 750
    assert compression.sent_bytes(1000, "qsgd", 16, 0.1, 100) == 10 * 4 + 750
    assert (
        compression.sent_bytes(1000, "qsgd", 16, 0.1, 0) == compression.sent_bytes(1000, "qsgd", 16, 0.1, None) == 754
    )
    assert compression.sent_bytes(1000, "qsgd", 16, 0.1, 5000) == 754  # one bucket, shorter than b
    # what a client's upload logs, with the section's default bucket (512): two tensors, 600 + 400 numbers
    shared = [torch.zeros(600), torch.zeros(400), torch.zeros(3, dtype=torch.int64)]
    reply = Weighted([torch.ones(600), torch.ones(400), torch.zeros(3, dtype=torch.int64)], 1.0)
    up, _ = compression.upload(reply, shared, CommunicationCfg(compress="qsgd"), None, 0, 0, 7)
    assert up.nbytes == 758


def test_gossips_contractive_qsgd_divides_by_the_bucket_tau():
    # d = 8, s = 4, bucket 4: τ = 1 + min(4/16, √4/4) = 1.25 (one norm for all 8: 1 + min(0.5, 0.71) = 1.5)
    v = torch.tensor([1.0, -1.0, 1.0, 1.0, 0.0, 0.0, 3.0, 0.0])  # norms 2 and 3: s·|v_i|/‖u‖ = 2, 0 or 4, levels
    cfg = CommunicationCfg(compress="qsgd", levels=4, bucket=4, gossip_step=0.5)
    assert torch.equal(compression.gossip_estimate(v, torch.zeros(8), cfg, 0, 3, 7), v / 1.25)


def test_error_feedback_sends_what_was_dropped_at_the_next_round():
    cfg = CommunicationCfg(compress="topk", ratio=0.5, error_feedback=True)
    shared = [torch.zeros(2)]
    up, rest = compression.upload(Weighted([torch.tensor([3.0, 1.0])], 5.0), shared, cfg, None, 0, 0, 7)
    assert torch.equal(up.model.values[0], torch.tensor([3.0, 0.0])) and up.model.weight == 5.0
    assert torch.equal(rest, torch.tensor([0.0, 1.0])) and up.nbytes == 8.0
    up, rest = compression.upload(Weighted([torch.tensor([0.0, 0.5])], 5.0), shared, cfg, rest, 0, 1, 7)
    assert torch.equal(up.model.values[0], torch.tensor([0.0, 1.5])) and torch.equal(rest, torch.zeros(2))
    plain = CommunicationCfg(compress="topk", ratio=0.5)
    _, none = compression.upload(Weighted([torch.tensor([3.0, 1.0])], 5.0), shared, plain, None, 0, 0, 7)
    assert none is None


DIGITS = ROOT / "scenarios" / "quickstart.yaml"


def digits(tmp_path, *overrides):
    sc = config.load(
        DIGITS,
        [
            "rounds=40",
            "eval.every=20",
            f"tracking.uri=sqlite:///{tmp_path}/m.db",
            f"checkpoint.dir={tmp_path}/ck",
            "checkpoint.every=0",
            *overrides,
        ],
    )
    return run_scenario(sc, engine="serial", progress=False)


def test_compressed_fedavg_learns_digits_and_error_feedback_repairs_topk(tmp_path):
    base = digits(tmp_path)
    none = digits(tmp_path, "communication.compress=none")
    assert none["final"] == base["final"]  # "none" changes nothing but the count
    d = 64 * 64 + 64 + 64 * 10 + 10  # the MLP 64-64-10
    assert none["history"][-1]["upload_bytes"] == 25 * 4 * d  # 25 clients a round
    qsgd = digits(tmp_path, "communication.compress=qsgd", "communication.levels=4")
    topk = digits(tmp_path, "communication.compress=topk", "communication.ratio=0.05")
    ef = digits(
        tmp_path, "communication.compress=topk", "communication.ratio=0.05", "communication.error_feedback=true"
    )
    acc = {n: s["final"]["accuracy"] for n, s in (("none", none), ("qsgd", qsgd), ("topk", topk), ("ef", ef))}
    # seed 0: none 0.873, qsgd (s = 4, buckets of 512) 0.873 (one norm: 0.892), topk 5 % 0.826, with
    # error feedback 0.859; chance is 0.1
    assert acc["qsgd"] > acc["none"] - 0.03 and acc["ef"] > 0.8
    assert acc["ef"] > acc["topk"] + 0.02  # the dropped 95 % comes back later
    assert ef["history"][-1]["upload_bytes"] == 25 * 8 * math.ceil(0.05 * d)  # a tenth of none's, about
    assert ef["history"][-1]["upload_bytes_total"] == 40 * 25 * 8 * math.ceil(0.05 * d)  # over the 40 rounds


def test_a_compressed_run_with_error_feedback_is_the_same_on_one_host_or_three_and_across_a_resume(tmp_path):
    from tests.test_runs import raysim, summary_of, tracked

    text = (
        TINY.replace("rounds: 3", "rounds: 5") + "communication: {compress: randk, ratio: 0.3, error_feedback: true}\n"
    )
    path = tracked(tmp_path, text)
    out = {}
    for hosts in (1, 3):
        out[hosts] = summary_of(
            tmp_path, path, "--engine", "serial", "--set", f"resources.hosts={hosts}", name=f"h{hosts}.json"
        )
    assert out[1]["final"] == out[3]["final"]
    assert [h["train_loss"] for h in out[1]["history"]] == [h["train_loss"] for h in out[3]["history"]]
    proc = raysim("run", path, "-q", "--engine", "serial", env={"RAYSIM_FAIL_AFTER_ROUND": "2"}, check=False, here=True)
    assert proc.returncode == 1 and "injected failure after round 2" in proc.stderr
    failed = proc.stderr.split("--resume ")[-1].split()[0]
    resumed = summary_of(tmp_path, path, "--engine", "serial", "--resume", failed, name="resumed.json")
    assert resumed["final"] == out[1]["final"]  # the remainders came back from the checkpoint
    assert [h["train_loss"] for h in resumed["history"]] == [h["train_loss"] for h in out[1]["history"]]
    assert [h["upload_bytes_total"] for h in resumed["history"]] == [h["upload_bytes_total"] for h in out[1]["history"]]


def test_a_fleets_clock_counts_the_compressed_upload(tmp_path):
    slow_up = "systems: {up: {dist: constant, value: 0.1}, down: {dist: constant, value: 1000}}\n"
    path = write_scenario(tmp_path, TINY + f"tracking: {{uri: 'sqlite:///{tmp_path}/m.db'}}\n" + slow_up)
    secs = {}
    for kind in ("none", "topk"):
        summary = tmp_path / f"{kind}.json"
        assert (
            cli.main(
                [
                    "run",
                    path,
                    "--engine",
                    "serial",
                    "-q",
                    "--summary",
                    str(summary),
                    "--set",
                    f"communication.compress={kind}",
                    "--set",
                    "communication.ratio=0.1",
                ]
            )
            == 0
        )
        secs[kind] = json.loads(summary.read_text())["history"][0]["round_virtual_s"]
    # the linear model 10 -> 2: d = 22 numbers; none sends 88 bytes, topk 3 pairs = 24, at 0.1 Mbit/s
    assert secs["none"] - secs["topk"] == pytest.approx((88 - 24) * 8 / 0.1e6, rel=1e-9)


@pytest.mark.parametrize(
    "extra,key,says",
    [
        (
            "algorithm: {name: scaffold, lr: 0.1}",
            "algorithm.name",
            "does not reply with the one model the server averages",
        ),
        ("privacy: {clip: 1.0}", "communication", "use one of the two sections"),
        ("systems: {aggregation: fedbuff, buffer: 2}", "communication", "use systems.aggregation: sync"),
        ("communication: {compress: qsgd, error_feedback: true}", "communication.error_feedback", "topk and randk"),
        ("communication: {compress: qsgd, bucket: -1}", "communication.bucket", "it must be an integer from 0"),
        ("communication: {compress: qsgd, bucket: 0.5}", "communication.bucket", "is not an integer"),
    ],
)
def test_compression_is_refused_where_it_does_not_apply(tmp_path, capsys, extra, key, says):
    text = (
        TINY if "algorithm" not in extra else TINY.replace("algorithm: {name: fedavg, lr: 0.1, batch_size: 16}\n", "")
    )
    section = "" if extra.startswith("communication") else "\ncommunication: {compress: qsgd}"
    path = write_scenario(tmp_path, text + extra + section + "\n")
    line = run_refused(capsys, tmp_path, path)
    assert f": {key}: " in line and says in line, line
