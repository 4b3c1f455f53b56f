"""SosicFL: the preparation (LDA, clustering, subregions), the subregion sampler, the simplex
step (eq. 8), the n-fold and per-client Dirichlet splits, the total variance, and end to end on
real digits."""

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score
from torch import nn

from raysim.algorithms import simplex
from raysim.algorithms.base import UpdateStats
from raysim.algorithms.sosicfl import SosicFL, SosicFLHyper
from raysim.core.data import ClientData, Context
from raysim.core.tasks import TASKS
from raysim.data import partition as P
from raysim.engine.serial import serial_driver
from raysim.models import SimpleCNNParams, simplecnn
from raysim.scenario import config


def fold_counts(folds: int, seed: int, clients: int = 100, per_class: int = 7000):
    """Training label counts (a random 80 % of each client) of an n-fold split of a balanced
    10-class pool the size of Fashion-MNIST (700 samples a client)."""
    y = np.repeat(np.arange(10), per_class)
    rng = np.random.default_rng(seed)
    parts = P.nfold(y, clients, P.NFoldParams(folds=folds), rng)
    counts = np.array([np.bincount(y[rng.permutation(p)[: int(0.8 * len(p))]], minlength=10) for p in parts])
    return counts, parts.groups


# -- preparation -------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(10))
def test_preparation_recovers_the_five_fold_groups_exactly(seed):
    counts, groups = fold_counts(5, seed)
    alpha = simplex.lda_alphas(counts, 5, restarts=5, seed=seed)  # M = 4
    assert alpha.shape == (100, 5)
    assert (alpha >= 0).all() and np.allclose(alpha.sum(1), 1.0)  # rows on the simplex
    for distance in ("l1", "hilbert"):
        z, centres = simplex.cluster(alpha, 5, distance, rng=np.random.default_rng(seed))
        assert adjusted_rand_score(groups, z) == 1.0
        assert np.allclose(centres.sum(1), 1.0) and (centres >= 0).all()


def test_preparation_recovers_a_two_fold_split_on_a_segment():
    counts, groups = fold_counts(2, 3)
    alpha = simplex.lda_alphas(counts, 2, restarts=5, seed=3)  # M = 1
    z, _ = simplex.cluster(alpha, 2, rng=np.random.default_rng(3))
    assert adjusted_rand_score(groups, z) == 1.0


def test_hilbert_distance_by_hand():
    p, q = np.array([[0.5, 0.25, 0.25]]), np.array([[0.25, 0.5, 0.25]])
    # log ratios: log 2, -log 2, 0 -> max - min = 2 log 2
    assert simplex.distances(p, q, "hilbert")[0, 0] == pytest.approx(2 * math.log(2))
    assert simplex.distances(p, q, "l1")[0, 0] == pytest.approx(0.5)


def _grid_mean_l1(mu: np.ndarray, n: int) -> float:
    """The paper's grid integration: the mean of ‖α − μ‖₁ over a fine regular grid of Δ^M
    (cell centres of the barycentric subdivision, M = 1 or 2)."""
    if len(mu) == 2:
        a = (np.arange(n) + 0.5) / n
        pts = np.stack([a, 1 - a], 1)
    else:
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        keep = i + j < n
        # centroids of the upward triangles and of the downward ones (equal areas)
        up = np.stack([i[keep] + 1 / 3, j[keep] + 1 / 3], 1) / n
        keep2 = i + j < n - 1
        down = np.stack([i[keep2] + 2 / 3, j[keep2] + 2 / 3], 1) / n
        xy = np.concatenate([up, down])
        pts = np.concatenate([xy, 1 - xy.sum(1, keepdims=True)], 1)
    return float(np.abs(pts - mu).sum(1).mean())


@pytest.mark.parametrize(
    "mu", [[0.5, 0.5], [1.0, 0.0], [0.3, 0.7], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0], [0.6, 0.3, 0.1]]
)
def test_mean_l1_distance_closed_form_equals_grid_integration(mu):
    mu = np.array(mu)
    closed = float(simplex.mean_l1_to_uniform(mu))
    assert closed == pytest.approx(_grid_mean_l1(mu, 400), abs=2e-4)
    # the hand values: vertex 2M/(M+1), centroid 2(M/(M+1))^(M+1)
    m = len(mu) - 1
    if mu.max() == 1.0:
        assert closed == pytest.approx(2 * m / (m + 1))
    if np.allclose(mu, 1 / len(mu)):
        assert closed == pytest.approx(2 * (m / (m + 1)) ** (m + 1))


