"""Byzantine nodes in gossip (an ``adversary`` or a ``defence`` with a ``topology``): what a
malicious node sends, one node's robust mixing by hand, the one-line errors, the same metrics on 1
and 3 hosts, and end to end on D-SGD that a sign-flipping minority wrecks plain gossip while
ClippedGossip and BRIDGE keep the honest nodes near the clean run."""

import numpy as np
import pytest
import torch

from raysim.core.mixing import Rows
from raysim.engine.serial import serial_driver
from raysim.federation import robust_gossip
from raysim.scenario import config
from raysim.scenario.config import ScenarioError
from tests.conftest import TINY, write_scenario

DSGD = """
name: dsgd-byz
seed: 0
rounds: 20
data: {dataset: digits, clients: 20, partition: {kind: dirichlet, alpha: 100.0}}
model: {name: mlp, hidden: [32]}
algorithm: {name: fedavg, lr: 0.1, batch_size: 16, local_epochs: 1}
topology: {kind: erdos_renyi, p: 0.4}
eval: {every: 10}
resources: {hosts: 2}
"""


def load(tmp_path, text, *overrides):
    return config.load(write_scenario(tmp_path, text), list(overrides))


def run(sc, hosts):
    d = serial_driver(sc, hosts)
    for _ in range(sc.rounds):
        d.step()
    return d


def t(*v):
    return torch.tensor(v, dtype=torch.float64)


class Sc:
    """The two keys ``robust_gossip`` reads, for the checks by hand."""

    def __init__(self, tmp_path, *overrides):
        sc = load(tmp_path, DSGD, *overrides)
        self.adversary, self.defence, self.seed = sc.adversary, sc.defence, sc.seed


def test_a_malicious_node_sends_its_crafted_parameters(tmp_path):
    before, after = t(1.0, 1.0), t(2.0, 3.0)  # its update Δ = (1, 2)
    flip = Sc(tmp_path, "adversary={attack: {name: sign_flip, s: 2}}")
    assert robust_gossip.sent(flip, 0, 5, before, after).tolist() == [-1.0, -3.0]  # x − 2Δ
    noise = Sc(tmp_path, "adversary={attack: {name: gaussian, mu: 0.5, sigma: 0.0}}")
    assert robust_gossip.sent(noise, 0, 5, before, after).tolist() == [1.5, 1.5]  # x + N(0.5, 0)
    flipped = Sc(tmp_path, "adversary={attack: label_flip}")
    assert robust_gossip.sent(flipped, 0, 5, before, after).tolist() == [2.0, 3.0]  # trained honestly
    # (gamma is the image backdoor's option; its arithmetic is the same x + γΔ)


def test_one_nodes_robust_mixing_by_hand(tmp_path):
    # node 0 hosted here: W_00 = 0.4, neighbours 1, 2, 3 at 0.2 each; node 0 is malicious and
    # sent (9, 9) but keeps its honest (1, 1) for itself
    rows = Rows({0: [(0, 0.4), (1, 0.2), (2, 0.2), (3, 0.2)]})
    sources = {0: t(9, 9), 1: t(2, 0), 2: t(4, 0), 3: t(100, 0)}
    own = {0: t(1, 1)}
    plain = robust_gossip.robust_mix(Sc(tmp_path), rows, sources, own)
    assert torch.allclose(plain, t(0.4 + 0.4 + 0.8 + 20, 0.4).unsqueeze(0))  # W_00 x_0 + Σ w_j x_j
    # BRIDGE, b = 1: per coordinate the largest and smallest neighbour value dropped, the rest
    # averaged with the node's own: ((1 + 4) / 2, (1 + 0) / 2)
    bridge = robust_gossip.robust_mix(Sc(tmp_path, "defence=bridge_trimmed_mean"), rows, sources, own)
    assert torch.allclose(bridge, t(2.5, 0.5).unsqueeze(0))
    # ClippedGossip, τ = 1: x + Σ_j w_j CLIP(x_j − x, 1); x_j − x = (1, −1), (3, −1), (99, −1)
    cg = robust_gossip.robust_mix(Sc(tmp_path, "defence={rule: clipped_gossip, tau: 1.0}"), rows, sources, own)
    d = [np.array(v) / max(1.0, np.hypot(*v)) for v in ((1, -1), (3, -1), (99, -1))]
    assert torch.allclose(cg, torch.from_numpy(np.array([1.0, 1.0]) + 0.2 * sum(d)).unsqueeze(0))


@pytest.mark.parametrize(
    "text, overrides, words",
    [
        (DSGD, ["adversary={attack: alie}"], "adversary.attack.name: alie reads the honest clients' updates"),
        (DSGD, ["defence=median"], "defence.rule: median is a server rule; with a topology choose one of"),
        (TINY, ["defence=clipped_gossip"], "defence.rule: clipped_gossip is a gossip rule; without a topology"),
        (
            DSGD,
            ["defence={rule: clipped_gossip, preaggregate: {kind: bucketing}}"],
            "defence.preaggregate: pre-aggregation acts on a server's round",
        ),
        (
            DSGD,
            ["topology={kind: ring}", "defence=bridge_trimmed_mean"],
            "defence.rule: bridge needs n_i ≥ 2b + 1 neighbours (n_i = 2, b = 1) at client 0 of the ring graph",
        ),
    ],
)
def test_bad_gossip_settings_are_one_line_errors(tmp_path, text, overrides, words):
    with pytest.raises(ScenarioError) as e:
        load(tmp_path, text, *overrides)
    msg = str(e.value)
    assert words in msg, msg
    assert "\n" not in msg


def strip(history):
    return [
        {k: v for k, v in h.items() if "seconds" not in k and "bytes" not in k and "messages" not in k} for h in history
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        [
            "adversary={fraction: 0.2, attack: {name: gaussian, sigma: 0.5}}",
            "defence={rule: clipped_gossip, delta: 0.3}",
        ],
        ["adversary={fraction: 0.2, attack: label_flip}", "defence=bridge_trimmed_mean", "algorithm.name=fedem"],
    ],
)
def test_same_metrics_on_one_and_three_hosts_in_gossip(tmp_path, overrides):
    sc = load(tmp_path, DSGD, "rounds=3", "eval.every=1", *overrides)
    a, b = run(sc, 1), run(sc, 3)
    assert strip(a.history) == strip(b.history)
    assert "honest_accuracy" in a.history[-1] and a.history[-1]["defence_fallbacks"] == 0.0


def test_sign_flippers_wreck_plain_gossip_and_the_robust_rules_resist(tmp_path):
    attack = "adversary={fraction: 0.2, attack: {name: sign_flip, s: 4}}"
    clean = run(load(tmp_path, DSGD), 2).history[-1]["accuracy"]
    plain = run(load(tmp_path, DSGD, attack), 2).history[-1]["honest_accuracy"]
    clipped = run(load(tmp_path, DSGD, attack, "defence={rule: clipped_gossip, delta: 0.3}"), 2).history[-1]
    bridge = run(load(tmp_path, DSGD, attack, "defence=bridge_trimmed_mean"), 2).history[-1]
    # measured: clean 0.853, plain 0.372, ClippedGossip (δ 0.3) 0.797, BRIDGE (b = 1) 0.683
    assert clean > 0.8
    assert plain < clean - 0.3
    assert clipped["honest_accuracy"] > clean - 0.1
    assert bridge["honest_accuracy"] > plain + 0.2
