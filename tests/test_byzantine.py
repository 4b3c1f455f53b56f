"""Byzantine clients in a run (scenario sections ``adversary`` and ``defence``): the server's
round on each client's reply checked by hand, the one-line errors of bad settings, the malicious
clients' poisoned data, and end to end on the serial engine: the same metrics on 1 and 3 hosts and
across a resume, a backdoor that succeeds under FedAvg and fails under Krum."""

import numpy as np
import pytest
import torch

from raysim.core.data import ClientData
from raysim.core.replies import Accumulator, ByKey, Weighted
from raysim.engine.serial import serial_driver
from raysim.federation import adversary
from raysim.federation.robust_round import RobustRound, at, parts, replaced
from raysim.scenario import config
from raysim.scenario.config import ScenarioError
from tests.conftest import TINY, write_scenario

DIGITS = """
name: digits-byz
seed: 0
rounds: 20
data: {dataset: digits, clients: 20, partition: {kind: dirichlet, alpha: 100.0}}
model: {name: mlp, hidden: [32]}
algorithm: {name: fedavg, lr: 0.1, batch_size: 16, local_epochs: 2}
eval: {every: 10}
resources: {hosts: 2, cpus_per_host: 1}
"""


def load(tmp_path, text, *overrides):
    return config.load(write_scenario(tmp_path, text), list(overrides))


def accs(*replies):
    out = {}
    for cid, reply in replies:
        out[cid] = Accumulator()
        out[cid].add(reply)
    return out


def t(*v):
    return torch.tensor(v, dtype=torch.float32)


# ----------------------------------------------------------------------------- the reply's parts


def test_parts_walk_lists_and_keys_and_replace_them():
    reply = ([Weighted([t(1.0)], 1.0), Weighted([t(2.0)], 2.0)], ByKey({3: Weighted([t(3.0)], 1.0)}), 7.0)
    found = [p for p, _ in parts(reply)]
    assert found == [(0, 0), (0, 1), (1, 3)]
    assert at(reply, (1, 3)).values[0].item() == 3.0
    assert at(ByKey({0: 1}), (2,)) is None  # a key the client did not send
    new = replaced(reply, {(1, 3): Weighted([t(9.0)], 1.0)})
    assert new[1][3].values[0].item() == 9.0 and new[0][1].values[0].item() == 2.0 and new[2] == 7.0


# ----------------------------------------------------------------------------- the round by hand


def test_sign_flip_under_fedavg_mean_by_hand(tmp_path):
    sc = load(tmp_path, TINY, "adversary={clients: [2], attack: sign_flip}")
    rr = RobustRound(sc, np.arange(12))
    theta = [t(1.0, 1.0)]
    replies = accs(
        (0, Weighted([t(2.0, 1.0)], 1.0)), (1, Weighted([t(1.0, 3.0)], 2.0)), (2, Weighted([t(0.0, 0.0)], 3.0))
    )
    reduced, metrics = rr.reduce(0, replies, theta)
    # updates (1, 0), (0, 2) and the attacker's −(−1, −1) = (1, 1), weighted 1, 2, 3:
    # (1·(1, 0) + 2·(0, 2) + 3·(1, 1)) / 6 = (4/6, 7/6), plus θ
    assert reduced.weight == 6.0
    assert torch.allclose(reduced.mean(torch.float64)[0], torch.tensor([10 / 6, 13 / 6], dtype=torch.float64))
    assert metrics["malicious"] == 1.0


def test_median_keeps_integer_tensors_summed(tmp_path):
    sc = load(tmp_path, TINY, "defence=median")
    rr = RobustRound(sc, np.arange(12))
    count = torch.tensor(5, dtype=torch.int64)  # a batch-norm counter: no update, summed as it is
    theta = [t(1.0, 1.0), count]
    replies = accs(
        (0, Weighted([t(2.0, 1.0), count], 1.0)),
        (1, Weighted([t(1.0, 3.0), count], 2.0)),
        (2, Weighted([t(0.0, 0.0), count], 3.0)),
    )
    reduced, _ = rr.reduce(0, replies, theta)
    # coordinate-wise median of (1, 0), (0, 2), (−1, −1) is (0, 0): the model stays at θ
    mean = reduced.mean(torch.float64)
    assert mean[0].tolist() == [1.0, 1.0]
    assert mean[1].item() == 5.0


