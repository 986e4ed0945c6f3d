"""`memloop tune` over a declared search space: any option of any policy (plug-ins included),
choices and int/float ranges with steps and log scales, each value checked against the policy
before a trial runs; on real Optuna and MLflow stores."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import optuna
import pytest
import yaml

from memloop.core.errors import UserError
from memloop.optimize.config import Range, TuneConfig, load_config
from memloop.optimize.tune import apply_params, space_values, suggest
from memloop.policies import AWIConfig, PluginConfig
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles
from memloop.testing.paths import REPO

EXAMPLE = REPO / "examples" / "keyword_memory"


def test_values_of_choices_and_ranges():
    assert space_values([2, "a", True]) == [2, "a", True]
    assert space_values(Range(low=0, high=10, step=4)) == [0, 4, 8]
    assert space_values(Range(low=3, high=5)) == [3, 4, 5]
    assert space_values(Range(low=0.5, high=1.5, step=0.25)) == [0.5, 0.75, 1.0, 1.25, 1.5]
    assert space_values(Range(low=0.001, high=1.0, log=True)) == [0.001, 1.0]  # its ends


def test_optuna_draws_each_kind_within_its_space():
    space = {
        "k": Range(low=1, high=64, log=True),
        "t": Range(low=0.001, high=1.0, log=True),
        "s": Range(low=0.0, high=1.0, step=0.5),
        "c": ["x", "y"],
    }
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(20):
        trial = study.ask()
        p = suggest(trial, space)
        assert isinstance(p["k"], int) and 1 <= p["k"] <= 64
        assert isinstance(p["t"], float) and 0.001 <= p["t"] <= 1.0
        assert p["s"] in (0.0, 0.5, 1.0) and p["c"] in ("x", "y")
        study.tell(trial, 0.0)
    d = study.trials[0].distributions
    assert d["k"] == optuna.distributions.IntDistribution(1, 64, log=True)
    assert d["t"] == optuna.distributions.FloatDistribution(0.001, 1.0, log=True)


def test_a_setting_is_validated_as_the_policys_yaml_would_be():
    base = AWIConfig(reply_max_tokens=64)
    tuned = apply_params(base, {"reply_max_tokens": 32, "grounded_values": False}, "w")
    assert (tuned.reply_max_tokens, tuned.grounded_values, tuned.update_freq) == (32, False, 2)
    with pytest.raises(UserError) as info:
        apply_params(base, {"update_freq": 0}, "tune.yaml: key 'search_space.update_freq'")
    assert "search_space.update_freq" in str(info.value) and "greater than or equal to 1" in str(
        info.value
    )
    with pytest.raises(UserError, match="unknown key 'top_k'"):
        apply_params(base, {"top_k": 3}, "w")  # AWI retrieves nothing
    with pytest.raises(UserError, match="'type' is not a tunable option"):
        apply_params(base, {"type": "awe"}, "w")
    plugin = PluginConfig(type="p.py:P", target="p.py:P", default_name="p", options={"a": {"b": 1}})
    nested = apply_params(plugin, {"a.b": 2, "a.c": "x", "top_k": 5}, "w")
    assert nested.options == {"a": {"b": 2, "c": "x"}, "top_k": 5}
    assert plugin.options == {"a": {"b": 1}}  # the base is not changed


def write(tmp_path: Path, policy: str, **over) -> Path:
    data = {
        "study": "space",
        "experiment": "unit-tune-space",
        "environment": {
            "procedural": {"users": 3, "periods": 1, "questions": 2, "seed": 1},
            "val_users": 2,
            "test_users": 1,
        },
        "policy": policy,
        "trials": 4,
        "heartbeat_s": 5,
        "parallel_users": 1,
        "tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db",
        "storage": f"sqlite:///{tmp_path}/mlruns/optuna.db",
        "out_dir": str(tmp_path / "tune"),
        **over,
    }
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"search_space": {"x": {"low": 0.1, "high": 1.0}}}, "the grid sampler needs choices"),
        ({"search_space": {"x": {"low": 0.1, "high": 1.0, "log": True, "step": 0.1}}}, "log:"),
        ({"search_space": {"x": {"low": 5, "high": 1}}}, "high 1 is below low 5"),
        ({"search_space": {"x": []}}, "search_space.x: no choice"),
        ({"search_space": {}}, "no option to search"),
        ({"search_space": {"x": [1, 2]}, "default_trial": {"y": 1}}, "a value for each of x"),
    ],
)
def test_a_bad_search_space_is_one_line(tmp_path, over, needle):
    (tmp_path / "p.yaml").write_text("type: awi\n")
    with pytest.raises(UserError) as info:
        load_config(write(tmp_path, str(tmp_path / "p.yaml"), **over), TuneConfig)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_a_value_the_policy_refuses_stops_tune_before_any_trial(tmp_path):
    from memloop.optimize.tune import run_tune

    (tmp_path / "p.yaml").write_text("type: awi\n")
    space = {"short_term_len": {"low": 0, "high": 512, "step": 256}}
    config = load_config(write(tmp_path, str(tmp_path / "p.yaml"), search_space=space), TuneConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        with pytest.raises(UserError) as info:
            run_tune(config, progress=False, clients=fake_roles(fake.base_url, tmp_path / "c.db"))
        assert fake.requests == []
    assert "key 'search_space.short_term_len' value 512" in str(info.value)
    assert "less than or equal to 256" in str(info.value)


def test_awi_tuned_on_a_grid_of_choices_and_an_int_range(tmp_path):
    """Not AWE: AWI's update_freq (choices) x reply_max_tokens (an int range with a step); the
    policy YAML's own setting is the first trial; every setting once; each trial's MLflow run
    holds its setting in the policy."""
    from memloop.optimize.tune import run_tune
    from memloop.runs import tracker

    (tmp_path / "p.yaml").write_text("type: awi\nreply_max_tokens: 64\n")
    space = {"update_freq": [2, 4], "reply_max_tokens": {"low": 32, "high": 64, "step": 32}}
    config = load_config(write(tmp_path, str(tmp_path / "p.yaml"), search_space=space), TuneConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        outcome = run_tune(
            config, progress=False, clients=fake_roles(fake.base_url, tmp_path / "c.db")
        )
    study = optuna.load_study(study_name="space", storage=config.storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert study.trials[0].params == {"update_freq": 2, "reply_max_tokens": 64}
    settings = {(t.params["update_freq"], t.params["reply_max_tokens"]) for t in done}
    assert len(done) == 4 and settings == set(itertools.product([2, 4], [32, 64]))
    assert outcome.exhausted and outcome.params == ["update_freq", "reply_max_tokens"]
    folders = sorted(p.name for p in (tmp_path / "tune" / "val").iterdir())
    assert folders == ["awi-2-32", "awi-2-64", "awi-4-32", "awi-4-64"]
    mlc = tracker.client(config.tracking_uri, create=False)
    exp = mlc.get_experiment_by_name("unit-tune-space")
    runs = mlc.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags["memloop.kind"] == "tune_trial"]
    assert {
        (r.data.params["spec.policy.update_freq"], r.data.params["spec.policy.reply_max_tokens"])
        for r in trials
    } == {("2", "32"), ("2", "64"), ("4", "32"), ("4", "64")}
    (parent,) = [r for r in runs if r.data.tags["memloop.kind"] == "tune"]
    assert json.loads(parent.data.params["spec.optimizer.space.update_freq"]) == [2, 4]
    logged = {a.path for a in mlc.list_artifacts(parent.info.run_id, "figures")}
    assert logged == {"figures/history.png", "figures/slice.png"}


def test_a_plugin_tuned_by_tpe_on_a_log_range(tmp_path):
    """The keyword-memory plug-in's top_k on a log-scale int range, drawn by TPE."""
    from memloop.optimize.tune import run_tune

    policy = str(EXAMPLE / "policy.yaml")
    space = {"top_k": {"low": 1, "high": 16, "log": True}}
    path = write(tmp_path, policy, search_space=space, sampler="tpe", trials=3)
    config = load_config(path, TuneConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        outcome = run_tune(
            config, progress=False, clients=fake_roles(fake.base_url, tmp_path / "c.db")
        )
    study = optuna.load_study(study_name="space", storage=config.storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3 and outcome.added == 3
    assert done[0].params == {"top_k": 3}  # the YAML's own value first
    assert all(1 <= t.params["top_k"] <= 16 for t in done)
    assert study.trials[0].distributions["top_k"] == optuna.distributions.IntDistribution(
        1, 16, log=True
    )
    folders = {p.name for p in (tmp_path / "tune" / "val").iterdir()}
    assert folders == {f"keyword-memory-{t.params['top_k']}" for t in done}


@pytest.mark.parametrize(
    ("given", "storage"),
    [
        ({}, "sqlite:///mlruns/optuna.db"),  # beside the default MLflow store, as before
        ({"tracking_uri": "sqlite:////data/exp/mlflow.db"}, "sqlite:////data/exp/optuna.db"),
        ({"tracking_uri": "sqlite:///elsewhere/m.db"}, "sqlite:///elsewhere/optuna.db"),
        ({"tracking_uri": "http://127.0.0.1:5000"}, "sqlite:///mlruns/optuna.db"),
        (
            {"tracking_uri": "sqlite:////data/exp/mlflow.db", "storage": "sqlite:////o/s.db"},
            "sqlite:////o/s.db",
        ),
    ],
)
def test_the_study_store_sits_beside_a_sqlite_tracking_store_unless_storage_says(given, storage):
    config = TuneConfig.model_validate(
        {
            "environment": {"procedural": {"users": 2}, "val_users": 1, "test_users": 1},
            "policy": "awi.yaml",
            **given,
        }
    )
    assert config.storage == storage