# -- the subregion sampler ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "mu,rho",
    [
        ([0.6, 0.2, 0.1, 0.1], 0.4),
        ([0.96, 0.01, 0.01, 0.01, 0.01], 0.4),
        ([0.2] * 5, 0.6),
        ([0.05, 0.05, 0.9], 0.1),
        ([0.7, 0.3], 0.6),
    ],
)
def test_subregion_samples_are_uniform_on_the_ball_within_the_simplex(mu, rho):
    mu = torch.tensor(mu, dtype=torch.float64)
    dim = len(mu)
    eta = rho * float(simplex.mean_l1_to_uniform(mu.numpy()))
    g = torch.Generator().manual_seed(0)
    a = simplex.sample_ball(g, mu, eta, 20000)
    assert a.shape == (20000, dim)
    assert (a >= 0).all() and torch.allclose(a.sum(1), torch.ones(20000, dtype=torch.float64))
    dist = (a - mu).abs().sum(1)
    assert (dist <= eta + 1e-9).all()
    # brute force: uniform points of the whole simplex, those inside the ball
    ref = simplex.uniform(torch.Generator().manual_seed(1), 4_000_000, dim)
    rd = (ref - mu).abs().sum(1)
    rd = rd[rd <= eta]
    assert len(rd) > 2000
    se = math.sqrt(dist.var() / len(dist) + rd.var() / len(rd))
    assert abs(float(dist.mean() - rd.mean())) < 4 * se
    # and the coordinates' means agree (uniformity, not only the radius)
    inside = ref[(ref - mu).abs().sum(1) <= eta]
    se_c = torch.sqrt(a.var(0) / len(a) + inside.var(0) / len(inside))
    assert ((a.mean(0) - inside.mean(0)).abs() < 4 * se_c + 1e-12).all()


def test_floco_code_sampler_is_the_official_formula():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    mu = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    a = simplex.sample_ball_floco(g1, mu, 0.1, 4)
    u = 2 * torch.rand(4, 3, generator=g2, dtype=torch.float64) - 1
    r = 0.1 * torch.rand(4, 1, generator=g2, dtype=torch.float64)
    assert torch.allclose(a, mu + r * u / u.abs().sum(1, keepdim=True))


# -- the simplex step ---------------------------------------------------------------------------
def _tiny_sosicfl(dim=2, **kw):
    torch.manual_seed(0)

    def model_fn(variant=0):
        torch.manual_seed(100 + variant)
        return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))

    hp = SosicFLHyper(lr=0.1, local_epochs=1, batch_size=8, momentum=0.0, weight_decay=0.0, dim=dim, **kw)
    return SosicFL(hp, model_fn, 10, TASKS["classification"]), model_fn


def test_one_sgd_step_through_w_alpha_moves_each_endpoint_by_alpha_m_times_the_gradient():
    algo, model_fn = _tiny_sosicfl(dim=2)
    server = algo.init_server(np.random.default_rng(0))
    flat = server.params
    # shared: layer 0 weight and bias, layer 2 bias; then 3 endpoints of layer 2's weight
    assert [tuple(p.shape) for p in flat] == [(3, 4), (3,), (2,), (2, 3), (2, 3), (2, 3)]
    assert not torch.equal(flat[3], flat[4])  # independent initializations
    x, y = torch.randn(8, 4), torch.tensor([0, 1] * 4)
    data = ClientData(0, x, y, x[:0], y[:0], x[:0], y[:0])
    alpha = torch.tensor([0.5, 0.3, 0.2])
    ctx = Context(0, 10, 0, torch.Generator().manual_seed(0))
    job = algo.job(flat, data, ctx, draws=lambda g, steps: alpha.expand(steps, 3).clone())
    (fit,) = algo.trainer(torch.device("cpu")).fit([job])
    # by hand: the model at w_α, its gradient, θ_m − γ α_m ∇_w F and p − γ ∇_p F
    w = [t.clone().requires_grad_(True) for t in algo.compose(flat, alpha.double())]
    model = model_fn()
    out = torch.func.functional_call(model, {n: t for (n, _), t in zip(model.named_parameters(), w)}, (x,))
    grads = torch.autograd.grad(nn.functional.cross_entropy(out, y), w)
    assert torch.allclose(fit.params[0], flat[0] - 0.1 * grads[0], atol=1e-6)
    assert torch.allclose(fit.params[2], flat[2] - 0.1 * grads[3], atol=1e-6)
    for m in range(3):
        assert torch.allclose(fit.params[3 + m], flat[3 + m] - 0.1 * alpha[m] * grads[2], atol=1e-6)


