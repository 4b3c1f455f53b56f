"""Communication graphs and mixing matrices for decentralized (gossip) training.

Graphs (networkx): Erdős–Rényi G(n, p) redrawn until connected (or its components bridged), ring, 2-D torus, complete, star,
or an edge list from a file. Mixing matrices W (symmetric, doubly stochastic, nonnegative, zero
off the graph, self-weights kept):

- ``metropolis``: W_ij = 1 / (1 + max(d_i, d_j)) on edges, W_ii = 1 − Σ_j W_ij
  (Xiao & Boyd, "Fast linear iterations for distributed averaging", 2004).
- ``fmmc``: the fastest-mixing Markov chain on the graph (Boyd, Diaconis & Xiao, SIAM Review
  2004): minimize the second-largest eigenvalue modulus of W over edge weights, solved by their
  projected subgradient method. The FedEM official code masks the diagonal of its FMMC solution
  (every self-weight 0); ours keeps the self-weights the optimization finds.

W is a ``scipy.sparse.csr_array`` built in O(clients + edges): a 100 000-client ring or
sparse graph costs kilobytes, not the 80 GB of a dense N × N matrix. FMMC needs a full
eigen-decomposition per iteration (O(N³)); beyond ``FMMC_MAX`` clients it stops with a message
naming Metropolis. The spectral gap 1 − SLEM(W) measures how fast gossip averages (larger is
faster); it is computed (a dense decomposition) up to ``GAP_MAX`` clients; beyond, the gossip
scheduler does not log it (on a 100 000-client ring the gap is ~1e-9, where Lanczos iterations
do not converge in useful time).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import networkx as nx
import numpy as np
import scipy.sparse as sp

FMMC_MAX = 3000  # clients: FMMC's dense eigen-decompositions beyond are hours
GAP_MAX = 2000  # clients: the spectral gap by a dense decomposition up to here


class TopologyError(ValueError):
    """A graph or mixing matrix that cannot be used (one line, says why)."""


def erdos_renyi(n: int, p: float, rng: np.random.Generator, tries: int = 1000, connect: str = "redraw") -> nx.Graph:
    """G(n, p): networkx's ``gnp_random_graph`` (O(n²)), or beyond ``GAP_MAX`` clients its
    ``fast_gnp_random_graph`` (O(n + edges), the same distribution). ``connect``: ``redraw``
    draws again until the graph is connected (the usual choice, and FedEM's); ``bridge`` draws
    once and joins its components in a chain, the smallest client id of each to that of the
    next (components - 1 added edges): at a sparse average degree d a large G(n, d/n) is almost
    never connected (about n·e^-d isolated clients), so redrawing cannot end."""
    draw = nx.gnp_random_graph if n <= GAP_MAX else nx.fast_gnp_random_graph
    if connect == "bridge":
        g = draw(n, p, seed=int(rng.integers(2**31)))
        heads = sorted(min(c) for c in nx.connected_components(g))
        g.add_edges_from(zip(heads[:-1], heads[1:]))
        return g
    for _ in range(tries):
        g = draw(n, p, seed=int(rng.integers(2**31)))
        if nx.is_connected(g):
            return g
    raise TopologyError(
        f"erdos_renyi: no connected G({n}, {p}) in {tries} draws; raise p, or set "
        "topology.connect: bridge to join the components of one draw"
    )


def torus(n: int) -> nx.Graph:
    """2-D periodic grid r x c with r*c = n and r, c as close as possible (r >= 3 for a true torus)."""
    r = max(d for d in range(1, int(math.isqrt(n)) + 1) if n % d == 0)
    if r < 3:
        raise TopologyError(f"torus: {n} clients do not factor into an r x c grid with r, c >= 3")
    g = nx.grid_2d_graph(r, n // r, periodic=True)
    return nx.convert_node_labels_to_integers(g, ordering="sorted")


def from_edges(path: str | Path, n: int) -> nx.Graph:
    """A file of lines ``i j`` (client ids 0..n-1 in ASCII digits, a space or a comma between;
    '#' starts a comment; a self loop ``i i`` adds nothing: every client keeps its self-weight)."""
    g = nx.Graph()
    g.add_nodes_from(range(n))
    p = Path(path)
    if not p.is_file():
        raise TopologyError(f"edges: no such file {path}")
    allowed = f"each line holds two client ids from 0 to {n - 1} (ASCII digits) or a '#' comment"
    for k, raw in enumerate(p.read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8").split("#", 1)[0].strip()
        except UnicodeDecodeError:
            raise TopologyError(f"edges: {path} line {k}: not UTF-8 text; {allowed}") from None
        if not line:
            continue
        parts = line.replace(",", " ").split()
        if len(parts) != 2 or not all(re.fullmatch("[0-9]+", x) for x in parts):
            raise TopologyError(f"edges: {path} line {k}: {line[:40]!r} is not two client ids; {allowed}")
        i, j = int(parts[0]), int(parts[1])
        if i >= n or j >= n:
            raise TopologyError(
                f"edges: {path} line {k}: client id {max(i, j)} is not one of the {n} clients (data.clients); {allowed}"
            )
        if i != j:
            g.add_edge(i, j)
    return g


def build(
    kind: str, n: int, rng: np.random.Generator, p: float = 0.5, edges: str | None = None, connect: str = "redraw"
) -> nx.Graph:
    if kind == "erdos_renyi":
        g = erdos_renyi(n, p, rng, connect=connect)
    elif kind == "ring":
        g = nx.cycle_graph(n) if n > 2 else nx.path_graph(n)
    elif kind == "torus":
        g = torus(n)
    elif kind == "complete":
        g = nx.complete_graph(n)
    elif kind == "star":
        g = nx.star_graph(n - 1)
    elif kind == "edges":
        g = from_edges(edges, n)
    else:
        raise TopologyError(f"unknown topology {kind!r}")
    if n > 1 and not nx.is_connected(g):
        what = f"edges {edges}" if kind == "edges" else kind
        raise TopologyError(
            f"{what}: the graph is not connected ({nx.number_connected_components(g)} "
            "components); gossip could never reach consensus"
        )
    return g


def scenario_graph(t, n: int, seed: int, key: int = 0) -> nx.Graph:
    """The graph a gossip run uses: topology config ``t`` over ``n`` clients, drawn from
    generator(seed, "topology", key) (key: the round for a graph redrawn each round, else 0)."""
    from raysim import rng

    return build(t.kind, n, rng.generator(seed, "topology", key), p=t.p, edges=t.edges, connect=t.connect)


def check_scenario(t, n: int, seed: int) -> None:
    """What a gossip run with topology config ``t`` would refuse, found before it starts
    (TopologyError): FMMC's size limit, and its first graph, drawn as the run draws it."""
    if t.mixing == "fmmc":
        _fmmc_fits(n)
    scenario_graph(t, n, seed)


def edge_array(g: nx.Graph) -> np.ndarray:
    """(edges, 2) int64, each undirected edge once."""
    return np.array(list(g.edges()), dtype=np.int64).reshape(-1, 2)


def from_edge_weights(n: int, edges: np.ndarray, we: np.ndarray) -> sp.csr_array:
    """The symmetric W with weight we on each edge (both directions) and 1 − (row sum) on the
    diagonal."""
    i, j = edges[:, 0], edges[:, 1]
    load = np.bincount(i, we, n) + np.bincount(j, we, n)
    rows = np.concatenate([i, j, np.arange(n)])
    cols = np.concatenate([j, i, np.arange(n)])
    vals = np.concatenate([we, we, 1.0 - load])
    return sp.csr_array((vals, (rows, cols)), shape=(n, n))


def metropolis_weights(n: int, edges: np.ndarray) -> np.ndarray:
    deg = np.bincount(edges.ravel(), minlength=n)
    return 1.0 / (1 + np.maximum(deg[edges[:, 0]], deg[edges[:, 1]]))


def metropolis(g: nx.Graph) -> sp.csr_array:
    n = g.number_of_nodes()
    edges = edge_array(g)
    return from_edge_weights(n, edges, metropolis_weights(n, edges))


def surviving(
    edges: np.ndarray, n: int, link_failure: float, node_failure: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """A round of an unreliable network: each client is down with probability ``node_failure``
    (it neither trains nor mixes; its links go with it), then each link fails with probability
    ``link_failure`` (drawn for every edge of ``edges``, in their order). Returns (the working
    edges, the down mask)."""
    down = rng.random(n) < node_failure
    failed = rng.random(len(edges)) < link_failure
    keep = ~failed & ~down[edges[:, 0]] & ~down[edges[:, 1]]
    return edges[keep], down


def _dense(w) -> np.ndarray:
    return w.toarray() if sp.issparse(w) else np.asarray(w)


def slem(w, counts: np.ndarray | None = None) -> float:
    """Second-largest eigenvalue modulus of a symmetric stochastic matrix, or of one in
    detailed balance with pi ∝ counts (through the similar symmetric D^½ W D^-½, D = diag pi).
    A dense decomposition: callers keep it to ``GAP_MAX`` clients."""
    n = w.shape[0]
    if counts is not None:
        pi = np.asarray(counts, dtype=np.float64)
        if not (pi > 0).all():  # general eigenvalues (real for a reversible chain)
            mods = np.sort(np.abs(np.linalg.eigvals(_dense(w))))
            return float(mods[-2]) if len(mods) > 1 else 0.0
        d = np.sqrt(pi / pi.sum())
        w = sp.diags_array(d) @ sp.csr_array(w) @ sp.diags_array(1 / d)
        w = (w + w.T) / 2  # symmetric up to rounding
    if n < 2:
        return 0.0
    ev = np.sort(np.linalg.eigvalsh(_dense(w)))
    return float(max(abs(ev[0]), abs(ev[-2])))


def spectral_gap(w, counts: np.ndarray | None = None) -> float:
    return 1.0 - slem(w, counts)


def _fmmc_fits(n: int) -> None:
    if n > FMMC_MAX:
        raise TopologyError(
            f"fmmc: {n} clients is beyond {FMMC_MAX} (each iteration is a dense "
            f"{n} x {n} eigen-decomposition); use mixing: metropolis"
        )


def fmmc(g: nx.Graph, iters: int = 1000, step: float = 0.05) -> sp.csr_array:
    """Fastest-mixing Markov chain by projected subgradient descent on the edge weights
    (Boyd, Diaconis & Xiao 2004, §5): start from Metropolis, step along −g/‖g‖ by step/√k,
    project onto {w >= 0, Σ_{edges at i} w <= 1}; keep the best iterate."""
    n = g.number_of_nodes()
    _fmmc_fits(n)
    edges = edge_array(g)
    if n <= 1 or len(edges) == 0:
        return sp.csr_array(sp.eye_array(n))
    w_edge = metropolis_weights(n, edges)

    def matrix(we):
        return from_edge_weights(n, edges, we).toarray()

    best, best_val = w_edge.copy(), math.inf
    for k in range(iters + 1):
        vals, vecs = np.linalg.eigh(matrix(w_edge))  # one decomposition: the value and the step
        val = max(abs(vals[0]), abs(vals[-2]))
        if val < best_val - 1e-12:
            best, best_val = w_edge.copy(), val
        if k == iters:
            break
        if abs(vals[-2]) >= abs(vals[0]):  # lambda_2 sets the SLEM
            u = vecs[:, -2]
            grad = -((u[edges[:, 0]] - u[edges[:, 1]]) ** 2)
        else:  # lambda_n sets it
            v = vecs[:, 0]
            grad = (v[edges[:, 0]] - v[edges[:, 1]]) ** 2
        norm = np.linalg.norm(grad)
        if norm == 0:
            break
        w_edge = _project(w_edge - step * grad / norm / math.sqrt(k + 1), edges, n)
    return from_edge_weights(n, edges, best)


def _project(we: np.ndarray, edges: np.ndarray, n: int) -> np.ndarray:
    """Nonnegative weights whose sum at every node is at most 1 (scaled down where exceeded)."""
    we = np.maximum(we, 0.0)
    for _ in range(50):
        load = np.zeros(n)
        np.add.at(load, edges[:, 0], we)
        np.add.at(load, edges[:, 1], we)
        over = np.maximum(load, 1.0)
        if np.all(load <= 1.0 + 1e-12):
            break
        we = we / np.maximum(over[edges[:, 0]], over[edges[:, 1]])
    return we


def mixing_matrix(g: nx.Graph, kind: str, fmmc_iters: int = 1000) -> sp.csr_array:
    if kind == "metropolis":
        w = metropolis(g)
    elif kind == "fmmc":
        w = fmmc(g, iters=fmmc_iters)
    else:
        raise TopologyError(f"unknown mixing {kind!r}; choose metropolis or fmmc")
    check_mixing(w, g)
    return w


def sample_weighted(w, counts: np.ndarray) -> sp.csr_array:
    """Metropolis-Hastings correction of a symmetric stochastic W towards the stationary
    distribution pi ∝ counts: W'_ij = W_ij·min(1, pi_j/pi_i) off the diagonal, the rest on it.
    Then pi_i W'_ij = pi_j W'_ji (detailed balance), so pi^T W' = pi^T: gossip θ <- W'θ keeps
    Σ_i pi_i θ_i, the sample-weighted average FedEM's server computes, where a doubly
    stochastic W keeps the plain average. W' stays row-stochastic, nonnegative, zero off the
    graph and keeps every self-weight; it is not symmetric unless the counts are equal."""
    w = sp.coo_array(w)
    n = w.shape[0]
    pi = np.asarray(counts, dtype=np.float64)
    if pi.shape != (n,) or (pi < 0).any():
        raise TopologyError(f"sample counts must be {n} nonnegative numbers")
    if pi.sum() == 0:
        return sp.csr_array(w)
    i, j, v = w.row, w.col, w.data
    off = i != j
    i, j, v = i[off], j[off], v[off]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(pi[i] > 0, pi[j] / pi[i], 1.0)
    v = v * np.minimum(1.0, ratio)
    diag = 1.0 - np.bincount(i, v, n)
    return sp.csr_array(
        (np.concatenate([v, diag]), (np.concatenate([i, np.arange(n)]), np.concatenate([j, np.arange(n)]))),
        shape=(n, n),
    )


def check_mixing(w, g: nx.Graph, tol: float = 1e-9, counts: np.ndarray | None = None) -> None:
    """Symmetric, doubly stochastic, nonnegative, zero off the graph (self-weights allowed); with
    ``counts``, in detailed balance with pi ∝ counts instead of symmetric. O(edges)."""
    n = g.number_of_nodes()
    if w.shape != (n, n):
        raise TopologyError(f"mixing matrix has shape {w.shape}, expected {(n, n)}")
    w = sp.csr_array(w)

    def biggest(m) -> float:
        m = sp.csr_array(m)
        return float(np.abs(m.data).max()) if m.nnz else 0.0

    if counts is None and biggest(w - w.T) > tol:
        raise TopologyError("mixing matrix is not symmetric")
    if w.nnz and w.data.min() < -tol:
        raise TopologyError("mixing matrix has negative entries")
    if not np.allclose(w.sum(axis=1), 1.0, atol=1e-8):
        raise TopologyError("mixing matrix rows do not sum to 1")
    e = edge_array(g)
    allowed = from_edge_weights(n, e, np.ones(len(e)))  # edges both ways and the diagonal
    allowed.data[:] = 1.0
    outside = w - w.multiply(allowed)
    if biggest(outside) > tol:
        raise TopologyError("mixing matrix has weight between clients that are not neighbours")
    if counts is not None:
        pi = np.asarray(counts, dtype=np.float64)
        flow = sp.diags_array(pi) @ w
        if biggest(flow - flow.T) > tol * max(1.0, pi.max()):
            raise TopologyError("mixing matrix is not in detailed balance with the sample counts")
