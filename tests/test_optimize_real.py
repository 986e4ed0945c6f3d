"""The optimize layer on the real path: the embedded model (0.5B), real MLflow and Optuna
stores, a tiny procedural environment. Two cycles of each evolver, a tune that grows on rerun,
compare's table, and `memloop eval` with AWI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memloop.experiments.cli import main

pytestmark = pytest.mark.real_model

ROOT = Path(__file__).resolve().parent.parent
ENV = {
    "procedural": {"users": 1, "periods": 1, "questions": 1, "seed": 3},
    "train_users": 1,
    "heldout_users": 0,
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("optreal")
    endpoint = root / "endpoint.yaml"
    # same model and slots as the session's local_client: one shared embedded server
    endpoint.write_text(
        "model: local-0.5b\nbase_url: local\nmax_concurrency: 2\ntimeout_s: 300\nmax_tokens: 384\n"
    )
    return root, endpoint


def endpoints(endpoint: Path) -> dict[str, str]:
    return {role: str(endpoint) for role in ("agent", "user_sim", "checker", "optimizer")}


@pytest.fixture(scope="module")
def evolved(workspace, local_client):
    root, endpoint = workspace
    config = {
        "experiment": "real-evolve",
        "environment": ENV,
        "policy": str(ROOT / "memloop/experiments/policies/awi.yaml"),
        "feedback_modes": ["none", "complete"],
        "evolvers": ["reflective"],
        "cycles": 2,
        "rounds": {"init": 1, "update": 1},
        "endpoints": endpoints(endpoint),
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
        "parallel_users": 1,
    }
    path = root / "evolve.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["evolve", str(path), "--no-progress"]) == 0
    return config


def test_two_cycles_of_each_evolver_logged(evolved):
    from memloop.optimize import tracking

    mlc = tracking.client(evolved["tracking_uri"])
    exp = mlc.get_experiment_by_name("real-evolve")
    runs = {
        (r.data.tags["memloop.feedback_mode"], r.data.tags["memloop.evolver"]): r
        for r in mlc.search_runs([exp.experiment_id])
    }
    assert set(runs) == {("none", "none"), ("complete", "reflective")}
    for (mode, evolver), run in runs.items():
        rid = run.info.run_id
        recall = [m.step for m in mlc.get_metric_history(rid, "factual_recall")]
        assert recall[:2] == [0, 1], (mode, evolver)
        overall = {m.step: m.value for m in mlc.get_metric_history(rid, "overall")}
        assert set(overall) >= {0, 1} and all(0 <= v <= 1 for v in overall.values())
        # memory score is logged at every cycle where it is defined (UB > random)
        ms_steps = {m.step for m in mlc.get_metric_history(rid, "memory_score")}
        assert ms_steps <= set(overall)
        prompts = {a.path for a in mlc.list_artifacts(rid, "prompts")}
        assert {"prompts/cycle_00.json", "prompts/cycle_01.json"} <= prompts
        name = run.data.tags["memloop.prompt_name"]
        versions = mlc.search_prompt_versions(name)
        assert len(versions) >= 2
        assert run.data.params["condition.feedback_mode"] == mode
        assert run.data.params["data.procedural.seed"] == "3"
    # the reflective run's second prompt came from the evolver
    rid = runs[("complete", "reflective")].info.run_id
    from memloop.optimize.compare import _download_text

    p0 = json.loads(_download_text(mlc, rid, "prompts/cycle_00.json"))
    p1 = json.loads(_download_text(mlc, rid, "prompts/cycle_01.json"))
    evolve = json.loads(_download_text(mlc, rid, "evolve/cycle_00.json"))
    assert set(p0) == set(p1) == {"writer"}
    assert p1 == evolve["prompts"]


def test_compare_table_from_real_runs(evolved, capsys):
    assert (
        main(
            [
                "compare",
                "--experiment",
                "real-evolve",
                "--tracking-uri",
                evolved["tracking_uri"],
                "--to",
                "last",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for word in ("none", "reflective", "first", "last", "best"):
        assert word in out
    assert "prompts of cycle 0 -> last cycle" in out


@pytest.mark.slow
def test_gepa_two_cycles(workspace, local_client):
    from memloop.optimize import tracking

    root, endpoint = workspace
    config = {
        "experiment": "real-gepa",
        "environment": ENV,
        "policy": str(ROOT / "memloop/experiments/policies/awi.yaml"),
        "feedback_modes": ["complete"],
        "evolvers": ["gepa"],
        "cycles": 2,
        "rounds": {"init": 1, "update": 1},
        "endpoints": endpoints(endpoint),
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
        "parallel_users": 1,
    }
    path = root / "gepa.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["evolve", str(path), "--no-progress"]) == 0
    mlc = tracking.client(config["tracking_uri"])
    (run,) = mlc.search_runs([mlc.get_experiment_by_name("real-gepa").experiment_id])
    steps = [m.step for m in mlc.get_metric_history(run.info.run_id, "factual_recall")]
    assert steps[:2] == [0, 1]
    assert "gepa_val_score" in run.data.metrics


@pytest.mark.slow
def test_tune_three_trials_then_six(workspace, local_client, capsys):
    import optuna

    root, endpoint = workspace
    config = {
        "study": "tiny-awe",
        "environment": ENV,
        "policy": str(ROOT / "memloop/experiments/policies/awe.yaml"),
        "trials": 3,
        "update_freq": [2, 4],
        "short_term_len": [0, 4],
        "top_k": [5, 30],
        "rounds": {"init": 1, "update": 1},
        "endpoints": endpoints(endpoint),
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "storage": f"sqlite:///{root}/mlruns/optuna.db",
        "out_dir": str(root / "tune"),
        "parallel_users": 1,
    }
    path = root / "tune.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["tune", str(path), "--no-progress"]) == 0
    study = optuna.load_study(study_name="tiny-awe", storage=config["storage"])
    assert len(study.trials) == 3
    assert study.trials[0].params == {"update_freq": 2, "short_term_len": 4, "top_k": 30}
    assert main(["tune", str(path), "--no-progress"]) == 0
    study = optuna.load_study(study_name="tiny-awe", storage=config["storage"])
    assert len(study.trials) == 6
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    out = capsys.readouterr().out
    assert "6 finished trials, 3 added now" in out
    from memloop.optimize import tracking

    mlc = tracking.client(config["tracking_uri"])
    exp = mlc.get_experiment_by_name("tune")
    children = [
        r
        for r in mlc.search_runs([exp.experiment_id])
        if r.data.tags.get("memloop.kind") == "tune-trial"
    ]
    assert len({r.data.tags.get("mlflow.parentRunId") for r in children}) == 1
    assert all("memory_score" in r.data.metrics for r in children)


def test_eval_cli_with_awi_on_embedded_model(workspace, local_client, capsys):
    root, endpoint = workspace
    env = root / "env.json"
    assert (
        main(
            [
                "env",
                "procedural",
                "--users",
                "1",
                "--periods",
                "1",
                "--questions",
                "2",
                "--seed",
                "4",
                "--out",
                str(env),
            ]
        )
        == 0
    )
    args = [
        "eval",
        "--env",
        str(env),
        "--policy",
        str(ROOT / "memloop/experiments/policies/awi.yaml"),
        "--out",
        str(root / "eval"),
        "--endpoint",
        str(endpoint),
        "--rounds-update",
        "1",
    ]
    assert main(args) == 0
    m = json.loads((root / "eval" / "metrics.json").read_text())
    for key in (
        "overall",
        "random",
        "upper_bound",
        "memory_score",
        "per_period",
        "diagnosis",
        "factual_recall",
        "usage",
    ):
        assert key in m
    d = m["diagnosis"]
    assert d["write"] + d["read"] + d["utilization"] == pytest.approx(1 - m["overall"])
    assert m["questions"] == 1 * 2 * 2 and len(m["per_period"]) == 2
    assert m["usage"]["agent"] > 0 and m["usage"]["probe"] > 0
    lines = (root / "eval" / "records.jsonl").read_text().splitlines()
    assert len(lines) == m["questions"]
    capsys.readouterr()
    assert main(args) == 0  # rerun: served from checkpoints
    assert "new model requests this run: 0" in capsys.readouterr().out
