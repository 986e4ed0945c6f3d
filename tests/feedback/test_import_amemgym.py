"""`memloop import-amemgym`: a hand-made run in the published AMemGym output format.

tests/data/amemgym_run is `<output_dir>/<agent name>` of the published eval/overall.py and
eval/diagnosis.py (2 users, 3 periods, 2 questions); tests/data/amemgym_ub_run is the
`<output_dir>/<llm model>` of eval/upperbound.py (its items in the other order). The expected
numbers below are counted from FIXTURE, the fixture's design, not from the importer.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from memloop.core.errors import UserError, exit_on_user_error
from memloop.experiments.commands import import_cmd
from memloop.feedback.import_amemgym import import_run
from memloop.feedback.records import QuestionRecord
from memloop.testing.paths import TEST_DATA

DATA = TEST_DATA
RUN = DATA / "amemgym_run"
UB = DATA / "amemgym_ub_run"
A = "3f9a1c2e-0b7d-4e51-8a66-1d2c3b4a5f60"  # running volume, shift pattern, commute mode
B = "b7e2d4f1-9c3a-4b8e-a1d5-6f0e2c9b8a73"  # diet, sleep schedule, living situation


class Q(NamedTuple):
    right: int  # memloop: the pick parsed, was in range and is the gold option
    failure: str | None  # memloop's class of a wrong answer
    options: int  # answer options of the question
    ub: int  # the upper bound's pick for the gold state is the gold option
    state: int  # required variables (of 2) the state query got right
    published: float  # scores.accuracy in overall_results.json


# Every variable has 3 values. A: shift pattern changes in period 1, commute mode in period 2.
# B: diet changes in period 1, living situation in period 2.
FIXTURE = {
    (A, 0, 0): Q(1, None, 4, 1, 2, 1.0),
    (A, 0, 1): Q(1, None, 5, 1, 2, 1.0),
    # picked the period-0 option; the state query still says day shifts (set in period 1): write
    (A, 1, 0): Q(0, "write", 4, 0, 1, 0.0),
    # unparsed ("Option 2 sounds right"): the published random pick happened to be the gold one
    (A, 1, 1): Q(0, "format", 5, 1, 2, 1.0),
    (A, 2, 0): Q(1, None, 4, 0, 2, 1.0),
    # both variables recalled right, wrong option: utilization; the UB answer did not parse
    (A, 2, 1): Q(0, "utilization", 5, 0, 2, 0.0),
    (B, 0, 0): Q(1, None, 4, 1, 2, 1.0),
    # living situation wrong in the period it was set (period 0): write
    (B, 0, 1): Q(0, "write", 6, 1, 1, 0.0),
    (B, 1, 0): Q(1, None, 4, 1, 2, 1.0),
    # {"answer": 0}: the published code wrapped it to the last option (wrong); memloop: format
    (B, 1, 1): Q(0, "format", 6, 1, 2, 0.0),
    # diet recalled right in period 1 (its write period), wrong now: read
    (B, 2, 0): Q(0, "read", 4, 1, 1, 0.0),
    # right answer, but the state query did not parse: both variables wrong
    (B, 2, 1): Q(1, None, 6, 1, 0, 1.0),
}
CHANCE = 1 / 3


def expected(rows: list[Q]) -> dict[str, Any]:
    n = len(rows)
    rand = sum(1 / r.options for r in rows)
    accuracy = sum(r.state for r in rows) / (2 * n)
    return {
        "questions": n,
        "overall": sum(r.right for r in rows) / n,
        "published_overall": sum(r.published for r in rows) / n,
        "random": rand / n,
        "upper_bound": sum(r.ub for r in rows) / n,
        "memory_score": (sum(r.right for r in rows) - rand) / (sum(r.ub for r in rows) - rand),
        "state_accuracy": accuracy,
        "state_score": (accuracy - CHANCE) / (1 - CHANCE),
        "diagnosis": {
            f: sum(r.failure == f for r in rows) / n
            for f in ("format", "write", "read", "utilization")
        },
    }


def rows_where(pred) -> list[Q]:
    return [q for key, q in sorted(FIXTURE.items()) if pred(*key)]


def check_group(got: dict[str, Any], want: dict[str, Any], with_ub: bool = True) -> None:
    for key in ("questions", "overall", "published_overall", "state_accuracy", "state_score"):
        assert got[key] == pytest.approx(want[key]), key
    assert got["state_chance"] == pytest.approx(CHANCE)
    assert got["diagnosis"] == pytest.approx(want["diagnosis"])
    for key in ("random", "upper_bound", "memory_score"):
        assert got[key] == (pytest.approx(want[key]) if with_ub else None), key
    assert got["no_memory"] is None and got["memory_gain"] is None


def read_records(out: Path) -> dict[tuple[str, int, int], dict[str, Any]]:
    lines = (out / "records.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]
    return {(r["user_id"], r["period"], r["question_index"]): r for r in rows}


def test_the_table_matches_the_fixture_files():
    """FIXTURE's published accuracy, parse failures and option counts are those of the files."""
    for user in (A, B):
        overall = json.loads((RUN / user / "overall_results.json").read_text(encoding="utf-8"))
        for (u, p, q), row in FIXTURE.items():
            if u == user:
                assert overall[p][q]["scores"]["accuracy"] == row.published
    assert json.loads((RUN / A / "overall_results.json").read_text())[1][1]["json_error"] is True
    assert json.loads((RUN / B / "overall_results.json").read_text())[1][1]["response"] == 0
    items = json.loads((UB / "utilization_results.json").read_text(encoding="utf-8"))
    assert [[len(opts) for opts in item] for item in items] == [[4, 6], [4, 5]]  # B, then A


