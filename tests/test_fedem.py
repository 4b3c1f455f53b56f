"""FedEM on tiny inputs: E-step, pi update, weighted loss, mixture prediction, unseen clients."""

import math

import pytest
import torch

import raysim.algorithms as algorithms
from raysim.algorithms.base import Received
from raysim.algorithms.fedem import FedEMServer, e_step, mixture_log_prob
from raysim.core.data import ClientData
from raysim.core.tasks import TASKS
from tests.test_algorithms import client, ctx, run, zero_model


def fedem(model_fn=None, **hp):
    cls = algorithms.get("fedem")
    base = dict(lr=0.1, batch_size=8, momentum=0.0, weight_decay=0.0, lr_schedule="constant", components=2)
    return cls(
        cls.Hyper(**{**base, **hp}),
        model_fn or (lambda variant=0: zero_model()),
        rounds=10,
        task=TASKS["classification"],
    )


def train(algo, state, comps, data, c):
    return run(algo, algo.train(state, Received(comps), data, c))[0]


def test_e_step_by_hand():
    # pi = (1/2, 1/2); sample 0 has losses (1, 2), sample 1 has (2, 1)
    q = e_step(torch.log(torch.tensor([0.5, 0.5])), torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    a = math.exp(-1) / (math.exp(-1) + math.exp(-2))  # 0.7311
    assert torch.allclose(q, torch.tensor([[a, 1 - a], [1 - a, a]]), atol=1e-6)
    assert torch.allclose(q.mean(dim=1), torch.tensor([0.5, 0.5]))  # the pi update
    # a prior tilts it: pi = (0.9, 0.1), equal losses -> q = pi for every sample
    q = e_step(torch.log(torch.tensor([0.9, 0.1])), torch.ones(2, 3))
    assert torch.allclose(q, torch.tensor([[0.9] * 3, [0.1] * 3]))


def test_weighted_loss_zero_weight_sample_contributes_nothing():
    # batch of 2: (x=2, y=0) weight 1 and (x=1, y=1) weight 0. The batch loss is mean_i w_i l_i,
    # so the gradient is half of sample 0's: W = 0.1 * 0.5 * [[1], [-1]] after one step.
    algo = fedem(batch_size=2)
    data = client(0, [2.0, 1.0], [0, 1])
    (f,) = algo.trainer(torch.device("cpu")).fit(
        [algo.job([torch.zeros(2, 1), torch.zeros(2)], data, ctx(), weights=torch.tensor([1.0, 0.0]))]
    )
    assert torch.allclose(f.params[0], torch.tensor([[0.05], [-0.05]]))
    assert torch.allclose(f.params[1], torch.tensor([0.025, -0.025]))


def test_mixture_prediction_by_hand():
    # component 0 is sure of class 0, component 1 of class 1 -> p = pi
    logits = torch.tensor([[[50.0, 0.0]], [[0.0, 50.0]]])
    p = mixture_log_prob(torch.tensor([0.25, 0.75]), logits).exp()
    assert torch.allclose(p, torch.tensor([[0.25, 0.75]]), atol=1e-6)


def fixed_components():
    """Component 0 always predicts class 0 (bias +3), component 1 class 1."""
    return [[torch.zeros(2, 1), torch.tensor([3.0, 0.0])], [torch.zeros(2, 1), torch.tensor([0.0, 3.0])]]


def test_train_updates_pi_towards_the_component_that_explains_the_data():
    algo = fedem()
    data = client(0, [1.0, 2.0, 3.0, 4.0], [1, 1, 1, 1])
    state, replies, nll = train(algo, algo.init_client(0, None), fixed_components(), data, ctx())
    # per-sample losses: comp 0: log(1 + e^3) = 3.0486, comp 1: log(1 + e^-3) = 0.0486
    l0, l1 = math.log(1 + math.e**3), math.log(1 + math.e**-3)
    q1 = 1 / (1 + math.exp(l1 - l0))
    assert state.pi[1].item() == pytest.approx(q1, abs=1e-6)
    assert nll == pytest.approx(-math.log(0.5 * math.exp(-l0) + 0.5 * math.exp(-l1)), abs=1e-6)
    assert len(replies) == 2 and all(r.weight == 4.0 for r in replies)


def sampled_replies():
    from raysim.core.replies import Accumulator, Weighted

    acc = Accumulator()
    acc.add([Weighted([torch.tensor([1.0])], 1.0), Weighted([torch.tensor([10.0])], 1.0)])
    acc.add([Weighted([torch.tensor([4.0])], 3.0), Weighted([torch.tensor([20.0])], 3.0)])
    return acc.result()


def test_server_averages_each_component_by_samples():
    algo = fedem()
    new = algo.aggregate(FedEMServer([[torch.zeros(1)], [torch.zeros(1)]]), sampled_replies(), 0)
    c = new.components
    assert c[0][0].item() == pytest.approx((1 + 12) / 4) and c[1][0].item() == pytest.approx((10 + 60) / 4)


def test_server_average_all_damps_by_the_unsampled_clients_share():
    # the official aggregator: 10 training samples in all, the sampled clients hold 4; the other
    # 6 contribute the previous components (2 and 30): (1 + 12 + 6*2) / 10, (10 + 60 + 6*30) / 10
    algo = fedem(server_average="all")
    server = FedEMServer([[torch.tensor([2.0])], [torch.tensor([30.0])]])
    req = algo.stats_request(server, 0)
    assert req is not None and req.clients == "all"
    server = algo.absorb_stats(server, 10.0, 0)  # the sum of every client's n_k
    assert algo.stats_request(server, 1) is None  # asked once
    c = algo.aggregate(server, sampled_replies(), 0).components
    assert c[0][0].item() == pytest.approx(2.5) and c[1][0].item() == pytest.approx(25.0)
    assert algo.check(algo.hp, decentralized=True)[0] == "server_average"


def test_unseen_client_iterates_pi_to_its_fixed_point_with_components_frozen():
    # one sample, losses l0 < l1: each E-step + pi update gives pi0' = pi0 e^-l0 / (pi0 e^-l0 +
    # pi1 e^-l1), so pi0 -> 1 geometrically; iterating to the tolerance gets within it of 1
    algo = fedem(unseen_tol=1e-9)
    data = ClientData(
        0,
        torch.tensor([[1.0]]),
        torch.tensor([0]),
        torch.zeros(0, 1),
        torch.zeros(0, dtype=torch.long),
        torch.tensor([[1.0]]),
        torch.tensor([0]),
    )
    msg = Received(fixed_components())
    one = fedem(unseen_max_steps=1).personalize(msg, data, ctx())
    l0, l1 = math.log(1 + math.e**-3), math.log(1 + math.e**3)
    assert one.pi[0].item() == pytest.approx(0.5 * math.exp(-l0) / (0.5 * math.exp(-l0) + 0.5 * math.exp(-l1)))
    done = algo.personalize(msg, data, ctx())
    assert done.pi[0].item() > 1 - 1e-6  # converged, far past one step
    (res,) = run(algo, algo.evaluate(done, msg, data, ctx()))
    assert res["accuracy"] == 1.0 and res["pi_entropy"] < 1e-4
    assert torch.equal(msg.shared[0][1], torch.tensor([3.0, 0.0]))  # the components were not touched


MIXTURE = """
name: mixture
seed: 0
rounds: 60
data:
  dataset: synthetic        # two linear labelling rules; most clients follow mainly one
  clients: 40
  dim: 10
  components: 2
  alpha: 0.1
  min_samples: 30
  max_samples: 60
  noise: 0.0
model: {name: linear}
algorithm: {name: fedem, components: 2, lr: 0.3, batch_size: 16, momentum: 0.0, weight_decay: 0.0,
            lr_schedule: constant}
sampling: {fraction: 1.0}
eval: {every: 60}
resources: {hosts: 2}
"""


def final_accuracy(tmp_path, algorithm):
    from raysim.engine.serial import serial_driver
    from raysim.scenario import config
    from tests.conftest import write_scenario

    text = MIXTURE if algorithm == "fedem" else MIXTURE.replace("name: fedem, components: 2,", f"name: {algorithm},")
    d = serial_driver(config.load(write_scenario(tmp_path, text, f"{algorithm}.yaml")))
    for _ in range(60):
        d.step()
    return d.history[-1]["accuracy"]


def test_fedem_beats_fedavg_and_local_on_a_mixture(tmp_path):
    em, avg, local = (final_accuracy(tmp_path, a) for a in ("fedem", "fedavg", "local"))
    assert em > avg + 0.05 and em > local + 0.02, (em, avg, local)
    assert em > 0.85


@pytest.mark.parametrize("stack", ["always", "never"])
def test_keep_momentum_carries_the_buffer_to_the_next_round_by_hand(stack):
    # M = 1, one sample (x=2, y=0), zero weights: the gradient is dW = (-1, 1), db = (-0.5, 0.5).
    # Round 1: buf = g, W = -lr*g = (0.1, -0.1). Round 2 from zero weights again: with the
    # buffer kept, buf = 0.9*g + g and W = (0.19, -0.19); with a fresh buffer W = (0.1, -0.1).
    data = client(0, [2.0], [0])
    zeros = [[torch.zeros(2, 1), torch.zeros(2)]]
    for keep, expect in ((True, 0.19), (False, 0.1)):
        algo = fedem(components=1, momentum=0.9, batch_size=4, keep_momentum=keep, stacking=stack)
        state, replies, _ = train(algo, algo.init_client(0, None), zeros, data, ctx())
        assert replies[0].values[0][:, 0].tolist() == pytest.approx([0.1, -0.1])
        assert (state.momentum is not None) == keep
        state, replies, _ = train(algo, state, zeros, data, ctx(round_=1))
        assert replies[0].values[0][:, 0].tolist() == pytest.approx([expect, -expect])


def mlp_fedem(**hp):
    from raysim.core.forward import params_of
    from raysim.models import MLPParams, mlp

    torch.manual_seed(2)
    net = mlp(MLPParams((6,)), (4,), 3)
    algo = fedem(
        lambda variant=0: net,
        **{**dict(lr=0.1, batch_size=8, components=3, momentum=0.9, weight_decay=5e-4, local_epochs=2), **hp},
    )
    return algo, [params_of(mlp(MLPParams((6,)), (4,), 3)) for _ in range(3)]


@pytest.mark.parametrize("keep", [False, True])
def test_many_clients_at_once_equal_one_at_a_time(keep):
    from tests.test_loop import clients, ctx_of

    algo, comps = mlp_fedem(keep_momentum=keep)
    alone, _ = mlp_fedem(keep_momentum=keep, stacking="never")
    assert algo.trainer(torch.device("cpu")).across
    datas = clients([5, 17, 0, 30, 8])  # ragged, one empty client, several batches
    many = [algo.init_client(d.cid, None) for d in datas]
    one = list(many)
    for r in range(2):
        res_many = run(algo, *[algo.train(s, Received(comps), d, ctx_of(d, r)) for s, d in zip(many, datas)])
        res_one = [run(alone, alone.train(s, Received(comps), d, ctx_of(d, r)))[0] for s, d in zip(one, datas)]
        for (s1, r1, l1), (s2, r2, l2) in zip(res_many, res_one):
            assert torch.allclose(s1.pi, s2.pi, atol=1e-6) and l1 == pytest.approx(l2, abs=1e-5)
            for a, b in zip(r1, r2):
                assert a.weight == b.weight and all(torch.allclose(u, v, atol=1e-5) for u, v in zip(a.values, b.values))
            if keep and s2.momentum is not None:
                for b1, b2 in zip(s1.momentum, s2.momentum):
                    assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(b1["momentum"], b2["momentum"]))
        many, one = [s for s, _, _ in res_many], [s for s, _, _ in res_one]
    assert torch.equal(many[2].pi, torch.full((3,), 1 / 3))  # the empty client keeps its pi
    assert (many[2].momentum is None) and ((many[0].momentum is not None) == keep)


def test_fedem_runs_identically_on_one_or_three_hosts(tmp_path):
    from raysim.scenario import config
    from tests.conftest import TINY, write_scenario
    from tests.test_engine import run_serial, strip_times

    text = TINY.replace(
        "algorithm: {name: fedavg, lr: 0.1, batch_size: 16}",
        "algorithm: {name: fedem, components: 2, lr: 0.1, batch_size: 16}\nmodel: {name: mlp, hidden: [8]}",
    )
    text = text.replace("model: {name: linear}\n", "")
    sc = config.load(write_scenario(tmp_path, text))
    a, b = run_serial(sc, 1), run_serial(sc, 3)
    assert strip_times(a.history) == strip_times(b.history)
    for x, y in zip(a.server_state.components, b.server_state.components):
        assert all(torch.equal(u, v) for u, v in zip(x, y))
