"""FedSoft and mixture-of-sources data: hand-checked pieces on tiny inputs, then the paper's
synthetic task end to end (a small version of scenarios/fedsoft_synthetic.yaml)."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.base import Received
from raysim.algorithms.fedsoft import (
    FedSoftServer,
    FedSoftState,
    aggregation_weights,
    importance_weights,
    select_per_cluster,
)
from raysim.core.data import ClientData
from raysim.core.replies import Accumulator
from raysim.data import MixtureParams, PartitionCfg, Splits, build_source
from raysim.data.mixture import RegressionParams, plan
from raysim.data.synthetic import DigitsParams
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from raysim.scenario.config import make_source
from tests.conftest import write_scenario
from tests.test_algorithms import ctx, make, run

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def line(w):
    """A 1-d linear model without intercept, weight w."""
    m = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        m.weight.fill_(w)
    return m


def regression_client(cid, xs, ys):
    x = torch.tensor(xs, dtype=torch.float32).reshape(-1, 1)
    y = torch.tensor(ys, dtype=torch.float32)
    return ClientData(cid, x, y, x[:0], y[:0], x, y)


# -- importance, aggregation weights, selection ----------------------------------------------
def test_importance_counts_each_sample_at_its_center_of_lowest_loss_with_smoothing():
    # 4 samples under 2 centers: samples 0, 1, 3 fit center 1 better, sample 2 ties (lowest index wins)
    losses = torch.tensor([[5.0, 4.0, 1.0, 9.0], [1.0, 2.0, 1.0, 0.0]])
    assert importance_weights(losses, 1e-4).tolist() == [0.25, 0.75]
    # a center that wins no sample gets σ, not 0 (and u is not renormalized)
    assert importance_weights(torch.tensor([[1.0, 1.0], [2.0, 3.0]]), 1e-4).tolist() == [1.0, 1e-4]


def test_client_estimates_per_sample_not_per_client():
    # x = 1 for every sample; center 0 predicts y = 0, center 1 predicts y = 2; labels 0, 0, 2:
    # a client-level argmin would give (1, σ); per sample it is (2/3, 1/3)
    algo = make("fedsoft", task="regression", model_fn=lambda v=0: line(0.0), clusters=2)
    d = regression_client(0, [1.0, 1.0, 1.0], [0.0, 0.0, 2.0])
    centers = [[torch.tensor([[0.0]])], [torch.tensor([[2.0]])]]
    state, reply = algo.client_stats(algo.init_client(0, None), Received(centers), d, ctx(0))
    assert state.u.tolist() == pytest.approx([2 / 3, 1 / 3])
    assert reply[0].tolist() == pytest.approx([2.0, 1.0])  # u·n_k, n_k = 3


def test_aggregation_weights_by_hand():
    # u·n of three clients (n = 100, 50, 10): v_sk = u_ks n_k / Σ_k' u_k's n_k'
    un = torch.tensor([[0.9 * 100, 0.1 * 100], [0.5 * 50, 0.5 * 50], [1e-4 * 10, 10.0]], dtype=torch.float64)
    v = aggregation_weights(un)
    col0 = 90 + 25 + 1e-3
    assert v[:, 0].tolist() == pytest.approx([90 / col0, 25 / col0, 1e-3 / col0])
    assert v[:, 1].tolist() == pytest.approx([10 / 45, 25 / 45, 10 / 45])


def test_selection_draws_k_distinct_per_center_and_a_client_once_with_the_mask_of_its_centers():
    ids = np.arange(10, 20)
    v = np.full((10, 2), 0.1)
    picks = select_per_cluster(ids, v, 4, np.random.default_rng(0))
    for s in range(2):
        assert sum(1 for m in picks.values() if m >> s & 1) == 4  # without replacement
    assert set(picks) <= set(range(10, 20)) and all(1 <= m <= 3 for m in picks.values())
    # probabilities: a client with v = 0 for center 0 is never drawn by it
    v0 = np.full((10, 2), 0.1)
    v0[0, 0] = 0.0
    for seed in range(20):
        assert not select_per_cluster(ids, v0, 9, np.random.default_rng(seed)).get(10, 0) & 1


# -- the local update and the center update ---------------------------------------------------
def test_local_step_is_the_data_gradient_plus_the_u_weighted_proximal_pull():
    # one SGD step (lr .1, the whole batch) from w = 1 on (x=1, y=3): ∇f = 2(w·1 − 3) = −4;
    # prox λ Σ_s u_s (w − c_s) with λ = 2, u = (.25, .5), c = (0, 4): 2(.25·1 + .5·(−3)) = −2.5
    algo = make(
        "fedsoft",
        task="regression",
        model_fn=lambda v=0: line(1.0),
        clusters=2,
        lam=2.0,
        optimizer="sgd",
        local_epochs=1,
        batch_size=1,
    )
    d = regression_client(0, [1.0], [3.0])
    state = FedSoftState([torch.tensor([[1.0]])], torch.tensor([0.25, 0.5], dtype=torch.float64))
    centers = [[torch.tensor([[0.0]])], [torch.tensor([[4.0]])]]
    ((new, reply, loss),) = run(algo, algo.train(state, Received(centers), d, ctx(0, group=0b10)))
    assert float(new.w[0]) == pytest.approx(1.0 - 0.1 * (-4.0 - 2.5))
    assert loss == pytest.approx(4.0)  # data loss (w·1 − 3)² before the step
    assert list(reply) == [1] and reply[1].weight == 1.0  # counted for center 1 only (its mask)


def test_center_is_the_uniform_mean_of_its_selected_clients_models():
    algo = make(
        "fedsoft",
        task="regression",
        model_fn=lambda v=0: line(0.0),
        clusters=2,
        lam=0.0,
        optimizer="sgd",
        local_epochs=1,
        batch_size=1,
    )
    centers = [[torch.tensor([[0.0]])], [torch.tensor([[0.0]])]]
    u = torch.tensor([0.5, 0.5], dtype=torch.float64)
    data = [regression_client(c, [1.0], [y]) for c, y in enumerate((1.0, 2.0, 4.0))]
    masks = (0b01, 0b11, 0b10)  # client 1 selected by both centers: trained once, counted twice
    outs = run(
        algo,
        *(
            algo.train(FedSoftState([torch.tensor([[0.0]])], u), Received(centers), d, ctx(d.cid, group=m))
            for d, m in zip(data, masks)
        ),
    )
    w = [float(s.w[0]) for s, _, _ in outs]
    assert w == pytest.approx([0.2, 0.4, 0.8])  # 0 − .1·2(0 − y)
    acc = Accumulator()
    for _, r, _ in outs:
        acc.add(r)
    server = algo.aggregate(FedSoftServer(centers, torch.arange(3), torch.ones(3, 2)), acc.result(), 0)
    assert float(server.centers[0][0]) == pytest.approx((0.2 + 0.4) / 2)
    assert float(server.centers[1][0]) == pytest.approx((0.4 + 0.8) / 2)


def test_without_selection_the_center_is_the_v_weighted_average():
    algo = make(
        "fedsoft",
        task="regression",
        model_fn=lambda v=0: line(0.0),
        clusters=2,
        lam=0.0,
        optimizer="sgd",
        local_epochs=1,
        batch_size=1,
        selection=False,
    )
    centers = [[torch.tensor([[0.0]])], [torch.tensor([[0.0]])]]
    us = [torch.tensor([0.9, 0.1], dtype=torch.float64), torch.tensor([0.2, 0.8], dtype=torch.float64)]
    data = [regression_client(0, [1.0], [1.0]), regression_client(1, [1.0, 1.0], [2.0, 2.0])]
    outs = run(
        algo,
        *(
            algo.train(FedSoftState([torch.tensor([[0.0]])], u), Received(centers), d, ctx(d.cid, group=3))
            for d, u in zip(data, us)
        ),
    )
    acc = Accumulator()
    for _, r, _ in outs:
        acc.add(r)
    server = algo.aggregate(FedSoftServer(centers, torch.arange(2), torch.ones(2, 2)), acc.result(), 0)
    w = [float(s.w[0]) for s, _, _ in outs]
    un = torch.stack([us[0] * 1, us[1] * 2])
    v = aggregation_weights(un)
    for s in range(2):
        assert float(server.centers[s][0]) == pytest.approx(float(v[0, s]) * w[0] + float(v[1, s]) * w[1])


def test_adam_state_persists_on_the_client_and_the_model_warm_starts():
    algo = make(
        "fedsoft",
        task="regression",
        model_fn=lambda v=0: line(0.0),
        clusters=1,
        lam=0.0,
        optimizer="adam",
        local_epochs=1,
        batch_size=1,
        lr=0.1,
    )
    d = regression_client(0, [1.0], [1.0])
    centers = [[torch.tensor([[5.0]])]]
    state = algo.init_client(0, None)
    ((s1, _, _),) = run(algo, algo.train(state, Received(centers), d, ctx(0, group=1)))
    ((s2, _, _),) = run(algo, algo.train(s1, Received(centers), d, ctx(0, 1, group=1)))
    # Adam's first step moves by lr: 0 -> .1 (from w_k, not from the center at 5). The second,
    # continuing the moments (g1 = −2, g2 = 2(.1 − 1) = −1.8): m = .9·(−.2) + .1·g2 = −.36,
    # v = .999·.004 + .001·g2² = .007236, step = .1·(m/.19)/(sqrt(v/.001999)) ≈ .09959 — a fresh
    # optimizer would step exactly .1 again
    assert float(s1.w[0]) == pytest.approx(0.1, abs=1e-6)
    m_hat, v_hat = -0.36 / (1 - 0.9**2), 0.007236 / (1 - 0.999**2)
    assert float(s2.w[0]) == pytest.approx(0.1 - 0.1 * m_hat / (v_hat**0.5 + 1e-8), abs=1e-6)
    assert int(s2.opt["step"]) == 2


# -- mixture data -------------------------------------------------------------------------------
def test_mixture_schemes_by_hand():
    rng = np.random.default_rng(0)
    counts = plan(MixtureParams("10:90", min_size=100, max_size=100), 4, rng)
    assert counts.tolist() == [[10, 90], [10, 90], [90, 10], [90, 10]]
    counts = plan(MixtureParams("30:70", min_size=10, max_size=10), 2, rng)
    assert counts.tolist() == [[3, 7], [7, 3]]
    counts = plan(MixtureParams("linear", min_size=200, max_size=200), 4, rng)
    assert counts[:, 0].tolist() == [25, 75, 125, 175]  # (k + .5)/4 of 200
    counts = plan(MixtureParams("random", sources=3, min_size=50, max_size=60), 200, rng)
    sizes = counts.sum(axis=1)
    assert counts.shape == (200, 3) and sizes.min() >= 50 and sizes.max() <= 60 and (counts >= 0).all()
    assert abs(counts[:, 0].sum() / sizes.sum() - 1 / 3) < 0.05  # Dir(1): each source 1/3 on average


def test_regression_mixture_labels_follow_each_samples_source_and_shares_are_recorded():
    src = build_source(
        "regression_mixture",
        RegressionParams(dim=3, noise=0.0),
        4,
        PartitionCfg("mixture", MixtureParams("10:90", min_size=50, max_size=50, holdout=20)),
        Splits(1.0, 0.0, 0.0),
        0,
    )
    d = src.client(0)
    # noiseless: every training sample is exactly one of the two sources' linear functions
    fits = torch.stack([(d.train_x @ torch.tensor(w, dtype=torch.float32) - d.train_y).abs() < 1e-4 for w in src.w])
    assert fits.any(dim=0).all() and fits[0].sum() == 5 and fits[1].sum() == 45
    assert src.true_shares(0).tolist() == [0.1, 0.9] and src.true_shares(3).tolist() == [0.9, 0.1]
    x, y = src.source_test(1)
    assert x.shape == (20, 3) and torch.allclose(x @ torch.tensor(src.w[1], dtype=torch.float32), y, atol=1e-4)
    dw = ((src.w[0] - src.w[1]) ** 2).sum()
    assert src.best_fit_mse(0) == pytest.approx(0.1 * 0.9 * dw)


def test_pooled_mixture_rotates_each_samples_source_and_holds_out_a_test_set():
    mix = MixtureParams("30:70", min_size=40, max_size=40, holdout=100)
    src = build_source("digits", DigitsParams(), 6, PartitionCfg("mixture", mix), Splits(1.0, 0.0, 0.0), 0)
    x, y, parts = src.pool()
    used = np.concatenate(parts.parts)
    assert len(np.unique(used)) == 240 and not set(used) & set(parts.holdout)  # disjoint, held out apart
    d = src.client(0)
    raw = x[parts.parts[0]].reshape(-1, 8, 8)
    rotated = np.rot90(raw, k=1, axes=(1, 2)).reshape(-1, 64)
    plain = raw.reshape(-1, 64)
    as_is = {r.tobytes() for r in plain[parts.sources[0] == 0]}
    turned = {r.tobytes() for r in rotated[parts.sources[0] == 1]}
    got = [r.numpy().tobytes() for r in d.train_x]
    assert sum(g in as_is for g in got) == 12 and sum(g in turned for g in got) == 28  # 30 % of 40 unrotated
    t0, t1 = src.source_test(0), src.source_test(1)
    assert torch.equal(t0[1], t1[1]) and torch.equal(
        t1[0].reshape(-1, 8, 8), torch.rot90(t0[0].reshape(-1, 8, 8), 1, (1, 2))
    )


def test_mixture_settings_no_scheme_can_honour_fail_with_the_key(tmp_path):
    p = write_scenario(
        tmp_path,
        """
