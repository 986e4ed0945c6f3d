"""Tables as text within 100 columns, CSV or Markdown; one set of column names; the objective's
column first and named as such (compare, tune, eval, quickstart)."""

from __future__ import annotations

import csv
import io
import re

import pytest

from memloop.core.tables import format_table
from memloop.feedback.metrics import metric_column, objective_first
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.commands import small_evolve

HEADERS = ["name", "score", "n"]
ROWS = [["a", 0.5, 3], ["b, c", None, 12]]


def longest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_csv_is_the_csv_module_s_with_the_text_table_s_numbers():
    assert format_table(HEADERS, ROWS, fmt="csv") == 'name,score,n\na,0.500,3\n"b, c",n/a,12'
    parsed = list(csv.reader(io.StringIO(format_table(HEADERS, ROWS, fmt="csv"))))
    assert parsed == [HEADERS, ["a", "0.500", "3"], ["b, c", "n/a", "12"]]


def test_markdown_has_a_header_separator_row_aligned_like_the_text_table():
    assert format_table(HEADERS, ROWS, fmt="md") == (
        "| name | score |   n |\n"
        "| ---- | ----: | --: |\n"
        "| a    | 0.500 |   3 |\n"
        "| b, c |   n/a |  12 |"
    )
    # a pipe in a cell is escaped; the text table is as before
    assert "a\\|b" in format_table(["x"], [["a|b"]], fmt="md")
    assert format_table(HEADERS, ROWS) == "name  score   n\na     0.500   3\nb, c    n/a  12"
    with pytest.raises(ValueError, match="fmt must be one of table, csv, md"):
        format_table(HEADERS, ROWS, fmt="html")


def test_a_wide_text_table_is_split_into_parts_repeating_the_row_names():
    headers = ["condition", "repeat", *(f"metric_{i}" for i in range(14))]
    rows = [["complete/reflective", "0", *range(14)], ["none/none", "1", *range(14)]]
    text = format_table(headers, rows, align="ll" + "r" * 14)
    parts = text.split("\n\n")
    assert len(parts) > 1 and longest(text) <= 100
    for part in parts:  # each part names its rows by the leading left-aligned columns
        assert [line.split()[:2] for line in part.splitlines()] == [
            ["condition", "repeat"],
            ["complete/reflective", "0"],
            ["none/none", "1"],
        ]
    shown = [h for part in parts for h in part.splitlines()[0].split()[2:]]
    assert shown == headers[2:]
    # no split when asked, nor in CSV and Markdown
    assert "\n\n" not in format_table(headers, rows, width=None)
    assert len(format_table(headers, rows, fmt="csv").splitlines()) == 3
    assert len(format_table(headers, rows, fmt="md").splitlines()) == 4


def test_one_name_per_quantity_and_the_objective_first():
    assert [metric_column(m) for m in ("memory_score", "state_accuracy", "factual_recall")] == [
        "mem_score",
        "state_acc",
        "recall",
    ]
    assert metric_column("state_accuracy", objective=True) == "state_acc (objective)"
    metrics = ("memory_score", "state_accuracy", "memory_gain")
    assert objective_first(metrics, "state_accuracy") == [
        "state_accuracy",
        "memory_score",
        "memory_gain",
    ]
    assert objective_first(metrics, None) == list(metrics)


# -- compare on a fake run, ranked on state accuracy ------------------------------------------


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """A baseline and an evolved run ranked on state accuracy, on the fake model; its config."""
    from memloop.optimize.evolve import run_evolve

    tmp = tmp_path_factory.mktemp("tables")
    config = small_evolve(
        tmp,
        "tables",
        (2, 2, 2),
        feedback_modes=["none", "question_only"],
        objective="state_accuracy",
        cycles=2,
    )
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        roles = fake_roles(fake.base_url, tmp / "c.sqlite")
        run_evolve(config, progress=False, clients=roles, builder=scripted_builder())
    return config


MARGINAL = ["condition", "selected", "n", "state_acc (objective)", "mem_score", "mem_gain"]
MARGINAL += ["recall", "tokens"]


def test_compare_fits_100_columns_with_the_objective_first(experiment):
    from memloop.experiments.commands.quickstart_cmd import per_cycle_table
    from memloop.results.compare import compare

    result = compare(experiment.tracking_uri, "tables")
    table = result["table"]
    assert longest(table) <= 100, table
    lines = table.splitlines()
    header = lines[lines.index(next(x for x in lines if x.startswith("marginal"))) + 1]
    assert re.split(r"\s{2,}", header) == MARGINAL
    # the paired rows: the objective's first, each named by its column name
    paired = table.split("paired with the baseline none/none")[1].splitlines()[2:]
    metrics = [line.split()[1] for line in paired if line.startswith("question_only/reflective")]
    assert metrics in (["state_acc", "mem_score", "mem_gain", "recall"], ["all"])
    assert "(state_acc):" in table  # within each run: on the objective
    # the per-cycle table of the quickstart names the objective first
    per_cycle = per_cycle_table(result["rows"])
    assert per_cycle.startswith("state_acc (objective) / mem_score / recall per cycle on the test")
    assert longest(per_cycle) <= 100


