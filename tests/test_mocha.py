"""MOCHA: SDCA steps and the server's W update against the closed forms written out here, the
Ω update against scipy's sqrtm, the primal-dual objectives over rounds, the duals as client
state through a checkpoint, and end to end on FedEM's synthetic data against Local."""

import numpy as np
import pytest
import scipy.linalg
import torch

import raysim.algorithms as algorithms
from raysim.algorithms.base import Received
from raysim.algorithms.mocha import MochaHyper, MochaServer, MochaState, sqrt_psd
from raysim.core.data import ClientData, Context
from raysim.core.tasks import TASKS
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from tests.conftest import TINY, write_scenario

F64 = torch.float64


def make(task="classification", bias=False, features=2, outputs=2, **hp):
    def model_fn(variant=0):
        return torch.nn.Linear(features, outputs, bias=bias)

    return algorithms.get("mocha")(MochaHyper(**hp), model_fn, rounds=10, task=TASKS[task])


def data(cid, xs, ys, regression=False):
    x = torch.tensor(xs, dtype=torch.float32)
    y = torch.tensor(ys, dtype=torch.float32 if regression else torch.int64)
    return ClientData(cid, x, y, x[:0], y[:0], x, y)


def ctx(cid, round_=0):
    return Context(round_, 10, cid, torch.Generator().manual_seed(100 + cid), torch.device("cpu"), cid)


def first_coords(cid, n, k):
    """The coordinates client ``cid``'s ctx draws: one permutation of n, its first k."""
    return torch.randperm(n, generator=ctx(cid).generator).tolist()[:k]


def one_round(algo, server, states, datas, round_=0):
    msg = algo.message(server, round_)
    outs = [
        algo.train(s, Received(msg.shared, msg.groups[d.cid]), d, ctx(d.cid, round_)) for s, d in zip(states, datas)
    ]
    reduced = {}
    for _, reply, _ in outs:
        reduced.update(reply)
    return [o[0] for o in outs], algo.aggregate(server, reduced, round_)


# a 2-client, 3-sample, 2-feature problem with a coupled Σ and σ' > 1
X = {0: [[1.0, 2.0], [-1.0, 0.5], [0.5, -1.5]], 1: [[2.0, -1.0], [0.0, 1.0], [-1.5, -0.5]]}
Y = {0: [1, 0, 1], 1: [0, 1, 1]}
W0 = [[0.3, -0.2], [-0.1, 0.4]]
B0 = [[0.05, 0.1], [-0.2, 0.02]]
SIGMA = [[0.6, 0.2], [0.2, 0.4]]
RHO, LAM = 1.5, 0.5
ALPHA = {0: [0.3, -0.5, 0.0], 1: [-1.0, 0.2, 0.7]}  # y·α in [0, 1] (y = ±1)


def server():
    t = lambda v: torch.tensor(v, dtype=F64)  # noqa: E731
    return MochaServer(torch.tensor([0, 1]), t(B0), t(W0), t(SIGMA), RHO, 0)


def test_one_hinge_sdca_step_and_the_server_update_match_the_closed_form():
    algo = make(lam=LAM, sdca_frac=0.34)  # ⌊3 · 0.34⌋ = 1 coordinate step per client
    states, new = one_round(
        algo,
        server(),
        [MochaState(torch.tensor(ALPHA[c], dtype=F64)) for c in (0, 1)],
        [data(c, X[c], Y[c]) for c in (0, 1)],
    )
    n = 3
    delta_b = []
    for c in (0, 1):
        (i,) = first_coords(c, n, 1)
        x, y, a = X[c][i], 2 * Y[c][i] - 1, ALPHA[c][i]
        margin = y * (x[0] * W0[c][0] + x[1] * W0[c][1])
        q = RHO * SIGMA[c][c] * (x[0] ** 2 + x[1] ** 2) / (LAM * n)
        a_new = y * min(1.0, max(0.0, y * a + (1 - margin) / q))  # fmtl's run_mocha.m
        want = list(ALPHA[c])
        want[i] = a_new
        assert torch.allclose(states[c].alpha, torch.tensor(want, dtype=F64), atol=1e-12), c
        delta_b.append([(a_new - a) * x[0] / n, (a_new - a) * x[1] / n])
    assert any(abs(v) > 1e-3 for row in delta_b for v in row)
    for t in (0, 1):  # w_t += (1/λ) Σ_s Σ_ts Δb_s;  b_t += Δb_t
        for j in (0, 1):
            w = W0[t][j] + sum(SIGMA[t][s] * delta_b[s][j] for s in (0, 1)) / LAM
            assert abs(float(new.w[t, j]) - w) < 1e-12
            assert abs(float(new.b[t, j]) - (B0[t][j] + delta_b[t][j])) < 1e-12
    assert torch.equal(new.sigma, server().sigma) and new.rho == RHO  # no Ω update in round 1


