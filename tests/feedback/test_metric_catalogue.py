"""feedback/metrics.py: one catalogue of metrics that every reader takes its names from; a metric
added as one row (and its computation) shows in MLflow, compare's paired table and the figure."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

import memloop
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.feedback import metrics, report
from memloop.feedback.metrics import Metric, metric_column, names
from memloop.runs import tracker
from memloop.testing import FakeOpenAIServer, writing_reply
from memloop.testing.commands import eval_argv

POLICIES = Path(memloop.__file__).parent / "experiments" / "policies"


def test_the_readers_lists_are_the_catalogues_rows():
    assert metrics.cycle_metrics() == (
        "memory_score",
        "state_accuracy",
        "state_prob",
        "memory_gain",
        "overall",
        "no_memory",
        "factual_recall",
        "format",
        "write",
        "read",
        "utilization",
        "memory_score_undefined_periods",
    )
    assert metrics.paired_metrics(probabilities=False) == (
        "memory_score",
        "state_accuracy",
        "memory_gain",
        "factual_recall",
    )
    assert metrics.paired_metrics() == (
        "memory_score",
        "state_accuracy",
        "state_prob",
        "memory_gain",
        "factual_recall",
    )
    assert metrics.trial_metrics() == (
        "memory_score",
        "state_accuracy",
        "memory_gain",
        "overall",
        "factual_recall",
    )
    assert metrics.headline_metrics() == ("memory_score", "state_accuracy", "factual_recall")
    assert names(higher_is_better=False) == (
        "format",
        "write",
        "read",
        "utilization",
        "memory_score_undefined_periods",
    )
    assert [metric_column(m) for m in ("memory_score", "utilization", "state_chance")] == [
        "mem_score",
        "util",
        "chance",
    ]
    assert metric_column("unknown_thing", objective=True) == "unknown_thing (objective)"
    with pytest.raises(TypeError, match="no field 'pairedd'"):
        names(pairedd=True)
    with pytest.raises(KeyError, match="no metric 'nope'"):
        metrics.metric("nope")


WORDS = Metric("answer_words", "words", "words per answer (test metric)", paired=True, plotted=True)


def words_of(per_user: dict) -> float:
    """The test metric's per-user definition: ten times the user's overall accuracy."""
    return 10 * per_user["overall"] + 1


@pytest.fixture
def a_new_metric(monkeypatch):
    """`answer_words` added the documented way: its computation in the report, one row."""
    monkeypatch.setattr(metrics, "CATALOGUE", (*metrics.CATALOGUE, WORDS))
    build = report.build_metrics

    def with_words(*args, **kwargs):
        values, notes = build(*args, **kwargs)
        for row in values["per_user"].values():
            row["answer_words"] = words_of(row)
        values["answer_words"] = statistics.fmean(
            r["answer_words"] for r in values["per_user"].values()
        )
        return values, notes

    monkeypatch.setattr(report, "build_metrics", with_words)


def eval_args(tmp_path: Path, url: str, policy: str, out: str, uri: str) -> list[str]:
    env = tmp_path / "env.json"
    if not env.exists():
        save_items(generate_procedural(users=3, periods=2, questions=2, seed=3), env)
    endpoint = tmp_path / "fake.yaml"
    endpoint.write_text(f"model: fake\nbase_url: {url}\n")
    argv = eval_argv(env, POLICIES / policy, endpoint, tmp_path / "c.db", tmp_path / out)
    return [*argv, "--tracking-uri", uri, "--experiment", "evals", "--no-progress"]


def test_a_metric_added_as_one_row_shows_in_mlflow_compare_and_the_figure(
    tmp_path, a_new_metric, capsys
):
    from memloop.results.compare import run_histories
    from memloop.results.plots import cycles_figure
    from memloop.results.rows import experiment_rows
    from memloop.runs.cycles import CycleRecord

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    with FakeOpenAIServer(reply=writing_reply) as fake:
        assert main(eval_args(tmp_path, fake.base_url, "awi.yaml", "a", uri)) == 0
        first = capsys.readouterr().out.split("MLflow: run ")[1].split()[0]
        assert main(eval_args(tmp_path, fake.base_url, "native.yaml", "n", uri)) == 0
    capsys.readouterr()
    mlc = tracker.client(uri, create=False)
    exp = mlc.get_experiment_by_name("evals").experiment_id
    per_user = {}
    for run in mlc.search_runs([exp]):
        record = CycleRecord.from_json(
            tracker.artifact_text(mlc, run.info.run_id, "cycle/cycle_00.json")
        )
        users = record.splits["test"].per_user
        per_user[run.info.run_name] = {u: words_of(v) for u, v in users.items()}
        # MLflow: the split's curve of the new metric, its value the mean over the users
        (point,) = mlc.get_metric_history(run.info.run_id, "test/answer_words")
        assert point.value == pytest.approx(statistics.fmean(per_user[run.info.run_name].values()))
    (second,) = set(per_user) - {first}
    assert len(per_user[first]) == 3
    # compare: the paired difference of the new metric under its column header
    compare = ["compare", "--experiment", "evals", "--tracking-uri", uri, "--baseline", first]
    assert main(compare) == 0
    out = capsys.readouterr().out
    users = sorted(per_user[first])
    diff = statistics.fmean(per_user[second][u] - per_user[first][u] for u in users)
    row = next(line for line in out.splitlines() if second in line and " words " in line)
    assert f"{diff:+.3f}" in row
    # the figure: a panel of the new metric, named by its title
    figure = cycles_figure(run_histories(experiment_rows(uri, "evals")), "")
    labels = [ax.get_ylabel() for ax in figure.axes]
    assert "words per answer (test metric)" in labels