def test_multi_krum_flags_the_attacker_and_scores_detection(tmp_path):
    sc = load(tmp_path, TINY, "adversary={clients: [4], attack: sign_flip}", "defence={rule: multi_krum, f: 1}")
    rr = RobustRound(sc, np.arange(12))
    theta = [t(0.0, 0.0)]
    honest = [(0.1, 0.0), (0.0, 0.1), (-0.1, 0.0), (0.0, -0.1)]
    replies = accs(*[(c, Weighted([t(*u)], 1.0)) for c, u in enumerate(honest)], (4, Weighted([t(10.0, 10.0)], 1.0)))
    reduced, metrics = rr.reduce(0, replies, theta)
    # Multi-Krum keeps the K − f = 4 lowest scores, the honest ones: their mean is (0, 0)
    assert torch.allclose(reduced.mean(torch.float64)[0], torch.zeros(2, dtype=torch.float64), atol=1e-7)
    assert metrics["flagged"] == 1.0
    assert metrics["detection_precision"] == 1.0 and metrics["detection_recall"] == 1.0


def test_a_cluster_part_too_small_for_the_rule_falls_back_to_the_median(tmp_path):
    sc = load(tmp_path, TINY, "defence={rule: krum, f: 1}")
    rr = RobustRound(sc, np.arange(12))
    origin = [[t(0.0)], [t(10.0)]]
    rows = [(c, ByKey({0: Weighted([t(v)], 1.0)})) for c, v in enumerate((0.0, 1.0, 1.5, 3.0, 10.0))]
    rows += [(5, ByKey({1: Weighted([t(11.0)], 1.0)})), (6, ByKey({1: Weighted([t(13.0)], 1.0)}))]
    reduced, metrics = rr.reduce(0, accs(*rows), origin)
    # cluster 0: f = ⌈1·5/7⌉ = 1, Krum's scores on the K − f − 2 = 2 nearest squared distances:
    # 0: 1 + 2.25, 1: 0.25 + 1, 1.5: 0.25 + 2.25, 3: 2.25 + 4, 10: 49 + 64, so client 1's model 1.0;
    # cluster 1: 2 clients, Krum cannot run: the median (1 + 3)/2 = 2 above θ = 10
    assert reduced[0].mean(torch.float64)[0].item() == 1.0
    assert reduced[1].mean(torch.float64)[0].item() == 12.0
    assert metrics["defence_fallbacks"] == 1.0


# ----------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            ["sampling.fraction=1.0", "adversary={fraction: 0.5, attack: sign_flip}", "defence=krum"],
            "defence.rule: krum",
        ),
        (
            ["sampling.fraction=1.0", "adversary={fraction: 0.25, attack: sign_flip}", "defence=bulyan"],
            "defence.rule: bulyan",
        ),
        (["algorithm.name=local", "adversary={attack: alie}"], "algorithm.name: 'local' does not reply with models"),
        (["algorithm.name=pfedhn", "defence=median"], "algorithm.name: 'pfedhn' does not reply with models"),
        (["adversary={attack: nothing}"], "adversary.attack.name: 'nothing' is not one of the choices"),
        (["adversary={attack: {name: alie, estimate: both}}"], "adversary.attack.estimate"),
        (["adversary={fraction: 0.2}"], "adversary.attack: missing"),
        (["adversary={clients: [99], attack: sign_flip}"], "adversary.clients: 99 is not a client id"),
        (["defence={rule: trimmed_mean, beta: 0.7}"], "defence.beta"),
        (["defence={rule: krum, preaggregate: {kind: bucketing, s: 3}}"], "defence.rule: krum"),
        (["defence=fltrust"], "defence.rule: fltrust carves its root set from a pooled dataset's pool; synthetic"),
        (["algorithm={name: fedem, lr: 0.1}", "defence=fltrust"], "fltrust scores each update against the server's"),
        (["privacy={clip: 1.0, noise_multiplier: 0.0}", "defence=median"], "defence: privacy transforms"),
        (["adversary={attack: backdoor}"], "adversary.attack.name: backdoor stamps a trigger on images"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, overrides, words):
    with pytest.raises(ScenarioError) as e:
        load(tmp_path, TINY, *overrides)
    msg = str(e.value)
    assert words in msg, msg
    assert "\n" not in msg