def test_two_squared_loss_steps_carry_sigma_prime_times_the_local_update():
    # regression: the second step sees u = w_t + σ' Δw_t, Δw_t = Σ_tt Δα x / (λ n)
    algo = make("regression", outputs=1, lam=LAM, sdca_frac=0.67)  # ⌊3 · 0.67⌋ = 2 steps
    ys = [0.5, -1.0, 2.0]
    (state,), new = one_round(algo, server(), [None], [data(0, X[0], ys, regression=True)])
    n, s00 = 3, SIGMA[0][0]
    u, alpha = list(W0[0]), [0.0, 0.0, 0.0]
    for i in first_coords(0, n, 2):
        x = X[0][i]
        q = RHO * s00 * (x[0] ** 2 + x[1] ** 2) / (LAM * n)
        d = (ys[i] - alpha[i] - (x[0] * u[0] + x[1] * u[1])) / (1 + q)  # argmax of the coordinate's quadratic
        alpha[i] += d
        u = [u[j] + RHO * s00 * d * x[j] / (LAM * n) for j in (0, 1)]
    assert torch.allclose(state.alpha, torch.tensor(alpha, dtype=F64), atol=1e-12)
    db = [sum(alpha[i] * X[0][i][j] for i in range(3)) / n for j in (0, 1)]
    for t in (0, 1):
        for j in (0, 1):
            assert abs(float(new.w[t, j]) - (W0[t][j] + SIGMA[t][0] * db[j] / LAM)) < 1e-12


def test_bias_feature_and_evaluation_logits():
    # bias: true appends a constant 1; a hinge client's logits are (−s/2, s/2) of its margin s
    algo = make(bias=True, lam=LAM)
    w = torch.tensor([[1.0, -2.0, 0.5]], dtype=F64)
    srv = MochaServer(torch.tensor([0]), w * 0, w, torch.eye(1, dtype=F64), 1.0, 0)
    msg = algo.message(srv, 0)
    d = data(0, [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [1, 0, 1])
    got = algo.evaluate(None, Received(None, msg.groups[0]), d, ctx(0))
    s = torch.tensor([1.5, -1.5, -0.5], dtype=F64)
    want = TASKS["classification"].scores(torch.stack([-s / 2, s / 2], -1), d.test_y)
    assert got["accuracy"] == pytest.approx(2 / 3)
    assert got["test_loss"] == pytest.approx(want["test_loss"]) and got["ece"] == pytest.approx(want["ece"])
    assert not any(k.startswith("global_") for k in got)


# -- the Ω update ------------------------------------------------------------------------------
def test_omega_update_is_the_normalized_matrix_square_root_of_wtw():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 4))  # 3 tasks, 4 features: WᵀW (3 x 3) has full rank
    b = rng.normal(size=(3, 4))
    srv = MochaServer(
        torch.tensor([0, 1, 2]), torch.from_numpy(b), torch.from_numpy(w), torch.eye(3, dtype=F64) / 3, 1.0, 0
    )
    algo = make(features=4, lam=0.2, omega_every=5)
    assert algo.aggregate(srv, None, 3).omega_updates == 0  # only after rounds 5, 10, ...
    new = algo.aggregate(srv, None, 4)
    sq = scipy.linalg.sqrtm(w @ w.T).real
    sigma = sq / np.trace(sq)
    rho = max(np.abs(sigma[t]).sum() / sigma[t, t] for t in range(3))
    assert np.allclose(new.sigma.numpy(), sigma, atol=1e-12)
    assert new.rho == pytest.approx(rho, rel=1e-12) and new.omega_updates == 1
    assert np.allclose(new.w.numpy(), sigma @ b / 0.2, atol=1e-10)  # dual map: W = W(α) = Σ B / λ
    fm = make(features=4, lam=0.2, omega_every=5, w_map="fmtl").aggregate(srv, None, 4)
    assert torch.equal(fm.w, srv.w) and np.allclose(fm.sigma.numpy(), sigma, atol=1e-12)  # fmtl: W kept