def test_endpoints_only_personal_step_keeps_the_feature_extractor_and_pulls_each_endpoint_to_the_global_one():
    from raysim.algorithms.sosicfl import SosicFLPlus, SosicFLPlusHyper

    _, model_fn = _tiny_sosicfl(dim=2)
    hp = SosicFLPlusHyper(
        lr=0.1,
        local_epochs=1,
        batch_size=8,
        momentum=0.0,
        weight_decay=0.0,
        dim=2,
        lam=0.5,
        personal_pool=0,
        personal="endpoints",
    )
    algo = SosicFLPlus(hp, model_fn, 10, TASKS["classification"])
    glob = algo.init_server(np.random.default_rng(0)).params
    mine = list(glob[:3]) + [t + 0.1 for t in glob[3:]]  # a personal copy: endpoints off by 0.1
    x, y = torch.randn(8, 4), torch.tensor([0, 1] * 4)
    data = ClientData(0, x, y, x[:0], y[:0], x[:0], y[:0])
    alpha = torch.tensor([0.5, 0.3, 0.2])
    ctx = Context(0, 10, 0, torch.Generator().manual_seed(0))
    job = algo.job(
        mine,
        data,
        ctx,
        objective=algo.personal_objective(),
        consts={"anchor": glob, "mu": 0.5},
        draws=lambda g, steps: alpha.expand(steps, 3).clone(),
    )
    (fit,) = algo.trainer(torch.device("cpu")).fit([job])
    for i in range(3):  # the feature extractor and bias: untouched
        assert torch.equal(fit.params[i], glob[i])
    w = [t.clone().requires_grad_(True) for t in algo.compose(mine, alpha.double())]
    model = model_fn()
    out = torch.func.functional_call(model, {n: t for (n, _), t in zip(model.named_parameters(), w)}, (x,))
    grads = torch.autograd.grad(nn.functional.cross_entropy(out, y), w)
    for m in range(3):  # θ_m − γ (α_m ∇_w F + λ (θ_m − θ̂_m)), with θ_m − θ̂_m = 0.1
        assert torch.allclose(fit.params[3 + m], mine[3 + m] - 0.1 * (alpha[m] * grads[2] + 0.5 * 0.1), atol=1e-6)
    assert len(algo.kept(fit.params).params) == 3  # the state holds the endpoints only
    assert algo.personal_params(algo.kept(fit.params), glob)[:3] == list(glob[:3])


def test_sosicfl_all_mixes_every_parameter_with_one_alpha():
    algo, _ = _tiny_sosicfl(dim=1, layers="all")
    flat = algo.init_server(np.random.default_rng(0)).params
    assert len(flat) == 2 * 4
    w = algo.compose(flat, torch.tensor([0.25, 0.75], dtype=torch.float64))
    for i in range(4):
        assert torch.allclose(w[i], 0.25 * flat[2 * i] + 0.75 * flat[2 * i + 1])


def test_draws_come_from_the_clients_subregion_fresh_per_batch_or_from_a_pool():
    algo, _ = _tiny_sosicfl(dim=2)
    part = torch.tensor([0.8, 0.1, 0.1, 0.3, 0.8, 0.1, 0.1], dtype=torch.float64)  # μ, η, local point
    a = algo._draws(part, 0)(torch.Generator().manual_seed(0), 50)
    assert a.shape == (50, 3) and len(torch.unique(a, dim=0)) == 50
    assert ((a.double() - part[:3]).abs().sum(1) <= 0.3 + 1e-6).all()
    pooled = SosicFL(SosicFLHyper(dim=2, alpha_pool=4), algo.model_fn, 10, algo.task)._draws(part, 4)(
        torch.Generator().manual_seed(0), 10
    )
    assert torch.equal(pooled[:4], pooled[4:8]) and torch.equal(pooled[:2], pooled[8:])
    assert len(torch.unique(pooled[:4], dim=0)) == 4
    before = algo._draws(None, 0)(torch.Generator().manual_seed(0), 2000)  # before t̃: all of Δ
    assert torch.allclose(before.sum(1), torch.ones(2000)) and before.min() >= 0
    assert before.double().mean(0).sub(1 / 3).abs().max() < 0.02