def test_compare_writes_csv_and_markdown(experiment, capsys):
    from memloop.experiments.cli import main

    argv = ["compare", "--experiment", "tables", "--tracking-uri", experiment.tracking_uri]
    assert main([*argv, "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    # one table (one header), a `table` column naming each row's table: pandas reads it whole
    import pandas

    frame = pandas.read_csv(io.StringIO(out), dtype=str, keep_default_na=False)
    assert list(frame.columns[: 1 + len(MARGINAL)]) == ["table", *MARGINAL]
    assert list(dict.fromkeys(frame["table"])) == [
        "marginal",
        "within each run",
        "paired with the baseline none/none on the same users",
    ]
    marginal = frame[frame["table"] == "marginal"]
    assert len(marginal) == 2  # the two runs
    within = frame[frame["table"] == "within each run"]
    paired = ["condition", "cycles", "n", "mean diff", "95% CI", "p (sign-flip)", "up/tied/down"]
    assert set(paired) <= set(frame.columns) and len(within) == 2
    assert (within["cycles"] != "").all() and (marginal["cycles"] == "").all()
    rows = list(csv.reader(io.StringIO(out)))
    assert all(len(r) == len(rows[0]) for r in rows)
    assert "run " in err and "prompts of cycle 0" in err  # the diff: not in the CSV
    assert main([*argv, "--format", "md"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("| condition "))
    assert [c.strip() for c in lines[at].strip("|").split("|")] == MARGINAL
    rule = [c.strip() for c in lines[at + 1].strip("|").split("|")]
    assert rule[0].startswith("---") and all(c.endswith("-:") for c in rule[1:])
    assert "```diff" in out


# -- tune and eval ---------------------------------------------------------------------------


def test_tune_names_its_objective_and_prints_n_a_for_undefined_numbers():
    from memloop.feedback.objective import Objective
    from memloop.optimize.tune import TuneOutcome, format_outcome

    trial = {
        "number": 0,
        "update_freq": 2,
        "short_term_len": 4,
        "top_k": 30,
        "memory_score": None,
        "objective": 0.5,
        "tokens_per_user": 1234.4,
        "overall": 0.25,
        "factual_recall": None,
    }
    test = {
        "trial": 0,
        "update_freq": 2,
        "short_term_len": 4,
        "top_k": 30,
        "memory_score": None,
        "state_accuracy": 0.75,
        "memory_gain": 0.0,
        "overall": 0.5,
        "factual_recall": None,
        "users": 2,
    }
    outcome = TuneOutcome(
        study_name="s",
        storage="sqlite:///optuna.db",
        trials=[trial],
        best=[trial],
        added=1,
        test=test,
        objective=Objective.STATE_ACCURACY,
        params=["update_freq", "short_term_len", "top_k"],
    )
    text = format_outcome(outcome)
    assert "None" not in text and "mem_score (objective)" not in text
    header = next(line for line in text.splitlines() if line.startswith("trial"))
    assert header.split("  ")[0:1] == ["trial"] and "state_acc (objective)" in header
    assert "val mem_score" not in text and longest(text) <= 100
    assert "0*" in text and "n/a" in text
    assert "test users: state_acc 0.750, mem_score n/a, overall 0.500, recall n/a" in text
    rows = list(csv.reader(io.StringIO(format_outcome(outcome, "csv"))))
    assert rows == [
        ["trial", "update_freq", "short_term_len", "top_k", "state_acc (objective)"]
        + ["overall", "recall", "tokens/user"],
        ["0*", "2", "4", "30", "0.500", "0.250", "n/a", "1234"],
    ]
    assert "| trial |" in format_outcome(outcome, "md")


def test_eval_tables_fit_100_columns_and_share_the_column_names():
    from memloop.feedback.report import format_metrics

    diagnosis = {"format": 0.0, "write": 0.25, "read": 0.25, "utilization": 0.0}
    period = {
        "memory_score": None,
        "state_accuracy": 0.5,
        "overall": 0.5,
        "no_memory": 0.25,
        "random": 0.25,
        "upper_bound": 1.0,
        "state_chance": 0.5,
        "factual_recall": 0.75,
        "diagnosis": diagnosis,
    }
    metrics = {
        **period,
        "memory_gain": 0.25,
        "per_period": [{"period": 0, **period}, {"period": 1, **period}],
        "usage": {"agent": 100, "probe": 50},
        "usage_cached": {"agent": 10},
    }
    text = format_metrics(metrics, first="state_accuracy")
    assert longest(text) <= 100
    assert text.splitlines()[0].split() == [
        "period",
        "state_acc",
        "mem_score",
        "overall",
        "no_mem",
        "random",
        "upper_bd",
        "chance",
        "recall",
    ]
    assert "tokens: 150 (10 of 150 served from the response cache): agent 100, probe 50" in text
    rows = list(csv.reader(io.StringIO(format_metrics(metrics, "csv", first="memory_score"))))
    assert rows[0] == [
        "period",
        "mem_score",
        "state_acc",
        "overall",
        "no_mem",
        "random",
        "upper_bd",
        "chance",
        "recall",
        "format",
        "write",
        "read",
        "util",
    ]
    assert [r[0] for r in rows[1:]] == ["0", "1", "all"] and rows[1][1] == "n/a"
