"""Engine semantics on the serial engine (fast): sampling, reduction, evaluation, checkpoints."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from raysim.engine import checkpoint
from raysim.engine.driver import sample_clients, split_unseen, summarize
from raysim.engine.serial import serial_driver
from raysim.scenario import config
from tests.conftest import TINY, write_scenario


def scenario(tmp_path, *overrides):
    return config.load(write_scenario(tmp_path, TINY), list(overrides))


def strip_times(history):
    return [{k: v for k, v in h.items() if "seconds" not in k and "bytes" not in k} for h in history]


def run_serial(sc, hosts):
    d = serial_driver(sc, hosts)
    for _ in range(sc.rounds):
        d.step()
    return d


def test_same_metrics_for_one_or_three_hosts(tmp_path):
    sc = scenario(tmp_path)
    a, b = run_serial(sc, 1), run_serial(sc, 3)
    assert strip_times(a.history) == strip_times(b.history)
    for x, y in zip(a.server_state, b.server_state):
        assert torch.equal(x, y)


def test_local_state_persists_and_is_host_count_independent(tmp_path):
    sc = scenario(tmp_path, "algorithm.name=local", "sampling.fraction=1.0")
    a, b = run_serial(sc, 1), run_serial(sc, 4)
    assert strip_times(a.history) == strip_times(b.history)
    states = a.transport.get_states()
    assert sorted(states) == list(range(12))  # every client kept its own model
    assert not torch.equal(states[0]["state"]["params"][0], states[1]["state"]["params"][0])


def test_sampling_is_seeded_per_round_and_sorted(tmp_path):
    sc = scenario(tmp_path)
    ids = np.arange(12)
    r0, r0b, r1 = sample_clients(sc, ids, 0), sample_clients(sc, ids, 0), sample_clients(sc, ids, 1)
    assert len(r0) == 6 and list(r0) == sorted(r0) and np.array_equal(r0, r0b)
    assert not np.array_equal(r0, r1)
    sc2 = scenario(tmp_path, "sampling={count: 4}")
    assert len(sample_clients(sc2, ids, 0)) == 4


def test_unseen_clients_never_train(tmp_path):
    sc = scenario(tmp_path, "eval.unseen_fraction=0.25", "sampling.fraction=1.0", "algorithm.name=local")
    train_ids, unseen = split_unseen(sc)
    assert len(unseen) == 3 and set(train_ids) | set(unseen) == set(range(12))
    d = run_serial(sc, 2)
    assert set(d.transport.get_states()) == set(train_ids.tolist())
    assert "unseen_accuracy" in d.history[-1]


def test_summarize_weighted_mean_and_bottom_decile_of_every_metric():
    # accuracies 0, .1, ..., 1 and losses 1, .9, ..., 0 on 10 test samples each
    res = {c: ({"accuracy": c / 10, "test_loss": 1 - c / 10}, 10) for c in range(11)}
    s = summarize(res)
    assert s["accuracy"] == pytest.approx(0.5) and s["test_loss"] == pytest.approx(0.5)
    assert s["bottom_decile_accuracy"] == pytest.approx(0.1)
    assert s["bottom_decile_test_loss"] == pytest.approx(0.9)  # lower is better: the 90th percentile
    # weighted by test size; a client without a test split (weight 0) does not count
    weighted = summarize({0: ({"accuracy": 1.0}, 1), 1: ({"accuracy": 0.0}, 3), 2: ({"accuracy": 1.0}, 0)})
    assert weighted["accuracy"] == pytest.approx(0.25)
    # a metric only some clients report (e.g. per cluster) averages over those clients
    some = summarize({0: ({"accuracy": 1.0, "cluster_mse": 2.0}, 1), 1: ({"accuracy": 0.0}, 1)}, "unseen_")
    assert some["unseen_cluster_mse"] == 2.0 and some["unseen_accuracy"] == 0.5


def test_eval_every_and_final_round(tmp_path):
    sc = scenario(tmp_path, "rounds=5", "eval.every=2")
    d = run_serial(sc, 2)
    evaluated = [h["round"] for h in d.history if "accuracy" in h]
    assert evaluated == [2, 4, 5]


def test_checkpoint_roundtrip_continues_identically(tmp_path):
    sc = scenario(tmp_path, "rounds=4", "algorithm.name=local")
    full = run_serial(sc, 2)
    part = serial_driver(sc, 2)
    part.step(), part.step()
    path = tmp_path / "ck"
    part.save(str(path))
    resumed = serial_driver(sc, 3)  # another host count, fresh process state
    assert resumed.restore(str(path)) == 2
    resumed.step(), resumed.step()
    assert strip_times(resumed.history) == strip_times(full.history)


def test_checkpoint_is_one_file_per_host_and_an_atomic_manifest(tmp_path, monkeypatch):
    import json

    sc = scenario(tmp_path, "rounds=4", "algorithm.name=local", "sampling.fraction=1.0")
    full = run_serial(sc, 2)
    d = serial_driver(sc, 3)
    d.step(), d.step()
    folder = tmp_path / "ck"
    d.save(str(folder))
    doc = json.loads((folder / "manifest.json").read_text())
    assert doc["round"] == 2 and doc["folder"] == "round-00000002"
    assert [h["file"] for h in doc["hosts"]] == ["host-0.pt", "host-1.pt", "host-2.pt"]
    for h, entry in enumerate(doc["hosts"]):  # each host wrote exactly its own clients
        assert entry["clients"] == d.transport.placement.clients(h)
        assert sorted(checkpoint.load(folder / doc["folder"] / entry["file"])["states"]) == entry["clients"]
    assert sorted(c for e in doc["hosts"] for c in e["clients"]) == list(range(12))
    assert "clients" not in checkpoint.load(folder / doc["folder"] / "server.pt")  # no gathered models
    d.step()
    monkeypatch.setattr(checkpoint, "commit", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):  # a crash before the manifest is replaced
        d.save(str(folder))
    monkeypatch.undo()
    assert checkpoint.manifest(folder)["round"] == 2  # the last complete round still stands
    resumed = serial_driver(sc, 2)
    assert resumed.restore(str(folder)) == 2
    resumed.step(), resumed.step()
    assert strip_times(resumed.history) == strip_times(full.history)
    resumed.save(str(folder))
    assert sorted(p.name for p in folder.glob("round-*")) == ["round-00000004"]  # older rounds removed


def test_hosts_that_do_not_see_the_checkpoint_folder_hand_their_states_over(tmp_path, monkeypatch):
    from raysim.engine import host as host_module

    sc = scenario(tmp_path, "rounds=4", "algorithm.name=local", "sampling.fraction=1.0")
    full = run_serial(sc, 2)
    d = serial_driver(sc, 2)
    d.step(), d.step()
    monkeypatch.setattr(host_module.checkpoint, "visible", lambda folder, token: False)  # another node
    d.save(str(tmp_path / "ck"))
    resumed = serial_driver(sc, 3)
    assert resumed.restore(str(tmp_path / "ck")) == 2
    resumed.step(), resumed.step()
    assert strip_times(resumed.history) == strip_times(full.history)


def test_placement_balances_samples_largest_first_deterministically():
    from raysim.engine.driver import Placement

    # sizes 10, 1, 1, 8, 2 on 2 hosts: 10 -> h0, 8 -> h1, 2 -> h1 (8 < 10), then the two 1s:
    # loads tie at 10/10, so client 1 -> h0 (lower index), client 2 -> h1: 11 and 11 samples
    p = Placement.balanced([10, 1, 1, 8, 2], 2)
    assert p.owner.tolist() == [0, 0, 1, 1, 1]
    assert p.clients(0) == [0, 1] and p.clients(1) == [2, 3, 4]
    # round robin would give 13 and 9; equal sizes give round robin
    assert Placement.round_robin(5, 2).owner.tolist() == [0, 1, 0, 1, 0]
    assert Placement.balanced([3] * 5, 2).owner.tolist() == [0, 1, 0, 1, 0]


def test_checkpoint_is_loaded_weights_only(tmp_path, capsys):
    import pickle

    path = tmp_path / "evil.pt"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"x": Evil()}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        checkpoint.load(path)
    assert "pwned" not in capsys.readouterr().out  # the reduce never ran


def test_gpu_fraction_selects_cuda_when_present(monkeypatch):
    from raysim.engine import host

    assert host.pick_device(0.0).type == "cpu"
    monkeypatch.setattr(host.torch.cuda, "is_available", lambda: True)
    assert host.pick_device(0.25).type == "cuda"
    assert host.pick_device(0.0).type == "cpu"
    monkeypatch.setattr(host.torch.cuda, "is_available", lambda: False)
    assert host.pick_device(0.5).type == "cpu"  # asked for a GPU, none visible: CPU


def test_eval_clients_scores_one_seeded_sample_for_the_whole_run(tmp_path):
    from raysim.engine.driver import eval_sample, split_unseen
    from raysim.engine.serial import serial_driver
    from raysim.scenario.config import load
    from tests.conftest import TINY, write_scenario

    path = write_scenario(tmp_path, TINY.replace("eval: {every: 1}", "eval: {every: 1, clients: 0.25}"))
    sc = load(path)
    train, _ = split_unseen(sc)
    chosen = eval_sample(sc, train)
    assert len(chosen) == 3 and set(chosen) <= set(train)  # 25 % of 12
    assert list(chosen) == list(eval_sample(load(path), train))  # seeded
    assert len(eval_sample(load(path, ["eval.clients=5"]), train)) == 5  # a count
    assert list(eval_sample(load(path, ["eval.clients=1.0"]), train)) == list(train)
    d = serial_driver(sc)
    d.step()
    got = d.evaluate()
    # the mean over the sample equals the sample's own per-client scores, test-size weighted
    full = serial_driver(load(path, ["eval.clients=null"]))
    full.step()
    per = {}
    for part in full.transport.evaluate(
        full.round, full.eval_message(), [{int(c): 0 for c in g} for g in full._by_host(chosen)], []
    ):
        per.update(part)
    acc = sum(per[c][0]["accuracy"] * per[c][1] for c in chosen) / sum(per[c][1] for c in chosen)
    assert got["accuracy"] == pytest.approx(acc)
    with pytest.raises(config.ScenarioError, match="eval.clients: 2.5: a count"):
        load(path, ["eval.clients=2.5"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_a_host_hands_the_heap_memory_freed_in_a_round_back_to_the_system(tmp_path, monkeypatch):
    """glibc keeps freed memory on its heap: 200 blocks of 1 MB freed between blocks still held
    (64 KB each) stay resident, about 200 MB, until ``release_freed_memory`` trims the heap; a
    host calls it after each round's training and its evaluation (the memory of the round's
    stacked passes)."""
    code = """