def test_total_variance_by_hand():
    deltas = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), torch.tensor([2.0, 2.0])]
    s = UpdateStats.of(deltas[0])
    for d in deltas[1:]:
        t = UpdateStats.of(d)
        s = UpdateStats(s.total + t.total, s.squares + t.squares, s.count + t.count)
    # mean (1, 1): ‖(0,−1)‖² + ‖(−1,0)‖² + ‖(1,1)‖² = 1 + 1 + 2
    assert s.variance() == pytest.approx(4.0)


def test_total_variance_is_the_same_for_any_grouping_of_the_clients_over_hosts():
    """The server sums hosts' partial sums of the clients' UpdateStats (float64 sums of float32
    values): 1 host of 9 clients or hosts of 2, 3 and 4 give the same variance to the last bit."""
    from raysim.core.replies import Accumulator

    def total(stats, groups):
        server = Accumulator()
        for group in groups:
            host = Accumulator()
            for k in group:
                host.add(stats[k])
            server.merge(host)
        return server.result().variance()

    # with ‖Δ_k‖² kept as float64 numbers, their sums differed in the last bit for seed 4
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        stats = [UpdateStats.of(torch.randn(50, generator=g) * 10.0 ** float(k % 4 - 2)) for k in range(9)]
        one = total(stats, [range(9)])
        assert one > 0 and total(stats, [range(0, 2), range(2, 5), range(5, 9)]) == one
        assert total(stats, [[k] for k in range(9)]) == one


def test_literal_server_weights_scale_the_step_by_the_participants_share():
    algo, _ = _tiny_sosicfl(dim=1, server_weights="all")
    server = algo.init_server(np.random.default_rng(0))
    server.counts = torch.tensor([[30, 10], [40, 20]])  # N = 100
    from raysim.algorithms.base import Weighted
    from raysim.algorithms.sosicfl import SimplexReply

    target = [p + 1.0 for p in server.params]
    reply = SimplexReply(Weighted([t.double() * 40 for t in target], 40.0), [], UpdateStats.of(torch.zeros(1)))
    new = algo.aggregate(server, reply, 0)
    # θ + (40 / 100)(mean − θ) = θ + 0.4
    old = algo.init_server(np.random.default_rng(0)).params
    assert all(torch.allclose(n, o + 0.4) for n, o in zip(new.params, old))


# -- data and model ------------------------------------------------------------------------------
def test_nfold_split_by_hand():
    y = np.repeat(np.arange(10), 100)
    parts = P.nfold(y, 10, P.NFoldParams(folds=5, size=50), np.random.default_rng(0))
    assert parts.groups.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    counts = np.array([np.bincount(y[p], minlength=10) for p in parts])
    # 80 % of 50 = 40 over the 2 primary classes, 10 over the 8 others (2 get 2, 6 get 1)
    assert (counts[0, :2] == 20).all() and counts[0, 2:].sum() == 10 and counts[0, 2:].max() == 2
    assert (counts[9, 8:] == 20).all()
    assert len(np.unique(np.concatenate(parts))) == 500  # disjoint
    every = P.nfold(y, 10, P.NFoldParams(folds=5, primary=0.7, spread="all", size=50), np.random.default_rng(0))
    c = np.bincount(y[every[0]], minlength=10)
    assert c[:2].tolist() == [19, 19] and c.sum() == 50  # 35/2 + 15/10 (authors' code)
    whole = P.nfold(y, 10, P.NFoldParams(folds=5), np.random.default_rng(0))
    assert sum(len(p) for p in whole) == 1000  # the largest size uses every sample


def test_client_dirichlet_gives_equal_sizes_and_skew_that_follows_beta():
    y = np.repeat(np.arange(10), 500)
    skew = {}
    for beta in (0.1, 100.0):
        parts = P.client_dirichlet(y, 20, P.ClientDirichletParams(beta=beta, size=200), np.random.default_rng(0))
        assert [len(p) for p in parts] == [200] * 20
        assert len(np.unique(np.concatenate(parts))) == 4000
        skew[beta] = np.mean([np.bincount(y[p], minlength=10).max() / 200 for p in parts])
    assert skew[0.1] > 0.5 > 0.2 > skew[100.0]


