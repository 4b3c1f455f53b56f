"""Checkpoints without a bottleneck: each host writes its own clients' state, the server writes
its own, and an atomic manifest says which round is complete; every file is verified before
it is used.

A run's checkpoint is a folder ``<checkpoint.dir>/<run id>/``::

    manifest.json            {"format": 3, "run": ID, "round": R, "folder": "round-0000000R",
                              "server": {"file": "server.pt", "size": N, "sha256": HEX},
                              "hosts": [{"file": "host-0.pt", "size": N, "sha256": HEX, "clients": [...]}, ...]}
    round-0000000R/server.pt  format, run, round, the hosts' entries (as in the manifest), server
                              state, metrics history, the scenario
    round-0000000R/host-H.pt  format, run, round, "states": {client id: {"state": ..., "server": ...}}
    .raysim-dir              a random token: a host that reads it back sees this folder

Writing a round: the hosts write their files (each to a temporary name, hashed while written,
fsynced, renamed) and return their entries (file, size, SHA-256, clients); the server writes
server.pt, which records those entries, then replaces the manifest (``os.replace``, atomic),
which records server.pt's size and SHA-256 and the same entries; older round folders are then
removed. A crash at any point leaves the manifest naming the last complete round; a failed
write (a full disk: "no space left on DIR") removes the partial round folder and raises
CheckpointWriteError naming the file.

Reading checks the chain: the manifest (format, run id = the folder's name, round), then each
file before it is loaded (its size and SHA-256 against the manifest, read in chunks; inside:
format, run id, round, and for a host file exactly the clients its entry lists), and server.pt's
host entries against the manifest's. Anything amiss raises CheckpointError, one line naming the
file and what is wrong (an input error, exit 2); a listed client's state is never silently
replaced by a fresh start. ``verify`` checks every file; a resume reads the manifest and
server.pt (``read``), and each host verifies the files holding its clients as it reads them
(with the same placement, its own file). A host on a node that does not see the folder (no
shared file system) hands its states to the server (in the driver's process), which writes (or
reads) that host's file for it: one host's states at a time, never every model at once.

Files are loaded with ``torch.load(..., weights_only=True)``: nothing in a checkpoint is
unpickled as code.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch

from raysim.scenario.schema import ScenarioError

FORMAT = 3
MANIFEST, TOKEN, SERVER = "manifest.json", ".raysim-dir", "server.pt"


class CheckpointError(ScenarioError):
    """A checkpoint that cannot be used (missing, truncated, damaged, replaced, of another run,
    round or format): one line naming the file and what is wrong; exit 2, as bad input."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint file could not be written (one line naming it; a full disk says "no space
    left on DIR"); the manifest still names the last complete round. The run fails (exit 1)."""


def run_dir(directory: str, run_id: str) -> Path:
    return Path(directory) / run_id


def exists(folder: str | os.PathLike) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def _run_id(folder: str | os.PathLike) -> str:
    """A checkpoint folder's name is its run's id (``run_dir``)."""
    return Path(os.path.abspath(folder)).name


def header(folder: str | os.PathLike, round_: int) -> dict:
    """What every file of round ``round_`` of the checkpoint in ``folder`` records: the format,
    the run id and the round."""
    return {"format": FORMAT, "run": _run_id(folder), "round": int(round_)}


# -- writing ---------------------------------------------------------------------------------
class _Hashing:
    """The file torch.save writes through: counts and hashes the bytes on their way."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, b) -> int:
        n = self.f.write(b)
        self.sha.update(b)
        self.size += memoryview(b).nbytes
        return n

    def flush(self) -> None:
        self.f.flush()


def _write_error(path: Path, err: BaseException) -> CheckpointWriteError:
    """``err`` as one line naming ``path``. Torch reports a failed write as RuntimeError
    "unexpected pos", with the OSError as its context (none when torch wrote the file itself)."""
    os_err: BaseException | None = err
    while os_err is not None and not isinstance(os_err, OSError):
        os_err = os_err.__cause__ or os_err.__context__
    if getattr(os_err, "errno", None) == errno.ENOSPC or (os_err is None and "unexpected pos" in str(err)):
        why = f"no space left on {path.parent}"
    else:
        why = getattr(os_err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[-1]
    return CheckpointWriteError(f"{path}: {why}")


def _atomic(path: str | os.PathLike, write) -> None:
    """``write(f)`` into a temporary file beside ``path``, fsynced, then renamed over it; on
    failure the temporary file is removed and CheckpointWriteError names ``path``."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        with suppress(OSError):
            tmp.unlink()
        raise _write_error(path, err) from err


def save(path: str | os.PathLike, state: Any) -> dict:
    """Write ``state`` to ``path`` atomically; its ``{"size", "sha256"}`` (hashed while written)."""
    sinks: list[_Hashing] = []

    def write(f):
        sinks.append(_Hashing(f))
        torch.save(state, sinks[-1])

    _atomic(path, write)
    return {"size": sinks[-1].size, "sha256": sinks[-1].sha.hexdigest()}