def test_metrics_with_the_upper_bound(tmp_path):
    out = tmp_path / "out"
    metrics = import_run(RUN, out, UB)
    assert json.loads((out / "metrics.json").read_text(encoding="utf-8")) == metrics
    assert (metrics["users"], metrics["periods"], metrics["scorer_version"]) == (2, 3, "3")
    everything = rows_where(lambda u, p, q: True)
    check_group(metrics, expected(everything))
    # counted by hand: 6 right of 12; random 3*(1/4+1/5) + 3*(1/4+1/6) = 2.6; 9 UB right
    assert metrics["overall"] == 0.5
    assert metrics["memory_score"] == pytest.approx((6 - 2.6) / (9 - 2.6))
    assert metrics["state_accuracy"] == pytest.approx(19 / 24)
    assert metrics["json_errors"] == 2  # the unparsed answer and the out-of-range one
    assert metrics["imported_from"]["published_json_errors"] == 1
    assert [r["period"] for r in metrics["per_period"]] == [0, 1, 2]
    for row in metrics["per_period"]:
        check_group(row, expected(rows_where(lambda u, p, q, k=row["period"]: p == k)))
    assert [r["overall"] for r in metrics["per_period"]] == [3 / 4, 1 / 4, 2 / 4]
    for user in (A, B):
        mine = expected(rows_where(lambda u, p, q, k=user: u == k))
        got = metrics["per_user"][user]
        assert got["overall"] == pytest.approx(mine["overall"])
        assert got["memory_score"] == pytest.approx(mine["memory_score"])
        assert got["state_accuracy"] == pytest.approx(mine["state_accuracy"])
        assert got["no_memory"] is None
    assert metrics["factual_recall"] is None
    assert metrics["usage"] == {}
    assert any("no-memory control" in n for n in metrics["imported_from"]["not_imported"])


