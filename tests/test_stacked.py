"""Stacked components (algorithms/stacked.py): M copies trained in one pass must equal training
them one after another, on every model of the zoo, and unsupported models must be refused."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import algorithms
from algorithms import stacked
from algorithms.base import ClientData, Context, LocalTraining
from algorithms.local_sgd import get_params, local_sgd
from raysim.models import CNNParams, LinearParams, MLPParams, femnist_cnn, linear, mlp
from tests.test_algorithms import client, ctx

ZOO = {
    "linear": (lambda: linear(LinearParams(), (5,), 3), (5,)),
    "linear_image": (lambda: linear(LinearParams(), (1, 4, 4), 3), (1, 4, 4)),
    "mlp": (lambda: mlp(MLPParams((7, 6)), (1, 4, 4), 3), (1, 4, 4)),
    "femnist_cnn": (lambda: femnist_cnn(CNNParams(), (1, 28, 28), 62), (1, 28, 28)),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_stacked_training_equals_one_copy_at_a_time(name):
    build, shape = ZOO[name]
    torch.manual_seed(0)
    models = [build() for _ in range(3)]
    n = 21
    x, y = torch.randn(n, *shape), torch.randint(0, 3, (n,))
    q = torch.softmax(torch.randn(3, n), dim=0)
    hp = LocalTraining(lr=0.05, batch_size=8, momentum=0.9, weight_decay=5e-4, local_epochs=2)
    start = [get_params(m) for m in models]
    assert stacked.stackable(models[0])
    losses = stacked.per_sample_losses(models[0], stacked.stack(start), x, y)
    expect = torch.stack([F.cross_entropy(m(x), y, reduction="none") for m in models])
    assert torch.allclose(losses, expect, atol=1e-5)
    out, _ = stacked.local_sgd(models[0], start, x, y, hp, Context(0, 10, 0, torch.Generator().manual_seed(3)), q)
    g = torch.Generator().manual_seed(3)          # the sequential loop draws the same orders
    for m, model in enumerate(models):
        local_sgd(model, x, y, hp, Context(0, 10, 0, g), sample_weight=q[m])
        for a, b in zip(out[m], model.parameters()):
            assert torch.allclose(a, b, atol=1e-6), (name, m)
        assert not torch.equal(out[m][0], start[m][0])        # it did train


def test_two_copies_by_hand():
    # two 1-d logistic copies with zero weights, one sample (x=2, y=0), weights q = (1, 0):
    # copy 0 steps by lr * grad = 0.1 * (0.5*2, -0.5*2) on W; copy 1 (weight 0) does not move.
    start = [[torch.zeros(2, 1), torch.zeros(2)], [torch.zeros(2, 1), torch.zeros(2)]]
    hp = LocalTraining(lr=0.1, batch_size=4)
    out, _ = stacked.local_sgd(nn.Linear(1, 2), start, torch.tensor([[2.0]]), torch.tensor([0]), hp, ctx(),
                               torch.tensor([[1.0], [0.0]]))
    assert torch.allclose(out[0][0], torch.tensor([[0.1], [-0.1]]))
    assert torch.allclose(out[0][1], torch.tensor([0.05, -0.05]))
    assert torch.equal(out[1][0], torch.zeros(2, 1)) and torch.equal(out[1][1], torch.zeros(2))


def test_unsupported_models_are_not_stacked():
    assert not stacked.stackable(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    assert not stacked.stackable(nn.Sequential(nn.Conv2d(2, 2, 3, groups=2)))
    assert not stacked.stackable(nn.LSTM(3, 3))


def test_fedem_stacked_and_sequential_paths_agree():
    cls = algorithms.get("fedem")
    torch.manual_seed(1)
    base = nn.Linear(1, 2)

    def model_fn(variant=0):
        m = nn.Linear(1, 2)
        m.load_state_dict(base.state_dict())
        return m

    comps = [get_params(nn.Linear(1, 2)) for _ in range(3)]
    data = client(0, [0.5, -1.0, 2.0, 1.5, -0.3], [0, 1, 1, 0, 1])
    out = {}
    for flag in (True, False):
        algo = cls(cls.Hyper(lr=0.1, batch_size=2, components=3, stack_components="always" if flag else "never"), model_fn, rounds=10)
        state, replies, nll = algo.train(algo.init_client(0, None), comps, data, ctx())
        ev = algo.evaluate(state, comps, data, ctx())
        out[flag] = (state.pi, [r.values for r in replies], nll, ev.loss_sum)
    (pi_a, rep_a, nll_a, ev_a), (pi_b, rep_b, nll_b, ev_b) = out[True], out[False]
    assert torch.allclose(pi_a, pi_b) and nll_a == pytest.approx(nll_b, abs=1e-6)
    assert ev_a == pytest.approx(ev_b, abs=1e-5)
    for a, b in zip(rep_a, rep_b):
        assert all(torch.allclose(s, t, atol=1e-6) for s, t in zip(a, b))


def fedem_clients(sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for cid, n in enumerate(sizes):
        x = torch.randn(n, 4, generator=g)
        y = torch.randint(0, 3, (n,), generator=g)
        out.append(ClientData(cid, x, y, x[:0], y[:0], x, y))
    return out


def fedem_algo(model="mlp", **hp):
    cls = algorithms.get("fedem")
    torch.manual_seed(2)
    net = mlp(MLPParams((6,)), (4,), 3) if model == "mlp" else linear(LinearParams(), (4,), 3)
    base = dict(lr=0.1, batch_size=8, components=3, momentum=0.9, weight_decay=5e-4, local_epochs=2)
    return cls(cls.Hyper(**{**base, **hp}), lambda variant=0: net, rounds=10), \
        [get_params(mlp(MLPParams((6,)), (4,), 3) if model == "mlp" else linear(LinearParams(), (4,), 3))
         for _ in range(3)]


def ctxs_for(datas, round_=0):
    return [Context(round_, 10, d.cid, torch.Generator().manual_seed(100 + d.cid)) for d in datas]


@pytest.mark.parametrize("model", ["linear", "mlp"])
def test_fedem_many_clients_at_once_equals_one_at_a_time(model):
    algo, comps = fedem_algo(model)
    assert algo._batching()
    datas = fedem_clients([5, 17, 0, 30, 8])          # ragged, one empty client, several batches
    states = [algo.init_client(d.cid, None) for d in datas]
    many = algo.train_many(states, comps, datas, ctxs_for(datas))
    one = [algo.train(s, comps, d, c) for s, d, c in zip(states, datas, ctxs_for(datas))]
    for (s1, r1, l1), (s2, r2, l2) in zip(many, one):
        assert torch.allclose(s1.pi, s2.pi, atol=1e-6) and l1 == pytest.approx(l2, abs=1e-5)
        for a, b in zip(r1, r2):
            assert a.weight == b.weight
            assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(a.values, b.values))
    assert torch.equal(many[2][0].pi, states[2].pi)         # the empty client keeps its pi


def test_a_clients_numbers_do_not_depend_on_the_other_clients_in_the_call():
    algo, comps = fedem_algo("mlp")
    datas = fedem_clients([5, 17, 40, 30, 8, 12])
    states = [algo.init_client(d.cid, None) for d in datas]
    everyone = algo.train_many(states, comps, datas, ctxs_for(datas))
    for pick in ([1], [0, 3], [2, 4, 5]):
        part = algo.train_many([states[i] for i in pick], comps, [datas[i] for i in pick],
                               ctxs_for([datas[i] for i in pick]))
        for i, (s, r, l) in zip(pick, part):
            assert torch.equal(s.pi, everyone[i][0].pi) and l == everyone[i][2]
            for a, b in zip(r, everyone[i][1]):
                assert all(torch.equal(u, v) for u, v in zip(a.values, b.values))


def test_fedem_runs_identically_on_one_or_three_hosts(tmp_path):
    from raysim import config
    from tests.conftest import TINY, write_scenario
    from tests.test_engine import run_serial, strip_times
    text = TINY.replace("algorithm: {name: fedavg, lr: 0.1, batch_size: 16}",
                        "algorithm: {name: fedem, components: 2, lr: 0.1, batch_size: 16}\nmodel: {name: mlp, hidden: [8]}")
    text = text.replace("model: {name: linear}\n", "")
    sc = config.load(write_scenario(tmp_path, text))
    a, b = run_serial(sc, 1), run_serial(sc, 3)
    assert strip_times(a.history) == strip_times(b.history)
    for x, y in zip(a.server_state, b.server_state):
        assert all(torch.equal(u, v) for u, v in zip(x, y))


def test_fedem_many_with_no_samples_or_no_clients():
    algo, comps = fedem_algo("linear")
    datas = fedem_clients([0, 0])
    states = [algo.init_client(d.cid, None) for d in datas]
    out = algo.train_many(states, comps, datas, ctxs_for(datas))
    assert [r[1][0].weight for r in out] == [0.0, 0.0]
    assert all(torch.equal(a, b) for a, b in zip(out[0][1][1].values, comps[1]))
    assert algo.train_many([], comps, [], []) == []


def test_auto_stacks_small_models_without_convolutions_only():
    assert stacked.worth_stacking(linear(LinearParams(), (150,), 2))
    assert stacked.worth_stacking(mlp(MLPParams((100,)), (64,), 10))
    assert not stacked.worth_stacking(mlp(MLPParams((200, 200)), (784,), 10))   # measured slower
    assert not stacked.worth_stacking(femnist_cnn(CNNParams(), (1, 28, 28), 62))
    cls = algorithms.get("fedem")
    cnn = lambda variant=0: femnist_cnn(CNNParams(), (1, 28, 28), 62)   # noqa: E731
    assert not cls(cls.Hyper(), cnn, rounds=1)._stacking()
    assert cls(cls.Hyper(stack_components="always"), cnn, rounds=1)._stacking()
    assert not cls(cls.Hyper(stack_components="always"), cnn, rounds=1)._batching()   # convolutions


def baseline(name, **hp):
    cls = algorithms.get(name)
    torch.manual_seed(4)
    net = mlp(MLPParams((6,)), (4,), 3)
    base = dict(lr=0.1, batch_size=8, momentum=0.9, weight_decay=5e-4, local_epochs=2)
    return cls(cls.Hyper(**{**base, **hp}), lambda variant=0: net, rounds=10)


@pytest.mark.parametrize("name,hp", [("fedavg", {}), ("fedprox", {"mu": 0.5}), ("local", {}), ("fedavg+", {})])
def test_baselines_many_clients_at_once_equal_one_at_a_time(name, hp):
    algo = baseline(name, **hp)
    assert algo._batching() if name != "local" else True
    message = get_params(mlp(MLPParams((6,)), (4,), 3))
    datas = fedem_clients([5, 17, 0, 30, 8])
    states = [algo.init_client(d.cid, None) for d in datas]
    if name == "local":          # one client with a model of its own already
        from algorithms.local import LocalState
        states[1] = LocalState(get_params(mlp(MLPParams((6,)), (4,), 3)))
    many = algo.train_many(states, message, datas, ctxs_for(datas))
    one = [algo.train(s, message, d, c) for s, d, c in zip(states, datas, ctxs_for(datas))]
    for (s1, r1, l1), (s2, r2, l2) in zip(many, one):
        assert l1 == pytest.approx(l2, abs=1e-5)
        a, b = (r1.values, r2.values) if r1 is not None else (s1.params, s2.params)
        assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(a, b))
        if r1 is not None:
            assert r1.weight == r2.weight
    # a client's numbers do not depend on the others in the call
    part = algo.train_many([states[3]], message, [datas[3]], ctxs_for([datas[3]]))
    a = part[0][1].values if part[0][1] is not None else part[0][0].params
    b = many[3][1].values if many[3][1] is not None else many[3][0].params
    assert all(torch.equal(u, v) for u, v in zip(a, b)) and part[0][2] == many[3][2]


def test_dsgd_many_clients_at_once_equal_one_at_a_time():
    algo = baseline("fedprox", mu=0.3)
    datas = fedem_clients([5, 17, 30])
    states = [algo.gossip_init(d.cid, get_params(mlp(MLPParams((6,)), (4,), 3))) for d in datas]
    many = algo.gossip_train_many(states, datas, ctxs_for(datas))
    one = [algo.gossip_train(s, d, c) for s, d, c in zip(states, datas, ctxs_for(datas))]
    for (s1, m1, l1), (s2, m2, l2) in zip(many, one):
        assert l1 == pytest.approx(l2, abs=1e-5)
        assert all(torch.allclose(u, v, atol=1e-5) for u, v in zip(m1, m2))