def host_file(h: int) -> str:
    return f"host-{h}.pt"


def write_host(path: str | os.PathLike, head: dict, states: dict[int, Any]) -> dict:
    """Write a host file (``head``: see ``header``); its manifest entry."""
    return {
        "file": Path(path).name,
        **save(path, {**head, "states": states}),
        "clients": sorted(int(c) for c in states),
    }


def token(folder: str | os.PathLike) -> str:
    """The folder's token (created on first use): hosts compare it to tell whether they see
    the same folder as the server."""
    path = Path(folder) / TOKEN
    if not path.exists():
        _atomic(path, lambda f: f.write(secrets.token_hex(16).encode()))
    return path.read_text()


def visible(folder: str | os.PathLike, expected: str) -> bool:
    """True when this process sees the folder the server made (same token)."""
    try:
        return (Path(folder) / TOKEN).read_text() == expected
    except OSError:
        return False


def _round_name(round_: int) -> str:
    return f"round-{round_:08d}"


def _committed(folder: str | os.PathLike) -> str | None:
    """The round folder the manifest names (unchecked), if any."""
    try:
        return json.loads((Path(folder) / MANIFEST).read_text()).get("folder")
    except (OSError, ValueError, AttributeError):
        return None


def round_folder(folder: str | os.PathLike, round_: int) -> Path:
    """A fresh folder for round ``round_``'s files (emptied if a crash left one)."""
    path = Path(folder) / _round_name(round_)
    if path.exists():
        shutil.rmtree(path)
    try:
        path.mkdir(parents=True)
    except OSError as err:
        raise _write_error(path, err) from err
    return path


@contextmanager
def writing(folder: str | os.PathLike, rdir: str | os.PathLike) -> Iterator[None]:
    """Round folder ``rdir`` being written: if anything fails, it is removed (unless the
    manifest names it already) and the error goes on; the last complete round stands."""
    try:
        yield
    except BaseException:
        if _committed(folder) != Path(rdir).name:
            shutil.rmtree(rdir, ignore_errors=True)
        raise


