"""Graphs and mixing matrices: stochasticity, sparsity, self-weights, known spectral gaps."""

import math

import networkx as nx
import numpy as np
import pytest

from raysim.federation import topology as T


def test_metropolis_on_a_path_by_hand():
    g = nx.path_graph(3)  # degrees 1, 2, 1 -> every edge weight 1/3
    w = T.metropolis(g)
    expected = np.array([[2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]])
    assert np.allclose(w.toarray(), expected)
    T.check_mixing(w, g)


@pytest.mark.parametrize("kind", ["ring", "torus", "complete", "star", "erdos_renyi"])
@pytest.mark.parametrize("mixing", ["metropolis", "fmmc"])
def test_mixing_matrices_are_doubly_stochastic_and_sparse(kind, mixing):
    g = T.build(kind, 16, np.random.default_rng(0), p=0.3)
    w = T.mixing_matrix(g, mixing).toarray()
    assert np.allclose(w.sum(0), 1) and np.allclose(w.sum(1), 1) and np.allclose(w, w.T)
    assert (w >= -1e-12).all()
    assert 0 < T.spectral_gap(w) <= 1 + 1e-9


def test_known_spectral_gaps():
    # complete graph, Metropolis: W = J/n, eigenvalues 1 and 0 -> gap 1
    assert T.spectral_gap(T.metropolis(nx.complete_graph(8))) == pytest.approx(1.0)
    # ring of n, Metropolis weights 1/3: eigenvalues 1/3 + 2/3 cos(2 pi k / n)
    n = 10
    expected = 1 - max(abs(1 / 3 + 2 / 3 * math.cos(2 * math.pi * k / n)) for k in range(1, n))
    assert T.spectral_gap(T.metropolis(nx.cycle_graph(n))) == pytest.approx(expected)


def test_fmmc_mixes_at_least_as_fast_and_keeps_self_weights():
    g = T.build("erdos_renyi", 12, np.random.default_rng(3), p=0.3)
    metro, fast = T.metropolis(g), T.mixing_matrix(g, "fmmc")
    assert T.spectral_gap(fast) >= T.spectral_gap(metro) - 1e-9
    # ring of 10 with uniform edge weight w: eigenvalues 1 - 2w(1 - cos(2 pi k/10)); the optimum
    # equalizes 1 - 2w(1 - cos 36deg) with 4w - 1: w = 2 / (4 + 2(1 - cos 36deg)) ~ 0.4564, which
    # leaves every self-weight 1 - 2w ~ 0.087 > 0. Zeroing the diagonal (the official code's FMMC
    # mask) would give W_ij = 1/2 and the eigenvalue -1: a ring of even length would never mix.
    c = 1 - math.cos(2 * math.pi / 10)
    w_opt = 2 / (4 + 2 * c)
    ring = T.mixing_matrix(nx.cycle_graph(10), "fmmc")
    assert (ring.diagonal() > 0.05).all()  # the optimum keeps self-weights
    assert T.spectral_gap(ring) == pytest.approx(1 - (1 - 2 * w_opt * c), abs=2e-3)
    # star K_1,4: the optimum is w = 1/4 on each edge (SLEM 3/4), centre self-weight 0
    star = T.mixing_matrix(nx.star_graph(4), "fmmc")
    assert T.spectral_gap(star) == pytest.approx(0.25, abs=1e-3)


def test_torus_and_bad_inputs(tmp_path):
    g = T.torus(12)
    assert all(d == 4 for _, d in g.degree())
    with pytest.raises(T.TopologyError, match="do not factor"):
        T.torus(7)
    f = tmp_path / "edges.txt"
    f.write_text("0 1\n1 2\n# comment\n")
    with pytest.raises(T.TopologyError, match="not connected"):
        T.build("edges", 4, np.random.default_rng(0), edges=str(f))
    f.write_text("0 1\n1 x\n")
    with pytest.raises(T.TopologyError, match="line 2"):
        T.build("edges", 3, np.random.default_rng(0), edges=str(f))
    g3 = nx.path_graph(3)
    bad = np.full((3, 3), 1 / 3)
    with pytest.raises(T.TopologyError, match="not neighbours"):
        T.check_mixing(bad, g3)


def test_erdos_renyi_is_seeded_and_connected():
    a = T.build("erdos_renyi", 20, np.random.default_rng(5), p=0.15)
    b = T.build("erdos_renyi", 20, np.random.default_rng(5), p=0.15)
    assert set(a.edges()) == set(b.edges()) and nx.is_connected(a)