rounds: 1
data: {dataset: regression_mixture, clients: 4, partition: {kind: mixture, scheme: "10:90", sources: 3}}
model: linear
algorithm: fedavg
""",
    )
    with pytest.raises(config.ScenarioError, match=r"data\.partition\.sources: 3: scheme 10:90 mixes 2 sources"):
        config.load(p)
    p = write_scenario(
        tmp_path,
        """
rounds: 1
data: {dataset: regression_mixture, clients: 4, partition: {kind: dirichlet}}
model: linear
algorithm: fedavg
""",
    )
    with pytest.raises(
        config.ScenarioError,
        match=r"data\.partition\.kind: 'dirichlet' is not one of the choices; choose one of mixture",
    ):
        config.load(p)


# -- end to end --------------------------------------------------------------------------------
def small(seed=0, extra=()):
    return config.load(
        ROOT / "scenarios" / "fedsoft_synthetic.yaml",
        [
            f"seed={seed}",
            "rounds=20",
            "data.clients=40",
            "algorithm.per_cluster=12",
            "eval.every=20",
            "resources.hosts=2",
            *extra,
        ],
    )


def test_fedsoft_synthetic_separates_the_sources_and_recovers_the_shares(tmp_path):
    from raysim.experiment.runner import run as run_scenario

    sc = small(extra=[f"tracking.uri=sqlite:///{tmp_path}/m.db", f"checkpoint.dir={tmp_path}/ck"])
    summary = run_scenario(sc, engine="serial", progress=False, summary_path=str(tmp_path / "s.json"))
    f = json.loads((tmp_path / "s.json").read_text())["final"]
    table, assoc = np.array(f["center_source"]), f["association"]
    assert sorted(assoc) == [0, 1]  # distinct centers
    for s in range(2):
        assert table[assoc[s], s] <= 0.45 * table[assoc[1 - s], s]
    est = {c: v[assoc[0]] for c, v in f["importance"].items()}
    true = {c: v[0] for c, v in f["true_shares"].items()}
    assert np.mean([abs(est[c] - true[c]) for c in est]) <= 0.1
    assert 0 < np.mean([min(v) > 1e-3 for v in f["importance"].values()])  # soft, not all 0/1
    src = make_source(sc)
    floor = np.mean([src.best_fit_mse(int(c)) for c in est])
    assert 0.85 * floor <= summary["final"]["train_mse"] <= 1.3 * floor
    # a regression task end to end: metric names come from the task
    assert "accuracy" not in summary["final"] and summary["final"]["mse"] > 0


def test_fedsoft_results_do_not_depend_on_the_number_of_hosts():
    sc = small(extra=["rounds=3", "eval.every=1"])
    one, three = serial_driver(sc, 1), serial_driver(sc, 3)
    same = lambda r: {k: v for k, v in r.items() if "seconds" not in k and "bytes" not in k}  # noqa: E731
    for _ in range(3):
        assert same(one.step()) == same(three.step())
    assert one.report() == three.report()


# -- Clustered FL ------------------------------------------------------------------------------
def cfl_round(algo, server, updates, round_, cluster=0):
    """Aggregate hand-made updates {cid: Δθ of a 2-parameter model} of one cluster's clients."""
    from raysim.core.replies import ByKey, PerClient, Weighted

    acc = Accumulator()
    for cid, d in updates.items():
        delta = [torch.tensor(d, dtype=torch.float32)]
        acc.add(
            (
                ByKey({cluster: Weighted(delta, 1.0)}),
                PerClient({cid: [torch.tensor(d, dtype=torch.float32), torch.tensor(1.0, dtype=torch.float64)]}),
            )
        )
    return algo.aggregate(server, acc.result(), round_)


