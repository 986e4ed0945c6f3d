"""A new sqlite MLflow store is a copy of MLflow's schema, made once per MLflow version.

MLflow makes a store's schema by running its migrations (seconds); runs/tracker_store.py makes
that schema once into the memloop cache folder and copies it for each new store. The copy must
be the store MLflow makes itself: the same tables, indexes and schema revision, the Default
experiment added on first use, and a store that logs runs and registers prompts.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from memloop.runs import tracker, tracker_store


def schema(db: Path) -> tuple[list[tuple[str, str, list[str]]], list[str]]:
    """The store's tables and indexes (the lines of their SQL) and its schema revision.

    The lines are sorted: MLflow's own migrations write a table's constraints in an order that
    varies from one process to the next.
    """
    with sqlite3.connect(db) as con:
        objects = con.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
            "ORDER BY type, name"
        ).fetchall()
        revision = [r[0] for r in con.execute("SELECT version_num FROM alembic_version")]
    lines = [
        (kind, name, sorted(line.strip().rstrip(",") for line in (sql or "").splitlines()))
        for kind, name, sql in objects
    ]
    return lines, revision


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("MEMLOOP_CACHE_DIR", str(folder))
    return folder


def test_a_new_store_is_a_copy_of_the_schema_mlflow_makes(tmp_path, cache, monkeypatch):
    from mlflow import MlflowClient
    from mlflow.store.db import utils
    from mlflow.version import VERSION

    own = tmp_path / "mlflow-made" / "mlflow.db"
    own.parent.mkdir()
    MlflowClient(tracking_uri=f"sqlite:///{own}").search_experiments()

    first = tmp_path / "a" / "mlflow.db"
    tracker_store.client(f"sqlite:///{first}")
    kept = cache / "mlflow-schema" / f"{VERSION}.db"
    assert kept.is_file()
    assert schema(first) == schema(own)
    assert schema(kept) == schema(own)

    # the next store is copied: MLflow's migrations do not run again
    def no_migrations(engine):
        raise AssertionError("MLflow's migrations ran for a store that could be copied")

    monkeypatch.setattr(utils, "_initialize_tables", no_migrations)
    second = tmp_path / "b" / "mlflow.db"
    mlc = tracker_store.client(f"sqlite:///{second}")
    assert schema(second) == schema(own)
    assert [e.name for e in mlc.search_experiments()] == ["Default"]
    # it is a working store: a run with a metric, a registered prompt
    exp = mlc.create_experiment("copied")
    run = mlc.create_run(exp)
    mlc.log_metric(run.info.run_id, "val/overall", 0.25, step=1)
    assert mlc.get_run(run.info.run_id).data.metrics == {"val/overall": 0.25}
    text = {"writer": "Remember the user's city."}
    assert tracker.register_prompt(mlc, "copied", text, cycle=0, run_id=run.info.run_id, score=None)
    (version,) = mlc.search_prompt_versions("copied")
    assert version.template == "Remember the user's city."


def test_a_cache_folder_that_cannot_be_written_leaves_mlflow_to_make_the_schema(
    tmp_path, monkeypatch
):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder would be\n")
    monkeypatch.setenv("MEMLOOP_CACHE_DIR", str(blocked))
    db = tmp_path / "s" / "mlflow.db"
    mlc = tracker_store.client(f"sqlite:///{db}")
    assert [e.name for e in mlc.search_experiments()] == ["Default"]
    objects, revision = schema(db)
    assert revision and any(name == "runs" for _, name, _ in objects)
    assert blocked.read_text() == "a file where the cache folder would be\n"
    # nothing left over beside the store and its lock
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["mlflow.db", "mlflow.db.lock"]
