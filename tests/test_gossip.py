"""Decentralized rounds: the gossip scheduler, mixing across hosts, consensus, D-SGD, D-FedEM."""

import pytest
import torch

from raysim.engine.serial import serial_driver
from raysim.scenario import config
from raysim.scenario.config import ScenarioError
from tests.conftest import write_scenario
from tests.test_runs import tracked

DFEDEM = """
name: dfedem
seed: 0
rounds: 4
data:
  dataset: synthetic
  clients: 12
  dim: 10
  components: 2
  alpha: 0.1
  min_samples: 40
  max_samples: 40
model: {name: linear}
algorithm: {name: fedem, components: 2, lr: 0.3, batch_size: 16, momentum: 0.0, weight_decay: 0.0,
            lr_schedule: constant}
topology: {kind: erdos_renyi, p: 0.5, mixing: metropolis}
eval: {every: 2}
resources: {hosts: 2, cpus_per_host: 0.5}
"""


def load(tmp_path, text, *overrides, name="s.yaml"):
    return config.load(write_scenario(tmp_path, text, name), list(overrides))


def run(sc, hosts=None):
    d = serial_driver(sc, hosts)
    for _ in range(sc.rounds):
        d.step()
    return d


def strip(history):
    return [{k: v for k, v in h.items() if "seconds" not in k and "messages" not in k} for h in history]


def test_dfedem_same_metrics_for_one_or_three_hosts(tmp_path):
    sc = load(tmp_path, DFEDEM)
    a, b = run(sc, 1), run(sc, 3)
    assert strip(a.history) == strip(b.history)
    assert "spectral_gap" in a.history[0] and "spectral_gap" not in a.history[1]  # fixed graph
    assert {"consensus_distance_0", "consensus_distance_1", "pi_entropy"} <= set(a.history[-1])
    assert b.history[0]["messages_fetched_across_hosts"] > 0


def test_dfedem_clients_of_unequal_sizes_give_the_same_metrics_on_one_or_three_hosts(tmp_path):
    """Clients of 23 to 61 samples: packed on a host one after another, a client's rows would
    start at an offset set by the sizes before it, and the CPU's matrix kernels add differently
    on differently aligned rows (FedEM's component losses differed in the last bits, 1 host
    against 3). Each client's rows start on a 64-byte boundary (``data.pack``)."""
    sc = load(tmp_path, DFEDEM, "data.min_samples=23", "data.max_samples=61", "rounds=2", "eval.every=2")
    a, b = run(sc, 1), run(sc, 3)
    assert len({h.data(c).num_train for h in a.transport.hosts for c in h.cids}) > 3
    assert strip(a.history) == strip(b.history)


def test_resampled_graph_logs_its_gap_every_round(tmp_path):
    sc = load(tmp_path, DFEDEM, "topology.resample=true", "rounds=3")
    d = run(sc)
    assert all("spectral_gap" in h for h in d.history)


def path_round(tmp_path, *overrides, weighting="uniform"):
    """Clients 0 - 1 - 2 with theta = 1, 2, 4 and a negligible lr (the local step leaves theta
    as it is): one round on 2 hosts; returns (driver, record, theta after the round)."""
    edges = tmp_path / "path.txt"
    edges.write_text("0 1\n1 2\n")
    text = (
        DFEDEM.replace("clients: 12", "clients: 3")
        .replace("algorithm: {name: fedem, components: 2, lr: 0.3,", "algorithm: {name: fedavg, lr: 1.0e-30,")
        .replace(
            "topology: {kind: erdos_renyi, p: 0.5, mixing: metropolis}",
            f"topology: {{kind: edges, edges: '{edges}', mixing: metropolis, weighting: {weighting}}}",
        )
    )
    d = serial_driver(load(tmp_path, text, "rounds=1", *overrides), 2)
    d.transport.set_states(
        {
            c: {"state": None, "server": [torch.full((2, 10), v), torch.zeros(2)]}
            for c, v in ((0, 1.0), (1, 2.0), (2, 4.0))
        }
    )
    rec = d.step()
    states = d.transport.get_states()
    return d, rec, [states[c]["server"][0][0, 0].item() for c in range(3)]


