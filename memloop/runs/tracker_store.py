"""The tracker's store upkeep: tracking URIs, the MLflow client and the store's failures.

With runs/tracker.py (run logging and reading) this is "the tracker", the only code in memloop
that imports MLflow or calls an MLflow client (tests/test_architecture.py checks it). Here:
- a tracking URI MLflow cannot open is one line (`check_tracking_uri`, `require_store`,
  `check_server`, `check_store`);
- `client(uri)` opens the store; a sqlite store is made in a temporary file and renamed into
  place, so a kill leaves none, and one left by an older memloop is rebuilt when it holds no runs;
  its schema is a copy of one made once per MLflow version (`_copy_schema`);
- a store locked, deleted, moved or unreachable while a command uses it is one line
  (`store_errors`, around every call that reaches the store), with the sqlite wait
  (`SQLITE_BUSY_TIMEOUT`) and the engine hooks installed once per process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memloop.core.credentials import store_url_problem
from memloop.core.errors import UserError
from memloop.core.files import sqlite_file, sqlite_problem, store_lock
from memloop.core.settings import apply_offline_defaults, cache_root

process_lock = threading.Lock()

SQLITE_BUSY_TIMEOUT = 20.0
"""Seconds a call waits for a sqlite store that another program holds locked, then fails.