def test_records_with_the_upper_bound(tmp_path):
    import_run(RUN, tmp_path, UB)
    records = read_records(tmp_path)
    assert sorted(records) == sorted(FIXTURE)
    for key, row in records.items():
        want = FIXTURE[key]
        assert row["correct"] == bool(want.right), key
        assert row["ub_correct"] == bool(want.ub), key
        assert len(row["choices"]) == want.options
        assert row["state_choices"] == dict.fromkeys(row["required_info"], 3)
        assert sum(
            row["state_answers"][v] == row["true_values"][v] for v in row["required_info"]
        ) == (want.state)
        assert row["nm_chosen_index"] is None and row["retrieved_memories"] == []
        record = QuestionRecord.model_validate(
            {k: v for k, v in row.items() if k not in ("correct", "ub_correct")}
        )
        assert record.correct == bool(want.right)
    unparsed = records[(A, 1, 1)]
    assert unparsed["chosen_index"] is None and "random option 2" in unparsed["json_error"]
    wrapped = records[(B, 1, 1)]
    assert wrapped["chosen_index"] is None and "option 6" in wrapped["json_error"]
    assert records[(A, 2, 1)]["ub_chosen_index"] is None and records[(A, 2, 1)]["ub_json_error"]
    assert records[(A, 2, 1)]["write_periods"] == {"work_shift_pattern": 1, "commute_mode": 2}
    assert records[(A, 2, 1)]["true_values"] == {
        "work_shift_pattern": "night_shifts",
        "commute_mode": "bike",
    }
    assert records[(A, 0, 0)]["choices"][0].startswith("Keep three easy evening runs")
    lost = records[(B, 2, 1)]
    assert set(lost["state_answers"].values()) == {None} and lost["state_json_error"]


def test_without_the_upper_bound_the_memory_score_is_left_out(tmp_path):
    metrics = import_run(RUN, tmp_path)
    check_group(metrics, expected(rows_where(lambda u, p, q: True)), with_ub=False)
    for row in metrics["per_period"]:
        check_group(
            row, expected(rows_where(lambda u, p, q, k=row["period"]: p == k)), with_ub=False
        )
        assert row["memory_score_cell_mean"] is None
    assert all(u["memory_score"] is None for u in metrics["per_user"].values())
    assert "warnings" not in metrics
    records = read_records(tmp_path)
    assert all(r["choices"] == [] and r["ub_chosen_index"] is None for r in records.values())
    assert all(r["ub_correct"] is None for r in records.values())
    assert any("utilization_results.json" in n for n in metrics["imported_from"]["not_imported"])


def test_without_the_diagnosis_only_the_format_share_is_known(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    for path in run.glob("*/diagnosis_*.json"):
        path.unlink()
    metrics = import_run(run, tmp_path / "out", UB)
    want = expected(rows_where(lambda u, p, q: True))
    assert metrics["overall"] == want["overall"]
    assert metrics["memory_score"] == pytest.approx(want["memory_score"])
    assert metrics["state_accuracy"] is None and metrics["state_score"] is None
    assert metrics["diagnosis"] == {
        "format": pytest.approx(2 / 12),
        "write": None,
        "read": None,
        "utilization": None,
    }
    assert metrics["imported_from"]["diagnosis"] is False
    records = read_records(tmp_path / "out")
    assert all(r["required_info"] == [] and r["state_answers"] == {} for r in records.values())


# ---------------------------------------------------------------- the command


def parser() -> argparse.ArgumentParser:
    from memloop.experiments.cli import Parser  # the command line's parsers (help, example)

    p = Parser(prog="memloop")
    import_cmd.register(p.add_subparsers(dest="group", required=True))
    return p


def run_command(argv: list[str]) -> tuple[int, str]:
    args = parser().parse_args(["import-amemgym", *argv])
    err = io.StringIO()
    return exit_on_user_error(lambda: args.func(args), stream=err), err.getvalue()


def test_the_command_writes_both_files(tmp_path, capsys):
    code, err = run_command([str(RUN), "--out", str(tmp_path / "o"), "--upper-bound", str(UB)])
    assert (code, err) == (0, "")
    printed = capsys.readouterr().out
    assert "mem_score" in printed and "0.531" in printed
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["metrics.json", "records.jsonl"]


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(change(data) or data), encoding="utf-8")


