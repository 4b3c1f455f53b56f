"""A new SQLite tracking store seeded from the user's cached empty store (store.seed_store)."""

import sqlite3

from mlflow.tracking import MlflowClient

from raysim.results import store


def _schema(db) -> dict:
    """The database's tables and indexes as SQLite keeps their definitions (a table's clauses
    sorted: MLflow's migrations write a table's constraints in an order that differs from one
    process to the next), and its rows of the tables MLflow fills on creation."""

    def clauses(sql):
        return sorted(line.strip().rstrip(",") for line in (sql or "").splitlines())

    with sqlite3.connect(db) as con:
        sql = sorted(
            (kind, name, clauses(text))
            for kind, name, text in con.execute(
                "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
            )
        )
        rows = {t: sorted(con.execute(f"SELECT * FROM {t}")) for t in ("alembic_version", "workspaces")}
        exps = sorted(con.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments"))
    return {"sql": sql, "rows": rows, "experiments": exps}


def test_a_seeded_store_is_the_store_mlflow_makes(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for d in ("made", "seeded", "again"):
        (tmp_path / d).mkdir()
    monkeypatch.chdir(tmp_path / "made")
    made = tmp_path / "made" / "mlflow.db"
    MlflowClient(f"sqlite:///{made}").search_experiments()  # MLflow's own new store
    monkeypatch.chdir(tmp_path / "seeded")
    seeded = tmp_path / "seeded" / "mlflow.db"
    assert store.seed_store(f"sqlite:///{seeded}")
    template = store._template()
    assert template.parent == tmp_path / "cache" / "raysim"
    assert _schema(template)["experiments"] == []  # MLflow adds Default on opening
    MlflowClient(f"sqlite:///{seeded}").search_experiments()
    want, got = _schema(made), _schema(seeded)
    assert got["sql"] == want["sql"] and got["rows"] == want["rows"]
    assert got["rows"]["alembic_version"] and got["rows"]["workspaces"]
    # Default's artifacts under the folder the store was opened from, as MLflow decides it
    assert want["experiments"] == [(0, "Default", str(tmp_path / "made" / "mlruns" / "0"), "active")]
    assert got["experiments"] == [(0, "Default", str(tmp_path / "seeded" / "mlruns" / "0"), "active")]
    # a second new store is copied from the template made the first time
    stamp = template.stat().st_mtime_ns
    monkeypatch.chdir(tmp_path / "again")
    again = tmp_path / "again" / "mlflow.db"
    assert store.seed_store(f"sqlite:///{again}")
    assert template.stat().st_mtime_ns == stamp
    client = MlflowClient(f"sqlite:///{again}")
    eid = client.create_experiment("e")
    run = client.create_run(eid)
    client.log_metric(run.info.run_id, "accuracy", 0.5, step=1)
    assert eid == "1" and client.get_metric_history(run.info.run_id, "accuracy")[0].value == 0.5
    assert list((tmp_path / "again").iterdir()) == [again]  # no part file left


def test_a_store_that_exists_or_is_not_sqlite_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("e"))
    assert not store.seed_store(uri)
    assert MlflowClient(uri).get_run(run.info.run_id).info.run_id == run.info.run_id
    assert not store.seed_store("sqlite:///:memory:")
    assert not store.seed_store(f"sqlite:///{tmp_path}/other.db?timeout=30")  # options: MLflow's own way
    assert not store.seed_store(f"file://{tmp_path}/mlruns")
    assert not (tmp_path / "cache").exists()


def test_a_cache_that_cannot_be_written_leaves_the_store_to_mlflow(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file, not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert not store.seed_store(uri)
    assert not (tmp_path / "mlflow.db").exists()
    assert [e.name for e in MlflowClient(uri).search_experiments()] == ["Default"]


def test_a_template_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def broken(uri):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "MlflowClient", broken)
    assert not store.seed_store(f"sqlite:///{tmp_path}/mlflow.db")
    assert list((tmp_path / "cache" / "raysim").iterdir()) == []
    assert not (tmp_path / "mlflow.db").exists()
