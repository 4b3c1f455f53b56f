"""q-FFL, TERM and AFL: each one's step by hand on tiny inputs, the simplex projection against a
second solver (scipy's SLSQP), and end to end on a label-skewed digits split, where the methods
built for fairness raise the worst clients' accuracy above FedAvg's."""

import math

import numpy as np
import pytest
import scipy.optimize
import torch

from raysim.algorithms.afl import AFLServer, project_simplex
from raysim.algorithms.base import PerClient, Received
from raysim.algorithms.qffl import QReply
from raysim.algorithms.term import TERMServer, tilted_weights
from tests.test_algorithms import client, ctx, make, run


def test_qffl_reply_of_one_full_batch_step_by_hand():
    # zero logits on 2 classes: F = ln 2; x = (1, −1), y = (0, 1): ∂F/∂W = (−.5, .5)ᵀ, ∂F/∂b = 0,
    # and one SGD step at lr .1 makes L(w − w̄) = (w − w̄)/η that gradient: ‖g‖² = .5
    q = make("qffl", lr=0.1, batch_size=2, local_epochs=1, momentum=0.0, weight_decay=0.0, q=2.0)
    data = client(0, [1.0, -1.0], [0, 1])
    glob = [torch.zeros(2, 1), torch.zeros(2)]
    ((_, reply, _),) = run(q, q.train(None, Received(glob), data, ctx(0)))
    f = math.log(2)
    assert torch.allclose(reply.delta[0], torch.tensor([[-0.5], [0.5]]) * f**2, atol=1e-6)
    assert torch.allclose(reply.delta[1], torch.zeros(2), atol=1e-7)
    assert reply.h == pytest.approx(2 * f * 0.5 + f**2 / 0.1, rel=1e-6)
    # the server's step: w − ΣΔ/Σh (two clients' sums)
    summed = QReply([torch.tensor([[1.0], [2.0]], dtype=torch.float64), torch.tensor([0.5, 0.0])], 4.0)
    new = q.aggregate([torch.ones(2, 1), torch.ones(2)], summed, 1)
    assert torch.allclose(new[0], torch.tensor([[0.75], [0.5]])) and torch.allclose(new[1], torch.tensor([0.875, 1.0]))


def test_qffl_with_q_zero_steps_to_the_unweighted_mean_of_the_clients_models():
    # q = 0: Δ_k = (w − w̄_k)/η, h_k = 1/η, so w − ΣΔ/Σh = mean_k w̄_k whatever the sizes
    q = make("qffl", lr=0.5, q=0.0)
    glob = [torch.tensor([[1.0], [0.0]]), torch.tensor([0.0, 2.0])]
    models = [[torch.tensor([[0.0], [1.0]]), torch.tensor([1.0, 1.0])], [torch.tensor([[3.0], [1.0]]), torch.zeros(2)]]
    from raysim.algorithms.qffl import q_terms

    terms = [q_terms(glob, m, loss, 0.0, 0.5) for m, loss in zip(models, (0.3, 2.0))]
    summed = QReply([sum(t[0][i].double() for t in terms) for i in range(2)], sum(t[1] for t in terms))
    new = q.aggregate(glob, summed, 1)
    assert torch.allclose(new[0], torch.tensor([[1.5], [1.0]])) and torch.allclose(new[1], torch.tensor([0.5, 0.5]))


def test_term_weights_by_hand_and_both_normalizers():
    # t = ln 3, losses 1 and 2, equal sizes: ω ∝ (e^(−t), 1) = (1/3, 1): (.25, .75)
    w = tilted_weights({0: 1.0, 1: 2.0}, {0: 5.0, 1: 5.0}, math.log(3))
    assert w[0] == pytest.approx(0.25) and w[1] == pytest.approx(0.75)
    # sizes enter as p_k: n = (3, 1) gives (1, 1)/2; a huge loss does not overflow (shifted by the max)
    w = tilted_weights({0: 1.0, 1: 2.0}, {0: 3.0, 1: 1.0}, math.log(3))
    assert w[0] == pytest.approx(0.5)
    assert tilted_weights({0: 1e4, 1: 0.0}, {0: 1.0, 1: 1.0}, 1.0)[0] == 1.0
    term = make("term", t=math.log(3))
    model = [torch.zeros(2, 1), torch.zeros(2)]
    got = term.absorb_stats(TERMServer(model, {}, 0.0), PerClient({0: (1.0, 5.0), 1: (2.0, 5.0)}), 3)
    assert got.omega == pytest.approx({0: 0.25, 1: 0.75}) and got.asked == 3
    assert term.stats_request(got, 3) is None and term.stats_request(got, 4) is not None
    # the official code's: ω_k = e^(t(F_k − max)) / (m·est), est = ½·0 + ½·mean(1/3, 1) = 1/3
    official = make("term", t=math.log(3), normalizer="official")
    got = official.absorb_stats(TERMServer(model, {}, 0.0), PerClient({0: (1.0, 5.0), 1: (2.0, 5.0)}), 1)
    assert got.est == pytest.approx(1 / 3) and got.omega == pytest.approx({0: 0.5, 1: 1.5})