def test_simplecnn_has_the_authors_shapes():
    m = simplecnn(SimpleCNNParams(), (3, 32, 32), 10)
    assert [tuple(p.shape) for p in m.parameters()][-4:] == [(128, 576), (128,), (10, 128), (10,)]
    m = simplecnn(SimpleCNNParams(), (1, 28, 28), 10)
    assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert tuple(list(m.parameters())[-4].shape) == (128, 256)


# -- end to end ---------------------------------------------------------------------------------
SCENARIO = """
name: digits-sosicfl
seed: 0
rounds: {rounds}
data:
  dataset: digits
  clients: 20
  partition: {{kind: nfold, folds: 5}}
  splits: {{train: 0.8, test: 0.2}}
model: {{name: mlp, hidden: [32]}}
algorithm: {algorithm}
sampling: {{count: 5}}
eval: {{every: {every}}}
resources: {{hosts: 2, cpus_per_host: 0.5}}
"""
SGD = "lr: 0.05, batch_size: 10, local_epochs: 2, momentum: 0.5"


def write(tmp_path, algorithm, rounds=30, every=10, name="s.yaml"):
    path = tmp_path / name
    path.write_text(SCENARIO.format(rounds=rounds, every=every, algorithm=algorithm))
    return path


def run_serial(path, hosts=None):
    driver = serial_driver(config.load(path), hosts)
    for _ in range(driver.sc.rounds):
        driver.step()
    return driver


def test_sosicfl_end_to_end_on_digits_clusters_the_folds_and_learns(tmp_path):
    d = run_serial(write(tmp_path, f"{{name: sosicfl, {SGD}, dim: 4, clusters: 5}}"))
    last = d.history[-1]
    assert last["cluster_ari"] == 1.0
    assert last["accuracy"] > 0.6 and last["global_accuracy"] > 0.6  # chance: 0.1
    assert all(h["total_variance"] > 0 for h in d.history)
    rep = d.report()["simplex"]
    assert len(rep["alpha"]) == 20 and len(rep["centres"]) == 5 and rep["eta"] > 0
    # late start at round 11: no clusters before, the same preparation after
    late = run_serial(
        write(tmp_path, f"{{name: sosicfl, {SGD}, dim: 4, clusters: 5, start_round: 11}}", rounds=20, name="late.yaml")
    )
    assert "cluster_ari" not in late.history[9] and late.history[19]["cluster_ari"] == 1.0
    assert late.history[9]["accuracy"] == late.history[9]["global_accuracy"]  # at the centroid before t̃


def test_sosicfl_plus_personal_copies_and_subregion_mean(tmp_path):
    d = run_serial(
        write(tmp_path, f"{{name: sosicfl+, {SGD}, dim: 4, clusters: 5, local_at: subregion_mean}}", rounds=20)
    )
    states = d.transport.get_states()
    assert len(states) == 20 and all(s is not None for s in states.values())  # all sampled by round 20
    assert all(len(s["state"]["params"]) == 5 for s in states.values())  # personal: endpoints (M + 1)
    assert d.history[-1]["accuracy"] > 0.6
    means = d.server_state.means
    assert torch.allclose(means.sum(1), torch.ones(5, dtype=torch.float64))
    assert ((means - d.server_state.centres).abs().sum(1) > 0.05).all()  # corner centres: the mean is inside


@pytest.mark.ray
def test_sosicfl_plus_on_three_ray_hosts_equals_the_serial_run(tmp_path):
    from tests.test_runs import summary_of

    path = write(tmp_path, f"{{name: sosicfl+, {SGD}, dim: 2, clusters: 5, rho: 0.6}}", rounds=6, every=3)
    path.write_text(
        path.read_text().replace("hosts: 2,", "hosts: 3,") + f"tracking: {{uri: 'sqlite:///{tmp_path}/m.db'}}\n"
        f"checkpoint: {{dir: '{tmp_path}/ck'}}\n"
    )
    ray_run = summary_of(tmp_path, str(path), name="ray.json")
    serial = summary_of(tmp_path, str(path), "--engine", "serial", name="serial.json")
    assert ray_run["final"] == serial["final"] and "simplex" in serial["final"]
    assert [h["total_variance"] for h in ray_run["history"]] == [h["total_variance"] for h in serial["history"]]