def test_sqrt_psd_raises_small_eigenvalues_when_one_is_negative_as_fmtl():
    v, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))
    a = v @ np.diag([-1e-9, 0.5, 2.0]) @ v.T
    want = scipy.linalg.sqrtm(v @ np.diag([1e-7, 0.5, 2.0]) @ v.T).real
    assert np.allclose(sqrt_psd(a), want, atol=1e-12)
    ok = v @ np.diag([1e-9, 0.5, 2.0]) @ v.T  # all >= 0: taken as it is
    assert np.allclose(sqrt_psd(ok), scipy.linalg.sqrtm(ok).real, atol=1e-9)


# -- objectives over rounds ---------------------------------------------------------------------
def primal_dual(srv, xs, ys, alphas, lam, hinge):
    """P(W; Σ) = Σ_t mean ℓ + (λ/2) tr(W Ω Wᵀ) and D(α) = Σ_t mean(−ℓ*(−α)) − tr(Bᵀ Σ B)/(2λ)."""
    w, b, sigma = srv.w.numpy(), srv.b.numpy(), srv.sigma.numpy()
    p = d = 0.0
    for t, (x, y, a) in enumerate(zip(xs, ys, alphas)):
        z = x @ w[t]
        p += np.maximum(0, 1 - y * z).mean() if hinge else (0.5 * (z - y) ** 2).mean()
        d += (y * a).mean() if hinge else (y * a - 0.5 * a * a).mean()
    p += lam / 2 * np.trace(w.T @ np.linalg.inv(sigma) @ w)
    d -= np.trace(b.T @ sigma @ b) / (2 * lam)
    return p, d


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_dual_ascends_and_the_duality_gap_closes_over_rounds(task):
    hinge = task == "classification"
    rng = np.random.default_rng(3)
    theta = rng.normal(size=(2, 3))
    datas, xs, ys = [], [], []
    for c in range(4):  # 4 clients from two related tasks, 3 features, 20 samples each
        x = rng.normal(size=(20, 3))
        z = x @ theta[c % 2] + 0.3 * rng.normal(size=20)
        y = (z > 0).astype(np.int64) if hinge else z
        datas.append(data(c, x.tolist(), y.tolist(), regression=not hinge))
        xs.append(x.astype(np.float32).astype(np.float64))
        ys.append(2.0 * y - 1 if hinge else y.astype(np.float32).astype(np.float64))
    lam, every = 0.05, 12
    algo = make(task, features=3, outputs=2 if hinge else 1, lam=lam, sdca_frac=1.0, omega_every=every)
    srv = algo.absorb_stats(algo.init_server(None), {c: 20.0 for c in range(4)}, 0)
    states = [None] * 4
    p, d = primal_dual(srv, xs, ys, [np.zeros(20)] * 4, lam, hinge)  # W = 0, α = 0
    gaps, duals, starts = [p - d], [d], [0]
    for r in range(3 * every):
        states, srv = one_round(algo, srv, states, datas, r)
        alphas = [s.alpha.numpy() for s in states]
        p, d = primal_dual(srv, xs, ys, alphas, lam, hinge)
        assert p >= d - 1e-9, (r, p, d)  # weak duality: W is W(α)
        assert np.allclose(srv.w.numpy(), srv.sigma.numpy() @ srv.b.numpy() / lam)
        if (r + 1) % every:  # the same Σ as before the round
            assert d >= duals[-1] - 1e-12, (r, d, duals[-1])  # the safe σ' makes it an ascent
        else:
            starts.append(len(gaps))  # Ω updated after this round
        gaps.append(p - d)
        duals.append(d)
    assert srv.omega_updates == 3 and srv.rho > 1.0  # Σ coupled the tasks
    assert not np.allclose(srv.sigma.numpy(), np.diag(np.diag(srv.sigma.numpy())))
    for a, b in zip(starts, starts[1:]):  # within each Σ period the gap shrinks 5-fold or more
        assert gaps[b - 1] < gaps[a] / 5, (a, b, gaps)
    assert gaps[starts[-1] - 1] < gaps[0] / 1000, gaps