def test_mixing_step_by_hand_on_a_path(tmp_path):
    # Metropolis on the path: W = [[2/3,1/3,0],[1/3,1/3,1/3],[0,1/3,2/3]]; one round gives W @ theta
    _, rec, got = path_round(tmp_path)
    assert got == pytest.approx([4 / 3, 7 / 3, 10 / 3], abs=1e-6)
    # consensus distance: the 20 weights of each client equal theta_i, mean 7/3, the biases 0:
    # mean_k 20 (theta_k - 7/3)^2 = 20 * ((1)^2 + 0 + (1)^2) / 3
    assert rec["consensus_distance"] == pytest.approx(20 * 2 / 3, rel=1e-5)


def test_sample_weighted_mixing_step_and_exchange_on_a_path(tmp_path):
    # the same path with clients of unequal sizes and weighting: samples: one round gives
    # W' @ theta with W'_ij = W_ij min(1, n_j/n_i) (n = the clients' training samples).
    # Hosts (round robin): 0 and 2 on host 0, 1 on host 1 -> host 0 fetches {1}, host 1 fetches {0, 2}.
    import numpy as np

    from raysim.federation import topology

    d, rec, got = path_round(
        tmp_path, "data.min_samples=10", "data.max_samples=300", "resources.placement=round_robin", weighting="samples"
    )
    n = d.counts
    assert len(set(n)) > 1  # unequal, so the weighting matters
    assert list(n) == [h.data(c).num_train for c in range(3) for h in d.transport.hosts if c in h.cids]
    w = topology.sample_weighted(topology.metropolis(topology.from_edges(tmp_path / "path.txt", 3)), n)
    assert got == pytest.approx(list(w @ np.array([1.0, 2.0, 4.0])), abs=1e-6)
    assert rec["messages_fetched_across_hosts"] == 3


def test_dsgd_on_a_complete_graph_is_fedavg(tmp_path):
    # equal-sized clients and W = J/n: every client ends each round at the plain average,
    # which is FedAvg's sample-weighted average; consensus distance is 0
    text = DFEDEM.replace("algorithm: {name: fedem, components: 2, lr: 0.3,", "algorithm: {name: fedavg, lr: 0.3,")
    dsgd = run(load(tmp_path, text, "topology.kind=complete", "rounds=3"))
    fedavg = run(
        load(
            tmp_path,
            text.split("topology:")[0] + "eval: {every: 2}\nresources: {hosts: 2}\n",
            "rounds=3",
            name="f.yaml",
        )
    )
    assert all(h["consensus_distance"] < 1e-10 for h in dsgd.history)
    states = dsgd.transport.get_states()
    for c in range(12):
        for a, b in zip(states[c]["server"], fedavg.server_state):
            assert torch.allclose(a, b, atol=1e-6)
    assert dsgd.history[-1]["accuracy"] == pytest.approx(fedavg.history[-1]["accuracy"], abs=0.02)


def test_topology_validation(tmp_path):
    with pytest.raises(ScenarioError, match="algorithm.name: 'local' has no decentralized form"):
        load(tmp_path, DFEDEM, "algorithm={name: local}")
    with pytest.raises(ScenarioError, match="algorithm.server_average: 'all' averages at a server"):
        load(tmp_path, DFEDEM, "algorithm.server_average=all")
    with pytest.raises(ScenarioError, match="eval.unseen_fraction"):
        load(tmp_path, DFEDEM, "eval.unseen_fraction=0.2")
    with pytest.raises(ScenarioError, match="topology.kind: 'hypercube' is not allowed"):
        load(tmp_path, DFEDEM, "topology.kind=hypercube")
    with pytest.raises(ScenarioError, match="topology.edges: no such file"):
        load(tmp_path, DFEDEM, "topology.kind=edges", "topology.edges=/nonexistent")


