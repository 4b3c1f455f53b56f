"""FedScale's pickled traces read as plain data (never unpickled) and written as raysim's CSVs."""

import os
import pickle
import re
import subprocess
import sys
import time

import pytest

from raysim import cli
from raysim.federation import traces
from raysim.federation.fleet import TraceError, read_devices, read_windows

DEVICES = {i + 1: {"computation": 100.0 + 10 * i, "communication": 5000.0 + i} for i in range(4)}
BEHAVIOUR = {
    i + 1: {"active": [0, 1000 + i], "inactive": [500, 2000], "finish_time": 3000, "duration": 3000, "model": "Pixel"}
    for i in range(4)
}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_plain_data_reads_from_every_pickle_protocol(tmp_path, protocol):
    nested = {"a": [1, 2.5, None, True, "x", (3, 4)], 7: {"b": -(2**70)}}
    if protocol >= 4:  # sets and bytes are opcodes of their own from protocol 4 (3 for bytes)
        nested["a"] += [{5}, frozenset({6}), b"raw"]
    for obj in (DEVICES, BEHAVIOUR, nested):
        path = tmp_path / "t.pkl"
        path.write_bytes(pickle.dumps(obj, protocol=protocol))
        assert traces.literal(path) == obj


class Evil:
    def __reduce__(self):
        return (os.system, ("echo never",))


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_a_pickle_that_would_import_or_call_is_refused_naming_the_opcode(tmp_path, protocol):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"a": Evil()}, protocol=protocol))
    with pytest.raises(TraceError, match=r"evil.pkl: opcode (GLOBAL|STACK_GLOBAL) at byte \d+ is not plain data"):
        traces.literal(path)
    path.write_bytes(b"not a pickle")
    with pytest.raises(TraceError, match=r"evil.pkl: not a readable pickle"):
        traces.literal(path)