def test_krum_message_names_the_assumed_share(tmp_path):
    with pytest.raises(ScenarioError) as e:
        load(tmp_path, TINY, "sampling.fraction=1.0", "adversary={fraction: 0.5, attack: sign_flip}", "defence=krum")
    assert "f is the adversary's 6 of the round's 12" in str(e.value)


# ----------------------------------------------------------------------------- the malicious clients


def test_malicious_clients_are_drawn_from_the_seed_among_training_clients(tmp_path):
    sc = load(tmp_path, TINY, "adversary={fraction: 0.25, attack: sign_flip}")
    ids = adversary.malicious_ids(sc, np.arange(12))
    assert len(ids) == 3 and list(ids) == sorted(ids)
    assert list(adversary.malicious_ids(sc, np.arange(12))) == list(ids)
    other = load(tmp_path, TINY, "seed=1", "adversary={fraction: 0.25, attack: sign_flip}")
    assert list(adversary.malicious_ids(other, np.arange(12))) != list(ids)


def test_always_puts_every_malicious_client_in_every_round(tmp_path):
    sc = load(tmp_path, TINY, "adversary={clients: [3, 7], participation: always, attack: sign_flip}")
    d = serial_driver(sc, 2)
    for _ in range(3):
        rec = d.step()
        assert rec["clients"] == 6.0 and rec["malicious"] == 2.0


def test_label_flip_poisons_only_the_malicious_clients_training_labels(tmp_path):
    sc = load(tmp_path, DIGITS, "adversary={clients: [1], attack: label_flip}")
    d = serial_driver(sc, 2)
    host = {c: h for h in d.transport.hosts for c in h.cids}
    clean = d.source.client(1)
    bad = host[1].data(1)
    assert torch.equal(bad.train_y, 9 - clean.train_y)  # reverse: y → C − 1 − y
    assert torch.equal(bad.test_y, clean.test_y)  # its test split is not touched
    assert torch.equal(host[0].data(0).train_y, d.source.client(0).train_y)


def test_triggered_test_set_stamps_the_non_target_inputs(tmp_path):
    sc = load(tmp_path, DIGITS, "adversary={fraction: 0.2, attack: {name: backdoor, size: 2, target: 3}}")
    x = torch.zeros(3, 64)
    data = ClientData(0, x, torch.tensor([0, 1, 2]), x[:0], torch.tensor([]), x, torch.tensor([3, 5, 1]))
    trig = adversary.triggered(sc, data, (8, 8))
    assert trig.test_y.tolist() == [3, 3]  # the input of the target class is left out
    img = trig.test_x.view(2, 8, 8)
    assert img[:, 6:, 6:].eq(1.0).all() and img.sum().item() == 2 * 4  # a 2 × 2 white square, bottom right


# ----------------------------------------------------------------------------- end to end


def strip(history):
    return [{k: v for k, v in h.items() if "seconds" not in k and "bytes" not in k} for h in history]


def run(sc, hosts, rounds=None):
    d = serial_driver(sc, hosts)
    for _ in range(rounds or sc.rounds):
        d.step()
    return d


def test_same_metrics_on_one_and_three_hosts_with_attack_and_defence(tmp_path):
    sc = load(
        tmp_path,
        DIGITS,
        "rounds=4",
        "sampling.fraction=0.5",
        "adversary={fraction: 0.2, attack: alie}",
        "defence={rule: trimmed_mean, preaggregate: {kind: bucketing, s: 2}}",
    )
    a, b = run(sc, 1), run(sc, 3)
    assert strip(a.history) == strip(b.history)
    assert a.history[-1]["attack_z"] > 0


def test_resume_gives_the_uninterrupted_run_with_stateful_attack_and_defence(tmp_path):
    sc = load(
        tmp_path,
        DIGITS,
        "rounds=4",
        "adversary={fraction: 0.2, attack: {name: mimic, warmup: 3}}",
        "defence={rule: centered_clipping, tau: 1.0}",
    )
    whole = run(sc, 2)
    first = run(sc, 2, rounds=2)
    first.save(str(tmp_path / "ck"))
    again = serial_driver(sc, 3)
    again.restore(str(tmp_path / "ck"))
    for _ in range(2):
        again.step()
    assert strip(again.history) == strip(whole.history)