def commit(folder: str | os.PathLike, head: dict, server: dict, hosts: list[dict]) -> None:
    """Make round ``head["round"]`` the checkpoint (``server``: server.pt's size and SHA-256;
    ``hosts``: the host files' entries): replace the manifest atomically, then remove the older
    round folders."""
    folder = Path(folder)
    name = _round_name(head["round"])
    doc = {**head, "folder": name, "server": {"file": SERVER, **server}, "hosts": hosts}
    _atomic(folder / MANIFEST, lambda f: f.write(json.dumps(doc).encode()))
    for old in folder.glob("round-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


# -- reading ---------------------------------------------------------------------------------
def load(path: str | os.PathLike) -> Any:
    """A file's content, unverified (``weights_only``: no code is unpickled)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def _format_error(path: Path, got: Any) -> CheckpointError:
    if isinstance(got, int) and got < FORMAT:
        return CheckpointError(
            f"{path}: checkpoint format {got}, written by an older raysim; this one reads "
            f"format {FORMAT} and cannot resume it"
        )
    return CheckpointError(f"{path}: not a raysim checkpoint of format {FORMAT} (format {got!r})")


def _entry_ok(e: Any) -> bool:
    return (
        isinstance(e, dict)
        and isinstance(e.get("file"), str)
        and e["file"] == Path(e["file"]).name
        and e["file"] not in ("", ".", "..")
        and isinstance(e.get("size"), int)
        and isinstance(e.get("sha256"), str)
    )


def _manifest(folder: str | os.PathLike) -> dict:
    """The manifest, checked on its own: it parses, its format, its run id is the folder's
    name, its entries are well formed."""
    path = Path(folder) / MANIFEST
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (no checkpoint here)") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err})") from None
    except ValueError as err:
        raise CheckpointError(f"{path}: not valid JSON, file truncated or damaged ({err})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: not a raysim checkpoint manifest")
    if doc.get("format") != FORMAT:
        raise _format_error(path, doc.get("format"))
    run = _run_id(folder)
    if doc.get("run") != run:
        raise CheckpointError(f"{path}: written by run {doc.get('run')}, not {run} (the checkpoint folder's name)")
    hosts = doc.get("hosts")
    if not (
        isinstance(doc.get("round"), int)
        and doc.get("folder") == _round_name(doc["round"])
        and _entry_ok(doc.get("server"))
        and doc["server"]["file"] == SERVER
        and isinstance(hosts, list)
        and all(
            _entry_ok(h) and isinstance(h.get("clients"), list) and all(isinstance(c, int) for c in h["clients"])
            for h in hosts
        )
    ):
        raise CheckpointError(f"{path}: malformed (damaged or edited)")
    return doc


def _digest(path: Path) -> tuple[int, str]:
    sha, size = hashlib.sha256(), 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                sha.update(chunk)
                size += len(chunk)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (the manifest lists it)") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err})") from None
    return size, sha.hexdigest()


def _check_inside(path: Path, part: Any, head: dict, clients: list[int] | None) -> None:
    """What file ``path`` records against what the manifest expects (``head``; a host file's
    ``clients``)."""
    if not isinstance(part, dict):
        raise CheckpointError(f"{path}: not a raysim checkpoint file")
    if part.get("format") != FORMAT:
        raise _format_error(path, part.get("format"))
    if part.get("run") != head["run"]:
        raise CheckpointError(f"{path}: written by run {part.get('run')}, not {head['run']} (a file of another run)")
    if part.get("round") != head["round"]:
        raise CheckpointError(
            f"{path}: holds round {part.get('round')}, the manifest round {head['round']} (a file of another round)"
        )
    if clients is not None:
        have, listed = set(part.get("states") or {}), set(clients)
        if missing := sorted(listed - have):
            raise CheckpointError(
                f"{path}: no state for client {missing[0]}"
                f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}, "
                "which the manifest lists for this file"
            )
        if extra := sorted(have - listed):
            raise CheckpointError(
                f"{path}: holds the state of client {extra[0]}, which the manifest does not list for this file"
            )


def _open(folder: str | os.PathLike, doc: dict, entry: dict, host: bool) -> dict:
    """File ``entry`` of the manifest ``doc``, loaded once verified: its size and SHA-256
    against the entry, then what it records. A file that differs but loads is first checked
    for what it records (a file of another round or run says so)."""
    path = Path(folder) / doc["folder"] / entry["file"]
    head = header(folder, doc["round"])
    clients = entry["clients"] if host else None
    size, sha = _digest(path)
    if (size, sha) != (entry["size"], entry["sha256"]):
        try:
            part = load(path)
        except Exception:  # noqa: BLE001 - damaged beyond loading: the size or hash says it
            part = None
        if isinstance(part, dict) and part.get("format") == FORMAT:
            _check_inside(path, part, head, clients)
        what = (
            f"{size} bytes, the manifest says {entry['size']}"
            if size != entry["size"]
            else "SHA-256 differs from the manifest's"
        )
        raise CheckpointError(f"{path}: {what} (file damaged or replaced)")
    try:
        part = load(path)
    except Exception as err:  # noqa: BLE001 - as written yet unreadable (another torch?)
        raise CheckpointError(
            f"{path}: cannot be loaded ({type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]})"
        ) from None
    _check_inside(path, part, head, clients)
    return part


def read(folder: str | os.PathLike) -> tuple[dict, dict]:
    """(manifest, server.pt's content) of the last complete round, both verified: the
    manifest, server.pt against it, and the host entries server.pt records against the
    manifest's. Raises CheckpointError."""
    doc = _manifest(folder)
    server = _open(folder, doc, doc["server"], host=False)
    if server.get("hosts") != doc["hosts"]:
        raise CheckpointError(
            f"{Path(folder) / MANIFEST}: its host files' entries differ from those "
            f"{doc['folder']}/{SERVER} records (manifest damaged or edited)"
        )
    return doc, server


def manifest(folder: str | os.PathLike) -> dict:
    """The verified manifest (see ``read``)."""
    return read(folder)[0]


def server_part(folder: str | os.PathLike) -> dict:
    """The server's file of the last complete round (round, server, history, scenario),
    verified (see ``read``)."""
    return read(folder)[1]


def verify(folder: str | os.PathLike) -> dict:
    """Check the whole checkpoint in ``folder`` (``read``, then every host file: its size,
    SHA-256 and what it records), one file in memory at a time; the manifest. Raises
    CheckpointError naming the file and what is wrong."""
    doc, _ = read(folder)
    for entry in doc["hosts"]:
        _open(folder, doc, entry, host=True)
    return doc


def holding(doc: dict, cids) -> dict:
    """The manifest with only the host files that hold any of ``cids``."""
    want = set(int(c) for c in cids)
    return {**doc, "hosts": [h for h in doc["hosts"] if want.intersection(h["clients"])]}


def read_clients(folder: str | os.PathLike, doc: dict, cids) -> dict[int, Any]:
    """The states of clients ``cids`` from the manifest's host files that list them (each
    verified and read whole). A client the manifest lists must be in its file."""
    want, out = set(int(c) for c in cids), {}
    for entry in doc["hosts"]:
        mine = want.intersection(entry["clients"])
        if mine:
            states = _open(folder, doc, entry, host=True)["states"]
            out.update({c: states[c] for c in sorted(mine)})
    return out
