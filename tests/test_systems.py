"""The simulated fleet on a virtual clock (scenario ``systems``): device times, availability,
dropouts, deadlines, over-selection, and runs identical for any number of hosts."""

import re

import numpy as np
import pytest

from raysim import rng
from raysim.engine.serial import serial_driver
from raysim.experiment.runner import run as run_scenario
from raysim.federation.fleet import MBIT, Fleet, Profiles, TraceError, Windows, read_devices, read_windows
from raysim.scenario.config import ScenarioError
from raysim.scenario.sections import DistCfg, SystemsCfg
from tests.conftest import TINY
from tests.test_gossip import DFEDEM, load, resumed, run
from tests.test_gossip import strip as strip_timings


def strip(history):
    """The records without timings, message counts and bytes (which count per host)."""
    return [{k: v for k, v in h.items() if not k.startswith("bytes_")} for h in strip_timings(history)]


def fleet(**kw) -> Fleet:
    return Fleet(SystemsCfg(**kw), 6, seed=0)


def test_a_clients_time_is_download_work_and_upload_with_latency():
    # client 1: latency 0.05 s each way; 2 MB down at 8 Mbit/s (1 MB/s) = 2 s; 300 samples at
    # 100 samples/s = 3 s; 1 MB up at 4 Mbit/s (0.5 MB/s) = 2 s: 0.1 + 2 + 3 + 2 = 7.1 s
    p = Profiles(
        speed=np.array([50.0, 100.0]),
        down=np.array([1.0, 8.0]) * MBIT,
        up=np.array([1.0, 4.0]) * MBIT,
        latency=np.array([0.0, 0.05]),
    )
    got = p.seconds(np.array([1]), np.array([300.0]), np.array([2e6]), np.array([1e6]))
    assert got[0] == pytest.approx(7.1)


def test_the_driver_times_a_client_from_its_train_split_its_work_and_the_model_size(tmp_path):
    # a linear model on 10 features and 2 classes: 22 float32 parameters = 88 bytes each way;
    # speed 10 samples/s, 8 Mbit/s both ways, latency 0.5 s; E = 2 epochs over n_train samples
    sc = load(
        tmp_path,
        TINY,
        "algorithm.local_epochs=2",
        "systems={speed: {value: 10}, down: {value: 8}, up: {value: 8}, latency: {value: 0.5}}",
        "data.classes=2",
    )
    d = serial_driver(sc, 1)
    n = d.n_train([3])[0]
    assert n == d.transport.hosts[0].data(3).num_train
    secs = d.device_seconds(np.array([3]), d.eval_message())
    assert secs[0] == pytest.approx(2 * 0.5 + 88 / 1e6 + 2 * n / 10 + 88 / 1e6)


def test_a_deadline_drops_the_stragglers_and_the_round_waits_for_it():
    f = fleet(deadline_s=4.0)
    out = f.round(0, 0.0, np.array([0, 1, 2, 3]), 4, np.array([1.0, 5.0, 3.0, 7.0]))
    assert out.kept.tolist() == [True, False, True, False]
    assert out.late.tolist() == [False, True, False, True]
    assert out.duration == 4.0  # it waited for the two that never came
    everyone = f.round(0, 0.0, np.array([0, 1]), 2, np.array([1.0, 3.5]))
    assert everyone.kept.all() and everyone.duration == 3.5  # all in: it ends at the last reply


def test_over_selection_invites_more_and_keeps_the_first_k_to_report():
    f = fleet(over_selection=1.3)
    assert f.invite(10) == 13 and f.invite(3) == 4 and f.invite(1) == 2
    out = f.round(0, 0.0, np.array([0, 1, 2, 3, 4, 5]), 3, np.array([4.0, 1.0, 3.0, 2.0, 5.0, 2.0]))
    # first three replies: client 1 (1 s), clients 3 and 5 (2 s, the tie kept in id order)
    assert np.flatnonzero(out.kept).tolist() == [1, 3, 5]
    assert out.duration == 2.0


def test_dropouts_are_drawn_per_round_from_the_seed_and_the_round_waits_for_the_deadline():
    f = fleet(dropout=0.5, deadline_s=10.0)
    secs = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    out = f.round(7, 0.0, np.arange(6), 6, secs)
    want = rng.generator(0, "systems", "dropout", 7).random(6) < 0.5
    assert out.dropped.tolist() == want.tolist() and want.any() and not want.all()
    assert out.kept.tolist() == (~want).tolist()
    assert out.duration == 10.0
    again = f.round(7, 0.0, np.arange(6), 6, secs)
    assert again.kept.tolist() == out.kept.tolist()
    no_deadline = fleet(dropout=0.5).round(7, 0.0, np.arange(6), 6, secs)
    assert no_deadline.duration == 6.0  # a dropped client is noticed when it would have reported