def test_cfl_splits_by_cosine_similarity_when_the_mean_update_is_small_and_one_is_large():
    from raysim.algorithms.cfl import CFLServer

    algo = make("cfl", model_fn=lambda v=0: line(0.0), eps1=0.4, eps2=1.6, split_after=2, min_split_size=2)
    server = CFLServer([[torch.zeros(2)]], {}, [], [[]])
    # two opposed pairs: mean (0, 0.1), norm .1 < .4; max norm 2.0 > 1.6
    ups = {0: [2.0, 0.0], 1: [1.8, 0.2], 2: [-2.0, 0.0], 3: [-1.8, 0.2]}
    same = cfl_round(algo, server, ups, 1)  # round 2 (1-based): not after split_after
    assert len(same.models) == 1 and torch.allclose(same.models[0][0], torch.tensor([0.0, 0.1]))
    split = cfl_round(algo, server, ups, 2)
    assert len(split.models) == 2
    new = split.member  # the part without client 0 gets the new index
    assert set(new) == {2, 3} and set(new.values()) == {1}
    assert torch.allclose(split.models[0][0], torch.tensor([1.9, 0.1]))  # θ + its members' mean update
    assert torch.allclose(split.models[1][0], torch.tensor([-1.9, 0.1]))
    assert torch.allclose(split.cache[0][0], torch.tensor([0.0, 0.1])) and split.lineage == [[0], [0]]
    # no split: mean update too large, or no update large enough, or a cluster too small
    assert len(cfl_round(algo, server, {0: [2.0, 0.0], 1: [1.8, 0.2], 2: [1.0, 0.0]}, 5).models) == 1
    assert len(cfl_round(algo, server, {0: [1.0, 0.0], 1: [-1.0, 0.0], 2: [0.5, 0.0]}, 5).models) == 1
    assert len(cfl_round(algo, server, {0: [2.0, 0.0], 1: [-2.0, 0.0]}, 5).models) == 1