def test_fedscale_traces_become_raysims_csvs_by_hand(tmp_path):
    # computation 100 ms a sample, charged 3 times (forward and backward): 1000 / 300 = 3.33 samples/s;
    # 5000 kbit/s = 5 Mbit/s both ways; active [0, 1000] with inactive [500, 2000]: online 0-500 and 1000-2000
    (tmp_path / "cap").write_bytes(pickle.dumps(DEVICES))
    (tmp_path / "behave").write_bytes(pickle.dumps(BEHAVIOUR))
    assert (
        cli.main(
            [
                "data",
                "fedscale",
                "--devices",
                str(tmp_path / "cap"),
                "--availability",
                str(tmp_path / "behave"),
                "--clients",
                "3",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    p = read_devices(str(tmp_path / "out" / "devices.csv"), 3)
    assert p.speed.tolist() == pytest.approx([1000 / 300, 1000 / 330, 1000 / 360])
    assert p.down.tolist() == pytest.approx([5e6 / 8, 5.001e6 / 8, 5.002e6 / 8]) and p.latency.tolist() == [0, 0, 0]
    w = read_windows(str(tmp_path / "out" / "windows.csv"), 3, 86400.0).intervals
    assert w[0] == [(0.0, 500.0), (1000.0, 2000.0)] and w[2] == [(0.0, 500.0), (1002.0, 2000.0)]
    assert (
        cli.main(
            ["data", "fedscale", "--devices", str(tmp_path / "cap"), "--clients", "9", "--out", str(tmp_path / "o2")]
        )
        == 2
    )


def test_fedscale_availability_repeats_with_each_clients_finish_time(tmp_path):
    # FedScale replays a client's trace every finish_time: client 0 (finish 200) is online 0-50 and
    # 100-150 of every 200 s; client 1 (finish 60) 0-30 and 40-65 cut at 60, its interval 70-90 past the
    # finish left out; with --repeat global no period is written and period_s (1000) applies to both
    behave = {
        0: {"active": [0, 100], "inactive": [50, 150], "finish_time": 200},
        1: {"active": [0, 40, 70], "inactive": [30, 65, 90], "finish_time": 60},
    }
    (tmp_path / "behave").write_bytes(pickle.dumps(behave))
    args = ["data", "fedscale", "--availability", str(tmp_path / "behave"), "--clients", "2", "--out"]
    assert cli.main(args + [str(tmp_path / "own")]) == 0
    own = read_windows(str(tmp_path / "own" / "windows.csv"), 2, 1000.0)
    assert own.intervals == [[(0.0, 50.0), (100.0, 150.0)], [(0.0, 30.0), (40.0, 60.0)]]
    assert own.period.tolist() == [200.0, 60.0]
    assert cli.main(args + [str(tmp_path / "glob"), "--repeat", "global"]) == 0
    glob = read_windows(str(tmp_path / "glob" / "windows.csv"), 2, 1000.0)
    assert glob.intervals[1] == [(0.0, 30.0), (40.0, 65.0), (70.0, 90.0)] and glob.period.tolist() == [1000.0] * 2


def test_a_refused_trace_leaves_the_output_folder_as_it_was(tmp_path):
    # good devices but a behaviour trace whose client 2 has no 'inactive': neither CSV is touched
    # (the devices one is complete, but the command refuses as a whole), no part file is left, and
    # a folder the command made for them is gone again
    (tmp_path / "cap").write_bytes(pickle.dumps(DEVICES))
    (tmp_path / "behave").write_bytes(pickle.dumps({**BEHAVIOUR, 2: {"active": [0]}}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "devices.csv").write_text("mine\n")
    (out / "windows.csv").write_text("mine too\n")
    args = [
        "data",
        "fedscale",
        "--devices",
        str(tmp_path / "cap"),
        "--availability",
        str(tmp_path / "behave"),
        "--clients",
        "3",
        "--out",
    ]
    assert cli.main(args + [str(out)]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["devices.csv", "windows.csv"]
    assert (out / "devices.csv").read_text() == "mine\n" and (out / "windows.csv").read_text() == "mine too\n"
    assert cli.main(args + [str(tmp_path / "new" / "deeper")]) == 2
    assert not (tmp_path / "new").exists()
    (tmp_path / "behave").write_bytes(pickle.dumps(BEHAVIOUR))
    assert cli.main(args + [str(out)]) == 0
    assert (out / "windows.csv").read_text().splitlines()[:2] == ["client,start_s,end_s,period_s", "0,0.0,500.0,3000.0"]
    assert sorted(p.name for p in out.iterdir()) == ["devices.csv", "windows.csv"]


NESTED = b"]" * 5000 + b"a" * 4999  # 5000 lists, each in the one before (EMPTY_LIST, APPEND)


def _crafted(obj) -> bytes:
    """``obj`` pickled, its string 'NESTED' replaced by 5000 nested lists (too deep to pickle)."""
    return pickle.dumps(obj, protocol=2).replace(b"X\x06\x00\x00\x00NESTED", NESTED)


@pytest.mark.parametrize(
    "kind, record, error",
    [
        ("devices", {"computation": True, "communication": 5.0}, r"client 1: computation: expected a number, got True"),
        ("devices", {"computation": "12", "communication": 5.0}, r"client 1: computation: expected a number, got '12'"),
        (
            "devices",
            {"computation": 10**400, "communication": 5.0},
            r"client 1: computation: <an integer of 1329 bits> is too large",
        ),
        ("devices", {"computation": float("nan"), "communication": 5.0}, r"client 1: computation: nan is not a finite"),
        (
            "devices",
            {"computation": 1.0, "communication": float("inf")},
            r"client 1: communication: inf is not a finite",
        ),
        (
            "devices",
            {"computation": "NESTED", "communication": 5.0},
            r"APPEND at byte \d+ nests containers more than 32 deep",
        ),  # the reader's cap
        (
            "devices",
            {"computation": 1e-310, "communication": 5.0},
            r"client 1: computation 1e-310 ms and communication "
            r"5 kbit/s give inf samples/s and 0.005 Mbit/s",
        ),
        (
            "availability",
            {"active": [0, float("nan")], "inactive": [5]},
            r"client 1: active: nan is not a finite number",
        ),
        (
            "availability",
            {"active": [0], "inactive": [5], "finish_time": float("inf")},
            r"client 1: finish_time: inf is not a finite number",
        ),
        ("availability", {"active": "05", "inactive": [5]}, r"client 1: active: expected a list of seconds, got '05'"),
        ("availability", {"active": ["NESTED"], "inactive": [5]}, r"APPEND at byte \d+ nests containers more than 32"),
        (
            "availability",
            {"active": [0], "inactive": [10**400]},
            r"client 1: inactive: <an integer of 1329 bits> is too",
        ),
        ("availability", {"active": [-5], "inactive": [5]}, r"client 1: active: -5 s; times are at least 0"),
        (
            "availability",
            {"active": [0], "inactive": [5], "finish_time": 0},
            r"client 1: finish_time: 0 must be above 0",
        ),
    ],
)
def test_a_crafted_fedscale_record_is_a_one_line_error(tmp_path, capsys, kind, record, error):
    path = tmp_path / "trace"
    path.write_bytes(_crafted({1: record, 2: record}))
    assert cli.main(["data", "fedscale", f"--{kind}", str(path), "--clients", "2", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(rf"raysim: {re.escape(str(path))}: {error}", err), err
    assert not (tmp_path / "o").exists()


def test_crafted_client_ids_and_an_out_that_is_a_file_are_one_line_errors(tmp_path, capsys):
    deep_key = b"\x80\x02}K\x01" + b"\x85" * 5000 + b"}s."  # {((((1,),),)...): {}}, 5000 tuples deep
    cases = [
        (deep_key, r"TUPLE1 at byte 37 nests containers more than 32 deep"),  # the reader's caps
        (pickle.dumps({1: {}, (1,): {}}), r"SETITEMS at byte \d+: a dict key or set item is a tuple"),
        (pickle.dumps({float("nan"): {}}), r"client id nan: expected a number or a string"),
    ]
    for data, error in cases:
        (tmp_path / "cap").write_bytes(data)
        assert (
            cli.main(
                ["data", "fedscale", "--devices", str(tmp_path / "cap"), "--clients", "1", "--out", str(tmp_path / "o")]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and re.match(rf"raysim: .*cap: {error}", err), err
    (tmp_path / "cap").write_bytes(pickle.dumps(DEVICES))
    (tmp_path / "file").write_text("x")
    for out in ("file", "file/sub"):
        assert (
            cli.main(
                ["data", "fedscale", "--devices", str(tmp_path / "cap"), "--clients", "1", "--out", str(tmp_path / out)]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert err == f"raysim: {tmp_path / out}: --out must be a folder, but {tmp_path / 'file'} is a file\n"


def test_the_windows_conversion_is_linear_in_the_times(tmp_path):
    # 30 000 active and 30 000 inactive times, alternating: 30 000 intervals; pairing each active time
    # by scanning the inactive ones took 12 s, one pass over the two sorted lists takes a fraction of one
    n = 30_000
    behave = {
        0: {
            "active": [2.0 * i for i in range(n)],
            "inactive": [2.0 * i + 1 for i in range(n)][::-1],
            "finish_time": 2.0 * n,
        }
    }
    (tmp_path / "behave").write_bytes(pickle.dumps(behave))
    t0 = time.perf_counter()
    rows = list(traces.window_rows(tmp_path / "behave", 1))
    assert time.perf_counter() - t0 < 3.0
    assert len(rows) == n + 1 and rows[1] == [0, "0.0", "1.0", "60000.0"] and rows[-1][1:3] == ["59998.0", "59999.0"]


def test_the_trace_tools_do_not_import_torch(tmp_path):
    """A conversion and a refusal in a fresh interpreter leave torch unimported (it costs half a
    gigabyte and seconds to load, for a tool that only reads and writes tables)."""
    (tmp_path / "cap").write_bytes(pickle.dumps(DEVICES))
    (tmp_path / "bad").write_bytes(pickle.dumps({1: {"computation": -1.0, "communication": 1.0}}))
    code = (
        "import sys; from raysim import cli; "
        f"a = cli.main(['data', 'fedscale', '--devices', {str(tmp_path / 'cap')!r}, '--clients', '2', "
        f"'--out', {str(tmp_path / 'out')!r}]); "
        f"b = cli.main(['data', 'fedscale', '--devices', {str(tmp_path / 'bad')!r}, '--clients', '1', "
        f"'--out', {str(tmp_path / 'out')!r}]); "
        "print(a, b, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "0 2 False", done.stdout + done.stderr
    assert (tmp_path / "out" / "devices.csv").read_text().count("\n") == 3


# Crafted pickles, built opcode by opcode (pickle's opcode constants are one-byte bytes).
P = pickle


def _opcodes(body: bytes) -> bytes:
    return P.PROTO + b"\x04" + body + P.STOP


def _get(i: int) -> bytes:
    return P.BINGET + bytes([i])


def _tuple_key_dag(levels: int = 60) -> bytes:
    """{t: None} where t = (t', t') and so on down to 0: 2^60 leaves, one tuple per level in the file."""
    body = P.EMPTY_DICT + P.BININT1 + b"\x00" + P.MEMOIZE + P.POP
    for i in range(levels):
        body += _get(i) + _get(i) + P.TUPLE2 + P.MEMOIZE + P.POP
    return _opcodes(body + _get(levels) + P.NONE + P.SETITEM)


def _list_dag(levels: int = 40) -> bytes:
    """{1: L} where L = [L', L'] and so on down to []: a list of 2^40 lists."""
    body = P.EMPTY_DICT + P.BININT1 + b"\x01" + P.EMPTY_LIST + P.MEMOIZE + P.POP
    for i in range(levels):
        body += P.EMPTY_LIST + P.MEMOIZE + P.MARK + _get(i) + _get(i) + P.APPENDS + P.POP
    return _opcodes(body + _get(levels) + P.SETITEM)


def _colliding_int_keys(n: int = 20_000) -> bytes:
    """{k·(2^61 − 1): None for k = 1..n}: every key hashes to 0, so each insertion compares all before it."""
    m = 2**61 - 1
    keys = b"".join(
        P.LONG1 + bytes([10]) + (k * m).to_bytes(10, "little", signed=True) + P.NONE for k in range(1, n + 1)
    )
    return _opcodes(P.EMPTY_DICT + P.MARK + keys + P.SETITEMS)


def _deep_tuple_key(depth: int = 300_000) -> bytes:
    return _opcodes(P.EMPTY_DICT + P.BININT1 + b"\x00" + P.TUPLE1 * depth + P.NONE + P.SETITEM)


# Each runs in a child process as `raysim data fedscale --devices FILE` runs it (traces.devices_csv),
# with 200 MB of address space beyond what Python, numpy and torch hold once imported; the child
# times each file with perf_counter.
CHILD = r"""
import json, resource, sys, time
from raysim.federation import traces
from raysim.federation.fleet import TraceError
held = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (held + 200 * 2 ** 20, resource.RLIM_INFINITY))
found = {}
for path in sys.argv[2:]:
    start = time.perf_counter()
    try:
        list(traces.device_rows(path, 1))
        found[path] = [None, time.perf_counter() - start]
    except TraceError as e:
        found[path] = [str(e), time.perf_counter() - start]
print(json.dumps(found))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the address space from /proc")
def test_crafted_pickles_that_would_hang_or_exhaust_memory_are_refused_fast_in_bounded_memory(tmp_path):
    import json
    import subprocess
    import sys

    # a tuple or list of level j holds 2^(j+2) - 1 values, 2^27 - 1 > 10^8 first at j = 25: the TUPLE2 at byte
    # 11 + 7·25 (PROTO, EMPTY_DICT, BININT1, MEMOIZE, POP, then 7 bytes a level), the APPENDS at 15 + 9·25
    # (PROTO, EMPTY_DICT, BININT1, EMPTY_LIST, MEMOIZE, POP, then 9 bytes a level); the first colliding key is
    # 2^61 - 1 itself, at SETITEMS after PROTO, EMPTY_DICT, MARK and 20 000 keys of 13 bytes
    cases = {
        "tuple_key_dag": (_tuple_key_dag(), "TUPLE2 at byte 186 builds a tuple of more than 100,000,000 values"),
        "list_dag": (_list_dag(), "APPENDS at byte 240 builds a list of more than 100,000,000 values"),
        "colliding_keys": (
            _colliding_int_keys(),
            f"SETITEMS at byte {2 + 2 + 20_000 * 13}: an int dict key or set item beyond ±2^61",
        ),
    }
    for name, (data, _) in cases.items():
        assert len(data) < 300_000
        (tmp_path / name).write_bytes(data)
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "out.csv"), *(str(tmp_path / name) for name in cases)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout)
    for name, (_, message) in cases.items():
        text, seconds = found[str(tmp_path / name)]
        assert text is not None and text.startswith(f"{tmp_path / name}: {message}"), (name, text)
        assert seconds < 1.0, (name, seconds)


def test_a_tuple_key_nested_300000_deep_is_one_line_from_the_command_not_a_crash(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "deep"
    path.write_bytes(_deep_tuple_key())
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "raysim.cli",
            "data",
            "fedscale",
            "--devices",
            str(path),
            "--clients",
            "1",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # PROTO (2 bytes), EMPTY_DICT, BININT1 0 (2 bytes): the TUPLE1s start at byte 5; the 33rd nests 33 deep
    assert run.returncode == 2
    assert (
        run.stderr == f"raysim: {path}: TUPLE1 at byte 37 nests containers more than 32 deep "
        f"(a FedScale trace nests 3)\n"
    )


@pytest.mark.parametrize(
    "body, message",
    [
        (
            P.EMPTY_LIST + P.MARK + P.BININT1 + b"\x01" + P.BININT1 + b"\x02" + P.SETITEMS,
            "SETITEMS at byte 8 adds to a list; it adds only to a dict",
        ),
        (
            P.EMPTY_TUPLE + P.BININT1 + b"\x01" + P.BININT1 + b"\x02" + P.SETITEM,
            "SETITEM at byte 7 adds to a tuple; it adds only to a dict",
        ),
        (
            P.EMPTY_DICT + P.MARK + P.BININT1 + b"\x01" + P.APPENDS,
            "APPENDS at byte 6 adds to a dict; it adds only to a list",
        ),
        (P.EMPTY_DICT + P.BININT1 + b"\x01" + P.APPEND, "APPEND at byte 5 adds to a dict; it adds only to a list"),
        (
            P.EMPTY_LIST + P.MARK + P.BININT1 + b"\x01" + P.ADDITEMS,
            "ADDITEMS at byte 6 adds to a list; it adds only to a set",
        ),
        (
            P.EMPTY_DICT + P.BININT1 + b"\x01" + P.BININT1 + b"\x02" + P.TUPLE2 + P.NONE + P.SETITEM,
            "SETITEM at byte 9: a dict key or set item is a tuple; only str, int, float, bool, None or bytes are read",
        ),
        (P.EMPTY_SET + P.MARK + P.EMPTY_TUPLE + P.ADDITEMS, "ADDITEMS at byte 5: a dict key or set item is a tuple"),
        (P.EMPTY_LIST + P.MEMOIZE + _get(0) + P.APPEND, "APPEND at byte 6 puts a list inside itself (a cycle)"),
        (
            P.EMPTY_LIST + P.MEMOIZE + P.EMPTY_LIST + _get(0) + P.APPEND + _get(0) + P.BININT1 + b"\x01" + P.APPEND,
            "APPEND at byte 12 changes a list already inside another container",
        ),
        (
            P.EMPTY_DICT + P.BININT1 + b"\x01" + P.EMPTY_LIST * 100_000 + P.APPEND * 99_999 + P.SETITEM,
            "APPEND at byte 100036 nests containers more than 32 deep",
        ),
    ],
)
def test_an_opcode_that_builds_what_plain_data_cannot_hold_is_refused_naming_it_and_its_byte(tmp_path, body, message):
    path = tmp_path / "bad.pkl"
    path.write_bytes(_opcodes(body))
    start = time.perf_counter()
    with pytest.raises(TraceError) as e:
        list(traces.device_rows(path, 1))
    assert time.perf_counter() - start < 1.0
    assert str(e.value).startswith(f"{path}: {message}")


def test_a_malformed_pickle_is_refused_without_quoting_its_bytes(tmp_path):
    path = tmp_path / "bad.pkl"  # a protocol-0 string opcode whose argument has no quotes
    path.write_bytes(P.EMPTY_DICT + P.BININT1 + b"\x01" + P.STRING + b"x" * 100_000 + b"\n" + P.SETITEM + P.STOP)
    with pytest.raises(TraceError) as e:
        traces.literal(path)
    assert str(e.value) == (
        f"{path}: not a readable pickle (an opcode or its argument after byte 1 is unknown, malformed or cut short)"
    )


def test_a_value_beyond_a_float_is_a_trace_error_naming_the_client(tmp_path):
    path = tmp_path / "cap"
    path.write_bytes(pickle.dumps({7: {"computation": 2**2000, "communication": 1.0}}))
    with pytest.raises(TraceError, match=r"cap: client 7: computation: <an integer of 2001 bits> is too large"):
        list(traces.device_rows(path, 1))
    path.write_bytes(pickle.dumps({"x" * 1000: {"active": [2**2000], "inactive": []}}))
    with pytest.raises(TraceError, match=r"cap: client 'x{12}\.\.\.x{13}': active: <an integer of 2001 bits>"):
        list(traces.window_rows(path, 1))


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_shared_references_read_as_pickle_reads_them(tmp_path, protocol):
    # FedScale's files memoize every container and string: a list used twice is one BINGET the second time
    shared = [1.5, 2.5]
    data = pickle.dumps(
        {3: {"active": shared, "inactive": shared, "finish_time": 9.0}, 4: (shared, shared)}, protocol=protocol
    )
    assert pickle.GET in data or pickle.BINGET in data
    path = tmp_path / "t.pkl"
    path.write_bytes(data)
    got, want = traces.literal(path), pickle.loads(data)  # bytes made here, not a user's file
    assert (
        got
        == want
        == {3: {"active": [1.5, 2.5], "inactive": [1.5, 2.5], "finish_time": 9.0}, 4: ([1.5, 2.5], [1.5, 2.5])}
    )
    assert got[3]["active"] is got[3]["inactive"] is got[4][0] is got[4][1]