def resumed(tmp_path, sc, at: int):
    """The run checkpointed after ``at`` rounds on 2 hosts, restored on 3 and run to its end."""
    part = serial_driver(sc, 2)
    for _ in range(at):
        part.step()
    part.save(str(tmp_path / "ck"))
    again = serial_driver(sc, 3)
    assert again.restore(str(tmp_path / "ck")) == at
    for _ in range(sc.rounds - at):
        again.step()
    return again


@pytest.mark.parametrize("extra", [(), ("algorithm.momentum=0.9", "algorithm.keep_momentum=true")])
def test_gossip_checkpoint_resume_is_identical(tmp_path, extra):
    sc = load(tmp_path, DFEDEM, *extra)
    assert strip(resumed(tmp_path, sc, 2).history) == strip(run(sc, 2).history)


def test_sweep_runs_every_topology_and_prints_a_table(tmp_path):
    from tests.test_runs import raysim

    text = DFEDEM.replace("rounds: 4", "rounds: 2") + (
        "sweep:\n  ring: {topology.kind: ring}\n  complete: {topology.kind: complete}\n"
    )
    path = tracked(tmp_path, text)
    out = tmp_path / "sweep.json"
    proc = raysim("run", path, "-q", "--engine", "serial", "--summary", str(out), here=True)
    lines = proc.stdout.strip().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("variant"))
    table = lines[at : at + 3]
    assert table[0].split()[:2] == ["variant", "accuracy"] and table[1].startswith("ring")
    # then the comparison table of the parent's runs (both variants are D-FedEM: one row each)
    assert "| fedem [ring] |" in proc.stdout and "| fedem [complete] |" in proc.stdout
    import json

    s = json.loads(out.read_text())
    assert list(s["variants"]) == ["ring", "complete"]
    ring, complete = s["variants"]["ring"], s["variants"]["complete"]
    assert ring["mlflow_run_id"] != complete["mlflow_run_id"]
    assert complete["history"][-1]["consensus_distance"] < ring["history"][-1]["consensus_distance"]


def test_consensus_distance_is_identical_for_any_number_of_hosts_near_consensus(tmp_path):
    # a complete graph reaches consensus in one mix: the distance is tiny, where mean||theta||^2 -
    # ||mean theta||^2 cancelled catastrophically; computed directly it is the same for 1, 2, 5 hosts
    sc = load(tmp_path, DFEDEM, "topology.kind=complete", "rounds=2")
    runs = [run(sc, h) for h in (1, 2, 5)]
    values = [[h["consensus_distance_0"] for h in d.history] for d in runs]
    assert values[0] == values[1] == values[2]
    assert all(0 <= v < 1e-10 for v in values[0])


def test_fedavg_plus_with_a_topology_tunes_each_clients_own_model(tmp_path):
    text = DFEDEM.replace("algorithm: {name: fedem, components: 2, lr: 0.3,", "algorithm: {name: fedavg+, lr: 0.3,")
    d = run(load(tmp_path, text, "rounds=2"))
    last = d.history[-1]
    assert 0.5 < last["accuracy"] <= 1.0 and "global_accuracy" not in last