def test_erdos_renyi_bridge_chains_one_draws_components_by_their_smallest_ids():
    # p so small the draw is mostly isolated clients: bridge adds exactly components - 1 edges,
    # each from one component's smallest id to the next's, and keeps every drawn edge
    raw = nx.gnp_random_graph(30, 0.02, seed=int(np.random.default_rng(7).integers(2**31)))
    heads = sorted(min(c) for c in nx.connected_components(raw))
    assert len(heads) > 5
    g = T.build("erdos_renyi", 30, np.random.default_rng(7), p=0.02, connect="bridge")
    assert nx.is_connected(g)
    assert set(map(frozenset, g.edges())) == set(map(frozenset, raw.edges())) | {
        frozenset(e) for e in zip(heads[:-1], heads[1:])
    }
    with pytest.raises(T.TopologyError, match="topology.connect: bridge"):
        T.build("erdos_renyi", 30, np.random.default_rng(7), p=0.02)
    # 100 000 clients at average degree 8: one draw, connected, in seconds
    big = T.build("erdos_renyi", 100_000, np.random.default_rng(0), p=8 / 100_000, connect="bridge")
    assert nx.is_connected(big) and 7.5 < 2 * big.number_of_edges() / 100_000 < 8.5


def test_sample_weighted_mixing_on_a_path_by_hand():
    # path 0 - 1 - 2, Metropolis W = [[2/3,1/3,0],[1/3,1/3,1/3],[0,1/3,2/3]], counts (1, 2, 4):
    # W'_ij = W_ij min(1, n_j/n_i): W'_01 = 1/3, W'_10 = 1/6, W'_12 = 1/3, W'_21 = 1/6
    g = nx.path_graph(3)
    counts = np.array([1.0, 2.0, 4.0])
    w = T.sample_weighted(T.metropolis(g), counts).toarray()
    expect = np.array([[2 / 3, 1 / 3, 0], [1 / 6, 1 / 2, 1 / 3], [0, 1 / 6, 5 / 6]])
    assert np.allclose(w, expect)
    T.check_mixing(w, g, counts=counts)
    pi = counts / counts.sum()
    assert np.allclose(pi @ w, pi)  # keeps the sample-weighted average
    x = np.array([1.0, 2.0, 4.0])
    for _ in range(300):
        x = w @ x
    assert np.allclose(x, (pi * [1.0, 2.0, 4.0]).sum())  # consensus on Σ n_i θ_i / Σ n_i = 3
    gap = T.spectral_gap(w, counts)
    assert gap == pytest.approx(1 - sorted(abs(np.linalg.eigvals(w)))[-2])
    with pytest.raises(T.TopologyError, match="detailed balance"):
        T.check_mixing(T.metropolis(g), g, counts=counts)  # symmetric W, unequal counts
    assert np.allclose(T.sample_weighted(T.metropolis(g), np.ones(3)).toarray(), T.metropolis(g).toarray())


def test_fmmc_iterations_are_a_budget_and_never_worse_than_metropolis():
    g = T.build("erdos_renyi", 30, np.random.default_rng(1), p=0.3)
    base = T.slem(T.metropolis(g))
    few, many = T.mixing_matrix(g, "fmmc", fmmc_iters=3), T.mixing_matrix(g, "fmmc", fmmc_iters=300)
    assert T.slem(many) <= T.slem(few) <= base


def test_large_ring_mixing_is_sparse_and_each_row_is_its_two_neighbours():
    from raysim.engine.gossip import GossipDriver

    n = 49_998  # a multiple of the 3 hosts: client c on host c % 3
    g = T.build("ring", n, np.random.default_rng(0))
    w = T.mixing_matrix(g, "metropolis")
    assert w.format == "csr" and w.nnz == 3 * n  # a dense W would be 20 GB
    groups = [list(range(h, n, 3)) for h in range(3)]
    rows, outboxes = GossipDriver._plan(w, groups, np.arange(n) % 3)

    def row(h, k):  # host h's k-th client's (neighbours ascending, weights)
        ids, ptr, idx, val = rows[h]
        return idx[ptr[k] : ptr[k + 1]].tolist(), val[ptr[k] : ptr[k + 1]].tolist()

    assert rows[0][0][:2].tolist() == [0, 3] and rows[1][0][:2].tolist() == [1, 4]
    assert row(0, 0)[0] == [0, 1, n - 1] and row(1, 0)[0] == [0, 1, 2]
    assert row(0, 0)[1] + row(1, 0)[1] == pytest.approx([1 / 3] * 6)
    # a client's two neighbours are on the two other hosts: each message goes to both of them;
    # host 0 (clients 0, 3, ...) gets 1, 4, ... from host 1 and 2, 5, ... from host 2
    assert sum(len(v) for out in outboxes for v in out.values()) == 2 * n
    assert outboxes[1][0] == list(range(1, n, 3)) and outboxes[2][0] == list(range(2, n, 3))


def test_fmmc_beyond_its_limit_names_metropolis(monkeypatch):
    monkeypatch.setattr(T, "FMMC_MAX", 10)
    with pytest.raises(T.TopologyError, match="12 clients is beyond 10 .*use mixing: metropolis"):
        T.mixing_matrix(nx.cycle_graph(12), "fmmc")
