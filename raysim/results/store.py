"""The MLflow tracking store: its URI (``resolve_uri``), a SQLite store's file, the lock beside it
while it is created, where a new experiment keeps its artifacts, a new store seeded from the
user's cached empty one (``seed_store``), and the store opened with the scenario's experiment
(``open_store``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import mlflow
from mlflow.tracking import MlflowClient

from raysim.cachedir import user_cache

if TYPE_CHECKING:
    from raysim.scenario.config import Scenario


def sqlite_file(uri: str) -> str | None:
    """The database file of a SQLite tracking URI; None for another store or an in-memory one."""
    path = uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else ""
    return path if path and path != ":memory:" else None


@contextlib.contextmanager
def store_lock(uri: str):
    """An exclusive lock beside a SQLite tracking database while it may be created: MLflow
    builds a new database's tables on first use, and two runs starting at once on the same
    new file would both do it and one fail ("table ... already exists")."""
    path = sqlite_file(uri)
    if path is None:
        yield
        return
    lock = os.path.abspath(path) + ".lock"
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store's file
    (``<folder of the .db>/mlruns``), so they do not land in whichever folder the first run
    was started from; None (MLflow's choice) for other stores."""
    path = sqlite_file(uri)
    return None if path is None else str(Path(path).resolve().parent / "mlruns")


def resolve_uri(uri: str | None, verbose: bool = False) -> str:
    """The tracking URI: ``uri``, else MLFLOW_TRACKING_URI, else MLflow's default
    (``sqlite:///mlflow.db`` here); MLflow's INFO lines (database migrations, which would
    break a progress bar) are silenced unless ``verbose``."""
    if not verbose:
        logging.getLogger("mlflow").setLevel(logging.WARNING)
        logging.getLogger("alembic").setLevel(logging.WARNING)
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        mlflow.set_tracking_uri(uri)
    return mlflow.get_tracking_uri()


def _template() -> Path:
    """Where this MLflow's empty store is kept: named by MLflow's version and its migrations
    (an MLflow with other migrations never reads another's template)."""
    versions = Path(mlflow.__file__).parent / "store" / "db_migrations" / "versions"
    names = sorted(p.name for p in versions.glob("*.py")) if versions.is_dir() else []
    key = hashlib.sha256("\n".join([mlflow.__version__, *names]).encode()).hexdigest()[:16]
    return user_cache() / f"mlflow-{mlflow.__version__}-{key}.db"


def seed_store(uri: str) -> bool:
    """Give a SQLite store that does not exist yet the tables of an empty one, copied from a
    template in the user's cache (``_template``), made the first time by MLflow itself: MLflow
    otherwise builds a new database's tables and runs its ~70 migrations, 1.7 to 2 s of a core
    on a 2-core machine, in every new store (each experiment folder, each sweep's, each
    test's). The template holds MLflow's schema, its migrations' version and no experiment:
    MLflow adds its Default experiment (its artifact folder as of this run) when it opens the
    copy, as it would in a store of its own making. Returns whether the store was seeded; where
    the cache cannot be written, MLflow makes the store as before. Called under ``store_lock``."""
    path = sqlite_file(uri)
    if path is None or "?" in path or (os.path.exists(path) and os.path.getsize(path) > 0):
        return False
    try:
        template = _template()
        if not template.exists():
            template.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=template.parent) as tmp:
                db = Path(tmp) / "store.db"
                MlflowClient(f"sqlite:///{db}").search_experiments()  # MLflow makes and migrates it
                with contextlib.closing(sqlite3.connect(db)) as con:
                    con.execute("DELETE FROM experiments")
                    con.commit()
                    con.execute("VACUUM")
                os.replace(db, template)  # whole or not at all
        part = f"{path}.{os.getpid()}.part"
        try:
            shutil.copyfile(template, part)
            os.replace(part, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(part)
    except Exception:  # noqa: BLE001 - any failure leaves the store to MLflow, which says its own error
        return False
    return True


def open_store(sc: Scenario, verbose: bool = False, create: bool = True):
    """(tracking URI, client, the scenario's experiment): the store opened (a new SQLite
    database seeded from the template or created and migrated, under ``store_lock``) and the
    experiment created unless ``create`` is false."""
    uri = resolve_uri(sc.tracking.uri, verbose)
    with store_lock(uri):
        seed_store(uri)
        client = MlflowClient(uri)
        exp = client.get_experiment_by_name(sc.tracking.experiment)  # creates a new store
        if create and exp is None:
            exp = client.get_experiment(client.create_experiment(sc.tracking.experiment, artifact_root(uri)))
    return uri, client, exp
