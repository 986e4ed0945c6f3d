"""The run layer: a RunSpec's key, params, tags and spec.json; names that never build paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memloop.core.errors import UserError
from memloop.llm.endpoint import Endpoint
from memloop.runs.folder import open_run_folder, read_spec
from memloop.runs.spec import LONG_PARAM, RunSpec


def spec(**over) -> RunSpec:
    base = dict(
        kind="evolve",
        experiment="x",
        environment={"path": "env.json", "sha256": "ab" * 32},
        users={"train": ["u1", "u2"], "val": ["u3"], "test": ["u4"]},
        policy={"type": "awi", "name": None},
        prompts_sha256="cd" * 32,
        endpoints={"agent": Endpoint(model="m").result_settings()},
        evaluation={"periods": 2},
        mode="complete",
        objective="state_accuracy",
        optimizer={"evolver": "reflective"},
        seed=0,
    )
    base.update(over)
    return RunSpec(**base)


def test_the_key_follows_what_changes_a_response_and_nothing_else():
    fetched_differently = Endpoint(model="m", max_concurrency=1, timeout_s=5.0, max_retries=0)
    assert spec(endpoints={"agent": fetched_differently.result_settings()}).key() == spec().key()
    hotter = Endpoint(model="m", temperature=0.7)
    assert spec(endpoints={"agent": hotter.result_settings()}).key() != spec().key()
    for field, value in [("users", {"train": ["u2", "u1"]}), ("repeat", 1), ("seed", 1)]:
        assert spec(**{field: value}).key() != spec().key(), field


def test_like_runs_differ_only_in_what_the_optimizer_chooses():
    chosen = spec(mode="none", objective="memory_score", optimizer={"evolver": "none"}, repeat=2)
    assert chosen.key() != spec().key() and chosen.like_key() == spec().like_key()
    other_model = spec(endpoints={"agent": Endpoint(model="other").result_settings()})
    assert other_model.like_key() != spec().like_key()
    assert other_model.differences(spec()) == ["endpoints.agent"]


def test_params_are_the_spec_flat_with_long_values_hashed():
    many = {"train": [f"user-{i:04d}" for i in range(100)]}
    params = spec(users=many).params()
    assert params["spec.kind"] == "evolve" and params["spec.evaluation.periods"] == "2"
    assert params["spec.seed"] == "0" and params["spec.policy.type"] == "awi"
    # an unset value is no param (MLflow shows no "null"); spec.json keeps it
    assert "spec.policy.name" not in params and spec().identity()["policy"]["name"] is None
    assert not [k for k, v in params.items() if v in ("null", "None")]
    assert (
        params["spec.users.train"].startswith("sha256:") and len(params["spec.users.train"]) == 71
    )
    assert json.loads(spec().params()["spec.users.train"]) == ["u1", "u2"]
    assert max(len(v) for v in params.values()) <= LONG_PARAM
    assert params["spec.key"] == spec(users=many).key()
    tags = spec().tags()
    assert tags["memloop.run_key"] == spec().key() and tags["memloop.like"] == spec().like_key()
    assert tags["memloop.feedback_mode"] == "complete" and tags["memloop.objective"] == (
        "state_accuracy"
    )


def test_spec_json_reads_back_and_a_foreign_one_is_refused(tmp_path):
    folder = tmp_path / "run"
    with open_run_folder(folder, spec(), "test"):
        pass
    assert read_spec(folder) == spec()
    assert json.loads((folder / "spec.json").read_text())["key"] == spec().key()
    with pytest.raises(UserError, match=r"changed: mode, optimizer.evolver"):
        with open_run_folder(folder, spec(mode="none", optimizer={"evolver": "none"}), "test"):
            pass
    (folder / "spec.json").write_text('{"components": {}}')
    with pytest.raises(UserError, match="holds files memloop did not write"):
        read_spec(folder)


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("name", ["../../outside", "/tmp/absolute", "a/b", ".."])
def test_names_never_build_paths(tmp_path, monkeypatch, name):
    """An experiment, a policy's name and a study are names: their folders stay under runs/."""
    from memloop.optimize.config import EvolveConfig, TuneConfig, load_config
    from memloop.optimize.context import RunContext
    from memloop.optimize.searches.episode import EpisodeSearch
    from memloop.testing import fake_roles, scripted_builder

    monkeypatch.chdir(tmp_path)
    policy = write(tmp_path / "awi.yaml", {"type": "awi", "name": name})
    env = {"procedural": {"users": 3, "periods": 1, "questions": 1, "seed": 1}}
    evolve = load_config(
        write(
            tmp_path / "e.yaml",
            {
                "experiment": name,
                "environment": {**env, "train_users": 1, "val_users": 1},
                "policy": str(policy),
            },
        ),
        EvolveConfig,
    )
    runs = (tmp_path / "runs").resolve()
    assert evolve.output_root.resolve().parent == runs / "evolve"
    ctx = RunContext(
        evolve,
        "complete",
        "reflective",
        EpisodeSearch(),
        clients=fake_roles("http://127.0.0.1:9/v1", None),
        builder=scripted_builder(),
        progress=False,
    )
    assert ctx.run_dir.resolve().parent == evolve.output_root.resolve()
    tune = load_config(
        write(
            tmp_path / "t.yaml",
            {"study": name, "environment": {**env, "val_users": 1}, "policy": str(policy)},
        ),
        TuneConfig,
    )
    assert tune.output_root.resolve().parent == runs / "tune"


def test_a_data_files_description_holds_no_machine_path(tmp_path):
    """The run identity of a data-file environment is its name and contents: the same file in
    another folder (a moved project) is the same environment."""
    from memloop.core.files import file_sha256
    from memloop.environment.datafile import save_items
    from memloop.environment.procedural import generate_procedural
    from memloop.optimize.config import EnvSpec
    from memloop.runs.inputs import load_environment

    items = generate_procedural(users=2, periods=1, questions=1, seed=3)
    descriptions = []
    for folder in ("a", "b/c"):
        (tmp_path / folder).mkdir(parents=True)
        save_items(items, tmp_path / folder / "env.json")
        _, desc = load_environment(EnvSpec(path=str(tmp_path / folder / "env.json")))
        descriptions.append(desc)
    sha = file_sha256(tmp_path / "a" / "env.json")
    assert descriptions == [{"path": "env.json", "sha256": sha}] * 2
