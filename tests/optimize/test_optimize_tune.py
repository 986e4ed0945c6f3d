"""`memloop tune` against a loopback fake model and a scripted policy, on real Optuna (sqlite) and
MLflow stores: two worker processes on one study, a rerun that continues the search, the
objective on validation users, the best trial on test users, the Pareto plot, a dead worker's
trial found by its heartbeat and retried."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml

from memloop.core.files import sqlite_file
from memloop.feedback.records import SCORER_VERSION
from memloop.optimize.config import TuneConfig, load_config
from memloop.testing import (
    FakeOpenAIServer,
    evolve_loop_reply,
    fake_roles,
    request_schema,
    scripted_builder,
)
from memloop.testing.commands import tune_worker
from memloop.testing.paths import REPO

ROOT = REPO


def write_config(root: Path, **over) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    policy = root / "awe.yaml"
    policy.write_text("type: awe\n")
    data = {
        "study": "unit-awe",
        "experiment": "unit-tune",
        "environment": {
            "procedural": {"users": 3, "periods": 1, "questions": 2, "seed": 1},
            "val_users": 2,
            "test_users": 1,
        },
        "policy": str(policy),
        "trials": 2,
        "search_space": {"update_freq": [2, 4], "short_term_len": [0, 4], "top_k": [10, 30]},
        "heartbeat_s": 1,
        "parallel_users": 1,
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "storage": f"sqlite:///{root}/mlruns/optuna.db",
        "out_dir": str(root / "tune"),
    }
    for key in ("update_freq", "short_term_len", "top_k"):  # a grid over one option, in short
        if key in over:
            data["search_space"][key] = over.pop(key)
    data.update(over)
    path = root / "tune.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))  # the space's order names folders
    return path


def tune(root: Path, fake: FakeOpenAIServer, *, builder=None, cache=None, **over):
    from memloop.optimize.tune import run_tune

    config = load_config(write_config(root, **over), TuneConfig)
    roles = fake_roles(fake.base_url, cache or root / "c.sqlite")
    builder = builder or scripted_builder()
    return config, run_tune(config, progress=False, clients=roles, builder=builder)


def settings(study) -> list[tuple]:
    return [tuple(sorted(t.params.items())) for t in study.trials]


def test_objective_on_validation_best_on_test_and_rerun_continues(tmp_path):
    from memloop.runs import tracker

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, first = tune(tmp_path, fake)
        _, second = tune(tmp_path, fake)
    study = optuna.load_study(study_name="unit-awe", storage=config.storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 4 and (first.added, second.added) == (2, 2)
    assert len(set(settings(study))) == 4  # the rerun added new settings, replayed none
    assert study.trials[0].params == {"update_freq": 2, "short_term_len": 4, "top_k": 30}
    # the objective is the validation users' score: the trial folders hold only val users
    val_dirs = sorted(p.name for p in (tmp_path / "tune" / "val").iterdir())
    assert len(val_dirs) == 4
    for d in val_dirs:
        users = {p.name for p in (tmp_path / "tune" / "val" / d / "episodes").iterdir()}
        assert len(users) == 2
    # the best trial on the test user, logged on the study's MLflow run
    best = second.best[0]
    assert second.test is not None and second.test["trial"] == best["number"]
    assert second.test["users"] == 1
    test_dir = tmp_path / "tune" / "test"
    assert [p.name for p in test_dir.iterdir()] == [
        f"awe-{best['update_freq']}-{best['short_term_len']}-{best['top_k']}"
    ]
    mlc = tracker.client(config.tracking_uri)
    exp = mlc.get_experiment_by_name("unit-tune")
    runs = mlc.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags["memloop.kind"] == "tune"]
    # the best trial's test numbers are tags (no one-point charts), the objective's curve first
    assert parent.data.tags["headline.test_overall"] == f"{second.test['overall']:.4g}"
    assert parent.data.tags["headline.trial"] == str(best["number"])
    assert not [k for k in parent.data.metrics if k.startswith("test/")]
    objective = parent.data.tags["memloop.objective"]
    curve = mlc.get_metric_history(parent.info.run_id, f"Objective/val_{objective}")
    assert sorted(c.step for c in curve) == sorted(t["number"] for t in second.trials)
    assert f"best trial {best['number']}" in parent.data.tags["mlflow.note.content"]
    assert len(parent.data.params["spec.catalogue_sha256"]) == 64
    assert parent.data.params["spec.scorer_version"] == SCORER_VERSION == "3"
    assert json.loads(parent.data.params["spec.optimizer.space.top_k"]) == [10, 30]
    trials = [r for r in runs if r.data.tags["memloop.kind"] == "tune_trial"]
    assert len(trials) == 4 and all("val/overall" in r.data.metrics for r in trials)
    # each trial's params are its spec: the study's, with the trial's setting in the policy
    for r in trials:
        t = int(r.data.tags["memloop.trial"])
        setting = next(x for x in second.trials if x["number"] == t)
        for k in ("update_freq", "short_term_len", "top_k"):
            assert r.data.params[f"spec.policy.{k}"] == str(setting[k])


def test_the_grid_ends_when_every_setting_is_done(tmp_path, capsys):
    from memloop.optimize.tune import format_outcome

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, outcome = tune(
            tmp_path, fake, trials=5, update_freq=[2], short_term_len=[0, 4], top_k=[30]
        )
    assert outcome.added == 2 and outcome.exhausted
    assert "the grid is exhausted" in format_outcome(outcome)


def test_a_study_reopened_with_other_settings_is_refused(tmp_path, capsys):
    from memloop.experiments.cli import main

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        tune(tmp_path, fake, trials=1)
    capsys.readouterr()
    path = write_config(
        tmp_path,
        environment={"procedural": {"users": 4, "seed": 2}, "val_users": 2, "test_users": 1},
    )
    assert main(["tune", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made with other settings (changed: environment" in err[0]


@pytest.mark.parametrize("grid", [{"top_k": [30, 50, 70]}, {"update_freq": [2]}])
def test_a_study_reopened_with_a_changed_grid_is_one_line_and_starts_no_trial(tmp_path, grid):
    from memloop.core.errors import UserError

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, _ = tune(tmp_path, fake, trials=1)
        sent = len(fake.requests)
        with pytest.raises(UserError) as caught:
            tune(tmp_path, fake, trials=1, **grid)
        assert len(fake.requests) == sent
    assert str(caught.value) == (
        f"{config.source}: study 'unit-awe' in {config.storage} was made with other settings "
        "(changed: optimizer.space); set `study:` to a new name"
    )
    study = optuna.load_study(study_name="unit-awe", storage=config.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"]  # nothing left RUNNING


def test_a_study_reopened_after_its_default_prompts_changed_is_refused(tmp_path, monkeypatch):
    from memloop.core.errors import UserError
    from memloop.testing import policies

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        tune(tmp_path, fake, trials=1)
        sent = len(fake.requests)
        monkeypatch.setattr(policies, "DEFAULT_PROMPTS", {"writer": "Remember nothing."})
        with pytest.raises(UserError, match="was made with other settings"):
            tune(tmp_path, fake, trials=1)
        assert len(fake.requests) == sent


def test_the_pareto_front_is_optunas_and_its_plots_are_logged(tmp_path):
    from matplotlib.image import imread

    from memloop.runs import tracker

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, outcome = tune(tmp_path, fake, minimize_tokens=True, trials=3)
    study = optuna.load_study(study_name="unit-awe", storage=config.storage)
    assert study.metric_names == [outcome.objective.value, "tokens_per_user"]
    # the front: every trial no other trial beats on one objective without losing on the other
    points = {r["number"]: (r["objective"], r["tokens_per_user"]) for r in outcome.trials}
    front = {
        n
        for n, (s, t) in points.items()
        if not any(s2 >= s and t2 <= t and (s2, t2) != (s, t) for s2, t2 in points.values())
    }
    assert {r["number"] for r in outcome.best} == front == {t.number for t in study.best_trials}
    assert outcome.pareto_plot == config.output_root / "pareto.png"
    assert imread(outcome.pareto_plot).shape[:2] == (462, 704)  # 6.4 x 4.2 in at 110 dpi
    mlc = tracker.client(config.tracking_uri)
    exp = mlc.get_experiment_by_name("unit-tune")
    (parent,) = [
        r for r in mlc.search_runs([exp.experiment_id]) if r.data.tags["memloop.kind"] == "tune"
    ]
    logged = {a.path for a in mlc.list_artifacts(parent.info.run_id, "figures")}
    assert logged == {"figures/pareto.png", "figures/slice.png"}


def worker(path: Path, url: str, delay: float, cache: Path) -> subprocess.Popen:
    return tune_worker(path, url, delay, cache, cwd=ROOT)


def test_two_worker_processes_share_one_study(tmp_path):
    from memloop.runs import tracker

    # heartbeats every 5 s: on a loaded 2-core machine a live worker is never taken for dead
    path = write_config(tmp_path, trials=3, heartbeat_s=5)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        procs = [worker(path, fake.base_url, 0.05, tmp_path / f"c{i}.sqlite") for i in (0, 1)]
        outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
    config = load_config(path, TuneConfig)
    study = optuna.load_study(study_name="unit-awe", storage=config.storage)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 6, states
    assert len(set(settings(study))) == 6  # the grid gave each worker different settings
    mlc = tracker.client(config.tracking_uri)
    exp = mlc.get_experiment_by_name("unit-tune")
    runs = mlc.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags["memloop.kind"] == "tune"]
    assert len(parents) == 1  # both workers logged under one study run
    trials = [r for r in runs if r.data.tags["memloop.kind"] == "tune_trial"]
    assert len(trials) == 6


def test_a_dead_workers_trial_is_found_by_its_heartbeat_and_retried(tmp_path):
    path = write_config(tmp_path, trials=1)
    config = load_config(path, TuneConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        proc = worker(path, fake.base_url, 0.5, tmp_path / "c.sqlite")
        deadline = time.monotonic() + 120
        # wait until its trial runs and has beaten once: Optuna never takes a running trial
        # without a heartbeat for stale (a kill before the first beat left it running forever,
        # seen on a loaded machine)
        while time.monotonic() < deadline:
            try:
                study = optuna.load_study(study_name="unit-awe", storage=config.storage)
                if any(t.state == optuna.trial.TrialState.RUNNING for t in study.trials):
                    with sqlite3.connect(sqlite_file(config.storage)) as db:
                        if db.execute("SELECT count(*) FROM trial_heartbeats").fetchone()[0]:
                            break
            except Exception:  # the storage, the study or its tables do not exist yet
                pass
            time.sleep(0.2)
        proc.kill()
        proc.wait()
        study = optuna.load_study(study_name="unit-awe", storage=config.storage)
        assert [t.state for t in study.trials] == [optuna.trial.TrialState.RUNNING]
        time.sleep(2.5)  # past the grace period (2 x heartbeat_s)
        again = worker(path, fake.base_url, 0.0, tmp_path / "c.sqlite")
        out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    study = optuna.load_study(study_name="unit-awe", storage=config.storage)
    states = [t.state for t in study.trials]
    assert states[0] == optuna.trial.TrialState.FAIL
    assert states.count(optuna.trial.TrialState.COMPLETE) == 1
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") == 0]
    assert len(retried) == 1 and retried[0].params == study.trials[0].params
    assert "1 retried after their worker died" in out


@pytest.mark.parametrize(
    ("environment", "needle"),
    [
        (
            {"procedural": {"users": 2}, "val_users": 2, "test_users": 1},
            "val_users 2 + test_users 1 = 3 users, but the environment has 2",
        ),
        ({"procedural": {"users": 4}, "train_users": 1, "val_users": 2}, "tuning trains nothing"),
        ({"procedural": {"users": 4}, "val_users": 0}, "tuning needs validation users"),
    ],
)
def test_bad_tuning_splits_are_one_line_with_nothing_written(tmp_path, capsys, environment, needle):
    from memloop.experiments.cli import main

    path = write_config(tmp_path, environment=environment)
    assert main(["tune", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and str(path) in err[0], err
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "tune").exists()


def always_option_two(body):
    """evolve_loop_reply, except that every multiple-choice answer (the upper bound's too) is 2."""
    import json

    schema = request_schema(body) or {}
    if "answer" in schema.get("properties", {}):
        return json.dumps({"answer": 2})
    return evolve_loop_reply(body)


def test_an_undefined_objective_stops_tuning_and_state_accuracy_ranks_trials(tmp_path):
    from memloop.core.errors import UserError

    with FakeOpenAIServer(reply=always_option_two) as fake:
        # this environment's gold answers are rarely option 2: the upper bound never beats random
        with pytest.raises(UserError, match="memory_score is undefined on the 2 validation"):
            tune(tmp_path / "a", fake)
        # the hint followed in the same folder and study: the failed trial fixed no settings
        config, outcome = tune(tmp_path / "a", fake, objective="state_accuracy")
    study = optuna.load_study(study_name="unit-awe", storage=config.storage)
    assert study.user_attrs["memloop.run_spec"]["objective"] == "state_accuracy"
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2
    for t in done:  # each trial's value is its validation state accuracy
        assert t.values[0] == pytest.approx(t.user_attrs["state_accuracy"])
        assert t.user_attrs["memory_score"] is None


def test_a_trial_failed_before_all_its_params_were_drawn_leaves_the_grid_whole(tmp_path):
    """A worker killed between two suggestions (the race the dead-worker test can hit): the
    failed trial gets the rest of its params, so the grid sampler still tries every other
    setting (with only its first param, the grid lost that whole subtree: 19 of 27 trials)."""
    from memloop.optimize.tune import _storage

    config = load_config(write_config(tmp_path), TuneConfig)
    (tmp_path / "mlruns").mkdir()
    storage = _storage(config)
    sampler = optuna.samplers.BruteForceSampler(seed=0)
    study = optuna.create_study(study_name="s", storage=storage, sampler=sampler)
    space = config.space
    trial = study.ask()
    trial.suggest_categorical("update_freq", space["update_freq"])
    storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
    failed = study.trials[0]
    assert failed.params == {
        "update_freq": failed.params["update_freq"],
        "short_term_len": space["short_term_len"][0],
        "top_k": space["top_k"][0],
    }
    assert failed.system_attrs["memloop.params_filled"] == ["short_term_len", "top_k"]

    def objective(t):
        for name in ("update_freq", "short_term_len", "top_k"):
            t.suggest_categorical(name, space[name])
        return 0.0

    grid = len(space["update_freq"]) * len(space["short_term_len"]) * len(space["top_k"])
    study.optimize(objective, n_trials=grid)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == grid - 1  # every setting but the failed one
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == grid


def graded_builder(stop_in: int = 0):
    """scripted_builder whose multiple-choice option depends on the trial's setting, so the
    settings score differently; with `stop_in` = n, the n-th setting it sees raises
    KeyboardInterrupt (Ctrl-C) in its second user's conversation, after the first user's
    episodes are done."""
    from memloop.testing.policies import ScriptedPolicy

    seen: list[tuple] = []
    built: dict[tuple, int] = {}

    def build(config, client, workdir, prompts=None):
        key = (config.update_freq, config.short_term_len, config.top_k)
        if key not in seen:
            seen.append(key)
        built[key] = built.get(key, 0) + 1
        policy = ScriptedPolicy(choice=1 + (key[1] // 4 + key[2] // 10) % 3)
        if seen.index(key) + 1 == stop_in and built[key] == 2:

            def ctrl_c(message):
                raise KeyboardInterrupt

            policy.respond = ctrl_c  # type: ignore[method-assign]
        return policy

    build.built = built  # type: ignore[attr-defined]
    return build


def test_a_trial_stopped_by_ctrl_c_is_run_again_and_the_result_is_an_uninterrupted_runs(
    tmp_path,
):
    """Ctrl-C in the 2nd trial: the trial is FAIL, but the next run reruns its setting (it was
    never drawn again, and a later run called the grid exhausted with 3 of 4 settings done); the
    grid is exhausted only when all 4 are complete, and the best trial, the values and the test
    result are those of an uninterrupted run on the same cache."""
    from memloop.optimize.tune import format_outcome

    grid = {"update_freq": [2], "short_term_len": [0, 4], "top_k": [10, 30]}
    cache = tmp_path / "c.sqlite"

    def by_setting(config):
        study = optuna.load_study(study_name="unit-awe", storage=config.storage)
        done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        return study, {tuple(sorted(t.params.items())): t.values for t in done}

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, plain = tune(
            tmp_path / "plain", fake, builder=graded_builder(), cache=cache, trials=4, **grid
        )
        with pytest.raises(KeyboardInterrupt):
            tune(
                tmp_path / "b",
                fake,
                builder=graded_builder(stop_in=2),
                cache=cache,
                trials=4,
                **grid,
            )
        config_b = load_config(tmp_path / "b" / "tune.yaml", TuneConfig)
        study, _ = by_setting(config_b)
        assert [t.state for t in study.trials] == [
            optuna.trial.TrialState.COMPLETE,
            optuna.trial.TrialState.FAIL,
        ]
        stopped = study.trials[1].params
        # the stopped trial's first user was done and checkpointed
        folder = tmp_path / "b" / "tune" / "val" / "awe-{update_freq}-{short_term_len}-{top_k}"
        folder = Path(str(folder).format(**stopped))

        def files():
            return {p: p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()}

        checkpointed = files()
        assert len({p.relative_to(folder).parts[1] for p in checkpointed}) == 1
        _, second = tune(
            tmp_path / "b", fake, builder=graded_builder(), cache=cache, trials=1, **grid
        )
        # the rerun resumed them: the first user's checkpoints were not written again
        assert checkpointed.items() <= files().items()
        assert second.added == 1 and second.rerun == 1 and not second.exhausted
        assert "exhausted" not in format_outcome(second)
        assert "1 run again after a Ctrl-C" in format_outcome(second)
        _, third = tune(
            tmp_path / "b", fake, builder=graded_builder(), cache=cache, trials=4, **grid
        )
    assert plain.exhausted and third.exhausted and third.added == 2
    assert "the grid is exhausted: every setting has a complete trial" in format_outcome(third)
    study, values = by_setting(config_b)
    states = [t.state for t in study.trials]
    assert (
        states
        == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
        + [optuna.trial.TrialState.COMPLETE] * 3
    )
    # the setting stopped by Ctrl-C was run again (first, with the same params), once
    assert study.trials[2].params == stopped
    assert study.trials[2].user_attrs["memloop.rerun_of"] == 1
    assert study.trials[1].system_attrs["memloop.interrupted"] is True
    assert len(values) == 4 and len(settings(study)) == 5
    # the same result as the uninterrupted run: values per setting, best params, test scores
    _, plain_values = by_setting(config)
    assert values == plain_values
    assert len(set(v[0] for v in values.values())) > 1  # the settings do not all tie
    drop = ("number",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in third.best] == [
        {k: v for k, v in r.items() if k not in drop} for r in plain.best
    ]
    assert third.test is not None and plain.test is not None
    assert {k: v for k, v in third.test.items() if k != "trial"} == {
        k: v for k, v in plain.test.items() if k != "trial"
    }


@pytest.fixture
def fake():
    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        yield server


def test_the_best_trial_is_confirmed_against_the_policys_own_setting_on_fresh_users(
    tmp_path, monkeypatch, fake
):
    """Confirmation users (environment.confirm_users): the best validation trial against the
    policy's own setting, decided once by the gate; stand-in scores for the confirmation
    evaluations (+0.1 for the best trial on every user), real stores."""
    from types import SimpleNamespace

    from memloop.core.stats import gate
    from memloop.optimize.tune import Tuner, format_outcome
    from memloop.runs import tracker

    real = Tuner.evaluate
    seen: list[tuple[dict, int]] = []

    def evaluate(self, split, params, *, users=None, out=None):
        if split != "confirm":
            return real(self, split, params, users=users, out=out)
        seen.append((dict(params), len(users)))
        bump = 0.1 if params else 0.0  # {}: the policy's own setting
        per_user = {u.id: {"memory_score": 0.2 + 0.01 * i + bump} for i, u in enumerate(users)}
        return SimpleNamespace(metrics={"per_user": per_user})

    monkeypatch.setattr(Tuner, "evaluate", evaluate)
    env = {
        "procedural": {"users": 9, "periods": 1, "questions": 2, "seed": 1},
        "val_users": 2,
        "test_users": 1,
        "confirm_users": 6,
    }
    config, outcome = tune(
        tmp_path, fake, environment=env, update_freq=[4], short_term_len=[0], top_k=[10]
    )
    c = outcome.confirmation
    best = outcome.best[0]
    assert c is not None and c.candidate == best["number"]
    assert [n for _, n in seen] == [6, 6]  # one look: 6 users cannot stop early
    assert seen[0][0] == {} and seen[1][0] == {"update_freq": 4, "short_term_len": 0, "top_k": 10}
    expected = gate([c.scores[u] - c.seed[u] for u in c.users])
    assert c.verdict == expected.verdict.value == "improved"
    assert c.gate == expected.to_dict()
    decision = tmp_path / "tune" / "confirm" / f"trial_{best['number']}" / "decision.json"
    assert json.loads(decision.read_text())["verdict"] == "improved"
    text = format_outcome(outcome)
    assert f"confirmation: best trial {best['number']} - the policy's own setting on 6" in text
    assert "tune cannot decide" not in text
    mlc = tracker.client(config.tracking_uri)
    (parent,) = [
        r
        for r in mlc.search_runs([mlc.get_experiment_by_name("unit-tune").experiment_id])
        if r.data.tags["memloop.kind"] == "tune"
    ]
    assert parent.data.tags["memloop.verdict"] == "improved"
    assert "on 6 confirmation users: improved" in parent.data.tags["memloop.gate"]
    # a rerun reads the decision back: no confirmation episode again
    seen.clear()
    _, again = tune(
        tmp_path, fake, environment=env, update_freq=[4], short_term_len=[0], top_k=[10], trials=1
    )
    assert seen == [] and again.confirmation == c


def test_a_best_trial_that_is_the_policys_own_setting_is_not_confirmed(tmp_path):
    env = {
        "procedural": {"users": 9, "periods": 1, "questions": 2, "seed": 1},
        "val_users": 2,
        "test_users": 1,
        "confirm_users": 6,
    }
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        _, outcome = tune(
            tmp_path, fake, environment=env, update_freq=[2], short_term_len=[4], top_k=[30]
        )
    from memloop.optimize.tune import format_outcome

    c = outcome.confirmation
    assert c is not None and c.verdict == "identical to the seed" and c.gate is None
    assert not list((tmp_path / "tune" / "confirm").glob("trial_*/look_1"))
    assert "is the policy's own setting (identical to the seed); nothing to decide" in (
        format_outcome(outcome)
    )


def test_tune_names_the_trial_optuna_would_choose_when_ties_make_them_differ(tmp_path):
    """Every trial scores the same (the scripted policy ignores its setting). Without the
    policy's own setting in the space, memloop's tie goes to the smallest setting and Optuna's
    best_trial to the earliest of the tied: the grid's first draw here is update_freq 4."""
    import optuna

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, outcome = tune(
            tmp_path, fake, update_freq=[2, 4], short_term_len=[0], top_k=[30], sampler="grid"
        )
    study = optuna.load_study(study_name="unit-awe", storage=config.storage)
    assert len({t.values[0] for t in study.trials}) == 1  # all tied
    assert [t.params["update_freq"] for t in study.trials] == [4, 2]
    assert study.best_trial.number == 0 and outcome.best[0]["number"] == 1
    assert (
        "Optuna's best_trial is trial 0 (the first of the tied best); memloop names trial 1: "
        "ties go to the policy's own setting, then the smallest setting" in " ".join(outcome.notes)
    )


def test_the_importance_plot_is_drawn_once_trials_differ_in_their_objective(tmp_path):
    """Issue 59: Optuna's parameter-importance plot beside the history and the slices; none when
    every trial scored the same (fANOVA has no variance to apportion)."""
    from types import SimpleNamespace

    from memloop.feedback.objective import Objective
    from memloop.optimize.tune import study_plots

    outcome = SimpleNamespace(
        objective=Objective.STATE_ACCURACY, params=["update_freq", "top_k"], study_name="s"
    )
    for values, expected in (
        ([0.5, 0.5, 0.5], ["history.png", "slice.png"]),
        ([0.2, 0.6, 0.4], ["history.png", "importance.png", "slice.png"]),
    ):
        study = optuna.create_study(direction="maximize")
        for k, value in enumerate(values):
            study.enqueue_trial({"update_freq": [2, 4, 8][k], "top_k": [10, 30, 50][k]})
            trial = study.ask()
            trial.suggest_categorical("update_freq", [2, 4, 8])
            trial.suggest_categorical("top_k", [10, 30, 50])
            study.tell(trial, value)
        folder = tmp_path / str(len(set(values)))
        written = study_plots(study, outcome, folder)
        assert sorted(p.name for p in written) == expected
        assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in written)