def test_availability_always_probability_and_diurnal():
    cids = np.arange(6)
    assert fleet().available(cids, 123.0, 0).all()
    p = fleet(availability="probability", available_p=0.4)
    want = rng.generator(0, "systems", "available", 3).random(6) < 0.4
    assert p.available(cids, 0.0, 3).tolist() == want.tolist()
    d = fleet(availability="diurnal", period_s=100.0, online=0.25)
    phase = rng.generator(0, "systems", "phase").uniform(0.0, 100.0, 6)
    for t in (0.0, 30.0, 260.0):
        assert d.available(cids, t, 0).tolist() == (((t - phase) % 100.0) < 25.0).tolist()
    on = d.available(cids, 30.0, 0)
    until = d.online_until(cids[on], 30.0)
    assert until == pytest.approx(30.0 + 25.0 - (30.0 - phase[on]) % 100.0)


def test_an_availability_trace_and_a_client_going_offline_mid_round(tmp_path):
    path = tmp_path / "windows.csv"
    path.write_text("client,start_s,end_s\n0,0,100\n1,50,60\n1,80,200\n2,10,20\n")
    windows = read_windows(str(path), 4).intervals
    assert windows == [[(0.0, 100.0)], [(50.0, 60.0), (80.0, 200.0)], [(10.0, 20.0)], []]
    f = Fleet(SystemsCfg(availability="trace", availability_trace=str(path), period_s=1000.0), 4, 0)
    assert f.available(np.arange(4), 55.0, 0).tolist() == [True, True, False, False]
    assert f.available(np.arange(4), 1055.0, 0).tolist() == [True, True, False, False]  # repeats
    # at t = 55 client 1 is online until 60: a 10-second round loses it, client 0 (until 100) reports
    out = f.round(0, 55.0, np.array([0, 1]), 2, np.array([10.0, 10.0]))
    assert out.kept.tolist() == [True, False] and out.offline.tolist() == [False, True]
    once = Fleet(SystemsCfg(availability="trace", availability_trace=str(path), trace_repeats=False), 4, 0)
    assert not once.available(np.arange(4), 1055.0, 0).any()


def test_a_clients_own_period_in_the_trace_repeats_its_windows(tmp_path):
    # client 0 repeats every 100 s (its period_s), client 1 every period_s = 1000 s (its cell empty):
    # at 205 s client 0 is 5 s into its period (online 0-10), client 1 205 s into its own (offline)
    path = tmp_path / "windows.csv"
    path.write_text("client,start_s,end_s,period_s\n0,0,10,100\n0,40,45,100\n1,0,10,\n")
    f = Fleet(SystemsCfg(availability="trace", availability_trace=str(path), period_s=1000.0), 2, 0)
    assert f.period.tolist() == [100.0, 1000.0]
    assert f.available(np.arange(2), 205.0, 0).tolist() == [True, False]
    assert f.available(np.arange(2), 1005.0, 0).tolist() == [True, True]
    assert f.online_until(np.array([0]), 205.0).tolist() == [210.0]
    # at 50 s: client 0's next window opens at 100 + 0, client 1's at 1000
    assert f.next_online(np.arange(2), 50.0) == 100.0 and f.next_online(np.arange(2), 30.0) == 40.0
    once = Fleet(SystemsCfg(availability="trace", availability_trace=str(path), trace_repeats=False), 2, 0)
    assert once.period.tolist() == [np.inf, np.inf] and not once.available(np.arange(2), 205.0, 0).any()
    path.write_text("client,start_s,end_s,period_s\n0,0,10,100\n0,40,45,90\n")
    with pytest.raises(
        TraceError,
        match=r"windows.csv: line 3: period_s 90.0 for client 0, but line 2 gives it "
        r"100.0; a client's trace repeats with one period",
    ):
        read_windows(str(path), 1, 1000.0)


def _windows(tmp_path, rows, name="windows.csv") -> str:
    path = tmp_path / name
    path.write_text("client,start_s,end_s\n" + "".join(f"{c},{a},{b}\n" for c, a, b in rows))
    return str(path)