MLflow's own wait (its sessions set ``PRAGMA busy_timeout = 20000``); the sessions of MLflow
stores opened here wait this long instead (`_install_hooks`).
"""

TRACKING_URI_FORMS = (
    "sqlite:///mlruns/mlflow.db (a path relative to the working folder), "
    "sqlite:////abs/path/mlflow.db, http(s)://host:port (an MLflow server) or a database URL "
    "(postgresql://..., mysql://...)"
)


def mlflow_module():
    apply_offline_defaults()
    import logging

    import mlflow

    # "Creating initial MLflow database tables..." and similar INFO lines are not for our users
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    _install_hooks()
    return mlflow


# -- the tracking URI ----------------------------------------------------------------------------


def local_store(tracking_uri: str) -> Path | None:
    """The file (sqlite) or folder (file store) a local tracking URI names; None for a server.

    Creates nothing.
    """
    from urllib.parse import unquote, urlparse

    db = sqlite_file(tracking_uri, create_folder=False)
    if db is not None:
        return db
    if tracking_uri.startswith("file:"):
        return Path(unquote(urlparse(tracking_uri).path))
    if "://" in tracking_uri or tracking_uri.startswith(("databricks", "sqlite:")):
        return None  # a server, a database server or an in-memory store: MLflow's business
    return Path(tracking_uri)  # a plain path is a file store


def check_tracking_uri(tracking_uri: str) -> None:
    """Refuse, in one line naming it and the forms that work, a URI MLflow cannot open.

    Accepted: ``sqlite:///file`` (relative or absolute; ``sqlite://`` is an in-memory store),
    ``http(s)://host``, database URLs (postgresql, mysql, mssql), databricks and the schemes
    of installed MLflow store plugins. A plain path or ``file:`` URI is an MLflow file store,
    which MLflow 3 refuses unless ``MLFLOW_ALLOW_FILE_STORE=true``: accepted only then.
    """
    from urllib.parse import urlparse

    uri = tracking_uri
    if not uri.strip():
        raise UserError(f"the tracking URI is empty; use {TRACKING_URI_FORMS}")
    problem = store_url_problem(uri)
    if problem is not None:  # before any message below echoes the URI
        raise UserError(f"the tracking URI {problem}")
    if uri != uri.strip():
        raise UserError(
            f"tracking URI {uri!r}: spaces around it; use {TRACKING_URI_FORMS} (without spaces)"
        )
    if uri in ("databricks", "databricks-uc", "uc"):
        return
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", uri)
    scheme = match.group(1).lower() if match else ""
    base = scheme.split("+", 1)[0]
    if scheme in ("", "file"):
        if _file_store_allowed():
            return
        raise UserError(
            f"tracking URI {uri!r}: a plain path or file: URI is an MLflow file store, which "
            f"MLflow {_mlflow_version()} refuses (unless MLFLOW_ALLOW_FILE_STORE=true); use "
            f"{TRACKING_URI_FORMS}"
        )
    if base == "sqlite":
        if uri == "sqlite://" or (uri.startswith("sqlite:///") and uri != "sqlite:///"):
            return
        raise UserError(
            f"tracking URI {uri!r}: a sqlite URI is sqlite:/// followed by the database file; "
            f"use {TRACKING_URI_FORMS}"
        )
    if base in ("http", "https"):
        if urlparse(uri).netloc:
            return
        raise UserError(
            f"tracking URI {uri!r}: no server after {scheme}://; use {TRACKING_URI_FORMS}"
        )
    if base in ("postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc"):
        return
    if scheme in _plugin_schemes():
        return
    raise UserError(
        f"tracking URI {uri!r}: MLflow has no store for {scheme}: URIs; use {TRACKING_URI_FORMS}"
    )


def _file_store_allowed() -> bool:
    return os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").strip().lower() in ("true", "1")


def _mlflow_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlflow")
    except PackageNotFoundError:  # pragma: no cover - mlflow is a dependency
        return "(not installed)"


def _plugin_schemes() -> set[str]:
    """The URI schemes installed MLflow plugins add tracking stores for."""
    from importlib.metadata import entry_points

    return {ep.name.lower() for ep in entry_points(group="mlflow.tracking_store")}


# -- the store ---------------------------------------------------------------------------------


def require_store(tracking_uri: str) -> None:
    """Refuse, in one line, a local store that does not exist: reading one never creates it.

    A missing (or empty) sqlite file and a missing file-store folder are refused; nothing is
    created, not even a folder.
    """
    path = local_store(tracking_uri)
    if path is None:
        return
    missing = not path.exists()
    if not missing and tracking_uri.startswith("sqlite:") and path.is_file():
        missing = path.stat().st_size == 0  # an empty file is no store (MLflow would fill it)
    if missing:
        raise UserError(
            f"no MLflow store at {path}: run memloop evolve first (or give --tracking-uri)"
        )


SERVER_PROBE_S = 10.0
"""Seconds a tracking server has to answer /health before a command gives up on it (MLflow's
own client retries a refused connection with back-off for minutes)."""


def check_server(tracking_uri: str) -> None:
    """Refuse, in one line, a tracking server that does not answer."""
    import urllib.error
    import urllib.request

    url = tracking_uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=SERVER_PROBE_S) as answer:
            if answer.status == 200:
                return
            problem = f"HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        problem = f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        cause = getattr(exc, "reason", None) or exc
        problem = getattr(cause, "strerror", None) or str(cause)
    raise UserError(
        f"{tracking_uri}: cannot reach the MLflow server ({problem}); start it or fix the "
        "tracking URI, then rerun to resume"
    )


def check_store(tracking_uri: str, *, create: bool = False) -> None:
    """Refuse, in one line naming the file, a store MLflow cannot open.

    Read-only by default: a missing local store is refused (`require_store`), a sqlite store
    whose creation was cut short too (`evolve` rebuilds it), and nothing is created or changed.
    With `create`, the folder of a sqlite store is created (`client` makes the store). Always:
    the tracking URI's form (`check_tracking_uri`) and a sqlite file that is no database.
    """
    if not create:
        require_store(tracking_uri)
    check_tracking_uri(tracking_uri)
    if tracking_uri.startswith(("http://", "https://")):
        check_server(tracking_uri)
        return
    try:
        db = sqlite_file(tracking_uri)  # an existing store's folder exists: nothing is created
    except OSError as exc:
        raise UserError(
            f"{tracking_uri}: cannot create the folder of this tracking database "
            f"({exc.strerror}); choose another tracking URI"
        ) from None
    if db is None:
        return
    problem = sqlite_problem(db)
    if problem is not None:
        raise UserError(
            f"{db}: {problem}, so not an MLflow tracking database; choose another tracking URI "
            "(--tracking-uri, or tracking_uri in the YAML file)"
        )
    if not create and _sqlite_state(db, tracking_uri) == "unfinished":
        raise UserError(
            f"{db}: an MLflow store whose creation was cut short (it holds no runs): run "
            "memloop evolve, which rebuilds it, or choose another tracking URI"
        )


def client(tracking_uri: str, *, create: bool = True):
    """An MlflowClient on `tracking_uri`; creates the folder of a sqlite store.

    A new sqlite store is made in a temporary file beside the target and renamed onto it (MLflow's
    schema migrations take seconds, and a kill during them left a store every later command
    failed on); one left unfinished by an older memloop, or by MLflow itself, is made anew when it
    holds no runs, and refused in one line when it does. All under the store's file lock: two
    processes starting on a fresh store would otherwise both make it.
    With `create=False` (commands that only read: compare) a store that does not exist yet, or
    is unfinished, is refused in one line and nothing is created.

    Every method of the returned client runs under `store_errors`.
    """
    check_store(tracking_uri, create=create)
    mlflow = mlflow_module()
    mlflow.set_tracking_uri(tracking_uri)  # the prompt registry API reads the global URI
    db = sqlite_file(tracking_uri, create_folder=False)
    if db is not None and db.name == ":memory:":
        db = None  # sqlite:///:memory: is an in-memory store, as sqlite:// is
    if db is not None:
        _mlflow_files.add(os.path.realpath(db))
    with store_errors(tracking_uri, check_moved=False), store_lock(tracking_uri):
        if db is not None and create and _sqlite_state(db, tracking_uri) != "ready":
            _make_sqlite_store(db, tracking_uri)
        if db is not None and _moved(db):
            # another file than this process opened before (a store deleted or replaced
            # meanwhile): MLflow's pooled connections still read the old one
            _close_engines(tracking_uri, forget=False)
        try:
            mlc = mlflow.MlflowClient(tracking_uri=tracking_uri)
        except ImportError as exc:  # a database URL whose driver is not installed
            raise UserError(
                f"tracking URI {tracking_uri!r}: MLflow needs a database driver for it ({exc}); "
                f"install it, or use {TRACKING_URI_FORMS}"
            ) from None
        mlc.search_experiments(max_results=1)
        if db is not None:
            _remember_store(db)
    return _Client(mlc, tracking_uri)


class _Client:
    """An MlflowClient whose every method call runs under `store_errors`.

    Attributes (``tracking_uri``) read through; callers use it as the MlflowClient it wraps.
    """

    def __init__(self, inner: Any, tracking_uri: str) -> None:
        self._inner = inner
        self._tracking_uri = tracking_uri
        self._roots: dict[str, Any] = {}

    # -- artifacts of a moved sqlite store ------------------------------------------------------
    # MLflow records a file store's artifact locations as absolute paths (create_experiment
    # resolves a relative one), so a moved `mlruns/` folder kept its artifacts but lost the
    # way to them. For a run whose recorded folder is gone, these four methods use the same
    # place under the store's own folder (<store folder>/artifacts/<experiment>/<run>/artifacts),
    # through MLflow's own artifact repository. The MLflow UI still reads the recorded path.

    def _moved_repo(self, run_id: str) -> Any:
        if run_id not in self._roots:
            self._roots[run_id] = self._find_moved(run_id)
        return self._roots[run_id]

    def _find_moved(self, run_id: str) -> Any:
        db = sqlite_file(self._tracking_uri, create_folder=False)
        if db is None:
            return None
        with store_errors(self._tracking_uri):
            uri = self._inner.get_run(run_id).info.artifact_uri
        if not uri.startswith("file:"):
            return None
        from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository
        from mlflow.utils.file_utils import local_file_uri_to_path

        recorded = Path(local_file_uri_to_path(uri))
        tail = recorded.parts[-4:]  # artifacts/<experiment>/<run id>/artifacts
        if recorded.exists() or len(tail) < 4 or tail[0] != "artifacts":
            return None
        here = db.parent.resolve().joinpath(*tail)
        if here == recorded or not here.parent.parent.is_dir():
            return None
        return LocalArtifactRepository(here.as_uri())

    def list_artifacts(self, run_id: str, path: str | None = None) -> Any:
        repo = self._moved_repo(run_id)
        if repo is None:
            return self.__getattr__("list_artifacts")(run_id, path)
        return repo.list_artifacts(path)

    def download_artifacts(self, run_id: str, path: str, dst_path: str | None = None) -> Any:
        repo = self._moved_repo(run_id)
        if repo is None:
            return self.__getattr__("download_artifacts")(run_id, path, dst_path)
        return repo.download_artifacts(path, dst_path)

    def log_artifact(self, run_id: str, local_path: str, artifact_path: str | None = None) -> None:
        repo = self._moved_repo(run_id)
        if repo is None:
            return self.__getattr__("log_artifact")(run_id, local_path, artifact_path)
        return repo.log_artifact(local_path, artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        repo = self._moved_repo(run_id)
        if repo is None:
            return self.__getattr__("log_text")(run_id, text, artifact_file)
        import tempfile

        folder, _, name = artifact_file.rpartition("/")
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / name).write_text(text, encoding="utf-8")
            repo.log_artifact(str(Path(tmp) / name), folder or None)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name.startswith("_") or not callable(value):
            return value

        @functools.wraps(value)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            with store_errors(self._tracking_uri):
                return value(*args, **kwargs)

        return guarded

    def __repr__(self) -> str:
        return f"<memloop client of {self._inner!r}>"


def uri_of(mlc: Any) -> str:
    return str(getattr(mlc, "tracking_uri", "") or "")


# -- store failures: one line each -----------------------------------------------------------


@contextlib.contextmanager
def store_errors(tracking_uri: str, *, check_moved: bool = True) -> Iterator[None]:
    """Turn a failing tracking store into one `UserError` naming it; other errors pass unchanged.

    Store failures: a sqlite store locked by another program, deleted, moved or replaced, full,
    or otherwise failing (sqlite's OperationalError, however MLflow wraps it), and an MLflow
    server that cannot be reached. A programming error (a bad argument, a missing run) is not
    one, and keeps its traceback. With `check_moved` (the default), a sqlite store that is no
    longer the file `client` opened is refused before the call: sqlite would go on reading the
    deleted file (writes fail), and a store made anew in its place holds none of the run.
    """
    db = sqlite_file(tracking_uri, create_folder=False)
    if check_moved and db is not None and _moved(db):
        raise UserError(_moved_message(tracking_uri))
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        message = store_failure(exc, tracking_uri, db)
        if message is None:
            raise
        raise UserError(message) from None


def _moved_message(tracking_uri: str) -> str:
    return f"{tracking_uri}: the MLflow store was deleted or moved during the run; rerun to resume"


def store_failure(exc: BaseException, tracking_uri: str, db: Path | None) -> str | None:
    """The one-line message for `exc` if it is a failure of the store, else None."""
    import sqlite3

    sqlite_error = _find_cause(
        exc,
        lambda e: isinstance(e, sqlite3.OperationalError) or type(e) is sqlite3.DatabaseError,
    )
    text = (str(sqlite_error).strip() or type(sqlite_error).__name__) if sqlite_error else ""
    store = f"{tracking_uri}: the MLflow store"
    if "full" in text:  # before the moved check: a new store on a full disk was never made
        return f"{store} cannot grow ({text}); free some disk space, then rerun to resume"
    if db is not None and (sqlite_error is not None or _moved(db)):
        if _moved(db) or not db.exists():
            return _moved_message(tracking_uri)
    if sqlite_error is not None:
        if "locked" in text or "busy" in text:
            return f"{store} is locked by another program ({text}); rerun to resume"
        if "readonly" in text or "read-only" in text:
            return f"{store} cannot be written ({text}); check its permissions, then rerun"
        return (
            f"{store} failed ({text}); rerun to resume, or choose another tracking URI if it "
            "keeps failing"
        )
    unreachable = _find_cause(exc, _is_connection_error)
    if unreachable is not None:
        import re

        found = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", str(unreachable))
        reason = found.group(1).strip() if found else type(unreachable).__name__
        return (
            f"{tracking_uri}: cannot reach the MLflow server ({reason}); start it or fix the "
            "tracking URI, then rerun to resume"
        )
    return None


def _is_connection_error(exc: BaseException) -> bool:
    try:
        import requests
    except ImportError:  # pragma: no cover - an MLflow dependency
        return False
    return isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout)


def _find_cause(exc: BaseException, match: Any) -> BaseException | None:
    """`exc` or the first exception it was raised from (or during) that `match`es."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if match(current):
            return current
        orig = getattr(current, "orig", None)  # sqlalchemy's DBAPIError wraps the driver's
        todo += [current.__cause__, current.__context__]
        if isinstance(orig, BaseException):
            todo.append(orig)
    return None


# which file `client` opened, per sqlite store: (device, inode)
_STORE_IDS: dict[str, tuple[int, int]] = {}


def _remember_store(db: Path) -> None:
    with contextlib.suppress(OSError):
        st = os.stat(db)
        _STORE_IDS[os.path.abspath(db)] = (st.st_dev, st.st_ino)


def _moved(db: Path) -> bool:
    """Whether `db` is no longer the file `client` opened (deleted, moved or replaced)."""
    known = _STORE_IDS.get(os.path.abspath(db))
    if known is None:
        return False
    try:
        st = os.stat(db)
    except OSError:
        return True
    return (st.st_dev, st.st_ino) != known


# -- a sqlite store's schema: new, ready, or unfinished ---------------------------------------


def _sqlite_state(db: Path, tracking_uri: str) -> str:
    """'new' (no file, or an empty one), 'ready', or 'unfinished': MLflow's schema cut short.

    Unfinished: a kill during MLflow's schema migrations left a schema version short of this
    MLflow's (or none) and MLflow's tables only, and no runs, experiments (but MLflow's
    `Default`) or registered models in them. Anything else MLflow cannot open is refused in
    one line, and never changed: a database of other tables, one from a newer MLflow, one from
    an older MLflow (or unfinished) that holds runs. When MLflow's schema cannot be read here,
    'ready': MLflow decides.
    """
    if not db.exists() or db.stat().st_size == 0:
        return "new"
    schema = _mlflow_schema()
    if schema is None:
        return "ready"
    head, revisions, known_tables = schema
    with store_errors(tracking_uri, check_moved=False):
        tables, version, holds_data = _read_schema(db)
    if version == head:
        return "ready"
    foreign = sorted(t for t in tables if t.removeprefix("_alembic_tmp_") not in known_tables)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise UserError(
            f"{db}: a sqlite database that is not an MLflow store (tables {shown}); choose "
            "another tracking URI (--tracking-uri, or tracking_uri in the YAML file)"
        )
    mlflow_version = _mlflow_version()
    if version is not None and version not in revisions:
        raise UserError(
            f"{db}: an MLflow store made by a newer MLflow (schema {version}, unknown to "
            f"MLflow {mlflow_version}): upgrade mlflow, or choose another tracking URI"
        )
    if holds_data:
        raise UserError(
            f"{db}: an MLflow store at schema {version or 'none'}, not the {head} MLflow "
            f"{mlflow_version} needs, that holds runs: back it up, then run `mlflow db upgrade "
            f"{tracking_uri}`, or choose another tracking URI"
        )
    return "unfinished"


@functools.lru_cache(maxsize=1)
def _mlflow_schema() -> tuple[str, frozenset[str], frozenset[str]] | None:
    """(head revision, every revision, the table names) of this MLflow's sqlite schema."""
    mlflow_module()
    try:
        from alembic.script import ScriptDirectory
        from mlflow.store.db import utils as db_utils
        from mlflow.store.db.base_sql_model import Base

        script = ScriptDirectory.from_config(db_utils._get_alembic_config(""))
        head = db_utils._get_latest_schema_revision()
        revisions = frozenset(s.revision for s in script.walk_revisions())
        tables = frozenset(Base.metadata.tables) | {"alembic_version", "sqlite_sequence"}
    except Exception:  # pragma: no cover - MLflow's internals moved: let MLflow decide
        return None
    return head, revisions, tables


def _read_schema(db: Path) -> tuple[set[str], str | None, bool]:
    """(tables, alembic version or None, whether it holds data) of the sqlite file `db`.

    Data: any row but MLflow's own seeds (the `Default` experiment and workspace); rows copied
    into alembic's temporary tables count. A hot journal left by a kill is rolled back on
    opening, as by any sqlite connection.
    """
    import sqlite3

    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=rw", uri=True, timeout=SQLITE_BUSY_TIMEOUT)
    try:
        tables = {
            name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        version = None
        if "alembic_version" in tables:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
            version = row[0] if row else None
        seeds = {"experiments": "experiment_id != 0", "workspaces": "name != 'default'"}
        holds_data = False
        for table in sorted(tables - {"alembic_version", "sqlite_sequence"}):
            where = seeds.get(table.removeprefix("_alembic_tmp_"))
            quoted = '"' + table.replace('"', '""') + '"'
            query = f"SELECT 1 FROM {quoted}" + (f" WHERE {where}" if where else "") + " LIMIT 1"
            try:
                found = con.execute(query).fetchone() is not None
            except sqlite3.OperationalError as exc:
                if "no such column" not in str(exc):
                    raise
                found = True  # not the shape MLflow seeds: count it as data
            if found:
                holds_data = True
                break
    finally:
        con.close()
    return tables, version, holds_data


def _make_sqlite_store(db: Path, tracking_uri: str) -> None:
    """Make MLflow's schema in a temporary file beside `db`, then rename it onto `db`.

    Runs under the store's lock. A temporary file left by a kill is deleted first (no other
    process makes one while this one holds the lock), and so are the journal files of the file
    replaced (a journal left beside it would be played back into the new one).
    """
    import glob
    import secrets

    mlflow = mlflow_module()
    folder = db.parent
    pattern = f".{glob.escape(db.name)}.*.creating*"
    for stale in folder.glob(pattern):
        stale.unlink(missing_ok=True)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserError(
            f"{db}: cannot create an MLflow store in {folder} (permission denied); choose "
            "another tracking URI (--tracking-uri, or tracking_uri in the YAML file)"
        )
    # sqlite creates the file, with the permissions a store made in place would have
    tmp = folder / f".{db.name}.{os.getpid()}-{secrets.token_hex(4)}.creating"
    tmp_uri = f"sqlite:///{tmp}"
    try:
        _copy_schema(tmp)  # else MLflow makes the schema on first use, below
        made = mlflow.MlflowClient(tracking_uri=tmp_uri)
        made.search_experiments(max_results=1)  # adds the Default experiment
        _close_engines(tmp_uri, forget=True)
        for suffix in ("-journal", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        os.replace(tmp, db)
    except BaseException:
        _close_engines(tmp_uri, forget=True)
        for path in (tmp, Path(f"{tmp}-journal")):
            path.unlink(missing_ok=True)
        raise
    _close_engines(tracking_uri, forget=False)  # pooled connections to the file replaced


def _copy_schema(target: Path) -> None:
    """Copy MLflow's empty schema into `target` (a new file), when one can be had.

    MLflow makes its schema by running every one of its migrations (seconds), and the result is
    the same for one MLflow version. So it is made once per version, into the memloop cache
    folder (mlflow-schema/<version>.db, made in a temporary file and renamed into place), and
    copied for each new store (milliseconds). The copy holds no experiment: MLflow adds the
    Default experiment when the store is first opened, as it does in a store it makes itself.
    Anything that fails here (a cache folder that cannot be written) leaves MLflow to make the
    schema itself.
    """
    import secrets
    import shutil

    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables
    from mlflow.version import VERSION

    folder = cache_root() / "mlflow-schema"
    schema = folder / f"{VERSION}.db"
    making = folder / f".{schema.name}.{os.getpid()}-{secrets.token_hex(4)}.creating"
    try:
        if not schema.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            engine = sqlalchemy.create_engine(f"sqlite:///{making}")
            try:
                _initialize_tables(engine)
            finally:
                engine.dispose()
            os.replace(making, schema)
        shutil.copyfile(schema, target)
    except (OSError, sqlalchemy.exc.SQLAlchemyError):
        target.unlink(missing_ok=True)
    finally:
        with contextlib.suppress(OSError):
            making.unlink(missing_ok=True)


def _close_engines(db_uri: str, *, forget: bool) -> None:
    """Close the pooled connections MLflow's stores hold on `db_uri` (one engine per URI)."""
    classes: list[Any] = []
    with contextlib.suppress(ImportError):
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore as TrackingStore

        classes.append(TrackingStore)
    with contextlib.suppress(ImportError):
        from mlflow.store.model_registry.sqlalchemy_store import SqlAlchemyStore as RegistryStore

        classes.append(RegistryStore)
    for cls in classes:
        engines = getattr(cls, "_engine_map", None)
        if not isinstance(engines, dict):
            continue
        engine = engines.pop(db_uri, None) if forget else engines.get(db_uri)
        if engine is not None:
            engine.dispose()


_BUSY_PRAGMA = "PRAGMA busy_timeout = 20000;"  # what MLflow's sessions run on sqlite
_hooks_installed = False
_mlflow_files: set[str] = set()  # the sqlite stores `client` opened (real paths)


def _install_hooks() -> None:
    """Once per process: MLflow's sqlite sessions wait for a locked store, quietly.

    They wait `SQLITE_BUSY_TIMEOUT` seconds (its engines' own connections to a store `client`
    opened too: sqlite's default is 5 s), and MLflow does not log the traceback of a database
    error it raises anyway (`store_errors` reports it in one line).
    """
    global _hooks_installed
    if _hooks_installed:
        return
    import logging
    import sqlite3

    import sqlalchemy
    from sqlalchemy import event

    def rewrite(conn, cursor, statement, parameters, context, executemany):
        if statement == _BUSY_PRAGMA:
            statement = f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT * 1000)};"
        return statement, parameters

    def on_connect(dbapi_connection, connection_record):
        # MLflow's own engine-level reads (opening a store) wait as long as its sessions
        if _mlflow_files and isinstance(dbapi_connection, sqlite3.Connection):
            row = dbapi_connection.execute("PRAGMA database_list").fetchone()
            if row and row[2] and os.path.realpath(row[2]) in _mlflow_files:
                ms = int(SQLITE_BUSY_TIMEOUT * 1000)
                dbapi_connection.execute(f"PRAGMA busy_timeout = {ms}")

    event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", rewrite, retval=True)
    event.listen(sqlalchemy.engine.Engine, "connect", on_connect)
    logging.getLogger("mlflow.store.db.utils").addFilter(_RaisedAnyway())
    _hooks_installed = True


class _RaisedAnyway:
    """A log filter: drops MLflow's "SQLAlchemy database error" record (it raises the error)."""

    def filter(self, record: Any) -> bool:
        return not str(record.msg).startswith("SQLAlchemy database error")


# -- experiments, runs, metrics, prompts -------------------------------------------------------