def _set(data, keys, value):
    target = data
    for k in keys[:-1]:
        target = target[k]
    target[keys[-1]] = value


BAD_INPUTS = {
    "missing overall": (
        lambda run, ub: (run / B / "overall_results.json").unlink(),
        f"{B}/overall_results.json: missing",
    ),
    "overall is an object": (
        lambda run, ub: (run / A / "overall_results.json").write_text('{"accuracy": []}'),
        f"{A}/overall_results.json: expected a non-empty list of periods",
    ),
    "not JSON": (
        lambda run, ub: (run / A / "overall_results.json").write_text("[[{"),
        f"{A}/overall_results.json: not valid JSON",
    ),
    "unfinished question": (
        lambda run, ub: _edit_json(
            run / A / "overall_results.json", lambda d: _set(d, [1, 0], None)
        ),
        f"{A}/overall_results.json: period 1 question 0: no result",
    ),
    "response not a number": (
        lambda run, ub: _edit_json(
            run / B / "overall_results.json", lambda d: _set(d, [2, 1, "response"], "2")
        ),
        f"{B}/overall_results.json: period 2 question 1: 'response' should be an integer",
    ),
    "missing key": (
        lambda run, ub: _edit_json(
            run / B / "overall_results.json", lambda d: d[0][0].pop("answer") and None
        ),
        f"{B}/overall_results.json: period 0 question 0: missing key 'answer'",
    ),
    "diagnosis of one user only": (
        lambda run, ub: (run / B / "diagnosis_results.json").unlink(),
        f"{B}/diagnosis_results.json: missing, while 1 of 2 users have one",
    ),
    "diagnosis of other data": (
        lambda run, ub: _edit_json(
            run / A / "diagnosis_results.json",
            lambda d: _set(d, [1, 0, "results", 1, "answer_state"], "rotating_shifts"),
        ),
        f"{A}/diagnosis_results.json: period 1 question 0: results[1]: 'answer_state'",
    ),
    "diagnosis results not a list": (
        lambda run, ub: _edit_json(
            run / A / "diagnosis_results.json", lambda d: _set(d, [0, 1, "results"], {})
        ),
        f"{A}/diagnosis_results.json: period 0 question 1: 'results' should be a list",
    ),
    "upper bound folder without results": (
        lambda run, ub: (ub / "utilization_results.json").unlink(),
        "amemgym_ub_run/utilization_results.json: missing",
    ),
    "upper bound of other users": (
        lambda run, ub: _edit_json(ub / "utilization_results.json", lambda d: d.pop(1) and None),
        f"amemgym_ub_run/utilization_results.json: no item has the questions and gold options "
        f"of user {A}",
    ),
    "upper bound option numbering": (
        lambda run, ub: _edit_json(
            ub / "utilization_results.json", lambda d: _set(d, [0, 1, 2, "answer"], 2)
        ),
        "utilization_results.json: item 0 question 1 option 2: 'answer' should be 3",
    ),
    "not a run": (
        lambda run, ub: [shutil.rmtree(run / u) for u in (A, B)],
        "amemgym_run: no user folders",
    ),
    "a stray folder": (
        lambda run, ub: (run / "notes").mkdir(),
        "amemgym_run/notes/overall_results.json: missing (every sub-folder of RUN_DIR",
    ),
}


@pytest.mark.parametrize("out_exists", [False, True])
@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, case, out_exists):
    run, ub = tmp_path / "amemgym_run", tmp_path / "amemgym_ub_run"
    shutil.copytree(RUN, run)
    shutil.copytree(UB, ub)
    breaks, message = BAD_INPUTS[case]
    breaks(run, ub)
    out = tmp_path / "out"
    if out_exists:
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    code, err = run_command([str(run), "--out", str(out), "--upper-bound", str(ub)])
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("memloop: error: "), err
    assert message in err
    if out_exists:
        assert [p.name for p in out.iterdir()] == ["keep.txt"]
    else:
        assert not out.exists()