# -- persistent client state and the engine ----------------------------------------------------
MOCHA = "algorithm: {name: mocha, lam: 0.03, omega_every: 2}"


def scenario(tmp_path, *overrides):
    text = TINY.replace("algorithm: {name: fedavg, lr: 0.1, batch_size: 16}", MOCHA)
    return config.load(write_scenario(tmp_path, text), list(overrides))


def strip(history):
    return [{k: v for k, v in h.items() if "seconds" not in k and "bytes" not in k} for h in history]


def test_duals_persist_on_hosts_and_survive_a_checkpoint_on_another_host_count(tmp_path):
    sc = scenario(tmp_path, "rounds=4")
    full = serial_driver(sc, 2)
    for _ in range(4):
        full.step()
    states = full.transport.get_states()
    srv = full.server_state
    assert srv.omega_updates == 2 and len(srv.ids) == 12
    for k, c in enumerate(srv.ids.tolist()):  # B = [X_tᵀ α_t / n_t] from the duals the hosts keep
        if c in states:
            d = full.source.client(c)
            x = torch.cat([d.train_x.double(), torch.ones(d.num_train, 1, dtype=F64)], 1)
            assert torch.allclose(srv.b[k], x.T @ states[c]["state"]["alpha"] / d.num_train, atol=1e-12)
    part = serial_driver(sc, 2)
    for _ in range(2):
        part.step()
    part.save(str(tmp_path / "ck"))
    resumed = serial_driver(sc, 3)
    assert resumed.restore(str(tmp_path / "ck")) == 2
    for _ in range(2):
        resumed.step()
    assert strip(resumed.history) == strip(full.history)
    for f in ("b", "w", "sigma"):
        assert torch.equal(getattr(resumed.server_state, f), getattr(srv, f))


def test_a_model_other_than_linear_more_than_two_classes_and_unseen_clients_are_refused_at_validation(tmp_path, capsys):
    from raysim import cli

    with pytest.raises(ValueError, match="binary classification only"):
        make(outputs=3)
    path = write_scenario(tmp_path, TINY.replace("algorithm: {name: fedavg, lr: 0.1, batch_size: 16}", MOCHA))
    for override, line in [
        (
            "model.name=mlp",
            "algorithm.name: mocha trains linear models only; use model: {name: linear} "
            "(got a Sequential with 3 linear layers)",
        ),
        (
            "eval.unseen_fraction=0.2",
            "eval.unseen_fraction: mocha has no model for a client that never trained; use 0 (its default)",
        ),
        ("algorithm.w_map=both", "algorithm.w_map: 'both' is not allowed; choose one of dual, fmtl"),
    ]:
        assert cli.main(["validate", path, "--set", override]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [f"raysim: {path}: {line}"]


SYNTHETIC = """
name: synthetic-small
seed: 0
rounds: 40
data: {{dataset: synthetic, clients: 30, dim: 30, max_samples: 100, splits: {{train: 0.8, test: 0.2}}}}
model: {{name: linear}}
algorithm: {algorithm}
sampling: {{fraction: 1.0}}
eval: {{every: 40}}
resources: {{hosts: 2, cpus_per_host: 0.5}}
"""


def final_accuracy(tmp_path, algorithm, name):
    d = serial_driver(config.load(write_scenario(tmp_path, SYNTHETIC.format(algorithm=algorithm), name)), 2)
    for _ in range(40):
        d.step()
    assert not any(k.startswith("global_") for k in d.history[-1])
    return d.history[-1]["accuracy"]


def test_mocha_learns_fedem_synthetic_data_above_local(tmp_path):
    # 30 clients of FedEM's synthetic data (dim 30, 3 components), 40 rounds. Measured (seeds
    # 0/1/2): MOCHA 0.757/0.773/0.715; Local (SGD lr 0.1, batch 32) 0.690/0.717/0.650, and no
    # better with 5 local epochs (0.686/0.713/0.666)
    acc = final_accuracy(tmp_path, "{name: mocha, lam: 0.03, omega_every: 10}", "m.yaml")
    local = final_accuracy(tmp_path, "{name: local, lr: 0.1, batch_size: 32}", "l.yaml")
    assert acc > 0.7, acc  # binary: chance is about 0.5
    assert acc > local + 0.03, (acc, local)
