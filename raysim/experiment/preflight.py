"""What ``raysim run`` checks before Ray or any training starts, so that a run cannot train for an
hour and then fail on something known at the start: the tracking store answers (a dead server
fails in seconds, not after MLflow's retries), and every output path (``--summary``, the
checkpoint folder) can be written.

These checks read only the scenario file and its ``--set`` options (the YAML, without the
validation, which imports torch): they take milliseconds, so Ray's start still overlaps the
validation. Every problem is one ScenarioError line (exit 2) naming the key and what is wrong.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from raysim.scenario.config import CheckpointCfg, ScenarioError, absolute_uri, apply_override, read_yaml
from raysim.scenario.sections import ResourcesCfg
from raysim.scenario.stores import store_scheme, unknown_store

STORE_TIMEOUT_S = 5.0  # how long a tracking server has to answer


def check_run(file: str, overrides: list[str], summary: str | None, resume: str | None = None) -> int:
    """The checks above for ``raysim run FILE --set ... [--summary PATH] [--resume RUN_ID]``;
    with ``resume``, also that the run exists and may be continued (``tracking.resumable_run``;
    this imports MLflow before Ray starts, for a resume only). Returns ``host_actors`` of the
    scenario."""
    raw = read_yaml(file)
    for item in overrides:
        apply_override(raw, item, file)
    tracking = raw.get("tracking") if isinstance(raw.get("tracking"), dict) else {}
    given = tracking.get("uri") if isinstance(tracking.get("uri"), str) and tracking.get("uri") else None
    if given:
        check_store(absolute_uri(given), f"{file}: tracking.uri")
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        check_store(absolute_uri(os.environ["MLFLOW_TRACKING_URI"]), "MLFLOW_TRACKING_URI")
    else:  # MLflow's default store is in the working directory
        writable_folder(Path.cwd(), "the tracking store's folder (the working directory; set tracking.uri)")
    if resume is not None:
        from mlflow.tracking import MlflowClient

        from raysim.results import tracking as mlflow_tracking

        uri = mlflow_tracking.resolve_uri(absolute_uri(given) if given else None)
        mlflow_tracking.resumable_run(MlflowClient(uri), resume, uri)
    ck = raw.get("checkpoint") if isinstance(raw.get("checkpoint"), dict) else {}
    folder = ck.get("dir", CheckpointCfg.dir)
    if isinstance(folder, str) and folder:
        writable_folder(Path(folder).absolute(), f"{file}: checkpoint.dir")
    if summary is not None:
        writable_file(Path(summary).absolute(), "--summary")
    return host_actors(raw)


def host_actors(raw: dict) -> int:
    """How many host actors the scenario ``raw`` (the YAML with its ``--set`` options) starts on
    a local Ray that this command starts: ``resources.hosts``, less host 0 where it runs in the
    driver's process (``ResourcesCfg.host_in_driver``), at most one per CPU. Ray then boots that
    many workers as it starts, beside the scenario's validation, instead of when the hosts are
    asked for. 0 where a sweep or grid decides the runs, or where a value is one the validation
    will refuse."""
    if "sweep" in raw or "grid" in raw:
        return 0
    res = raw.get("resources", {})
    if not isinstance(res, dict):
        return 0
    default = ResourcesCfg()
    hosts = res.get("hosts", default.hosts)
    gpus = res.get("gpus_per_host", default.gpus_per_host)
    want = res.get("driver_host", default.driver_host)
    if type(hosts) is not int or hosts < 1 or type(gpus) not in (int, float) or want not in ("auto", True, False):
        return 0
    actors = hosts - int(ResourcesCfg.host_in_driver(want, local=True, gpus=gpus, trial=False))
    return min(actors, os.cpu_count() or 1)


def check_store(uri: str, where: str) -> None:
    """A tracking URI's store can be reached: its scheme is one MLflow has a store for
    (``raysim.scenario.stores.unknown_store``); a SQLite file's folder is writable and the file, if
    there, is a database; an HTTP(S) server answers within ``STORE_TIMEOUT_S``; a file store's
    folder is writable. The other stores (databricks, postgresql, a plugin's, ...) are left to
    MLflow."""
    unknown = unknown_store(uri)
    if unknown:
        raise ScenarioError(f"{where}: {unknown}")
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else store_scheme(uri)
    if scheme == "sqlite":
        path = uri[len("sqlite:///") :]
        if not path or path == ":memory:":
            return
        db = Path(path)
        writable_folder(db.parent, f"{where}: {uri}: the database's folder")
        if db.is_dir():
            raise ScenarioError(f"{where}: {uri}: {db} is a folder, not a SQLite database file")
        if db.exists():
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=STORE_TIMEOUT_S) as con:
                    con.execute("select count(*) from sqlite_master").fetchone()
            except sqlite3.Error as e:
                raise ScenarioError(f"{where}: {uri}: {db} cannot be read as a SQLite database ({e})") from None
    elif scheme in ("http", "https"):
        health = uri.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(health, timeout=STORE_TIMEOUT_S):
                pass
        except urllib.error.HTTPError:
            pass  # it answered: authentication and paths are MLflow's to report
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            raise ScenarioError(
                f"{where}: {uri}: the tracking server did not answer within "
                f"{STORE_TIMEOUT_S:g} s ({reason}); start it or point tracking.uri "
                "elsewhere"
            ) from None
    elif scheme == "file" or not scheme:
        writable_folder(Path(uri[len("file://") :] if scheme == "file" else uri).absolute(), f"{where}: {uri}")


def writable_folder(folder: Path, where: str) -> None:
    """``folder`` exists (created if need be) and a file can be created in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ScenarioError(f"{where}: cannot write to {folder} ({e.strerror or e})") from None


def writable_file(path: Path, where: str) -> None:
    """``path`` can be written: not a folder, its folder writable, the file writable if there."""
    if path.is_dir():
        raise ScenarioError(f"{where}: {path} is a folder; give a file path")
    writable_folder(path.parent, where)
    if path.exists() and not os.access(path, os.W_OK):
        raise ScenarioError(f"{where}: cannot write to {path} (permission denied)")
