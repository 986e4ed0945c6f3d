"""Several machines' parts on the real engines (`make test-scaleout`): a PostgreSQL server as the
Optuna storage of two `memloop tune` workers, one killed mid-trial, and `mlflow server` (its
backend on that PostgreSQL) as the tracking URI of tune, evolve, compare, export and ui.

The model is the loopback fake and the policy scripted (what is tested is the storage and the
tracking, not a model); the servers are real, started by the fixtures in a temporary folder.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml

from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.commands import tune_worker
from memloop.testing.paths import REPO
from memloop.testing.servers import MlflowServer, PostgresServer

pytestmark = pytest.mark.scaleout

ROOT = REPO


@pytest.fixture(scope="module")
def postgres():
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, postgres):
    backend = postgres.create_database("mlflow")
    with MlflowServer(tmp_path_factory.mktemp("mlflow-server"), backend) as server:
        yield server


def test_the_servers_are_the_real_engines(postgres, mlflow_server):
    """What the other tests rely on: a PostgreSQL dialect and an HTTP tracking server."""
    import mlflow
    import sqlalchemy

    engine = sqlalchemy.create_engine(postgres.url("postgres"))
    with engine.connect() as conn:
        assert conn.execute(sqlalchemy.text("select version()")).scalar().startswith("PostgreSQL")
    engine.dispose()
    assert mlflow_server.uri.startswith("http://127.0.0.1:")
    store = mlflow.MlflowClient(mlflow_server.uri)._tracking_client.store
    assert type(store).__name__ == "RestStore"  # every call goes over HTTP, no file is read


def worker(path: Path, url: str, delay: float, cache: Path) -> subprocess.Popen:
    return tune_worker(path, url, delay, cache, cwd=ROOT)


def test_two_tune_workers_on_postgres_one_killed_mid_trial(tmp_path, postgres, mlflow_server):
    storage = postgres.create_database("optuna_two_workers")
    policy = tmp_path / "awe.yaml"
    policy.write_text("type: awe\n")
    config = {
        "study": "scale-out",
        "experiment": "scale-out-tune",
        "environment": {
            "procedural": {"users": 3, "periods": 1, "questions": 2, "seed": 1},
            "val_users": 2,
            "test_users": 1,
        },
        "policy": str(policy),
        "trials": 6,
        "search_space": {"update_freq": [2, 4], "short_term_len": [0, 4], "top_k": [10, 30]},
        "heartbeat_s": 1,
        "parallel_users": 1,
        "tracking_uri": mlflow_server.uri,
        "storage": storage,
        "out_dir": str(tmp_path / "tune"),
    }
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(config))
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        doomed = worker(path, fake.base_url, 1.0, tmp_path / "a.sqlite")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until the doomed worker's trial runs
            try:
                study = optuna.load_study(study_name="scale-out", storage=storage)
                if any(t.state == optuna.trial.TrialState.RUNNING for t in study.trials):
                    break
            except Exception:  # the tables or the study do not exist yet
                pass
            time.sleep(0.2)
        survivor = worker(path, fake.base_url, 0.2, tmp_path / "b.sqlite")
        time.sleep(1.0)  # both work on the study
        doomed.kill()
        doomed.wait()
        out, err = survivor.communicate(timeout=600)
    assert survivor.returncode == 0, err[-3000:]
    study = optuna.load_study(study_name="scale-out", storage=storage)
    states = [t.state for t in study.trials]
    fails = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(fails) == 1, states  # the killed worker's trial, failed by its heartbeat
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == fails[0].number]
    assert len(retried) == 1 and retried[0].params == fails[0].params
    assert retried[0].state == optuna.trial.TrialState.COMPLETE
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 6  # the survivor's six trials, the retry among them
    assert len({tuple(sorted(t.params.items())) for t in done}) == 6  # the grid: no repeat
    assert "1 retried after their worker died" in out

    from memloop.runs import tracker

    mlc = tracker.client(mlflow_server.uri)
    exp = mlc.get_experiment_by_name("scale-out-tune")
    runs = mlc.search_runs([exp.experiment_id])
    assert len([r for r in runs if r.data.tags["memloop.kind"] == "tune"]) == 1
    finished = [
        r
        for r in runs
        if r.data.tags["memloop.kind"] == "tune_trial" and r.info.status == "FINISHED"
    ]
    assert len(finished) == 6


def evolve_config(tmp_path: Path, tracking_uri: str) -> Path:
    policy = tmp_path / "awi.yaml"
    policy.write_text("type: awi\n")
    data = {
        "experiment": "scale-out-evolve",
        "environment": {
            "procedural": {"users": 6, "periods": 2, "questions": 2, "seed": 1},
            "train_users": 2,
            "val_users": 2,
            "test_users": 2,
        },
        "policy": str(policy),
        "feedback_modes": ["none", "complete"],
        "evolvers": ["reflective"],
        "cycles": 2,
        "tracking_uri": tracking_uri,
        "out_dir": str(tmp_path / "runs"),
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_evolve_compare_export_and_ui_over_a_tracking_server(tmp_path, mlflow_server, capsys):
    from memloop.experiments.cli import main
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.runs import tracker

    config = load_config(evolve_config(tmp_path, mlflow_server.uri), EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
        builder = scripted_builder(garble_every=3)
        outcomes = run_evolve(config, progress=False, clients=roles, builder=builder)
        calls = len(fake.requests)
        again = run_evolve(config, progress=False, clients=roles, builder=builder)
        assert len(fake.requests) == calls  # resumed from the server's runs: nothing redone
    assert [o.headline for o in again] == [o.headline for o in outcomes]

    mlc = tracker.client(mlflow_server.uri)
    exp = mlc.get_experiment_by_name("scale-out-evolve")
    runs = mlc.search_runs([exp.experiment_id])
    assert len(runs) == 2  # one per condition; the rerun opened no new run
    # the artifacts went through the server (mlflow-artifacts:), not to a local path
    assert all(r.info.artifact_uri.startswith("mlflow-artifacts:") for r in runs)
    served = list((mlflow_server.folder / "artifacts").rglob("cycle_01.json"))
    assert served  # written by the server into its own artifacts folder

    capsys.readouterr()
    assert (
        main(["compare", "--experiment", "scale-out-evolve", "--tracking-uri", mlflow_server.uri])
        == 0
    )
    table = capsys.readouterr().out
    evolved = next(o for o in outcomes if o.mode == "complete")
    assert f"{evolved.headline:.3f}" in table

    out = tmp_path / "prompt.txt"
    name = mlc.get_run(evolved.run_id).info.run_name  # a run name, read from the server
    code = main(
        ["export", name, "--format", "text", "--tracking-uri", mlflow_server.uri, "--out", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    selected = evolved.selection.cycle
    from memloop.runs.store import CycleStore

    prompts = CycleStore(evolved.run_dir).saved_prompts(selected)
    text = out.read_text()
    assert all(p in text for p in prompts.values())
    assert f"cycle {selected}" in text

    capsys.readouterr()
    assert main(["ui", "--tracking-uri", mlflow_server.uri]) == 0
    assert mlflow_server.uri in capsys.readouterr().out  # the server is the UI: nothing started
