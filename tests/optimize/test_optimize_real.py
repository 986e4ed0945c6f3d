"""The optimize layer on the real path: the embedded model (0.5B), real MLflow and Optuna stores.

A tiny procedural environment: two GEPA cycles and a one-trial tune, with replies capped at a few
tokens. The rule of the real-model pass (issue 43, for make test's budget): each path meets the
real model once; what a second run on the same path adds (a study continued, a run resumed or
served from the cache) is checked on the fake model with the same real stores (the tune's rerun:
test_optimize_tune.py, test_objective_on_validation_best_on_test_and_rerun_continues).

The reflective evolver through check_evolver on the embedded model is in test_evolver_check.py
(it was checked twice, here too, until issue 43); the edits evolver's cycles, MLflow contents,
compare and `memloop eval` are covered by test_quickstart_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memloop.experiments.cli import main
from memloop.testing.paths import REPO

pytestmark = pytest.mark.real_model

ROOT = REPO
ENV = {"procedural": {"users": 2, "periods": 1, "questions": 1, "seed": 3}}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("optreal")
    endpoint = root / "endpoint.yaml"
    # same model and slots as the session's local_client: one shared embedded server
    endpoint.write_text(
        "model: local-0.5b\nbase_url: local\nmax_concurrency: 2\ntimeout_s: 300\nmax_tokens: 384\n"
    )
    return root, endpoint


def capped_policy(root: Path, name: str) -> str:
    """A shipped policy with chat replies capped at 32 tokens (memory writes keep their cap)."""
    data = yaml.safe_load((ROOT / f"memloop/experiments/policies/{name}.yaml").read_text())
    path = root / f"{name}-capped.yaml"
    path.write_text(yaml.safe_dump({**data, "reply_max_tokens": 32}))
    return str(path)


def endpoints(endpoint: Path) -> dict[str, str]:
    return {role: str(endpoint) for role in ("agent", "user_sim", "checker", "optimizer")}


@pytest.mark.slow
def test_gepa_two_cycles(workspace, local_client):
    from memloop.runs import tracker

    root, endpoint = workspace
    config = {
        "experiment": "real-gepa",
        # GEPA learns on the training user and selects on the validation user; one
        # confirmation user: the declared candidate and the null control are scored on it
        "environment": {
            "procedural": {**ENV["procedural"], "users": 3},
            "train_users": 1,
            "val_users": 1,
            "test_users": 0,
            "confirm_users": 1,
        },
        "null_control": True,
        "policy": capped_policy(root, "awi"),
        "feedback_modes": ["complete"],
        "search": "gepa",
        "cycles": 2,
        # one iteration: the seed on the validation user (1), the parent and its new candidate's
        # replay screen on the training user (2)
        "gepa": {"minibatch_size": 1, "max_metric_calls": 3, "reflection_max_tokens": 96},
        "rounds": {"init": 1, "update": 1},
        "endpoints": endpoints(endpoint),
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
        "parallel_users": 1,
    }
    path = root / "gepa.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["evolve", str(path), "--no-progress"]) == 0
    mlc = tracker.client(config["tracking_uri"])
    (run,) = mlc.search_runs([mlc.get_experiment_by_name("real-gepa").experiment_id])
    for split in ("train", "val"):
        steps = [m.step for m in mlc.get_metric_history(run.info.run_id, f"{split}/overall")]
        assert steps[:2] == [0, 1], split
    assert "optimizer/gepa_val_score" in run.data.metrics
    assert run.data.tags["memloop.search"] == "gepa"
    # GEPA's reflection ran through the optimizer contract. Its proposal either became a new
    # candidate, screened by replaying the training user's recorded conversation (its minibatch
    # held no new on-policy episode), or was refused by the leak check: the 0.5B model copies its
    # whole request, the users' feedback and their values included, into the proposal (seen:
    # "audiobooks", a user's value, refused). Nothing registered names a private value.
    (run_dir,) = (root / "runs").glob("*gepa*")
    (iteration,) = [
        h for h in json.loads((run_dir / "gepa_cycles.json").read_text()) if h["iteration"]
    ]
    assert iteration["optimizer_tokens"] > 0
    candidates = list(run_dir.glob("candidates/*.json"))
    screened = list(run_dir.glob("candidates/*/screen/*/*/period_00/record.json"))
    # a refused proposal keeps its parent's text: the seed is then the only candidate, and its
    # copy is what GEPA's minibatch screens
    assert len(candidates) == (1 if iteration["leaks_rejected"] else 2)
    assert screened and all(json.loads(p.read_text())["mode"] == "off_policy" for p in screened)
    from memloop.core.leaks import named
    from memloop.environment.procedural import generate_procedural

    # the confirmation on the real path: one user cannot decide (6 are the fewest at 0.05), and
    # the null control (the seed reworded, temperature 0) was scored on it like a candidate
    decision = json.loads((run_dir / "confirm" / "decision.json").read_text())
    assert decision["null"]["verdict"] == "too few users"
    assert decision["null"]["what"] == "the seed reworded ('Task:' before each text)"
    assert (run_dir / "confirm" / "look_1" / "null" / "metrics.json").is_file()
    assert decision["verdict"] in ("too few users", "identical to the seed")
    assert run.data.tags["memloop.null_control"].endswith(": too few users")
    logged = {a.path for a in mlc.list_artifacts(run.info.run_id, "confirmation")}
    assert logged == {"confirmation/decision.json"}
    procedural = {**ENV["procedural"], "users": 3}
    private = set().union(*(i.private_values() for i in generate_procedural(**procedural)))
    name = run.data.tags["memloop.prompt_name"]
    versions = sorted(mlc.search_prompt_versions(name), key=lambda v: int(v.version))
    assert versions and all(
        named(v.template, private, versions[0].template) == [] for v in versions
    )


@pytest.mark.slow
def test_tune_one_trial(workspace, local_client, capsys):
    import optuna

    root, endpoint = workspace
    config = {
        "study": "tiny-awe",
        # no test user: the best trial's re-run on test users is the same path again (the rule
        # above; on the fake model: test_objective_on_validation_best_on_test_and_rerun_continues)
        # no confirmation user either: tune's confirmation evaluates through the same
        # Tuner.evaluate as its trials (its decision: test_optimize_tune.py, real stores; the
        # confirmation's real-model path: test_gepa_two_cycles above); it cost 80 s of AWE here
        "environment": {**ENV, "train_users": 0, "val_users": 1, "test_users": 0},
        "policy": capped_policy(root, "awe"),
        "trials": 1,
        # always defined (the memory score is undefined when the 1.5B model's upper bound does
        # not beat random on the one validation user)
        "objective": "state_accuracy",
        "search_space": {"update_freq": [2, 4], "short_term_len": [0, 4], "top_k": [5, 30]},
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
    assert len(study.trials) == 1
    assert study.trials[0].params == {"update_freq": 2, "short_term_len": 4, "top_k": 30}
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE
    out = capsys.readouterr().out
    assert "1 finished trials, 1 added now" in out
    assert "tune cannot decide: its best trial is chosen on validation users" in out
    from memloop.runs import tracker

    mlc = tracker.client(config["tracking_uri"])
    exp = mlc.get_experiment_by_name("tune")
    children = [
        r
        for r in mlc.search_runs([exp.experiment_id])
        if r.data.tags.get("memloop.kind") == "tune_trial"
    ]
    assert len({r.data.tags.get("mlflow.parentRunId") for r in children}) == 1
    assert all("val/state_accuracy" in r.data.metrics for r in children)
    assert "val/state_accuracy" in parent_metrics(mlc, exp)


def parent_metrics(mlc, exp) -> dict:
    (parent,) = [
        r for r in mlc.search_runs([exp.experiment_id]) if r.data.tags.get("memloop.kind") == "tune"
    ]
    return parent.data.metrics