def test_a_star_runs_hosts_hold_no_mixing_rows_and_never_import_scipy():
    """A host's mixing rows start empty (no matrix, nothing mixed), so a star run's hosts, which
    never get a plan, do not import SciPy's sparse module (about 9 MB and 0.2 to 0.4 s of a
    process on this machine)."""
    import subprocess
    import sys
    from pathlib import Path

    from raysim.core.mixing import Rows

    empty = Rows({})
    assert empty.cids == [] and empty.matrix is None and empty.mix({}).numel() == 0
    code = (
        "import sys; from raysim.engine.serial import serial_driver; from raysim.scenario import config; "
        "d = serial_driver(config.load(sys.argv[1])); d.step(); d.step(); "
        "print(sorted(m for m in ('scipy', 'scipy.sparse') if m in sys.modules))"
    )
    path = Path(__file__).resolve().parents[1] / "bench" / "tiny.yaml"
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=300,
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_sparse_rows_mix_each_row_on_its_own_and_sums_add_row_by_row():
    """A host's rows of W as one sparse product: a client's mixed vector is bit for bit what
    its row alone gives (whichever other rows the host holds), equal to Σ_j W_ij θ_j by hand;
    the consensus sum adds the rows one after another in float64."""
    from raysim.core.mixing import Rows, squared_distances, squared_distances_rows
    from raysim.core.replies import Accumulator

    g = torch.Generator().manual_seed(0)
    sources = {j: torch.randn(7, generator=g) for j in (0, 2, 5, 9, 11)}
    rows = {2: [(0, 0.25), (2, 0.5), (5, 0.25)], 9: [(5, 1 / 3), (9, 1 / 3), (11, 1 / 3)], 11: [(9, 0.5), (11, 0.5)]}
    together = Rows(rows).mix(sources)
    for k, i in enumerate(sorted(rows)):
        alone = Rows({i: rows[i]}).mix(sources)[0]
        assert torch.equal(together[k], alone)
        by_hand = sum(w * sources[j].double() for j, w in rows[i]).float()
        assert torch.allclose(alone, by_hand, atol=1e-6)
    acc = Accumulator()
    acc.add_rows(together)
    one_by_one = Accumulator()
    for r in together:
        one_by_one.add(r)
    assert torch.equal(acc.result(), one_by_one.result()) and acc.count == one_by_one.count == 3
    mean = together.mean(0)
    per_row = squared_distances_rows(together, mean, [3, 4])
    assert per_row[1].tolist() == squared_distances(together[1], mean, [3, 4])
    assert per_row[1][0] == pytest.approx(float(((together[1, :3].double() - mean[:3].double()) ** 2).sum()))


DSGD = DFEDEM.replace("algorithm: {name: fedem, components: 2, lr: 0.3,", "algorithm: {name: fedavg, lr: 0.3,").replace(
    "  min_samples: 40\n  max_samples: 40\n", "  min_samples: 20\n  max_samples: 70\n"
)  # ragged: 2-5 batches


def states_of(d):
    """Each client's tensors (its server copy's and its state's), in a fixed order."""
    from raysim.engine.trees import tree_map

    def leaves(tree):
        out = []
        tree_map(lambda t: out.append(t.clone()), tree)
        return out

    return {c: leaves(s) for c, s in d.transport.get_states().items()}


@pytest.mark.parametrize(
    "extra",
    [
        ("topology.kind=ring",),
        (
            "algorithm.name=fedprox",
            "algorithm.mu=0.5",
            "algorithm.local_epochs=2",
            "algorithm.momentum=0.9",
            "topology.resample=true",
            "topology.weighting=samples",
        ),
    ],
)
def test_rows_path_gives_the_numbers_of_the_per_client_steps(tmp_path, monkeypatch, extra):
    """D-SGD and decentralized FedProx with a host's clients as rows of one matrix
    (``train_rows``) against the same runs client by client (the host-level path switched
    off): ragged clients (their jobs sorted by length inside the loop), momentum, two epochs,
    a graph redrawn each round, sample-weighted mixing, 1 and 3 hosts: every metric and every
    client's model equal, bit for bit."""
    from raysim.engine import host

    sc = load(tmp_path, DSGD, *extra)
    assert host.ROWS
    rows = [run(sc, h) for h in (1, 3)]
    assert rows[0].transport.hosts[0]._F is not None  # the path under test ran
    monkeypatch.setattr(host, "ROWS", False)
    each = run(sc, 3)
    assert each.transport.hosts[0]._F is None
    assert strip(rows[0].history) == strip(rows[1].history) == strip(each.history)
    assert rows[0].history[-1]["accuracy"] > 0.6
    a, b = states_of(rows[1]), states_of(each)
    assert a.keys() == b.keys() == set(range(12))
    assert all(torch.equal(x, y) for c in a for x, y in zip(a[c], b[c]))