def test_simplex_projection_by_hand_and_against_slsqp():
    assert project_simplex(np.array([0.5, 0.5, 0.5])) == pytest.approx([1 / 3] * 3)
    assert project_simplex(np.array([2.0, 0.0, 0.0])) == pytest.approx([1.0, 0.0, 0.0])
    assert project_simplex(np.array([0.6, 0.8])) == pytest.approx([0.4, 0.6])  # θ = (1.4 − 1)/2
    rng = np.random.default_rng(0)
    for _ in range(20):
        v = rng.uniform(0, 1, 5)
        got = project_simplex(v)
        ref = scipy.optimize.minimize(
            lambda x, v=v: ((x - v) ** 2).sum(),
            np.full(5, 0.2),
            method="SLSQP",
            bounds=[(0, 1)] * 5,
            constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}],
            options={"ftol": 1e-12},
        ).x
        assert got.sum() == pytest.approx(1.0, abs=1e-12) and got.min() >= 0
        assert got == pytest.approx(ref, abs=1e-5)


def test_afl_lambda_ascends_on_the_losses_and_the_model_step_takes_the_old_lambda():
    afl = make("afl", lambda_lr=0.1)
    model = [torch.zeros(2, 1), torch.zeros(2)]
    none = torch.zeros(0, dtype=torch.float64)
    s = afl.absorb_stats(AFLServer(model, none, none, model, 0), PerClient({0: 1.0, 1: 3.0}), 0)
    # λ_0 uniform; λ_1 = Proj((.5, .5) + .1·(1, 3)) = Proj(.6, .8) = (.4, .6)
    assert s.lam.tolist() == [0.5, 0.5] and s.pending.tolist() == pytest.approx([0.4, 0.6])
    assert afl.message(s, 0).groups[1] == 0.5  # this round's models are weighted by λ_0
    # the aggregate: λ moves on, the average of the iterates w̄_t = mean of w_1..w_t
    from raysim.algorithms.base import Weighted

    a = afl.aggregate(s, Weighted([torch.ones(2, 1, dtype=torch.float64), torch.ones(2, dtype=torch.float64)], 1.0), 0)
    assert a.lam.tolist() == pytest.approx([0.4, 0.6]) and a.steps == 1 and a.average[0].tolist() == [[1.0], [1.0]]
    b = afl.aggregate(
        a, Weighted([3 * torch.ones(2, 1, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)], 1.0), 1
    )
    assert b.model[0].tolist() == [[3.0], [3.0]] and b.average[0].tolist() == [[2.0], [2.0]]
    assert b.average[1].tolist() == [0.5, 0.5]


SKEWED = """
name: fairness
seed: 0
rounds: 30
data: {dataset: digits, clients: 20, partition: {kind: dirichlet, alpha: 0.3}}
model: {name: mlp, hidden: [32]}
algorithm: {name: NAME, lr: 0.1, batch_size: 16}
sampling: {fraction: 0.5}
eval: {every: 30}
resources: {hosts: 2}
"""


def test_afl_and_term_raise_the_worst_clients_accuracy_above_fedavgs(tmp_path):
    from tests.conftest import last_record

    def final(name, *over):
        return last_record(tmp_path, SKEWED.replace("NAME", name), *over)

    fedavg, afl, term, qffl = final("fedavg"), final("afl"), final("term", "algorithm.t=5"), final("qffl")
    # measured: worst client FedAvg .263, AFL .526, TERM (t 5) .368; mean accuracy .861, .861,
    # .856; q-FFL (q 1) learns more slowly in 30 rounds: .703 (chance .1)
    assert afl["worst_accuracy"] > fedavg["worst_accuracy"] + 0.1 and afl["accuracy"] > 0.8
    assert term["worst_accuracy"] > fedavg["worst_accuracy"] and term["accuracy"] > 0.8
    assert qffl["accuracy"] > 0.6
