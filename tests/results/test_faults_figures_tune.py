"""Faults in the figures memloop saves and in `memloop tune` reruns, on the fake endpoint and real
sqlite stores (MLflow, Optuna).

- A kill while evolve writes its figure leaves no empty or cut file (every figure is written to a
  temporary file and renamed into place), and a rerun draws whatever format is missing, empty or
  cut, and logs to the MLflow run whatever `figures/` file it lacks.
- A rerun of a finished grid starts no trial (Optuna's grid sampler drew a setting again).
- A trial run again after a Ctrl-C has its MLflow run named after its own number.
- A copied tune YAML (another file name, so another default experiment) continues the study; a
  changed grid is refused naming the grid alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from memloop.optimize.config import TuneConfig, load_config
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.commands import small_evolve
from memloop.testing.policies import ScriptedPolicy

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"


# -- figures -----------------------------------------------------------------------------------


def evolve(config: Any, roles: Any) -> list[Any]:
    from memloop.optimize.evolve import run_evolve

    return run_evolve(config, progress=False, clients=roles, builder=scripted_builder())


def assert_whole_figures(folder: Path) -> None:
    png = (folder / "cycles.png").read_bytes()
    assert png[:8] == PNG_MAGIC and png.endswith(PNG_END) and len(png) > 1000
    svg = (folder / "cycles.svg").read_text(encoding="utf-8")
    assert svg.startswith("<?xml") and svg.rstrip().endswith("</svg>")
    assert "<text" in svg and "figure-" in svg  # text stays text: the title is in the file


def logged_figures(mlc: Any, run_id: str) -> dict[str, int]:
    return {a.path: a.file_size for a in mlc.list_artifacts(run_id, "figures")}


def artifact_dir(mlc: Any, run_id: str) -> Path:
    from mlflow.utils.file_utils import local_file_uri_to_path

    return Path(local_file_uri_to_path(mlc.get_run(run_id).info.artifact_uri))


def assert_logged_whole(mlc: Any, outcome: Any) -> None:
    folder = outcome.run_dir / "figures"
    assert logged_figures(mlc, outcome.run_id) == {
        f"figures/cycles{ext}": (folder / f"cycles{ext}").stat().st_size for ext in (".png", ".svg")
    }


def test_a_kill_while_the_figure_is_written_leaves_no_cut_file_and_a_rerun_completes_it(
    tmp_path, monkeypatch
):
    """The kill arrives inside matplotlib's write of cycles.png (its first bytes are out): the
    run folder holds no figure file at all, and the rerun draws both formats and logs them."""
    from matplotlib.figure import Figure

    from memloop.runs import tracker

    config = small_evolve(tmp_path, "figure-kill", (1, 1, 1), periods=1, cycles=1)

    def killed_while_writing(self, fname, *args, **kwargs):
        if hasattr(fname, "write"):
            fname.write(PNG_MAGIC)
        else:
            Path(fname).write_bytes(PNG_MAGIC)
        raise KeyboardInterrupt

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:  # one port: one run identity
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
        with monkeypatch.context() as patch:
            patch.setattr(Figure, "savefig", killed_while_writing)
            with pytest.raises(KeyboardInterrupt):
                evolve(config, roles)
        (figures,) = list(config.output_root.rglob("figures"))
        assert list(figures.iterdir()) == []  # no cut cycles.png, no temporary file
        (outcome,) = evolve(config, roles)
    assert outcome.run_dir / "figures" == figures
    assert_whole_figures(figures)
    mlc = tracker.client(config.tracking_uri, create=False)
    assert_logged_whole(mlc, outcome)


def empty_png_no_svg_no_artifacts(folder: Path, logged: Path) -> None:
    """What a kill of the older memloop left: cycles.png empty (and newer than every cycle
    record), no cycles.svg, no figures/ in MLflow."""
    (folder / "cycles.png").write_bytes(b"")
    (folder / "cycles.svg").unlink()
    shutil.rmtree(logged)


def cut_svg(folder: Path, logged: Path) -> None:
    svg = folder / "cycles.svg"
    svg.write_bytes(svg.read_bytes()[: svg.stat().st_size // 2])


def no_artifacts(folder: Path, logged: Path) -> None:
    shutil.rmtree(logged)


def cut_artifact(folder: Path, logged: Path) -> None:
    png = logged / "cycles.png"
    png.write_bytes(png.read_bytes()[:100])


@pytest.mark.parametrize(
    ("damage", "redrawn"),
    [
        (empty_png_no_svg_no_artifacts, True),
        (cut_svg, True),
        (no_artifacts, False),
        (cut_artifact, False),
    ],
)
def test_a_rerun_draws_a_missing_empty_or_cut_figure_and_logs_what_mlflow_lacks(
    tmp_path, damage, redrawn
):
    from memloop.runs import tracker

    config = small_evolve(tmp_path, "figure-rerun", (1, 1, 1), periods=1, cycles=1)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
        (first,) = evolve(config, roles)
        mlc = tracker.client(config.tracking_uri, create=False)
        folder = first.run_dir / "figures"
        assert_whole_figures(folder)
        assert_logged_whole(mlc, first)
        whole = {p.name: p.read_bytes() for p in folder.iterdir()}
        damage(folder, artifact_dir(mlc, first.run_id) / "figures")
        drawn = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
        (again,) = evolve(config, roles)
    assert again.run_id == first.run_id and again.run_dir == first.run_dir
    assert_whole_figures(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == whole  # the same figure
    assert_logged_whole(mlc, again)
    still = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert (still != drawn) is redrawn  # whole files are not drawn again, only logged


def test_tunes_plots_are_written_atomically(tmp_path, monkeypatch):
    """Optuna's plots of a study go through the one atomic helper: a kill in the write of the
    second plot leaves the first whole and no file of the second."""
    from matplotlib.figure import Figure

    from memloop.optimize import tune as tune_module

    real = Figure.savefig
    calls = []

    def killed_on_second(self, fname, *args, **kwargs):
        calls.append(fname)
        if len(calls) == 2:
            if hasattr(fname, "write"):
                fname.write(PNG_MAGIC)
            else:
                Path(fname).write_bytes(PNG_MAGIC)
            raise KeyboardInterrupt
        return real(self, fname, *args, **kwargs)

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, outcome = tune(tmp_path, fake, trials=1)
    study = optuna.load_study(study_name="faults-study", storage=config.storage)
    folder = tmp_path / "plots"
    monkeypatch.setattr(Figure, "savefig", killed_on_second)
    with pytest.raises(KeyboardInterrupt):
        tune_module.study_plots(study, outcome, folder)
    assert [p.name for p in folder.iterdir()] == ["history.png"]
    png = (folder / "history.png").read_bytes()
    assert png[:8] == PNG_MAGIC and png.endswith(PNG_END)


# -- tune --------------------------------------------------------------------------------------


def write_tune(root: Path, name: str = "tune.yaml", **over: Any) -> Path:
    """A tune YAML in `root` named `name`: study `faults-study`, no `experiment:` key (the
    experiment is the file's name), AWE over short_term_len [0, 4] (2 settings)."""
    root.mkdir(parents=True, exist_ok=True)
    policy = root / "awe.yaml"
    policy.write_text("type: awe\n")
    data = {
        "study": "faults-study",
        "environment": {
            "procedural": {"users": 3, "periods": 1, "questions": 2, "seed": 1},
            "val_users": 2,
            "test_users": 1,
        },
        "policy": str(policy),
        "trials": 5,
        "search_space": {"update_freq": [2], "short_term_len": [0, 4], "top_k": [30]},
        "heartbeat_s": 5,
        "parallel_users": 1,
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "storage": f"sqlite:///{root}/mlruns/optuna.db",
        "out_dir": str(root / "tune"),
        **over,
    }
    path = root / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def tune(
    root: Path, fake: FakeOpenAIServer, *, name: str = "tune.yaml", builder: Any = None, **over
):
    from memloop.optimize.tune import run_tune

    config = load_config(write_tune(root, name, **over), TuneConfig)
    roles = fake_roles(fake.base_url, root / "c.sqlite")
    return config, run_tune(
        config, progress=False, clients=roles, builder=builder or scripted_builder()
    )


def mlflow_trials(config: TuneConfig) -> list[Any]:
    from memloop.runs import tracker

    mlc = tracker.client(config.tracking_uri, create=False)
    exp = mlc.get_experiment_by_name(config.experiment_name)
    runs = mlc.search_runs([exp.experiment_id])
    return [r for r in runs if r.data.tags["memloop.kind"] == "tune_trial"]


def test_a_finished_grid_rerun_adds_no_trial(tmp_path):
    from memloop.optimize.tune import format_outcome

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, first = tune(tmp_path, fake)
        sent = len(fake.requests)
        reruns = [tune(tmp_path, fake)[1] for _ in range(2)]
    study = optuna.load_study(study_name="faults-study", storage=config.storage)
    assert first.added == 2 and first.exhausted
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert len(mlflow_trials(config)) == 2
    for rerun in reruns:
        assert rerun.added == 0 and rerun.exhausted
        assert [r["number"] for r in rerun.trials] == [0, 1]
        assert rerun.best == first.best and rerun.test == first.test
        text = format_outcome(rerun)
        assert "2 finished trials, 0 added now" in text
        assert "the grid is exhausted: every setting has a complete trial" in text
    assert len(fake.requests) == sent  # nothing evaluated again (the test run is cached)


def stopping_builder():
    """scripted_builder whose second setting raises KeyboardInterrupt (Ctrl-C) in its first
    conversation, once."""
    seen: list[tuple] = []

    def build(config, client, workdir, prompts=None):
        key = (config.update_freq, config.short_term_len, config.top_k)
        if key not in seen:
            seen.append(key)
            if len(seen) == 2:
                policy = ScriptedPolicy()

                def ctrl_c(message):
                    raise KeyboardInterrupt

                policy.respond = ctrl_c  # type: ignore[method-assign]
                return policy
        return ScriptedPolicy()

    return build


def test_a_trial_rerun_after_ctrl_c_has_its_mlflow_run_named_after_its_number(tmp_path):
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        with pytest.raises(KeyboardInterrupt):
            tune(tmp_path, fake, builder=stopping_builder())
        config, outcome = tune(tmp_path, fake)
    study = optuna.load_study(study_name="faults-study", storage=config.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert study.trials[2].user_attrs["memloop.rerun_of"] == 1
    assert study.trials[2].params == study.trials[1].params
    assert [r["number"] for r in outcome.trials] == [0, 2] and outcome.rerun == 1
    runs = {r.data.tags["memloop.trial"]: r for r in mlflow_trials(config)}
    assert sorted(runs) == ["0", "2"]  # the stopped trial's run is the rerun's, renamed
    for row in outcome.trials:
        run = runs[str(row["number"])]
        folder = f"awe-{row['update_freq']}-{row['short_term_len']}-{row['top_k']}"
        assert run.info.run_name == f"trial-{row['number']}-{folder}"
        assert run.data.tags["mlflow.runName"] == run.info.run_name
        assert run.info.status == "FINISHED"
    assert runs["2"].data.tags["memloop.rerun_of"] == "1"
    assert "memloop.rerun_of" not in runs["0"].data.tags


def test_a_copied_yaml_continues_the_study_and_a_changed_grid_names_only_the_grid(tmp_path):
    from memloop.core.errors import UserError

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, first = tune(tmp_path, fake, trials=1)
        copy, second = tune(tmp_path, fake, name="tune-copy.yaml", trials=1)
        sent = len(fake.requests)
        with pytest.raises(UserError) as caught:
            tune(tmp_path, fake, name="tune-other.yaml", trials=1, search_space={"top_k": [10]})
        assert len(fake.requests) == sent
    assert (config.experiment_name, copy.experiment_name) == ("tune", "tune-copy")
    assert first.added == 1 and second.added == 1 and second.exhausted
    study = optuna.load_study(study_name="faults-study", storage=config.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == 2
    assert str(caught.value) == (
        f"{tmp_path / 'tune-other.yaml'}: study 'faults-study' in {config.storage} was made "
        "with other settings (changed: optimizer.space); set `study:` to a new name"
    )