def test_a_trace_that_opens_no_training_clients_window_is_refused(tmp_path):
    """Without a window for a training client every round would train nobody; refused up front:
    rows only for ids past the fleet, only for the unseen clients, or (played once) only before 0."""
    past = _windows(tmp_path, [(20, 0, 100)])
    with pytest.raises(
        ScenarioError,
        match=r"systems.availability_trace: .*windows.csv gives none of the 12 training "
        r"clients of ids 0 to 11 a window that opens: no round could train anyone",
    ):
        load(tmp_path, TINY, f"systems={{availability: trace, availability_trace: {past}}}")
    from raysim.engine.driver import split_unseen

    _, unseen = split_unseen(load(tmp_path, TINY, "eval.unseen_fraction=0.25"))
    only_unseen = _windows(tmp_path, [(c, 0, 100) for c in unseen.tolist()], "unseen.csv")
    with pytest.raises(
        ScenarioError,
        match=r"gives none of the 9 training clients of ids 0 to 11 a window that opens "
        r"\(the unseen clients do not train\)",
    ):
        load(
            tmp_path,
            TINY,
            "eval.unseen_fraction=0.25",
            f"systems={{availability: trace, availability_trace: {only_unseen}}}",
        )
    before = _windows(tmp_path, [(c, -50, -10) for c in range(12)], "before.csv")
    with pytest.raises(ScenarioError, match=r"before.csv gives none of the 12 training clients"):
        load(tmp_path, TINY, f"systems={{availability: trace, availability_trace: {before}, trace_repeats: false}}")


def test_a_round_with_nobody_online_waits_for_the_next_window(tmp_path):
    # everyone comes online at 100 s: the first round starts then (it used to start at 0 with nobody,
    # the clock frozen); the wait counts in the round's virtual time
    path = _windows(tmp_path, [(c, 100, 10**6) for c in range(12)])
    sc = load(tmp_path, TINY, "rounds=2", f"systems={{availability: trace, availability_trace: {path}}}")
    h = run(sc, 1).history
    assert h[0]["available"] == 12 and h[0]["clients"] == 6 and 100 < h[0]["virtual_time_s"] < 105
    assert h[0]["round_virtual_s"] == h[0]["virtual_time_s"] and h[1]["clients"] == 6


def test_a_trace_played_once_and_over_stops_the_run_with_an_error(tmp_path):
    # online 0-0.05 s only: the first round's clients (0.05 s latency each way alone) go offline before
    # they report; at the second round nobody ever comes online again
    path = _windows(tmp_path, [(c, 0, 0.05) for c in range(12)])
    sc = load(tmp_path, TINY, f"systems={{availability: trace, availability_trace: {path}, trace_repeats: false}}")
    d = serial_driver(sc, 1)
    rec = d.step()
    assert rec["clients"] == 0 and rec["dropped_out"] == 6
    with pytest.raises(
        ScenarioError,
        match=rf"s.yaml: systems.availability_trace: round 2: no training client is "
        rf"online at virtual time {d.clock:g} s or after \(.*windows.csv plays "
        rf"once \(trace_repeats: false\) and no training client's window opens "
        rf"after it\); 1 of the 3 rounds ran",
    ):
        d.step()


def test_next_online_is_never_for_windows_that_cannot_open(tmp_path):
    f = Fleet(
        SystemsCfg(availability="trace", availability_trace=_windows(tmp_path, [(0, 10, 20)]), period_s=100.0), 2, 0
    )
    assert f.next_online(np.arange(2), 50.0) == 110.0 and f.first_online(np.arange(2), 50.0, 0) == 110.0
    assert f.first_online(np.arange(2), 15.0, 0) == 15.0 and f.next_online(np.array([1]), 50.0) == np.inf
    f.starts = Windows([[(150.0, 160.0)], []], np.array([100.0, 100.0])).openings()  # past its period: never
    assert f.next_online(np.arange(2), 50.0) == np.inf and f.first_online(np.arange(2), 50.0, 0) == np.inf
    once = Fleet(
        SystemsCfg(
            availability="trace", availability_trace=_windows(tmp_path, [(0, 10, 20), (1, -9, -1)]), trace_repeats=False
        ),
        2,
        0,
    )
    assert once.next_online(np.arange(2), 5.0) == 10.0 and once.next_online(np.arange(2), 10.0) == np.inf


def test_a_window_starting_past_its_period_is_refused_with_its_line(tmp_path):
    path = tmp_path / "windows.csv"
    path.write_text("client,start_s,end_s,period_s\n0,10,20,\n1,60,70,50\n")
    with pytest.raises(
        TraceError,
        match=r"windows.csv: line 3: start_s 60 is not before the period 50 s the trace "
        r"repeats with \(its period_s\), so this window never opens",
    ):
        read_windows(str(path), 2, 1000.0)
    assert read_windows(str(path), 2, None).intervals == [[(10.0, 20.0)], [(60.0, 70.0)]]  # played once: fine
    path.write_text("client,start_s,end_s\n0,10,20\n1,2000,3000\n")
    with pytest.raises(
        TraceError,
        match=r"line 3: start_s 2000 is not before the period 1000 s the trace repeats "
        r"with \(systems.period_s\)",
    ):
        read_windows(str(path), 2, 1000.0)


