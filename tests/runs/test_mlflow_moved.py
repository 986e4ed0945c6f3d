"""A project folder moved with its `mlruns/` store: MLflow keeps the old absolute artifact paths,
memloop reads and writes each run's artifacts at the same place under the moved store."""

from __future__ import annotations

import shutil

import yaml

from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder

CONFIG = {
    "experiment": "moved",
    "environment": {
        "procedural": {"users": 4, "periods": 2, "questions": 2, "seed": 1},
        "train_users": 2,
        "val_users": 1,
        "test_users": 1,
    },
    "policy": "awi.yaml",
    "feedback_modes": ["complete"],
    "evolvers": ["reflective"],
    "cycles": 1,
    "out_dir": "runs",
}


def evolve(folder, fake, cycles: int):
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve

    uri = f"sqlite:///{folder}/mlruns/mlflow.db"
    (folder / "exp.yaml").write_text(
        yaml.safe_dump({**CONFIG, "cycles": cycles, "tracking_uri": uri})
    )
    config = load_config(folder / "exp.yaml", EvolveConfig)
    roles = fake_roles(fake.base_url, folder / "c.sqlite")
    (outcome,) = run_evolve(config, progress=False, clients=roles, builder=scripted_builder())
    return outcome


def test_compare_export_and_a_resumed_evolve_work_after_the_store_moved(
    tmp_path, monkeypatch, capsys, traces_on
):
    from memloop.experiments.cli import main
    from memloop.runs import tracker

    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    (old / "awi.yaml").write_text("type: awi\n")
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        monkeypatch.chdir(old)
        first = evolve(old, fake, cycles=1)
        uri = f"sqlite:///{new}/mlruns/mlflow.db"
        recorded = tracker.client(f"sqlite:///{old}/mlruns/mlflow.db").get_run(first.run_id)
        recorded = recorded.info.artifact_uri
        assert recorded.startswith(f"file://{old}/mlruns/artifacts/moved/")
        shutil.move(old, new)
        monkeypatch.chdir(new)
        capsys.readouterr()
        assert main(["compare", "--experiment", "moved", "--tracking-uri", uri]) == 0
        table = capsys.readouterr().out
        assert "complete" in table and "reflective" in table
        assert main(["export", first.run_id, "--tracking-uri", uri, "--out", "prompt.txt"]) == 0
        assert "=== writer ===" in (new / "prompt.txt").read_text()
        # one more cycle: the resumed run logs its new cycle beside the moved ones
        second = evolve(new, fake, cycles=2)
    assert second.run_id == first.run_id and len(second.cycles) == 2
    mlc = tracker.client(uri, create=False)
    logged = {a.path for a in mlc.list_artifacts(first.run_id, "cycle")}
    assert logged == {"cycle/cycle_00.json", "cycle/cycle_01.json"}
    run_folder = new / "mlruns" / "artifacts" / "moved" / first.run_id / "artifacts"
    assert (run_folder / "cycle" / "cycle_01.json").is_file()
    assert not old.exists()  # nothing was written at the recorded, old place
    # the cycle logged before the move has its traces; the moved store logs none (MLflow's trace
    # export would write at the old place)
    exp = mlc.get_experiment_by_name("moved").experiment_id
    cycles = {t.info.tags["memloop.cycle"] for t in mlc.search_traces(locations=[exp])}
    assert cycles == {"0"}