def test_cfl_finds_the_rotation_groups_of_real_digits(tmp_path):
    from sklearn.metrics import adjusted_rand_score

    from raysim.experiment.runner import run as run_scenario

    sc = config.load(
        ROOT / "scenarios" / "digits_rotated_cfl.yaml",
        [f"tracking.uri=sqlite:///{tmp_path}/m.db", f"checkpoint.dir={tmp_path}/ck", "rounds=25"],
    )
    f = run_scenario(sc, engine="serial", progress=False)["final"]
    cids = sorted(f["importance"], key=int)
    found = [int(np.argmax(f["importance"][c])) for c in cids]
    truth = [int(np.argmax(f["true_shares"][c])) for c in cids]
    assert len(set(found)) == 2 and adjusted_rand_score(truth, found) >= 0.9


def test_fedavg_learns_a_regression_task_end_to_end(tmp_path):
    """Regression through the generic path: one source, so one linear model fits everyone;
    FedAvg's MSE must come down to the label noise (1.0) from the initial model's."""
    p = write_scenario(
        tmp_path,
        """
rounds: 15
data:
  dataset: regression_mixture
  clients: 10
  partition: {kind: mixture, scheme: random, sources: 1, min_size: 60, max_size: 80, holdout: 100}
model: {name: linear, bias: false}
algorithm: {name: fedavg, lr: 0.02, batch_size: 10}
eval: {every: 1}
resources: {hosts: 2}
""",
    )
    d = serial_driver(config.load(p), 2)
    first = d.step()
    for _ in range(14):
        last = d.step()
    assert last["mse"] < 1.3 < 0.2 * first["mse"] and "accuracy" not in last
    assert last["global_mse"] == last["mse"]


def test_fedsoft_on_ray_hosts_matches_the_serial_engine(tmp_path):
    """Statistics replies per client, selection masks and per-center sums through Ray actors:
    the same report and metrics as in-process hosts."""
    from tests.test_runs import summary_of

    sets = [
        "--set",
        "rounds=4",
        "--set",
        "eval.every=2",
        "--set",
        "data.clients=30",
        "--set",
        "resources.hosts=3",
        "--set",
        "resources.cpus_per_host=0.5",
        "--set",
        f"tracking.uri=sqlite:///{tmp_path}/m.db",
        "--set",
        f"checkpoint.dir={tmp_path}/ck",
    ]
    path = str(ROOT / "scenarios" / "fedsoft_synthetic.yaml")
    serial = summary_of(tmp_path, path, "--engine", "serial", *sets, name="serial.json")
    on_ray = summary_of(tmp_path, path, *sets, name="ray.json")
    assert on_ray["final"] == serial["final"] and "center_source" in serial["final"]
    same = lambda h: {k: v for k, v in h.items() if "seconds" not in k}  # noqa: E731
    assert [same(h) for h in on_ray["history"]] == [same(h) for h in serial["history"]]