def test_a_window_past_its_period_closes_with_it(tmp_path):
    # online 80-150 in a period of 100: at 285 (85 into the third period) online until 300, the
    # period's end, where available() says it is offline (300 is 0 into the next period)
    f = Fleet(
        SystemsCfg(availability="trace", availability_trace=_windows(tmp_path, [(0, 80, 150)]), period_s=100.0), 1, 0
    )
    assert f.online_until(np.array([0]), 285.0).tolist() == [300.0]
    assert f.available(np.array([0]), 299.0, 0).tolist() == [True] and not f.available(np.array([0]), 300.0, 0).any()


def test_fedbuff_on_windows_past_the_period_stops_with_an_error_instead_of_hanging(tmp_path):
    """Every window opening after period_s: FedBuff waited for a client that could never come
    (the clock moved on a period a pass, for ever). Now the scenario is refused in one line."""
    import subprocess
    import sys

    windows = _windows(tmp_path, [(c, 2000, 3000) for c in range(12)])
    text = TINY.replace("sampling: {fraction: 0.5}", "sampling: {count: 4}") + (
        f"tracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\n"
        f"systems: {{availability: trace, availability_trace: {windows}, period_s: 1000, aggregation: fedbuff, "
        f"buffer: 2}}\n"
    )
    (tmp_path / "s.yaml").write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "raysim.cli", "run", str(tmp_path / "s.yaml"), "--engine", "serial", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"raysim: {tmp_path / 's.yaml'}: systems.availability_trace: {windows}: line 2: start_s 2000 is not before the "
        f"period 1000 s the trace repeats with (systems.period_s), so this window never opens; give start_s within "
        f"the period"
    )


