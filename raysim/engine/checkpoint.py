"""Checkpoints without a bottleneck: each host writes its own clients' state, the server writes
its own, and an atomic manifest says which round is complete.

A run's checkpoint is a folder ``<checkpoint.dir>/<run id>/``::

    manifest.json            {"format": 2, "round": R, "folder": "round-00000R",
                              "server": "server.pt", "hosts": [{"file": "host-0.pt", "clients": [...]}, ...]}
    round-00000R/server.pt   round, server state, metrics history, the scenario
    round-00000R/host-H.pt   {client id: {"state": ..., "server": ...}} of host H's clients
    .raysim-dir              a random token: a host that reads it back sees this folder

Writing a round: its folder is filled (each file written to a temporary name, fsynced, renamed),
then the manifest is replaced (``os.replace``, atomic) and older round folders are removed. A
crash at any point leaves the manifest naming the last complete round. Resuming reads the
manifest; each host reads only the files holding its clients (with the same placement, its own
file). A host on a node that does not see the folder (no shared file system) hands its states
to the server (in the driver's process), which writes (or reads) that host's file for it: one host's states at a
time, never every model at once.

Files are loaded with ``torch.load(..., weights_only=True)``: nothing in a checkpoint is
unpickled as code.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch

FORMAT = 2
MANIFEST, TOKEN, SERVER = "manifest.json", ".raysim-dir", "server.pt"


def run_dir(directory: str, run_id: str) -> Path:
    return Path(directory) / run_id


def exists(folder: str | os.PathLike) -> bool:
    return (Path(folder) / MANIFEST).is_file()


def save(path: str | os.PathLike, state: Any) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load(path: str | os.PathLike) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def token(folder: str | os.PathLike) -> str:
    """The folder's token (created on first use): hosts compare it to tell whether they see
    the same folder as the server."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / TOKEN
    if not path.exists():
        tmp = folder / f"{TOKEN}.tmp{os.getpid()}"
        tmp.write_text(secrets.token_hex(16))
        os.replace(tmp, path)
    return path.read_text()


def visible(folder: str | os.PathLike, expected: str) -> bool:
    """True when this process sees the folder the server made (same token)."""
    try:
        return (Path(folder) / TOKEN).read_text() == expected
    except OSError:
        return False


def round_folder(folder: str | os.PathLike, round_: int) -> Path:
    """A fresh folder for round ``round_``'s files (emptied if a crash left one)."""
    path = Path(folder) / f"round-{round_:08d}"
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def commit(folder: str | os.PathLike, round_: int, hosts: list[dict]) -> None:
    """Make round ``round_`` the checkpoint: replace the manifest atomically, then remove the
    older round folders."""
    folder = Path(folder)
    name = f"round-{round_:08d}"
    doc = {"format": FORMAT, "round": round_, "folder": name, "server": SERVER, "hosts": hosts}
    tmp = folder / f"{MANIFEST}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST)
    for old in folder.glob("round-*"):
        if old.name != name and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)


def manifest(folder: str | os.PathLike) -> dict:
    with open(Path(folder) / MANIFEST) as f:
        doc = json.load(f)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{folder}: checkpoint format {doc.get('format')}, this raysim reads {FORMAT}")
    return doc


def server_part(folder: str | os.PathLike) -> dict:
    """The server's file of the last complete round (round, server, history, scenario)."""
    doc = manifest(folder)
    return load(Path(folder) / doc["folder"] / doc["server"])


def host_file(h: int) -> str:
    return f"host-{h}.pt"


def read_clients(paths: list[str], cids) -> dict[int, Any]:
    """The states of clients ``cids`` from the host files ``paths`` (each read whole)."""
    want, out = set(int(c) for c in cids), {}
    for p in paths:
        out.update({int(c): t for c, t in load(p).items() if int(c) in want})
    return out


def files_for(doc: dict, folder: str | os.PathLike, cids) -> list[str]:
    """Paths of the manifest's host files that hold any of ``cids``."""
    want = set(int(c) for c in cids)
    base = Path(folder) / doc["folder"]
    return [str(base / h["file"]) for h in doc["hosts"] if want.intersection(h["clients"])]
