"""Issue 59: a tune study in optuna-dashboard beside MLflow, as an Optuna user opens it.

`memloop tune` (the fake endpoint for every role) adds two trials; `memloop ui --study` serves
optuna-dashboard on the study's store as tune wrote it, on 127.0.0.1, beside MLflow; headless
Chromium opens the study's page and its trials' page. Each trial's note on the dashboard links
its MLflow run (the importance plot: tests/optimize/test_optimize_tune.py; the fake scores every
trial alike, and fANOVA then has nothing to apportion).
"""

from __future__ import annotations

import subprocess
import sys

import optuna
from optuna_dashboard import get_note

from memloop.experiments.cli import main
from memloop.runs import tracker
from memloop.testing import FakeOpenAIServer, evolve_loop_reply
from memloop.testing.browser import driven, memloop_ui
from memloop.testing.commands import write_small_tune


def test_the_dashboard_shows_the_studys_trials_and_their_parameters(tmp_path):
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        endpoint = tmp_path / "fake.yaml"
        endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\nmax_retries: 0\n")
        path = write_small_tune(
            tmp_path,
            "dash",
            trials=2,
            search_space={"update_freq": [2, 4]},
            sampler="grid",
            tracking_uri=f"sqlite:///{tmp_path}/mlruns/mlflow.db",
            out_dir=str(tmp_path / "tune"),
            endpoints={r: str(endpoint) for r in ("agent", "user_sim", "checker", "optimizer")},
        )
        assert main(["tune", str(path), "--no-progress"]) == 0
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    storage = f"sqlite:///{tmp_path}/mlruns/optuna.db"  # tune's default, beside the tracking store
    study = optuna.load_study(study_name="dash", storage=storage)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert sorted(t.params["update_freq"] for t in trials) == [2, 4]
    mlc = tracker.client(uri)
    # each trial's note links its MLflow run
    for trial in trials:
        run = mlc.get_run(trial.user_attrs["run_id"])
        note = get_note(optuna.trial.Trial(study, trial._trial_id))
        assert f"#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}" in note
    with memloop_ui(uri, "tune", study="dash") as ui:  # the experiment: the YAML's name
        assert (
            ui.dashboard.startswith("http://127.0.0.1:") and "/dashboard/studies/" in ui.dashboard
        )
        with driven(ui.dashboard) as page:
            shown = page.wait_for_text("update_freq")
            assert "dash" in shown
        with driven(f"{ui.dashboard}/trials") as page:
            shown = page.wait_for_text("update_freq")
            # the trials' parameters and the link to each one's MLflow run
            assert "run_id" in page.wait_for_text("run_id")
            assert trials[0].user_attrs["run_id"] in page.text()


def test_a_study_not_in_the_store_is_refused_in_one_line(tmp_path):
    (tmp_path / "mlruns").mkdir()
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    tracker.client(uri)  # the MLflow store exists; the Optuna one does not
    memloop = [sys.executable, "-m", "memloop", "ui", "--tracking-uri", uri]
    done = subprocess.run(
        [*memloop, "--study", "nope"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"memloop: error: --study nope: no Optuna store at sqlite:///{tmp_path}/mlruns/optuna.db "
        "(run `memloop tune` first, or name its store with --storage)"
    )