def test_rows_checkpoint_resume_is_identical(tmp_path):
    """A checkpoint of hosts holding rows (each client's model written as a copy of its row)
    restores into rows, on another number of hosts, and the run goes on as if never stopped."""
    sc = load(tmp_path, DSGD)
    again = resumed(tmp_path, sc, 2)
    assert strip(again.history) == strip(run(sc, 2).history)
    one = next(iter(again.transport.hosts[0].get_states().values()))["server"][0]
    assert one.untyped_storage().nbytes() == one.numel() * one.element_size()  # a copy, not a view of the matrix


def test_which_methods_train_as_rows():
    """``train_rows`` stands for the per-client steps only where none of them is overridden
    below the class that defines it: FedProx (its own proximal constants) keeps it; Ditto and
    a subclass with its own aggregate do not; FedEM (client state) has none."""
    from algorithms.ditto import Ditto
    from algorithms.fedavg import FedAvg
    from algorithms.fedem import FedEM
    from algorithms.fedprox import FedProx

    class OwnAggregate(FedAvg):
        def aggregate(self, server, reduced, round_):
            return server

    assert FedAvg.has_rows() and FedProx.has_rows()
    assert not Ditto.has_rows() and not OwnAggregate.has_rows() and not FedEM.has_rows()


def test_failed_links_and_down_clients_by_hand():
    """``surviving``: client draws first, then one draw per edge in order; a down client's links
    go with it. Metropolis on a path 0-1-2 whose link 1-2 failed: 0 and 1 average, 2 keeps its own."""
    import numpy as np

    from raysim.federation import topology

    edges = np.array([[0, 1], [1, 2], [2, 3], [3, 0]])
    g = np.random.default_rng(5)
    down_draw, edge_draw = g.random(4), g.random(4)
    kept, down = topology.surviving(edges, 4, 0.5, 0.3, np.random.default_rng(5))
    assert down.tolist() == (down_draw < 0.3).tolist()
    want = [e for e, f in zip(edges.tolist(), edge_draw) if f >= 0.5 and not down[e[0]] and not down[e[1]]]
    assert kept.tolist() == want
    path = np.array([[0, 1]])  # 0-1-2 with 1-2 failed
    w = topology.from_edge_weights(3, path, topology.metropolis_weights(3, path)).toarray()
    assert w.tolist() == [[0.5, 0.5, 0.0], [0.5, 0.5, 0.0], [0.0, 0.0, 1.0]]


@pytest.mark.parametrize("text", [DFEDEM, DSGD], ids=["dfedem", "dsgd-rows"])
def test_unreliable_gossip_rebuilds_w_and_down_clients_keep_their_models(tmp_path, text):
    """Links failing with 0.3 and clients down with 0.2 each round: W is Metropolis on the
    round's working links, a down client neither trains nor mixes (its model unchanged), and
    the run is the same on 1 and 3 hosts."""
    import numpy as np

    from raysim import rng
    from raysim.federation import topology

    sc = load(tmp_path, text, "topology.link_failure=0.3", "topology.node_failure=0.2", "rounds=3")
    d = serial_driver(sc, 3)
    d.step()
    before = states_of(d)
    rec = d.step()
    base = topology.edge_array(topology.scenario_graph(sc.topology, 12, sc.seed))
    kept, down = topology.surviving(base, 12, 0.3, 0.2, rng.generator(sc.seed, "failures", 1))
    want = topology.from_edge_weights(12, kept, topology.metropolis_weights(12, kept)).toarray()
    assert np.array_equal(d.W.toarray(), want) and d.down.tolist() == down.tolist()
    assert rec["clients"] == 12 - down.sum() and rec["clients_down"] == down.sum()
    assert rec["links_failed"] == len(base) - len(kept) > 0
    after = states_of(d)
    for c in np.flatnonzero(down).tolist():
        assert all(torch.equal(a, b) for a, b in zip(before[c], after[c]))
    assert any(not all(torch.equal(a, b) for a, b in zip(before[c], after[c])) for c in range(12) if not down[c])
    d.step()
    assert strip(d.history) == strip(run(sc, 1).history)