def test_a_backdoor_succeeds_under_fedavg_and_krum_stops_it(tmp_path):
    attack = "adversary={fraction: 0.2, attack: {name: backdoor, size: 2}}"
    fedavg = run(load(tmp_path, DIGITS, attack), 2).history[-1]
    krum = run(load(tmp_path, DIGITS, attack, "defence=krum"), 2).history[-1]
    clean = run(load(tmp_path, DIGITS, "adversary={fraction: 0.0, attack: {name: backdoor, size: 2}}"), 2).history[-1]
    assert clean["attack_success_rate"] < 0.2  # the trigger alone does not make the target
    assert fedavg["attack_success_rate"] > 0.8
    assert krum["attack_success_rate"] < 0.2
    assert krum["detection_recall"] > 0.5
    assert fedavg["honest_accuracy"] > 0.7  # the replaced model still classifies clean inputs


def test_sign_flip_hurts_fedavg_and_the_median_resists_it(tmp_path):
    flip = "adversary={fraction: 0.3, attack: {name: sign_flip, s: 4.0}}"
    clean = run(load(tmp_path, DIGITS), 2).history[-1]["accuracy"]
    fedavg = run(load(tmp_path, DIGITS, flip), 2).history[-1]["honest_accuracy"]
    median = run(load(tmp_path, DIGITS, flip, "defence=median"), 2).history[-1]["honest_accuracy"]
    assert clean > 0.85
    assert fedavg < 0.5 * clean
    assert median > clean - 0.1


def test_the_command_on_ray_hosts_matches_the_serial_engine_and_resumes(tmp_path):
    from tests.test_runs import raysim, summary_of, tracked

    text = DIGITS.replace("rounds: 20", "rounds: 4").replace("every: 10", "every: 2")
    text += "sampling: {fraction: 0.5}\nadversary: {fraction: 0.2, attack: min_max}\ndefence: {rule: dnc, niters: 2, b: 500}\n"
    path = tracked(tmp_path, text)
    keys = ("train_loss", "malicious", "attack_gamma", "flagged", "honest_accuracy", "accuracy")
    pick = lambda s: [{k: h.get(k) for k in keys} for h in s["history"]]  # noqa: E731
    serial = summary_of(tmp_path, path, "--engine", "serial", "--set", "resources.hosts=1", name="serial.json")
    proc = raysim(
        "run",
        path,
        "-q",
        "--set",
        "resources.hosts=3",
        "--set",
        "resources.cpus_per_host=0.5",
        env={"RAYSIM_FAIL_AFTER_ROUND": "2"},
        check=False,
    )
    assert proc.returncode == 1 and "injected failure after round 2" in proc.stderr
    failed = proc.stderr.split("--resume ")[-1].split()[0]
    resumed = summary_of(
        tmp_path,
        path,
        "--set",
        "resources.hosts=3",
        "--set",
        "resources.cpus_per_host=0.5",
        "--resume",
        failed,
        name="ray.json",
    )
    assert resumed["final"] == serial["final"] and pick(resumed) == pick(serial)
    assert serial["final"]["honest_accuracy"] > 0.3 and "attack_gamma" in serial["history"][-1]


