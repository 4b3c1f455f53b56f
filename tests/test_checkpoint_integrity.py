"""Checkpoints verify themselves: each kind of damage is refused with one line naming the file
and what is wrong (never a resume with other metrics), a full disk keeps the last complete
checkpoint, and a clean checkpoint resumes bit-identically. Serial engine, tiny scenario."""

import contextlib
import errno
import io
import json
import shutil
import subprocess

import pytest
import torch

from raysim.engine import checkpoint
from raysim.engine.checkpoint import CheckpointError, CheckpointWriteError
from raysim.engine.serial import serial_driver
from raysim.errors import EXIT_FAILED, EXIT_INPUT, explain
from raysim.scenario import config
from tests.conftest import TINY, write_scenario
from tests.test_runs import raysim

SETS = ["rounds=5", "algorithm.name=local", "sampling.fraction=1.0"]  # stateful clients
R4 = "round-00000004"


def strip(history):
    return [{k: v for k, v in h.items() if "seconds" not in k and "bytes" not in k} for h in history]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Run "run-a" checkpointed at round 4 (its round-2 folder kept aside), run "run-b" (the
    same states, another run id), the reference 5-round run, and a driver to restore into."""
    tmp = tmp_path_factory.mktemp("made")
    sc = config.load(write_scenario(tmp, TINY), SETS)
    d = serial_driver(sc, 2)
    d.step(), d.step()
    d.save(str(tmp / "run-a"))
    shutil.copytree(tmp / "run-a" / "round-00000002", tmp / "round2")
    d.step(), d.step()
    d.save(str(tmp / "run-a"))
    d.save(str(tmp / "run-b"))
    d.step()
    return {"tmp": tmp, "sc": sc, "full": d, "victim": serial_driver(sc, 2), "cl0": d.transport.placement.clients(0)}


def fresh(made, tmp_path, run="run-a"):
    ck = tmp_path / run
    shutil.copytree(made["tmp"] / run, ck)
    return ck


def flip(path, at=None):
    data = bytearray(path.read_bytes())
    at = len(data) // 2 if at is None else at
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_manifest(ck, change):
    doc = json.loads((ck / "manifest.json").read_text())
    change(doc)
    (ck / "manifest.json").write_text(json.dumps(doc))


def reseal(ck, name, content):
    """Replace host file ``name`` by ``content`` and bring server.pt's and the manifest's
    entries up to date: a consistent checkpoint, down to the hashes."""
    rdir = ck / R4
    server = checkpoint.load(rdir / "server.pt")
    for h in server["hosts"]:
        if h["file"] == name:
            h.update(checkpoint.save(rdir / name, content))
    digest = checkpoint.save(rdir / "server.pt", server)
    edit_manifest(ck, lambda doc: doc.update(hosts=server["hosts"], server={"file": "server.pt", **digest}))


def swap_clients(doc):
    a, b = doc["hosts"]
    a["clients"], b["clients"] = b["clients"], a["clients"]


def empty_clients(doc):
    for h in doc["hosts"]:
        h["clients"] = []


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def plant(ck, source, *files):
    for f in files:
        shutil.copy(source / f, ck / R4 / f)


def size(m, name):
    return (m["tmp"] / "run-a" / R4 / name).stat().st_size


H0, S, M = f"{R4}/host-0.pt", f"{R4}/server.pt", "manifest.json"
SHA = "SHA-256 differs from the manifest's (file damaged or replaced)"
ENTRIES = f"{M}: its host files' entries differ from those {S} records (manifest damaged or edited)"
# kind: (damage(ck, made), the message after "<checkpoint folder>/" (made, ck))
DAMAGE = {
    "server_byte_flipped": (lambda ck, m: flip(ck / S), lambda m, ck: f"{S}: {SHA}"),
    "host_byte_flipped": (lambda ck, m: flip(ck / R4 / "host-1.pt"), lambda m, ck: f"{R4}/host-1.pt: {SHA}"),
    "manifest_clients_swapped": (lambda ck, m: edit_manifest(ck, swap_clients), lambda m, ck: ENTRIES),
    "manifest_clients_emptied": (lambda ck, m: edit_manifest(ck, empty_clients), lambda m, ck: ENTRIES),
    "host_file_empty": (
        lambda ck, m: torch.save({}, ck / H0),
        lambda m, ck: (
            f"{H0}: {(ck / H0).stat().st_size} bytes, the manifest says {size(m, 'host-0.pt')} "
            "(file damaged or replaced)"
        ),
    ),
    "host_file_empty_states_resealed": (
        lambda ck, m: reseal(ck, "host-0.pt", {**checkpoint.load(ck / H0), "states": {}}),
        lambda m, ck: (
            f"{H0}: no state for client {m['cl0'][0]} (and {len(m['cl0']) - 1} more), which the "
            "manifest lists for this file"
        ),
    ),
    "round2_files_planted": (
        lambda ck, m: plant(ck, m["tmp"] / "round2", "server.pt", "host-0.pt", "host-1.pt"),
        lambda m, ck: f"{S}: holds round 2, the manifest round 4 (a file of another round)",
    ),
    "round2_host_file_planted": (
        lambda ck, m: plant(ck, m["tmp"] / "round2", "host-1.pt"),
        lambda m, ck: f"{R4}/host-1.pt: holds round 2, the manifest round 4 (a file of another round)",
    ),
    "zero_byte_host_file": (
        lambda ck, m: (ck / H0).write_bytes(b""),
        lambda m, ck: f"{H0}: 0 bytes, the manifest says {size(m, 'host-0.pt')} (file damaged or replaced)",
    ),
    "host_file_missing": (lambda ck, m: (ck / H0).unlink(), lambda m, ck: f"{H0}: missing (the manifest lists it)"),
    "server_truncated": (
        lambda ck, m: truncate(ck / S),
        lambda m, ck: (
            f"{S}: {size(m, 'server.pt') // 2} bytes, the manifest says {size(m, 'server.pt')} (file damaged or replaced)"
        ),
    ),
    "manifest_truncated": (
        lambda ck, m: truncate(ck / M),
        lambda m, ck: f"{M}: not valid JSON, file truncated or damaged (",
    ),
    "server_of_another_run": (
        lambda ck, m: plant(ck, m["tmp"] / "run-b" / R4, "server.pt"),
        lambda m, ck: f"{S}: written by run run-b, not run-a (a file of another run)",
    ),
    "host_file_of_another_run": (
        lambda ck, m: plant(ck, m["tmp"] / "run-b" / R4, "host-0.pt"),
        lambda m, ck: f"{H0}: written by run run-b, not run-a (a file of another run)",
    ),
    "older_format": (
        lambda ck, m: edit_manifest(ck, lambda doc: doc.update(format=2)),
        lambda m, ck: (
            f"{M}: checkpoint format 2, written by an older raysim; this one reads format 3 and cannot resume it"
        ),
    ),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_refused_with_one_line_naming_the_file(made, tmp_path, kind):
    damage, expected = DAMAGE[kind]
    ck = fresh(made, tmp_path)
    damage(ck, made)
    with pytest.raises(CheckpointError) as verified:
        checkpoint.verify(ck)
    line = str(verified.value)
    assert line.startswith(f"{ck}/{expected(made, ck)}") and "\n" not in line
    with pytest.raises(CheckpointError) as restored:  # a resume (or a recovery) reads the same
        made["victim"].restore(str(ck))
    assert str(restored.value) == line
    assert explain(restored.value) == (EXIT_INPUT, line)


def test_a_whole_checkpoint_of_another_run_is_refused(made, tmp_path):
    ck = tmp_path / "run-a"
    shutil.copytree(made["tmp"] / "run-b", ck)  # run-b's folder put in place of run-a's
    with pytest.raises(
        CheckpointError,
        match=r"manifest.json: written by run run-b, not run-a \(the checkpoint "
        r"folder's name\)$",
    ):
        checkpoint.verify(ck)


def test_a_clean_checkpoint_verifies_and_resumes_bit_identically(made, tmp_path):
    ck = fresh(made, tmp_path)
    doc = checkpoint.verify(ck)
    assert doc["format"] == 3 and doc["run"] == "run-a" and doc["round"] == 4
    assert all(len(h["sha256"]) == 64 and h["size"] == (ck / R4 / h["file"]).stat().st_size for h in doc["hosts"])
    assert checkpoint.server_part(ck)["hosts"] == doc["hosts"]
    resumed = serial_driver(made["sc"], 3)  # another host count
    assert resumed.restore(str(ck)) == 4
    resumed.step()
    full = made["full"]
    assert strip(resumed.history) == strip(full.history)
    assert all(torch.equal(a, b) for a, b in zip(resumed.server_state, full.server_state))
    states, want = resumed.transport.get_states(), full.transport.get_states()
    assert sorted(states) == sorted(want)
    for c in want:
        assert all(torch.equal(a, b) for a, b in zip(states[c]["state"]["params"], want[c]["state"]["params"]))


@contextlib.contextmanager
def small_disk(tmp_path, monkeypatch):
    """A 1 MiB tmpfs at ``tmp_path/fs`` (root), or else a seam: files opened for writing in the
    checkpoint module fail as a full disk does. Yields fill(), which uses up the space."""
    fs = tmp_path / "fs"
    fs.mkdir()
    try:
        mounted = (
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(fs)], capture_output=True).returncode
            == 0
        )
    except OSError:  # no mount command
        mounted = False

    def fill():
        if mounted:
            with contextlib.suppress(OSError), open(fs / "filler", "wb", buffering=0) as f:
                while True:
                    f.write(b"\0" * 4096)
        else:

            class Full(io.FileIO):
                def write(self, b):
                    raise OSError(errno.ENOSPC, "No space left on device")

            real = open
            monkeypatch.setattr(
                checkpoint,
                "open",
                lambda p, mode="r", *a, **k: Full(p, "wb") if "w" in mode else real(p, mode, *a, **k),
                raising=False,
            )

    try:
        yield fs, fill
    finally:
        monkeypatch.undo()
        if mounted:
            subprocess.run(["umount", "-l", str(fs)], check=True)


def test_a_full_disk_keeps_the_last_complete_checkpoint_and_says_so(made, tmp_path, monkeypatch):
    with small_disk(tmp_path, monkeypatch) as (fs, fill):
        ck = fs / "run-a"
        shutil.copytree(made["tmp"] / "run-a", ck)
        d = serial_driver(made["sc"], 2)
        d.restore(str(ck))
        d.step()
        fill()
        with pytest.raises(CheckpointWriteError) as err:
            d.save(str(ck))
        code, line = explain(err.value)
        assert code == EXIT_FAILED  # a failure, not bad input
        assert line.startswith(
            f"run failed: CheckpointWriteError: {ck}/round-00000005/host-0.pt: no space left on {ck}/round-00000005"
        )
        monkeypatch.undo()
        (fs / "filler").unlink(missing_ok=True)
        assert sorted(p.name for p in ck.iterdir()) == [".raysim-dir", "manifest.json", R4]  # no partial round
        assert not list(ck.rglob("*.tmp*"))
        assert checkpoint.verify(ck)["round"] == 4
        resumed = serial_driver(made["sc"], 2)
        assert resumed.restore(str(ck)) == 4


def test_resume_of_a_damaged_checkpoint_exits_2_with_one_line(made, tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    rid = client.create_run(client.create_experiment("raysim")).info.run_id
    client.set_terminated(rid, "FAILED")  # a run that stopped, its checkpoint kept
    made["full"].save(str(tmp_path / "ck" / rid))
    flip(tmp_path / "ck" / rid / "round-00000005" / "server.pt")
    path = write_scenario(
        tmp_path, TINY + f"checkpoint: {{dir: '{tmp_path}/ck'}}\ntracking: {{uri: 'sqlite:///{tmp_path}/mlflow.db'}}\n"
    )
    sets = [a for s in SETS for a in ("--set", s)]
    proc = raysim("run", path, *sets, "--engine", "serial", "-q", "--resume", rid, check=False, here=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"raysim: {tmp_path}/ck/{rid}/round-00000005/server.pt: "
        "SHA-256 differs from the manifest's (file damaged or replaced)"
    ]


def test_damage_found_by_a_ray_host_is_still_one_line():
    """A host actor's CheckpointError reaches the driver as Ray's task error (an instance of
    CheckpointError too, whose text is Ray's traceback): the one line is the cause's."""
    from ray.exceptions import RayTaskError

    line = "ck/run-a/round-00000004/host-0.pt: SHA-256 differs from the manifest's (file damaged or replaced)"
    err = RayTaskError("RayHost.read_states", "Traceback (most recent call last):\n  ...", CheckpointError(line))
    assert explain(err.as_instanceof_cause()) == (EXIT_INPUT, line)