# -- Floco -----------------------------------------------------------------------------------------
def test_simplex_projection_and_riesz_energy_by_hand():
    p = simplex.project_simplex(np.array([[0.5, 0.5, 0.5], [2.0, 0.0, 0.0], [0.6, 0.5, -1.0]]))
    assert np.allclose(p, [[1 / 3] * 3, [1, 0, 0], [0.55, 0.45, 0.0]])
    assert np.allclose(simplex.project_simplex(np.array([[1.0, 1.0]]), 0.5), [[0.25, 0.25]])
    # two points at distance 1: mean 1/1² -> log 1 = 0; three vertices of Δ², pairwise √2: log(1/2)
    assert simplex.riesz_energy(np.array([[0.0, 0.0], [1.0, 0.0]])) == pytest.approx(0.0)
    assert simplex.riesz_energy(np.eye(3)) == pytest.approx(math.log(0.5))


def test_floco_places_clients_with_alike_classifiers_together():
    from raysim.algorithms.floco import place_on_simplex

    rng = np.random.default_rng(0)
    # 4 groups of 10 clients; weights of a classifier's scale (the z scan, as the official
    # code's, spreads PCA coordinates of magnitude up to about 1)
    centres = rng.normal(size=(4, 60)) * 0.05
    weights = np.concatenate([c + rng.normal(size=(10, 60)) * 0.005 for c in centres])
    beta = place_on_simplex(weights, 4)
    assert beta.shape == (40, 4) and np.allclose(beta.sum(1), 1) and (beta >= 0).all()
    d = np.abs(beta[:, None] - beta[None]).sum(-1)
    same = np.kron(np.eye(4), np.ones((10, 10))).astype(bool)
    assert d[same].max() < d[~same].min()


def test_floco_end_to_end_switches_at_tau_to_each_clients_own_point(tmp_path):
    algo = "{name: floco, " + SGD + ", endpoints: 5, tau: 6, rho: 0.2}"
    d = run_serial(write(tmp_path, algo, rounds=10, every=5))
    srv = d.server_state
    assert srv.prepared and srv.alpha.shape == (20, 5) and srv.eta == 0.2
    assert torch.allclose(srv.alpha.sum(1), torch.ones(20, dtype=torch.float64))
    # before τ every client is scored at the centroid; after it at its own β
    assert d.history[4]["accuracy"] == d.history[4]["global_accuracy"]
    assert d.history[9]["accuracy"] != d.history[9]["global_accuracy"]
    assert d.history[9]["accuracy"] > 0.3  # chance: 0.1
    draws = d.algo._draws(d.algo.message(srv, 10).groups[3], 0)(torch.Generator().manual_seed(0), 500)
    assert ((draws.double() - srv.alpha[3]).abs().sum(1) <= 0.2 + 1e-6).all()


def test_unseen_clients_are_scored_at_the_centroid_and_left_out_of_the_clusters(tmp_path):
    path = write(tmp_path, f"{{name: sosicfl, {SGD}, dim: 4, clusters: 5}}", rounds=4, every=4)
    path.write_text(path.read_text().replace("eval: {every: 4}", "eval: {every: 4, unseen_fraction: 0.25}"))
    d = run_serial(path)
    unseen = [int(c) for c in d.unseen_ids]
    assert len(unseen) == 5 and all(c not in d.server_state.ids.tolist() for c in unseen)
    assert d.algo.eval_groups(d.server_state, np.array(unseen)) == {c: -1 for c in unseen}
    last = d.history[-1]
    assert last["unseen_accuracy"] == last["unseen_global_accuracy"]  # the centroid
    assert set(d.report()["importance"]) == set(int(c) for c in d.train_ids)


@pytest.mark.parametrize("layers", ["head", "all"])
def test_compose_grad_is_the_adjoint_of_compose(layers):
    """⟨compose(flat, α), g⟩'s gradient in flat, by autograd, is ``compose_grad(flat, α, g)``:
    the shared parameters take g, endpoint m α_m·g (stacked sets, one α each)."""
    algo, _ = _tiny_sosicfl(dim=2, layers=layers)
    flat = [torch.stack([p, p + 1]) for p in algo.init_server(np.random.default_rng(0)).params]
    alpha = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    leaves = [p.clone().requires_grad_() for p in flat]
    point = algo.compose(leaves, alpha)
    g = [torch.randn_like(q) for q in point]
    want = torch.autograd.grad(sum((q * gi).sum() for q, gi in zip(point, g)), leaves)
    got = algo.compose_grad(flat, alpha, g)
    assert len(got) == len(want) and all(torch.allclose(a, b) for a, b in zip(got, want))