import json, numpy as np, psutil
from raysim.engine.host import release_freed_memory
uss = lambda: psutil.Process().memory_full_info().uss / 2**20
big = np.ones(8 * 2**20 // 8); del big      # freed: glibc then keeps blocks up to 8 MB on its heap
held, freed = [], []
for _ in range(200):
    freed.append(np.ones(2**20 // 8)); held.append(np.ones(2**16 // 8))
del freed
before = uss(); release_freed_memory(collect=False); after = uss()
print(json.dumps(before - after))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 150 <= json.loads(out.stdout.strip().splitlines()[-1]) <= 260
    from raysim.engine import host as host_mod

    calls = []
    monkeypatch.setattr(host_mod, "release_freed_memory", lambda collect=True: calls.append(collect))
    run_serial(scenario(tmp_path), 1)  # one host: 3 rounds, each trained and evaluated
    assert calls.count(False) == 3 + 3


def test_an_actor_that_could_not_be_created_is_reported_with_its_error_not_as_a_sigkill():
    """Ray's error for an actor whose creation raised (here: its plugin's module does not import
    on that node) named it a process killed by SIGKILL or the OOM killer."""
    from ray.exceptions import ActorDiedError, RayTaskError

    from raysim.engine.ray_engine import _cause

    tb = (
        'Traceback (most recent call last):\n  File "/srv/plug/mymodels.py", line 7, in <module>\n'
        "    import missing_dep\nModuleNotFoundError: No module named 'missing_dep'"
    )
    cause = ModuleNotFoundError("No module named 'missing_dep'")
    err = ActorDiedError(RayTaskError("RayHost.__init__", tb, cause, pid=42, ip="10.0.0.2"))
    assert _cause(err) == (
        "its actor could not be created (pid 42 on 10.0.0.2): ModuleNotFoundError: No module "
        "named 'missing_dep' (raised at /srv/plug/mymodels.py:7, in <module>)"
    )
