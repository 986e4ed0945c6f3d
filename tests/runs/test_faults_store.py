"""Faults of the MLflow store (issue 28), on real sqlite stores: a kill while a new store is made,
a store locked by another program or deleted while a command uses it, and tracking URIs MLflow
cannot open. Each is one line naming the store (never a traceback), or is repaired; a store that
holds runs is never rebuilt."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memloop.core.errors import UserError, exit_on_user_error
from memloop.experiments.cli import main
from memloop.runs import tracker, tracker_store
from memloop.testing import (
    FakeOpenAIServer,
    evolve_loop_reply,
    fake_roles,
    is_evolver_request,
    scripted_builder,
)
from memloop.testing.commands import write_small_evolve


@pytest.fixture(autouse=True)
def short_busy_timeout(monkeypatch):
    """A locked store fails after 0.3 s instead of MLflow's 20 s."""
    monkeypatch.setattr(tracker_store, "SQLITE_BUSY_TIMEOUT", 0.3)


def head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def revisions() -> list[str]:
    """MLflow's schema revisions, oldest first."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    script = ScriptDirectory.from_config(_get_alembic_config(""))
    return [s.revision for s in script.walk_revisions()][::-1]


def schema_version(db: Path) -> str | None:
    con = sqlite3.connect(db)
    try:
        tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "alembic_version" not in tables:
            return None
        row = con.execute("SELECT version_num FROM alembic_version").fetchone()
        return row[0] if row else None
    finally:
        con.close()


def dump(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return list(con.iterdump())
    finally:
        con.close()


def use_store(uri: str, key: str = "after") -> str:
    """Open the store, make an experiment and a run, log to it: the run's id."""
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "exp", uri)
    run_id, _ = tracker.open_run(mlc, exp, key, key, {"a": 1})
    tracker.log_metrics(mlc, run_id, {"m": 1.0}, step=0)
    tracker.finish_run(mlc, run_id)
    assert [m.value for m in mlc.get_metric_history(run_id, "m")] == [1.0]
    return run_id


