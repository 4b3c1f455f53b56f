"""IFCA and Ditto, the two methods that prove the contract: hand-checked two-client steps and
end-to-end learning on real digits."""

import collections
import math

import pytest
import torch

from raysim.algorithms.base import Received
from raysim.algorithms.ifca import IFCAServer
from raysim.core.replies import Accumulator
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from tests.test_algorithms import client, ctx, make, run, zeros

ROOT_SCENARIOS = __import__("pathlib").Path(__file__).resolve().parents[1] / "scenarios"


def biased(b0, b1):
    return [torch.zeros(2, 1), torch.tensor([b0, b1])]


def test_ifca_client_trains_the_cluster_of_lowest_loss_and_the_server_averages_per_cluster():
    algo = make("ifca", clusters=2, init_redraws=0)
    models = [biased(3.0, 0.0), biased(0.0, 3.0)]  # cluster 0 says class 0, cluster 1 class 1
    a = client(0, [2.0], [1])  # label 1: lower loss under cluster 1
    b = client(1, [1.0, 1.0], [1, 1])
    c = client(2, [2.0], [0])  # label 0: cluster 0
    (sa, ra, _), (sb, rb, _), (sc, rc, _) = run(
        algo, *(algo.train(None, Received(models), d, ctx(d.cid)) for d in (a, b, c))
    )
    assert (int(sa.cluster), int(sb.cluster), int(sc.cluster)) == (1, 1, 0)
    assert list(ra) == [1] and list(rc) == [0]
    # one step of lr .1 on (x=2, y=1) from bias (0, 3): p = softmax(0, 3), grad_b = p - (0, 1)
    p1 = 1 / (1 + math.exp(-3))
    assert ra[1].values[1].tolist() == pytest.approx([0.0 - 0.1 * (1 - p1), 3.0 - 0.1 * (p1 - 1)], abs=1e-6)
    acc = Accumulator()
    for r in (ra, rb, rc):
        acc.add(r)
    server = algo.aggregate(IFCAServer(models, ready=True), acc.result(), 0)
    # cluster 1 = (1 * a's + 2 * b's) / 3; cluster 0 = c's alone
    expect = (ra[1].values[1] + 2 * rb[1].values[1]) / 3
    assert torch.allclose(server.models[1][1], expect) and torch.equal(server.models[0][1], rc[0].values[1])


def test_ifca_redraws_the_initial_models_until_every_cluster_gets_its_share():
    algo = make("ifca", clusters=2, init_redraws=3, init_min_share=0.3)
    s = algo.init_server(None)
    assert algo.stats_request(s, 0).clients == "all"
    again = algo.absorb_stats(s, torch.tensor([9.0, 1.0], dtype=torch.float64), 0)  # 10 % < 30 %
    assert not again.ready and again.draws == 1
    done = algo.absorb_stats(again, torch.tensor([6.0, 4.0], dtype=torch.float64), 0)
    assert done.ready and algo.stats_request(done, 0) is None
    give_up = algo.absorb_stats(IFCAServer(s.models, 3), torch.tensor([10.0, 0.0], dtype=torch.float64), 0)
    assert give_up.ready  # at most init_redraws new draws


def purity(driver) -> float:
    src = driver.transport.hosts[0].source
    states = driver.transport.get_states()
    by_cluster = collections.defaultdict(collections.Counter)
    for c in sorted(states):
        by_cluster[int(states[c]["state"]["cluster"])][src.group_of(c)] += 1
    return sum(max(v.values()) for v in by_cluster.values()) / len(states)


def run_serial(sc):
    d = serial_driver(sc, 2)
    for _ in range(sc.rounds):
        d.step()
    return d


def test_ifca_recovers_the_rotation_groups_of_real_digits():
    sc = config.load(str(ROOT_SCENARIOS / "digits_rotated_ifca.yaml"))
    ifca = run_serial(sc)
    assert purity(ifca) >= 0.9
    fedavg = run_serial(
        config.load(
            str(ROOT_SCENARIOS / "digits_rotated_ifca.yaml"), ["algorithm={name: fedavg, lr: 0.1, batch_size: 16}"]
        )
    )
    assert ifca.history[-1]["accuracy"] > fedavg.history[-1]["accuracy"] + 0.2, (ifca.history[-1], fedavg.history[-1])


def test_ditto_personal_model_is_pulled_towards_the_global_one_by_hand():
    # two single-sample steps on (x=2, y=0) from zero weights; the personal model v starts at w:
    # step 1 has no pull, step 2 adds lam * (v - w) = lam * 0.1 to dW0 (as FedProx with mu = lam)
    p0 = 1 / (1 + math.exp(-0.5))
    dW0 = (p0 - 1) * 2
    algo = make("ditto", local_epochs=2, lam=1.0)
    data = client(0, [2.0], [0])
    ((state, reply, _),) = run(algo, algo.train(None, Received(zeros()), data, ctx()))
    assert reply.values[0][0, 0].item() == pytest.approx(0.1 - 0.1 * dW0, abs=1e-6)  # global: FedAvg
    assert state.personal[0][0, 0].item() == pytest.approx(0.1 - 0.1 * (dW0 + 0.1), abs=1e-6)
    (res,) = run(algo, algo.evaluate(state, Received(zeros()), client(0, [2.0], [0], test=([2.0], [0])), ctx()))
    assert res["accuracy"] == 1.0 and res["global_accuracy"] == 1.0  # zeros tie -> class 0


def test_ditto_beats_fedavg_on_a_pathological_split_and_its_global_model_is_fedavgs():
    path = str(ROOT_SCENARIOS / "digits_shards_personalized.yaml")
    ((_, ditto_sc),) = config.load_variants(path, only="ditto")
    ((_, fedavg_sc),) = config.load_variants(path, only="fedavg")
    ditto, fedavg = run_serial(ditto_sc), run_serial(fedavg_sc)
    assert ditto.history[-1]["accuracy"] > fedavg.history[-1]["accuracy"] + 0.05
    assert ditto.history[-1]["global_accuracy"] == fedavg.history[-1]["global_accuracy"]
    assert all(torch.equal(a, b) for a, b in zip(ditto.server_state, fedavg.server_state))