def test_a_missing_run_folder_and_the_wrong_level_are_named(tmp_path):
    with pytest.raises(UserError, match="nope: not a folder"):
        import_run(tmp_path / "nope", tmp_path / "out")
    with pytest.raises(UserError, match="this is one user's folder"):
        import_run(RUN / A, tmp_path / "out")
    with pytest.raises(UserError, match="holds several agents' runs"):
        import_run(DATA, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="file: exists and is not a folder"):
        import_run(RUN, tmp_path / "file")


def test_tracking_uri_and_experiment_go_together(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    code, err = run_command([str(RUN), "--out", str(tmp_path / "out"), "--tracking-uri", uri])
    assert code == 2 and "--tracking-uri and --experiment go together" in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "mlruns").exists()


def test_logs_the_metrics_to_mlflow(tmp_path, capsys):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    argv = [str(RUN), "--out", str(tmp_path / "out"), "--upper-bound", str(UB)]
    argv += ["--tracking-uri", uri, "--experiment", "imported"]
    assert run_command(argv) == (0, "")
    assert run_command(argv) == (0, "")  # the same import again: the same run, nothing twice
    mlc = MlflowClient(tracking_uri=uri)
    exp = mlc.get_experiment_by_name("imported")
    runs = mlc.search_runs([exp.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    want = expected(rows_where(lambda u, p, q: True))
    got = run.data.metrics
    assert got["overall"] == pytest.approx(want["overall"])
    assert got["memory_score"] == pytest.approx(want["memory_score"])
    assert got["state_accuracy"] == pytest.approx(want["state_accuracy"])
    assert got["diagnosis_write"] == pytest.approx(want["diagnosis"]["write"])
    assert got["published_overall"] == pytest.approx(want["published_overall"])
    assert "no_memory" not in got
    history = sorted(
        mlc.get_metric_history(run.info.run_id, "period_overall"), key=lambda m: m.step
    )
    assert [(m.step, m.value) for m in history] == [(0, 0.75), (1, 0.25), (2, 0.5)]
    assert run.data.params["spec.environment.amemgym_run"] == str(RUN.resolve())
    assert run.data.tags["memloop.kind"] == "import"
    assert run.info.run_id in capsys.readouterr().out


def _list_first_variable_twice(run: Path, user: str, diagnosis_change=None) -> None:
    """Period 0, question 0 of `user` requires its first variable twice, as in 2 of 5 users of
    the published reference runs (an identical second entry, unless `diagnosis_change`)."""

    def overall(d):
        row = d[0][0]
        row["answer_state"].append(row["answer_state"][0])
        row["response_state"].append(row["response_state"][0])

    def diagnosis(d):
        results = d[0][0]["results"]
        results.append(dict(results[0]))
        if diagnosis_change:
            diagnosis_change(results[-1])

    _edit_json(run / user / "overall_results.json", overall)
    _edit_json(run / user / "diagnosis_results.json", diagnosis)


def test_a_variable_listed_twice_identically_is_one_state_query(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    _list_first_variable_twice(run, A)
    dup_metrics, plain_metrics = import_run(run, tmp_path / "dup"), import_run(RUN, tmp_path / "p")
    assert dup_metrics.pop("imported_from")["run_dir"] == str(run)
    plain_metrics.pop("imported_from")
    assert dup_metrics == plain_metrics
    dup, plain = read_records(tmp_path / "dup"), read_records(tmp_path / "p")
    assert dup == plain and len(dup[(A, 0, 0)]["required_info"]) == 2


def test_a_variable_listed_twice_with_different_entries_is_refused(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    _list_first_variable_twice(run, A, lambda entry: entry.update(response_state="other"))
    with pytest.raises(UserError, match="appears twice in 'results' with different entries"):
        import_run(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()