def one_line(capfd, *words: str) -> str:
    """The single stderr line (nothing else on stderr: no logged traceback either)."""
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("memloop: error: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# -- 1. a kill while a new store is made -----------------------------------------------------

MLFLOW_MAKES = (
    "import sys, mlflow\nmlflow.MlflowClient(tracking_uri=sys.argv[1]).search_experiments()"
)
MEMLOOP_MAKES = "import sys\nfrom memloop.runs import tracker\ntracker.client(sys.argv[1])"


def kill_while_making(code: str, db: Path, delay: float) -> None:
    """Run `code` on a new store at `db` in a process; SIGKILL it `delay` s after a file shows."""
    folder = db.parent
    proc = subprocess.Popen(
        [sys.executable, "-c", code, f"sqlite:///{db}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not db.exists() and not list(folder.glob(".*.creating")):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        time.sleep(delay)
    finally:
        proc.kill()
        proc.wait()


def test_a_store_mlflow_was_killed_making_is_rebuilt(tmp_path):
    """What every later evolve, compare and ui failed on (5 of 7 tries): MLflow itself (and
    memloop before the fix) makes the schema in place; a kill leaves it part-migrated."""
    head = head_revision()
    unfinished = 0
    for i, delay in enumerate([0.0, 0.2, 0.5]):
        db = tmp_path / f"s{i}" / "mlflow.db"
        db.parent.mkdir()
        kill_while_making(MLFLOW_MAKES, db, delay)
        if db.exists() and db.stat().st_size and schema_version(db) != head:
            unfinished += 1
            # compare only reads: it names the file and leaves it as it is
            before = dump(db)
            with pytest.raises(UserError) as caught:
                tracker.client(f"sqlite:///{db}", create=False)
            assert str(caught.value) == (
                f"{db}: an MLflow store whose creation was cut short (it holds no runs): run "
                "memloop evolve, which rebuilds it, or choose another tracking URI"
            )
            assert dump(db) == before
        use_store(f"sqlite:///{db}")  # evolve rebuilds it
        assert schema_version(db) == head
    assert unfinished  # at least one kill hit the migrations (they take seconds)


def test_a_kill_while_memloop_makes_a_store_leaves_none_or_a_whole_one(tmp_path):
    head = head_revision()
    for i, delay in enumerate([0.0, 0.4, 1.0]):
        db = tmp_path / f"s{i}" / "mlflow.db"
        db.parent.mkdir()
        kill_while_making(MEMLOOP_MAKES, db, delay)
        assert not db.exists() or schema_version(db) == head, delay
        use_store(f"sqlite:///{db}")
        assert schema_version(db) == head
        # the temporary file of the killed process is gone too
        assert sorted(p.name for p in db.parent.iterdir()) == ["mlflow.db", "mlflow.db.lock"]


def migrate_to(uri: str, revision: str) -> None:
    """MLflow's schema up to `revision` only: where a kill between two migrations leaves it."""
    import sqlalchemy
    from alembic import command
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    engine = sqlalchemy.create_engine(uri)
    try:
        InitialBase.metadata.create_all(engine)
        config = _get_alembic_config(uri)
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


@pytest.mark.parametrize("cut", ["initial tables only", "between migrations", "mid-migration"])
def test_an_unfinished_store_is_rebuilt_by_evolve_and_named_by_compare(tmp_path, capfd, cut):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    middle = revisions()[len(revisions()) // 2]
    if cut == "initial tables only":
        migrate_to(uri, revisions()[0])
        con = sqlite3.connect(db)
        con.execute("DROP TABLE alembic_version")
        con.commit()
        con.close()
    else:
        migrate_to(uri, middle)
        if cut == "mid-migration":  # alembic's copy of a table being altered, left behind
            con = sqlite3.connect(db)
            con.execute("CREATE TABLE _alembic_tmp_runs AS SELECT * FROM runs")
            con.commit()
            con.close()
    before = dump(db)
    assert main(["compare", "--experiment", "exp", "--tracking-uri", uri]) == 2
    one_line(capfd, str(db), "creation was cut short", "memloop evolve")
    assert dump(db) == before
    use_store(uri)
    assert schema_version(db) == head_revision()


def test_a_store_that_holds_runs_is_never_rebuilt(tmp_path, capfd):
    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    run_id = use_store(uri, "kept")
    inode = db.stat().st_ino
    assert use_store(uri, "kept") == run_id  # a healthy store: opened as it is
    assert db.stat().st_ino == inode
    # the same store, as an interrupted `mlflow db upgrade` (or an older MLflow) leaves it
    old = revisions()[len(revisions()) // 2]
    con = sqlite3.connect(db)
    con.execute("UPDATE alembic_version SET version_num = ?", (old,))
    con.commit()
    con.close()
    before = dump(db)
    for create in (True, False):
        with pytest.raises(UserError) as caught:
            tracker.client(uri, create=create)
        message = str(caught.value)
        assert message.startswith(f"{db}: an MLflow store at schema {old}, not the "), message
        assert message.endswith(
            f"that holds runs: back it up, then run `mlflow db upgrade {uri}`, or choose "
            "another tracking URI"
        )
    assert main(["compare", "--experiment", "exp", "--tracking-uri", uri]) == 2
    one_line(capfd, str(db), "holds runs", "mlflow db upgrade")
    assert dump(db) == before and db.stat().st_ino == inode


def test_a_database_of_other_tables_is_refused_and_left_alone(tmp_path):
    db = tmp_path / "notes.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE notes (text TEXT)")  # empty, but not MLflow's
    con.commit()
    con.close()
    before = dump(db)
    with pytest.raises(UserError) as caught:
        tracker.client(f"sqlite:///{db}")
    assert str(caught.value) == (
        f"{db}: a sqlite database that is not an MLflow store (tables notes); choose another "
        "tracking URI (--tracking-uri, or tracking_uri in the YAML file)"
    )
    assert dump(db) == before


# -- 2. a store locked, deleted or moved during a run ------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, str, str]:
    """(file, experiment id, run id): a store with one run, made once (it takes seconds)."""
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    uri = f"sqlite:///{db}"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "exp", uri)
    run_id, _ = tracker.open_run(mlc, exp, "k", "n", {"a": 1})
    return db, exp, run_id


@pytest.fixture
def store(tmp_path, template):
    """(uri, db file, client, experiment id, run id): a copy of the template store."""
    source, exp, run_id = template
    db = tmp_path / "mlruns" / "mlflow.db"
    db.parent.mkdir()
    with contextlib.closing(sqlite3.connect(source)) as src:
        with contextlib.closing(sqlite3.connect(db)) as dst:
            src.backup(dst)
    uri = f"sqlite:///{db}"
    return uri, db, tracker.client(uri), exp, run_id


@contextlib.contextmanager
def locked(db: Path):
    """Another connection holds the store's exclusive lock (no reader, no writer gets in)."""
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


CALLS = {
    "log_metrics": lambda uri, mlc, exp, rid: tracker.log_metrics(mlc, rid, {"m": 2.0}, step=1),
    "open_run (new)": lambda uri, mlc, exp, rid: tracker.open_run(mlc, exp, "k2", "n2", {}),
    "open_run (resume)": lambda uri, mlc, exp, rid: tracker.open_run(mlc, exp, "k", "n", {}),
    "experiment_id": lambda uri, mlc, exp, rid: tracker.experiment_id(mlc, "other", uri),
    "log_text": lambda uri, mlc, exp, rid: tracker.log_text(mlc, rid, "x", "notes/a.txt"),
    "finish_run": lambda uri, mlc, exp, rid: tracker.finish_run(mlc, rid),
    "register_prompt": lambda uri, mlc, exp, rid: tracker.register_prompt(
        mlc, "p", {"w": "Keep facts."}, cycle=0, run_id=rid, score=None
    ),
    "the client's own method": lambda uri, mlc, exp, rid: mlc.set_tag(rid, "t", "v"),
    "a new client": lambda uri, mlc, exp, rid: tracker.client(uri),
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_locked_store_is_one_line_and_the_next_call_works(store, call):
    uri, db, mlc, exp, run_id = store
    started = time.monotonic()
    with locked(db), pytest.raises(UserError) as caught:
        CALLS[call](uri, mlc, exp, run_id)
    assert str(caught.value) == (
        f"{uri}: the MLflow store is locked by another program (database is locked); rerun to "
        "resume"
    )
    assert time.monotonic() - started < 15  # the busy timeout (0.3 s here), not a retry loop
    CALLS[call](uri, mlc, exp, run_id)  # the lock released: the same client goes on


def test_compare_on_a_locked_store_is_one_line(store, capfd):
    uri, db, *_ = store
    with locked(db):
        assert main(["compare", "--experiment", "exp", "--tracking-uri", uri]) == 2
    one_line(capfd, uri, "locked by another program (database is locked)", "rerun to resume")
    assert capfd.readouterr().out == ""


@pytest.mark.parametrize(
    "how, call",
    [
        ("deleted", "log_metrics"),
        ("moved", "open_run (new)"),
        ("replaced", "the client's own method"),
    ],
)
def test_a_store_deleted_or_moved_between_two_calls_is_one_line(store, tmp_path, how, call):
    uri, db, mlc, exp, run_id = store
    tracker.log_metrics(mlc, run_id, {"m": 1.0}, step=0)
    if how == "deleted":
        db.unlink()
    elif how == "moved":
        db.rename(tmp_path / "elsewhere.db")
    else:  # another store put in its place
        (tmp_path / "mlruns" / "mlflow.db").replace(tmp_path / "old.db")
        with contextlib.closing(sqlite3.connect(tmp_path / "old.db")) as src:
            with contextlib.closing(sqlite3.connect(db)) as dst:
                src.backup(dst)
    with pytest.raises(UserError) as caught:
        CALLS[call](uri, mlc, exp, run_id)
    assert str(caught.value) == (
        f"{uri}: the MLflow store was deleted or moved during the run; rerun to resume"
    )
    # a rerun makes a new store (or opens the one there now) and logs again
    use_store(uri, "rerun")


def test_a_store_failing_while_a_run_ends_leaves_the_first_error(store):
    """finish_run(KILLED) on the way out of a failure: the user sees the failure itself."""
    uri, db, mlc, exp, run_id = store
    with pytest.raises(RuntimeError, match="the first error"), locked(db):
        try:
            raise RuntimeError("the first error")
        except BaseException:
            tracker.finish_run(mlc, run_id, "KILLED")
            raise


def test_a_ctrl_c_stays_a_ctrl_c_when_ending_the_run_fails_otherwise():
    """As when Ctrl-C lands inside MLflow's first import: marking the run KILLED then failed
    with SQLAlchemy's "Table 'experiments' is already defined" and replaced the Ctrl-C."""

    class HalfImported:
        tracking_uri = "sqlite:///nowhere.db"

        def set_terminated(self, run_id, status):
            raise RuntimeError("Table 'experiments' is already defined for this MetaData")

    with pytest.raises(KeyboardInterrupt):
        try:
            raise KeyboardInterrupt
        except BaseException:
            tracker.finish_run(HalfImported(), "run", "KILLED")
            raise
    with pytest.raises(RuntimeError, match="already defined"):  # outside a failure: reported
        tracker.finish_run(HalfImported(), "run")


def test_a_programming_error_keeps_its_traceback(store):
    from mlflow.exceptions import MlflowException

    uri, db, mlc, exp, run_id = store
    with pytest.raises(MlflowException):  # not a store failure: not made a one-line error
        mlc.get_run("no-such-run")


# the whole loop: the store fails between two cycles of an evolve; a rerun resumes


def write_evolve_config(tmp_path: Path) -> Path:
    return write_small_evolve(tmp_path, "unit", (2, 1, 1), cycles=2)


@pytest.mark.parametrize("fault", ["locked", "deleted"])
def test_an_evolve_whose_store_fails_mid_run_is_one_line_and_a_rerun_finishes(
    tmp_path, capfd, fault
):
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve

    config = load_config(write_evolve_config(tmp_path), EvolveConfig)
    db = tmp_path / "mlruns" / "mlflow.db"
    uri = f"sqlite:///{db}"
    holder: list[sqlite3.Connection | None] = []

    def reply(body):
        if is_evolver_request(body) and not holder:  # cycle 0 is logged by then
            if fault == "locked":
                con = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
                con.execute("BEGIN EXCLUSIVE")
                holder.append(con)
            else:
                db.unlink()
                holder.append(None)
        return evolve_loop_reply(body)

    builder = scripted_builder(garble_every=3)
    with FakeOpenAIServer(reply=reply) as fake:
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")

        def evolve():
            return run_evolve(config, progress=False, clients=roles, builder=builder)

        assert exit_on_user_error(evolve) == 2
        assert holder  # the fault happened during the run
        what = "is locked by another program" if fault == "locked" else "was deleted or moved"
        line = one_line(capfd, uri, what, "rerun to resume")
        assert line.startswith(f"memloop: error: {uri}: the MLflow store "), line
        if holder[0] is not None:
            holder[0].execute("ROLLBACK")
            holder[0].close()
        (outcome,) = evolve()
    mlc = tracker.client(uri, create=False)
    assert outcome.resumed == (fault == "locked")  # the same run; a deleted one is made anew
    history = mlc.get_metric_history(outcome.run_id, "train/overall")
    assert [m.step for m in history] == [0, 1]
    assert mlc.get_run(outcome.run_id).info.status == "FINISHED"


# -- 3. tracking URIs MLflow cannot open -------------------------------------------------------

FORMS = "use sqlite:///mlruns/mlflow.db (a path relative to the working folder), sqlite:////abs/"


@pytest.mark.parametrize(
    "uri, why",
    [
        ("notauri", "a plain path or file: URI is an MLflow file store, which MLflow 3"),
        ("file:notauri", "a plain path or file: URI is an MLflow file store"),
        ("http//host:5000", "a plain path or file: URI is an MLflow file store"),
        ("sqlite:/mlflow.db", "a sqlite URI is sqlite:/// followed by the database file"),
        ("sqlite:mlflow.db", "a sqlite URI is sqlite:/// followed by the database file"),
        ("sqlite:///", "a sqlite URI is sqlite:/// followed by the database file"),
        ("http://", "no server after http://"),
        ("foo://bar", "MLflow has no store for foo: URIs"),
        (" sqlite:///mlflow.db", "spaces around it"),
    ],
)
def test_a_tracking_uri_mlflow_cannot_open_is_one_line(tmp_path, monkeypatch, uri, why):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(UserError) as caught:
        tracker.client(uri)
    message = str(caught.value)
    assert message.startswith(f"tracking URI {uri!r}: {why}"), message
    assert FORMS in message and "http(s)://host:port (an MLflow server)" in message
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_evolve_with_tracking_uri_notauri_is_one_line(tmp_path, capfd, monkeypatch):
    import yaml

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    path = write_evolve_config(tmp_path)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, "tracking_uri": "notauri"}))
    assert main(["evolve", str(path)]) == 2
    one_line(capfd, "tracking URI 'notauri': a plain path", "sqlite:///mlruns/mlflow.db")
    assert not (tmp_path / "notauri").exists()


def test_compare_on_a_folder_that_is_no_usable_store_is_one_line(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    (tmp_path / "notauri").mkdir()
    assert main(["compare", "--experiment", "x", "--tracking-uri", "notauri"]) == 2
    one_line(capfd, "tracking URI 'notauri'", "MLFLOW_ALLOW_FILE_STORE=true", "sqlite:///")


def test_a_database_url_without_its_driver_is_one_line(monkeypatch):
    import importlib.util

    if importlib.util.find_spec("MySQLdb") is not None:
        pytest.skip("the MySQL driver is installed here")
    with pytest.raises(UserError, match=r"^tracking URI 'mysql://u@localhost/x': MLflow needs a "):
        tracker.client("mysql://u@localhost/x")


def test_an_mlflow_server_that_is_not_running_is_one_line():
    """Refused by memloop's own probe, before MLflow's client retries it for minutes."""
    from memloop.testing.servers import free_port

    port = free_port()  # closed again: nothing listens there
    uri = f"http://127.0.0.1:{port}"
    with pytest.raises(UserError) as caught:
        tracker.client(uri)
    assert str(caught.value) == (
        f"{uri}: cannot reach the MLflow server (Connection refused); start it or fix the "
        "tracking URI, then rerun to resume"
    )


@pytest.mark.parametrize("form", ["relative", "absolute", "in-memory", "file store (opted in)"])
def test_the_forms_that_work_keep_working(tmp_path, monkeypatch, form):
    monkeypatch.chdir(tmp_path)
    uri = {
        "relative": "sqlite:///mlruns/mlflow.db",
        "absolute": f"sqlite:///{tmp_path}/abs/mlflow.db",
        "in-memory": "sqlite://",
        "file store (opted in)": str(tmp_path / "filestore"),
    }[form]
    if form == "file store (opted in)":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "exp", uri)
    run_id, resumed = tracker.open_run(mlc, exp, "k", "n", {"a": 1})
    tracker.log_metrics(mlc, run_id, {"m": 1.0}, step=0)
    assert not resumed and [m.value for m in mlc.get_metric_history(run_id, "m")] == [1.0]
    for remote in ("http://tracking-host:5000", "https://h", "postgresql://u@h/db", "databricks"):
        tracker.check_tracking_uri(remote)  # accepted as they are (MLflow's to open)


def test_a_new_store_on_a_full_disk_is_not_called_deleted_or_moved(tmp_path):
    """Issue 57: sqlite's "database or disk is full" while the store was being made (its file
    never appeared) was reported as a store deleted or moved during the run."""
    db = tmp_path / "mlruns" / "mlflow.db"
    uri = f"sqlite:///{db}"
    full = sqlite3.OperationalError("database or disk is full")
    assert not db.exists()
    assert tracker_store.store_failure(full, uri, db) == (
        f"{uri}: the MLflow store cannot grow (database or disk is full); free some disk space, "
        "then rerun to resume"
    )


KILLED_OPENING = """
import os, signal, sys
from memloop.runs import tracker

uri, sig = sys.argv[1], int(sys.argv[2])
mlc = tracker.client(uri)
exp = tracker.experiment_id(mlc, "opening", uri)
tracker._log_params = lambda *args: os.kill(os.getpid(), sig)  # killed right after creating
tracker.open_run(mlc, exp, "key-1", "run-1", {"spec.a": 1, "spec.b": "two"})
"""


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_a_run_killed_before_its_params_gets_them_when_resumed(tmp_path, signal_name):
    """Issue 57: a kill just after an MLflow run was created lost its spec.* params for good
    (an export then said "policy None"); the run resumed by its key now gets them."""
    import signal

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    script = tmp_path / "opening.py"
    script.write_text(KILLED_OPENING)
    sig = getattr(signal, signal_name)
    done = subprocess.run([sys.executable, str(script), uri, str(int(sig))], capture_output=True)
    assert done.returncode in (-sig, 128 + sig, 1), done.stderr[-500:]
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "opening", uri)
    (cut,) = mlc.search_runs([exp])
    assert cut.data.params == {}  # created, then killed
    run_id, resumed = tracker.open_run(mlc, exp, "key-1", "run-1", {"spec.a": 1, "spec.b": "two"})
    assert resumed and run_id == cut.info.run_id
    assert mlc.get_run(run_id).data.params == {"spec.a": "1", "spec.b": "two"}