def test_a_bad_setting_exits_2_with_one_line(tmp_path):
    from tests.test_runs import raysim

    path = write_scenario(
        tmp_path, TINY + "sampling: {fraction: 1.0}\nadversary: {fraction: 0.5, attack: ipm}\ndefence: krum\n"
    )
    proc = raysim("run", path, "-q", "--engine", "serial", check=False, here=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and ": defence.rule: krum needs" in lines[0], proc.stderr


def test_a_listed_adversary_and_a_preaggregated_defence_resolve_back_to_the_same_scenario(tmp_path):
    import dataclasses
    import json

    sc = load(
        tmp_path,
        TINY
        + "sampling: {fraction: 1.0}\nadversary: {clients: [3, 1], participation: always, attack: {name: alie, z: 1.5}}\n"
        + "defence: {rule: trimmed_mean, beta: 0.25, preaggregate: {kind: bucketing, s: 2}}\n",
    )
    full = json.loads(json.dumps(config.resolved(sc)))
    assert full["adversary"]["fraction"] is None and full["adversary"]["clients"] == [3, 1]
    assert full["adversary"]["attack"] == {"name": "alie", "z": 1.5, "estimate": "benign"}  # its default shown
    assert full["defence"]["rule"] == "trimmed_mean" and full["defence"]["beta"] == 0.25
    assert full["defence"]["preaggregate"] == {"kind": "bucketing", "s": 2, "weighted": False}
    back = config.validate(full, sc.path, check_data=False)
    assert dataclasses.replace(back, raw=sc.raw) == sc


def test_the_grid_figure_and_tables_average_a_cell_over_its_seeds(tmp_path):
    from raysim.results.byzantine import byzantine_figure
    from raysim.results.curves import Compared

    def run(attack, fraction, rule, acc, asr=None):
        final = {"honest_accuracy": acc, **({} if asr is None else {"attack_success_rate": asr})}
        sc = {
            "algorithm": {"name": "fedavg"},
            "data": {"clients": 10},
            "adversary": {"fraction": fraction, "clients": None, "attack": {"name": attack}},
            "defence": {"rule": rule},
        }
        return Compared({"final": final}, sc)

    runs = [
        run("sign_flip", 0.0, "mean", 0.90),
        run("sign_flip", 0.0, "mean", 0.80),  # a second seed: the clean cell is 0.85
        run("sign_flip", 0.2, "mean", 0.40),
        run("sign_flip", 0.2, "mean", 0.50),
        run("sign_flip", 0.2, "median", 0.70),
        run("backdoor", 0.2, "mean", 0.88, asr=0.9),
        run("backdoor", 0.2, "mean", 0.86, asr=0.7),
        Compared({"final": {"accuracy": 0.9}}, {"algorithm": {"name": "fedavg"}}),  # no adversary: left out
    ]
    png = byzantine_figure(runs, tmp_path)
    assert png == tmp_path / "byzantine.png" and png.stat().st_size > 10_000
    rows = (tmp_path / "byzantine.csv").read_text().splitlines()
    assert rows[0].startswith("attack,method / defence,malicious_percent,honest_accuracy")
    assert "sign_flip,fedavg / mean,20.0,0.45,,2" in rows and "backdoor,fedavg / mean,20.0,0.87,0.8,2" in rows
    md = (tmp_path / "byzantine.md").read_text()
    assert md.startswith("Malicious clients: 20 %")
    assert "| fedavg / mean | 0.850 | 0.450 | 0.870 (ASR 0.80) |" in md
    assert "| fedavg / median |  | 0.700 |  |" in md
    assert byzantine_figure(runs[-1:], tmp_path / "none") is None


# ----------------------------------------------------------------------------- FLTrust's root set


def test_the_root_set_is_carved_from_the_pool_before_the_partition(tmp_path):
    from raysim.scenario.probe import make_source

    sc = load(tmp_path, DIGITS, "defence={rule: fltrust, root_size: 100}")
    source = make_source(sc)
    held = np.concatenate([source._indices(c) for c in range(20)])
    root = source.root_set(20)
    assert root.num_train == 100 and len(source._root) == 100 and root.cid == 20
    assert len(held) == 1797 - 100 and not set(held.tolist()) & set(source._root.tolist())
    again = make_source(sc)
    assert again.root_set(20).train_y.tolist() == root.train_y.tolist()  # drawn from (seed, "root")
    plain = make_source(load(tmp_path, DIGITS))
    assert sum(plain.num_samples(c) for c in range(20)) == 1797


def test_fltrust_resists_sign_flip_and_gives_the_same_metrics_on_one_and_three_hosts(tmp_path):
    flip = "adversary={fraction: 0.3, attack: {name: sign_flip, s: 4}}"
    sc = load(tmp_path, DIGITS, flip, "defence=fltrust")
    one, three = run(sc, 1), run(sc, 3)
    assert strip(one.history) == strip(three.history)
    clean = run(load(tmp_path, DIGITS), 2).history[-1]["accuracy"]
    fedavg = run(load(tmp_path, DIGITS, flip), 2).history[-1]["honest_accuracy"]
    last = one.history[-1]
    # measured: clean 0.93, FedAvg under the attack 0.10, FLTrust 0.94
    assert fedavg < 0.5 * clean and last["honest_accuracy"] > clean - 0.05
    assert last["detection_recall"] == 1.0  # every flipped update has a negative cosine with g_0
