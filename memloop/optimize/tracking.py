"""MLflow logging for evolution and tuning.

One run per condition, found again by a key tag (so a restarted command continues the same run),
metrics with step = cycle logged at most once per step, prompts and feedback summaries as
artifacts, and each cycle's prompt as a version in the prompt registry with the alias `best` on
the best one.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import safe_name, sqlite_file, sqlite_problem, store_lock
from memloop.core.settings import apply_offline_defaults

RUN_KEY_TAG = "memloop.run_key"
_lock = threading.Lock()


def _mlflow():
    apply_offline_defaults()
    import logging

    import mlflow

    # "Creating initial MLflow database tables..." and similar INFO lines are not for our users
    logging.getLogger("mlflow").setLevel(logging.WARNING)

    return mlflow


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


def check_store(tracking_uri: str, *, create: bool = False) -> None:
    """Refuse, in one line naming the file, a sqlite store that cannot be an MLflow database.

    Read-only by default: a missing local store is refused (`require_store`) and nothing is
    created. With `create`, the folder of a sqlite store is created (the store itself is MLflow's
    to create); other URIs are left to MLflow.
    """
    if not create:
        require_store(tracking_uri)
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


def client(tracking_uri: str, *, create: bool = True):
    """An MlflowClient on `tracking_uri`; creates the folder of a sqlite store.

    The store is opened (and a new sqlite store's schema created) under the store's file lock:
    two processes starting on a fresh store would otherwise both run MLflow's migrations.
    With `create=False` (commands that only read: compare) a store that does not exist yet is
    refused in one line and nothing is created.
    """
    check_store(tracking_uri, create=create)
    mlflow = _mlflow()
    mlflow.set_tracking_uri(tracking_uri)  # the prompt registry API reads the global URI
    with store_lock(tracking_uri):
        mlc = mlflow.MlflowClient(tracking_uri=tracking_uri)
        mlc.search_experiments(max_results=1)
    return mlc


def experiment_id(mlc, name: str, tracking_uri: str) -> str:
    exp = mlc.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    db = sqlite_file(tracking_uri)
    if db is not None:
        location = (db.parent.resolve() / "artifacts" / safe_name(name)).as_uri()
    return mlc.create_experiment(name, artifact_location=location)


def open_run(
    mlc,
    exp_id: str,
    run_key: str,
    run_name: str,
    params: dict[str, Any],
    tags: dict[str, str] | None = None,
    parent_run_id: str | None = None,
) -> tuple[str, bool]:
    """(run id, resumed): the run tagged with `run_key`, or a new one with `params` logged.

    Looking up and creating happen under one lock shared by every process using the store (a
    file lock beside a sqlite store), so two workers never create the same run twice.
    """
    with _lock, store_lock(str(getattr(mlc, "tracking_uri", ""))):
        found = mlc.search_runs(
            [exp_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key}'", max_results=1
        )
        if found:
            run_id = found[0].info.run_id
            if found[0].info.status != "RUNNING":
                mlc.update_run(run_id, status="RUNNING")
            return run_id, True
        all_tags = {RUN_KEY_TAG: run_key, "mlflow.runName": run_name, **(tags or {})}
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = mlc.create_run(exp_id, run_name=run_name, tags=all_tags)
        run_id = run.info.run_id
    from mlflow.entities import Param

    flat = flatten(params)
    items = [Param(k[:250], str(v)[:6000]) for k, v in sorted(flat.items())]
    for i in range(0, len(items), 100):
        mlc.log_batch(run_id, params=items[i : i + 100])
    return run_id, False


def finish_run(mlc, run_id: str, status: str = "FINISHED") -> None:
    mlc.set_terminated(run_id, status=status)


def logged_steps(mlc, run_id: str, key: str) -> set[int]:
    return {m.step for m in mlc.get_metric_history(run_id, key)}


def log_metrics(mlc, run_id: str, metrics: dict[str, float | None], step: int) -> None:
    """Log each metric at `step` unless already there (a resumed cycle logs nothing twice)."""
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    batch = [
        Metric(k, float(v), now, step)
        for k, v in sorted(metrics.items())
        if v is not None and step not in logged_steps(mlc, run_id, k)
    ]
    if batch:
        mlc.log_batch(run_id, metrics=batch)


def log_text(mlc, run_id: str, text: str, artifact_file: str) -> None:
    mlc.log_text(run_id, text, artifact_file)


def prompt_name(*parts: str) -> str:
    return safe_name(".".join(parts))[:200]


def render_prompts(prompts: dict[str, str]) -> str:
    """One text for the registry: a section per predictor (single predictor: its text)."""
    if len(prompts) == 1:
        return next(iter(prompts.values()))
    return "\n\n".join(f"## {name}\n{text}" for name, text in sorted(prompts.items()))


def register_prompt(
    mlc,
    name: str,
    prompts: dict[str, str],
    *,
    cycle: int,
    run_id: str,
    score: float | None,
    objective: str = "memory_score",
) -> int:
    """The registry version for this (run, cycle), created once."""
    mlflow = _mlflow()
    with _lock:
        existing = _versions(mlc, name)
        for v in existing:
            if v.tags.get("memloop.run_id") == run_id and v.tags.get("memloop.cycle") == str(cycle):
                return int(v.version)
        tags = {
            "memloop.run_id": run_id,
            "memloop.cycle": str(cycle),
            "memloop.predictors": ",".join(sorted(prompts)),
        }
        if score is not None:
            tags[f"memloop.val_{objective}"] = f"{score:.6f}"  # what selection ranks on
        version = mlflow.genai.register_prompt(
            name=name, template=render_prompts(prompts), commit_message=f"cycle {cycle}", tags=tags
        )
        return int(version.version)


def set_best(mlc, name: str, version: int) -> None:
    _mlflow().genai.set_prompt_alias(name, alias="best", version=version)


def _versions(mlc, name: str) -> list[Any]:
    try:
        return list(mlc.search_prompt_versions(name))
    except Exception:
        return []


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        out = {}
        for i, v in enumerate(data):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): data}