def test_fedbuff_stops_with_an_error_when_nobody_comes_online_again(tmp_path, capsys):
    """A trace played once whose windows close before any client reports: the asynchronous
    server used to step on with nobody; it stops, in one line, within seconds (an alarm guards
    against a hang)."""
    import signal

    def hung(*_):
        raise TimeoutError("the asynchronous server is waiting for ever")

    path = _windows(tmp_path, [(c, 0, 0.05) for c in range(12)])
    overrides = (
        "sampling={count: 4}",
        "rounds=3",
        f"systems={{availability: trace, availability_trace: "
        f"{path}, trace_repeats: false, aggregation: fedbuff, buffer: 2}}",
    )
    sc = load(tmp_path, TINY, *overrides)
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        # the first step's four clients all go offline (their places, refilled as each fails, too); the
        # second finds nobody online now or later
        with pytest.raises(
            ScenarioError,
            match=r"round 2: no training client is online at virtual time [\d.]+ s or "
            r"after \(.*windows.csv plays once.*; 1 of the 3 rounds ran",
        ):
            run(sc, 1)
        # as a run: its MLflow run FAILED, with no resume command (a resume meets the same fleet)
        tracked = load(
            tmp_path, TINY, *overrides, f"tracking.uri=sqlite:///{tmp_path}/m.db", f"checkpoint.dir={tmp_path}/ck"
        )
        with pytest.raises(ScenarioError, match="no training client is online"):
            run_scenario(tracked, engine="serial", progress=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    told = capsys.readouterr().err
    assert re.search(r"raysim: MLflow run \w+ marked FAILED\n", told) and "continue it with" not in told, told


def test_device_trace_and_its_errors(tmp_path):
    good = tmp_path / "devices.csv"
    good.write_text("latency_s,client,speed,down_mbps,up_mbps\n0.1,1,20,8,4\n0,0,10,16,2\n0.2,7,1,1,1\n")
    p = read_devices(str(good), 2)
    assert p.speed.tolist() == [10.0, 20.0] and p.down.tolist() == [2e6, 1e6] and p.latency.tolist() == [0.0, 0.1]
    with pytest.raises(TraceError, match=r"devices.csv: no row for client 2 \(1 of the 3 clients missing\)"):
        read_devices(str(good), 3)
    bad = tmp_path / "bad.csv"
    bad.write_text("client,speed,down_mbps,up_mbps\n0,1,1,1\n")
    with pytest.raises(TraceError, match="bad.csv: the header lacks column 'latency_s'"):
        read_devices(str(bad), 1)
    bad.write_text("client,speed,down_mbps,up_mbps,latency_s\n0,fast,1,1,0\n")
    with pytest.raises(TraceError, match=r"bad.csv: line 2: speed: 'fast' is not a number"):
        read_devices(str(bad), 1)
    bad.write_text("client,speed,down_mbps,up_mbps,latency_s\n0,0,1,1,0\n")
    with pytest.raises(TraceError, match=r"bad.csv: line 2: speed: 0.0 must be > 0"):
        read_devices(str(bad), 1)


def test_trace_rows_a_reader_refuses_or_accepts_by_hand(tmp_path):
    head = "client,speed,down_mbps,up_mbps,latency_s\n"
    bad = tmp_path / "devices.csv"
    bad.write_text(head + "0,10,1,1,0\n1,20,1,1,0\n\n0,30,1,1,0\n")  # (a blank line: line 4)
    with pytest.raises(TraceError, match=r"devices.csv: line 5: a second row for client 0 \(the first is line 2\)"):
        read_devices(str(bad), 2)
    bad.write_text(head + "0,10,1,1,0\n1," + "9" * 200_000 + ",1,1,0\n")
    with pytest.raises(
        TraceError,
        match=r"devices.csv: line 3: not a CSV row raysim can read \(field larger than "
        r"field limit \(131072\)\)",
    ):
        read_devices(str(bad), 2)
    bad.write_text(head + "0,10,1,1,0\n-1,20,1,1,0\n")
    with pytest.raises(TraceError, match=r"devices.csv: line 3: client: -1 is negative; client ids run from 0"):
        read_devices(str(bad), 1)
    windows = tmp_path / "windows.csv"
    windows.write_text("client,start_s,end_s\n0,0,5\n-1,0,5\n")
    with pytest.raises(TraceError, match=r"windows.csv: line 3: client: -1 is negative"):
        read_windows(str(windows), 1)
    # a spreadsheet's byte-order mark before the header; client 5 of a larger fleet is ignored
    bad.write_bytes("\ufeff".encode() + (head + "1,20,8,4,0.1\n0,10,16,2,0\n5,1,1,1,0\n").encode())
    assert read_devices(str(bad), 2).speed.tolist() == [10.0, 20.0]
    windows.write_bytes("\ufeffclient,start_s,end_s\n1,3,4\n5,0,1\n".encode())
    assert read_windows(str(windows), 2).intervals == [[], [(3.0, 4.0)]]


def test_a_trace_is_read_row_by_row_not_held_whole(tmp_path):
    """20 000 clients' rows: the reader's peak allocation stays near its four result arrays
    (640 kB), where a list of every row as a dict took about 14 MB."""
    import tracemalloc

    path = tmp_path / "devices.csv"
    path.write_text(
        "client,speed,down_mbps,up_mbps,latency_s\n"
        + "".join(f"{i},{10 + i % 7}.5,8.25,4.125,0.0{i % 9}\n" for i in range(20_000))
    )
    tracemalloc.start()
    p = read_devices(str(path), 20_000)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert p.speed[:3].tolist() == [10.5, 11.5, 12.5] and p.latency[8] == 0.08
    assert peak < 3_000_000


def test_scenario_errors_name_the_key(tmp_path):
    with pytest.raises(ScenarioError, match=r"systems.speed.value: 0: a speed must be above 0"):
        load(tmp_path, TINY, "systems={speed: {value: 0}}")
    with pytest.raises(ScenarioError, match=r"systems.down: uniform needs low < high \(got low 5, high 2\)"):
        load(tmp_path, TINY, "systems={down: {dist: uniform, low: 5, high: 2}}")
    with pytest.raises(
        ScenarioError,
        match=r"systems.speed.dist: 'pareto' is not allowed; choose one of "
        r"constant, uniform, lognormal",
    ):
        load(tmp_path, TINY, "systems={speed: {dist: pareto}}")
    with pytest.raises(ScenarioError, match=r"systems.availability_trace: availability: trace needs the path"):
        load(tmp_path, TINY, "systems={availability: trace}")
    with pytest.raises(ScenarioError, match=r"systems.device_trace: no such file /nonexistent.csv"):
        load(tmp_path, TINY, "systems={device_trace: /nonexistent.csv}")
    with pytest.raises(ScenarioError, match=r"systems: the virtual clock drives a server's rounds"):
        load(tmp_path, DFEDEM, "systems={}")
    with pytest.raises(ScenarioError, match=r"systems.deadline: unknown key; allowed keys here: speed, down"):
        load(tmp_path, TINY, "systems={deadline: 3}")
    sc = load(tmp_path, TINY, "systems={speed: {dist: lognormal, sigma: 2}}")
    assert sc.systems.speed == DistCfg("lognormal", 100.0, 0.0, 1.0, 2.0)  # over the section's default


FLEET = (
    "systems={speed: {dist: lognormal, value: 2, sigma: 1.5}, dropout: 0.1, deadline_s: 60, "
    "over_selection: 1.5, availability: probability, available_p: 0.8}"
)


def test_a_fleet_run_is_identical_for_one_or_three_hosts_and_resumes_exactly(tmp_path):
    """Heterogeneous speeds, dropouts, a deadline, over-selection and availability: every
    metric (the clock, who reported, accuracy) the same on 1 and 3 hosts, and a run resumed
    from a checkpoint mid-way ends as the uninterrupted one, clock and participation included."""
    sc = load(tmp_path, TINY, FLEET, "rounds=6", "sampling={count: 4}")
    a, b = run(sc, 1), run(sc, 3)
    assert strip(a.history) == strip(b.history)
    h = a.history
    assert all(r["invited"] == 6 and r["clients"] <= 4 for r in h)  # ⌈4 x 1.5⌉ invited, 4 kept at most
    assert any(r["dropped_out"] > 0 for r in h) and any(r["stragglers"] > 0 for r in h)
    assert [r["virtual_time_s"] for r in h] == pytest.approx(np.cumsum([r["round_virtual_s"] for r in h]))
    assert a.participation.sum() == sum(r["clients"] for r in h)
    again = resumed(tmp_path, sc, 3)
    assert strip(again.history) == strip(a.history)
    assert again.clock == a.clock and again.participation.tolist() == a.participation.tolist()


def test_a_deadline_leaves_the_slowest_clients_out(tmp_path):
    """A deadline shorter than the slow devices' round: the slowest tenth never takes part,
    the fastest always does when sampled; without it everyone takes part."""
    fast_slow = "systems={speed: {dist: lognormal, value: 20, sigma: 2}, deadline_s: %s}"
    with_deadline = run(load(tmp_path, TINY, fast_slow % 5, "rounds=8", "sampling.fraction=1.0"), 2)
    final = with_deadline.history[-1]
    assert final["slowest_decile_participation"] == 0.0
    assert final["fastest_decile_participation"] == 8.0
    assert final["never_participated"] > 0
    without = run(load(tmp_path, TINY, fast_slow % "null", "rounds=8", "sampling.fraction=1.0"), 2)
    assert without.history[-1]["never_participated"] == 0.0
    assert without.history[-1]["round_virtual_s"] > 5.0  # the round waits for the slowest


ASYNC = (
    "systems={speed: {dist: lognormal, value: 20, sigma: 1}, aggregation: %s, buffer: 3, dropout: 0.1, server_lr: 0.8}"
)


def test_staleness_weights_by_hand():
    poly = fleet(staleness="polynomial", staleness_a=0.5)
    assert poly.staleness(0) == 1.0 and poly.staleness(3) == 0.5
    hinge = fleet(staleness="hinge", staleness_a=0.5, staleness_b=4)
    assert hinge.staleness(4) == 1.0 and hinge.staleness(6) == 0.5
    assert fleet(staleness="constant").staleness(100) == 1.0


def test_fedbuff_steps_after_the_first_buffer_arrivals_in_clock_order(tmp_path):
    """Equal clients on equal devices all launched at 0 arrive together: the buffer takes the
    three lowest ids (ties by id), each 0 steps stale; their places go to newcomers, which
    arrive one device-time later."""
    sc = load(
        tmp_path,
        TINY,
        "data.min_samples=40",
        "data.max_samples=40",
        "sampling={count: 6}",
        "rounds=3",
        "systems={speed: {value: 20}, aggregation: fedbuff, buffer: 3}",
    )
    d = serial_driver(sc, 2)
    d._top_up(0)
    launched = sorted(c for _, c, _, _ in d.flight)
    (secs,) = {f for f, _, _, _ in d.flight}
    rec = d.step()
    assert d.arrivals == [(c, 0) for c in launched[:3]]
    assert rec["clients"] == 3 and rec["staleness_max"] == 0 and rec["virtual_time_s"] == pytest.approx(secs)
    assert sorted(c for c in range(12) if d.participation[c]) == launched[:3]
    rec = d.step()  # the other three, launched at 0, now one step stale
    assert d.arrivals == [(c, 0) for c in launched[3:]] and rec["staleness_mean"] == 1.0


def _alone(d, c, start_state, s):
    """Client c's model from ``start_state`` through the ordinary (synchronous) path: trained
    alone, its reply aggregated by the method."""
    from raysim.engine.driver import groups_by_host

    msg = d.algo.message(start_state, s)
    ((acc, _, _),) = [p for p in d.transport.train(s, msg, groups_by_host({c: 0}, d.transport.placement)) if p[1]]
    return d.algo.server_params(d.algo.aggregate(start_state, acc.result(), s))


@pytest.mark.parametrize("aggregation", ["fedbuff", "fedasync"])
def test_the_asynchronous_update_weighs_each_reply_by_its_staleness(tmp_path, aggregation):
    """FedBuff's step x + η/B Σ s(τ_k)(x_k − x_{s_k}) and FedAsync's (1 − α s(τ)) x + α s(τ) x_k,
    checked against the arrived clients trained one by one, from the models they started
    from, through the synchronous path."""
    import copy

    import torch

    sc = load(tmp_path, TINY, ASYNC % aggregation, "sampling={count: 6}", "rounds=8")
    d = serial_driver(sc, 2)
    twin = serial_driver(sc, 2)  # trains the same clients alone, from the same states
    checked = 0
    for _ in range(sc.rounds):
        x = [t.clone() for t in d.algo.server_params(d.server_state)]
        versions = copy.deepcopy(d.versions)
        rec = d.step()
        r = d.round - 1
        stale = [r - s for _, s in d.arrivals]
        if max(stale) == 0 or any(s not in versions for _, s in d.arrivals):
            continue  # check the steps with stale replies, from models stored before
        models = {c: (s, _alone(twin, c, versions[s], s), twin.algo.server_params(versions[s])) for c, s in d.arrivals}
        if aggregation == "fedbuff":
            total = [torch.zeros_like(t, dtype=torch.float64) for t in x]
            for c in sorted(models):
                s, xk, xs = models[c]
                for acc, a, b in zip(total, xk, xs):
                    acc += d.fleet.staleness(r - s) * (a.double() - b.double())
            want = [(t.double() + 0.8 * g / len(models)).float() for t, g in zip(x, total)]
        else:
            ((c, (s, xk, _)),) = models.items()
            a = 0.6 * d.fleet.staleness(r - s)
            want = [((1 - a) * t.double() + a * m.double()).float() for t, m in zip(x, xk)]
        assert rec["staleness_max"] == max(stale)
        for got, w in zip(d.algo.server_params(d.server_state), want):
            assert torch.allclose(got, w, atol=1e-6)
        checked += 1
    assert checked >= 2


def test_an_asynchronous_run_is_identical_for_one_or_three_hosts_and_resumes_exactly(tmp_path):
    sc = load(tmp_path, TINY, ASYNC % "fedbuff", "sampling={count: 6}", "rounds=6")
    a, b = run(sc, 1), run(sc, 3)
    assert strip(a.history) == strip(b.history)
    assert all(h["clients"] == 3 for h in a.history) and any(h["staleness_max"] > 0 for h in a.history)
    assert [h["virtual_time_s"] for h in a.history] == sorted(h["virtual_time_s"] for h in a.history)
    assert strip(resumed(tmp_path, sc, 3).history) == strip(a.history)


def test_asynchronous_aggregation_is_refused_where_it_cannot_run(tmp_path):
    with pytest.raises(
        ScenarioError,
        match=r"systems.aggregation: fedbuff steps a global model with each reply; "
        r"'local' cannot run so \(it has no global model\); use sync, or one of "
        r"fedavg, fedprox",
    ):
        load(tmp_path, TINY, "algorithm.name=local", "systems={aggregation: fedbuff, buffer: 2}")
    with pytest.raises(ScenarioError, match=r"'scaffold' cannot run so \(its server control variate c is updated"):
        load(tmp_path, TINY, "algorithm.name=scaffold", "systems={aggregation: fedasync}")
    with pytest.raises(ScenarioError, match=r"systems.deadline_s: a synchronous round's; fedasync has no rounds"):
        load(tmp_path, TINY, "systems={aggregation: fedasync, deadline_s: 5}")
    with pytest.raises(ScenarioError, match=r"systems.buffer: 10 replies a step, but only 6 clients train at once"):
        load(tmp_path, TINY, "systems={aggregation: fedbuff, buffer: 10}")


@pytest.mark.ray
def test_fedbuff_on_three_ray_hosts_with_one_killed_ends_as_the_serial_run(tmp_path):
    """FedBuff over Ray (replies travel one by one from the hosts), a host killed mid-training:
    the run rolls back to its checkpoint (clients in flight, their start models, the clock) and
    ends with the serial engine's every per-step metric."""
    from tests.test_faults import kill, same_run
    from tests.test_runs import summary_of, tracked

    text = TINY.replace("rounds: 3", "rounds: 6").replace("sampling: {fraction: 0.5}", "sampling: {count: 6}")
    path = tracked(tmp_path, text + "systems: " + (ASYNC % "fedbuff").split("=", 1)[1] + "\n", every=1)
    serial = summary_of(tmp_path, path, "--engine", "serial", name="serial.json")
    ray_run = summary_of(
        tmp_path, path, "--set", "resources.hosts=3", env=kill(tmp_path, "kill:train:3:1"), name="ray.json"
    )
    assert (tmp_path / "killed").exists()
    same_run(ray_run, serial)
    assert strip(ray_run["history"]) == strip(serial["history"])
    assert serial["final"]["participation_mean"] > 0 and "target_virtual_hours" not in serial["final"]


def test_partial_work_gives_a_straggler_what_fits_after_its_transfers():
    # deadline 10 s: client 0 needs 16 s (4 s of transfers, 12 of training): it trains half its
    # steps and reports at the deadline; client 1's transfers alone take 11 s: it is a straggler;
    # client 2 (5 s) is on time
    f = fleet(deadline_s=10.0, stragglers="partial")
    out = f.round(0, 0.0, np.array([0, 1, 2]), 3, np.array([16.0, 13.0, 5.0]), np.array([12.0, 2.0, 3.0]))
    assert out.kept.tolist() == [True, False, True] and out.late.tolist() == [False, True, False]
    assert out.work.tolist() == [0.5, 1.0, 1.0] and out.seconds.tolist() == [10.0, 13.0, 5.0]
    assert out.record()["partial"] == 1.0 and out.duration == 10.0
    dropping = fleet(deadline_s=10.0).round(
        0, 0.0, np.array([0, 1, 2]), 3, np.array([16.0, 13.0, 5.0]), np.array([12.0, 2.0, 3.0])
    )
    assert dropping.kept.tolist() == [False, False, True]


def test_fednova_normalizes_each_update_by_its_steps_by_hand():
    """Two clients from x = 1: τ 2, n 1, x_1 = 0.6 (d = 0.2); τ 4, n 3, x_2 = 0 (d = 0.25):
    p = (1/4, 3/4), d̄ = 0.2375, τ_eff = 3.5, x ← 1 − 3.5 · 0.2375 = 0.16875 (FedAvg: 0.15).
    With momentum ρ = 0.5, two steps weigh a = (2 − 0.5·0.75/0.5)/0.5 = 2.5."""
    import torch

    from algorithms.fednova import FedNova, NovaReply
    from raysim.core.replies import Accumulator, Weighted
    from raysim.core.tasks import TASKS
    from raysim.models import LinearParams, linear

    algo = FedNova(FedNova.Hyper(), lambda variant=0: linear(LinearParams(), (1,), 2), 10, TASKS["classification"])
    acc = Accumulator()
    for d, a, n in ((0.2, 2.0, 1.0), (0.25, 4.0, 3.0)):
        acc.add(NovaReply(Weighted([torch.tensor([d])], n), Weighted([torch.tensor([a], dtype=torch.float64)], n)))
    (x,) = algo.aggregate([torch.tensor([1.0])], acc.result(), 0)
    assert x.item() == pytest.approx(0.16875)
    assert algo.normalizer(4) == 4.0
    momentum = FedNova(FedNova.Hyper(momentum=0.5), algo.model_fn, 10, algo.task)
    assert momentum.normalizer(2) == pytest.approx(2.5)


def test_fednova_is_fedavg_when_every_client_takes_the_same_steps_and_learns_with_stragglers(tmp_path):
    import torch

    same = "data.min_samples=40", "data.max_samples=40", "rounds=3"
    nova, avg = run(load(tmp_path, TINY, "algorithm.name=fednova", *same), 2), run(load(tmp_path, TINY, *same), 2)
    for a, b in zip(nova.algo.server_params(nova.server_state), avg.algo.server_params(avg.server_state)):
        assert torch.allclose(a, b, atol=1e-6)
    partial = run(
        load(
            tmp_path,
            TINY,
            "algorithm.name=fednova",
            "rounds=6",
            "sampling.fraction=1.0",
            "systems={speed: {dist: lognormal, value: 20, sigma: 1.5}, deadline_s: 5, stragglers: partial}",
        ),
        2,
    )
    h = partial.history
    assert sum(r["partial"] for r in h) > 0 and all(r["stragglers"] + r["clients"] <= 12 for r in h)
    assert h[-1]["accuracy"] > 0.6


def test_a_bad_trace_file_stops_the_scenario_before_it_runs(tmp_path):
    bad = tmp_path / "devices.csv"
    bad.write_text("client,speed,down_mbps,up_mbps,latency_s\n0,10,1,1,0\n")
    with pytest.raises(
        ScenarioError,
        match=r"systems.device_trace: .*devices.csv: no row for client 1 "
        r"\(11 of the 12 clients missing\)",
    ):
        load(tmp_path, TINY, f"systems={{device_trace: {bad}}}")


def test_the_resume_command_keeps_an_override_with_braces():
    """A run started with ``--set systems={...}`` (a mapping in braces) is told how to resume
    with that override intact (the command is a format string for the run id)."""
    import shlex

    from raysim.experiment.sweep import resume_command

    cmd = resume_command("s.yaml", ["systems={speed: {value: 20}, deadline_s: 8}"], "serial", None, None)
    filled = cmd.format(run_id="abc123")
    assert shlex.split(filled) == [
        "raysim",
        "run",
        "s.yaml",
        "--set",
        "systems={speed: {value: 20}, deadline_s: 8}",
        "--engine",
        "serial",
        "--resume",
        "abc123",
    ]
