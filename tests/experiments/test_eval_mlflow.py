"""`memloop eval` in MLflow: one run per eval in the layout compare reads, the source of its
`prompts_from:` as tags, traces of its users, and `compare` pairing two evals user by user."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memloop
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.feedback import evaluate
from memloop.runs import tracker
from memloop.runs.cycles import CycleRecord
from memloop.runs.spec import RunSpec
from memloop.testing import FakeOpenAIServer, writing_reply

POLICIES = Path(memloop.__file__).parent / "experiments" / "policies"


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAIServer(reply=writing_reply) as server:
        yield server


def eval_args(tmp_path: Path, fake, policy: Path, out: str, uri: str) -> list[str]:
    env = tmp_path / "env.json"
    if not env.exists():
        save_items(generate_procedural(users=3, periods=2, questions=2, seed=3), env)
    endpoint = tmp_path / "fake.yaml"
    endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
    return [
        "eval",
        "--env",
        str(env),
        "--endpoint",
        str(endpoint),
        "--cache",
        str(tmp_path / "c.db"),
        "--policy",
        str(policy),
        "--out",
        str(tmp_path / out),
        "--tracking-uri",
        uri,
        "--experiment",
        "evals",
        "--no-progress",
    ]


def test_an_eval_is_one_mlflow_run_with_its_record_prompts_numbers_and_traces(
    tmp_path, fake, capsys, traces_on, monkeypatch
):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    calibration_calls: list[dict] = []
    calibrate = evaluate.checker_calibration

    def calibrated(*args, **kwargs):  # the requests the checker's calibration makes
        before = len(fake.requests)
        result = calibrate(*args, **kwargs)
        calibration_calls.extend(fake.requests[before:])
        return result

    monkeypatch.setattr(evaluate, "checker_calibration", calibrated)
    sent = len(fake.requests)
    assert main(eval_args(tmp_path, fake, POLICIES / "awi.yaml", "a", uri)) == 0
    requests = fake.requests[sent:]  # every model call of the eval (a new cache: none cached)
    printed = capsys.readouterr().out
    mlc = tracker.client(uri, create=False)
    exp = mlc.get_experiment_by_name("evals").experiment_id
    (run,) = mlc.search_runs([exp])
    name = run.info.run_name
    assert name.startswith("eval-awi") and f"MLflow: run {name} in experiment 'evals'" in printed
    tags, params = run.data.tags, run.data.params
    assert tags["memloop.kind"] == "eval" and tags["memloop.feedback_mode"] == "eval"
    assert tags["mlflow.source.name"] == "memloop eval"
    spec = RunSpec.from_document(json.loads((tmp_path / "a" / "spec.json").read_text()))
    assert spec is not None and tags["memloop.run_key"] == spec.key()  # the eval folder's run
    # the record compare reads: the eval's users as the test split, the numbers of metrics.json
    record = CycleRecord.from_json(
        tracker.artifact_text(mlc, run.info.run_id, "cycle/cycle_00.json")
    )
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert list(record.splits) == ["test"]
    assert record.score("test", "state_accuracy") == pytest.approx(metrics["state_accuracy"])
    assert record.splits["test"].users == 3
    assert params["headline.test_users"] == "3"
    assert params["headline.test_state_accuracy"] == f"{metrics['state_accuracy']:.4g}"
    (point,) = mlc.get_metric_history(run.info.run_id, "test/state_accuracy")
    assert point.step == 0 and point.value == pytest.approx(metrics["state_accuracy"])
    prompts = json.loads(tracker.artifact_text(mlc, run.info.run_id, "prompts/cycle_00.json"))
    assert set(prompts) == {"writer"}
    # each user's sessions as traces, tagged as test users
    traces = mlc.search_traces(locations=[exp], run_id=run.info.run_id, max_results=500)
    assert {t.info.tags["memloop.user"] for t in traces} == set(record.splits["test"].per_user)
    assert {t.info.tags["memloop.split"] for t in traces} == {"test"}
    # each model call is a span with the request's messages, the raw output, tokens, latency
    # (a request asked twice in the eval is answered by the cache the second time)
    calls = [s for t in traces for s in t.data.spans if s.get_attribute("component")]
    fresh = [c for c in calls if not c.get_attribute("cache_hit")]
    asked = [
        json.dumps([{"role": m["role"], "content": m["content"]} for m in r["messages"]])
        for r in requests
    ]
    # all but the checker's calibration, which runs before any session, on made-up notes
    calibration = [
        json.dumps([{"role": m["role"], "content": m["content"]} for m in c["messages"]])
        for c in calibration_calls
    ]
    assert len(calibration) == 4
    for text in calibration:
        asked.remove(text)
    assert sorted(json.dumps(c.inputs["messages"]) for c in fresh) == sorted(asked)
    for call in calls:
        assert call.get_attribute("prompt_tokens") > 0
        assert call.get_attribute("latency_s") == pytest.approx(
            (call.end_time_ns - call.start_time_ns) / 1e9, abs=1e-4
        )
        assert call.outputs["choices"][0]["message"]["content"]
    # a rerun resumes: the same run, nothing logged twice
    assert main(eval_args(tmp_path, fake, POLICIES / "awi.yaml", "a", uri)) == 0
    assert [r.info.run_id for r in mlc.search_runs([exp])] == [run.info.run_id]
    again = mlc.search_traces(locations=[exp], run_id=run.info.run_id, max_results=500)
    assert len(again) == len(traces)


def test_prompts_from_an_exported_file_and_a_registry_version_are_tagged_with_their_source(
    tmp_path, fake
):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    # a registry version memloop registered, as evolve does
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "src", uri)
    source_run = mlc.create_run(exp, run_name="source").info.run_id
    text = "Record what the user says about their life."
    version = tracker.register_prompt(
        mlc, "src.awi", {"writer": text}, cycle=2, run_id=source_run, score=0.5
    )
    registry = tmp_path / "from-registry.yaml"
    registry.write_text("type: awi\nprompts_from: prompts:/src.awi/1\n")
    assert main(eval_args(tmp_path, fake, registry, "r", uri)) == 0
    # an exported file: its header names the run and cycle
    exported = tmp_path / "evolved.txt"
    exported.write_text(
        "# memloop export of run awi-2-4-complete-edits (abc123)\n"
        "# policy awi, cycle 1 (best validation)\n\n=== writer ===\n" + text + " Keep it short.\n"
    )
    from_file = tmp_path / "from-file.yaml"
    from_file.write_text("type: awi\nprompts_from: evolved.txt\n")
    assert main(eval_args(tmp_path, fake, from_file, "f", uri)) == 0
    runs = {
        r.data.tags["memloop.prompts_from"]: r.data.tags
        for r in mlc.search_runs([mlc.get_experiment_by_name("evals").experiment_id])
    }
    assert runs["prompts:/src.awi/1"]["memloop.prompts_from.run"] == source_run
    assert runs["prompts:/src.awi/1"]["memloop.prompts_from.cycle"] == "2"
    assert runs["prompts:/src.awi/1"]["memloop.prompts_from.version"] == f"src.awi/{version}"
    assert runs["evolved.txt"]["memloop.prompts_from.run"] == "awi-2-4-complete-edits"
    assert runs["evolved.txt"]["memloop.prompts_from.cycle"] == "1"


def test_the_same_text_from_two_sources_is_two_runs_each_named_after_its_source(
    tmp_path, fake, capsys
):
    """An eval's name, description and compare's row say which prompts ran; one text given
    inline and from a file is two runs, neither source dropped."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    text = "Record what the user says about their life."
    (tmp_path / "same.txt").write_text("=== writer ===\n" + text + "\n")
    from_file = tmp_path / "from-file.yaml"
    from_file.write_text("type: awi\nprompts_from: same.txt\n")
    inline = tmp_path / "inline.yaml"
    inline.write_text(f"type: awi\nprompts:\n  writer: {text}\n")
    assert main(eval_args(tmp_path, fake, from_file, "f", uri)) == 0
    assert main(eval_args(tmp_path, fake, inline, "i", uri)) == 0
    assert main(eval_args(tmp_path, fake, POLICIES / "awi.yaml", "s", uri)) == 0
    capsys.readouterr()
    mlc = tracker.client(uri, create=False)
    runs = mlc.search_runs([mlc.get_experiment_by_name("evals").experiment_id])
    by_source = {r.data.tags["memloop.prompts_source"]: r for r in runs}
    assert sorted(by_source) == ["inline", "same.txt", "seed"]
    for source, run in by_source.items():
        tags = run.data.tags
        key = tags["memloop.run_key"][:8]
        assert run.info.run_name == f"eval-{tags['memloop.policy']}-{source}-{key}"
        assert f"with the prompts of `{source}`" in tags["mlflow.note.content"]
    same = [by_source[s] for s in ("inline", "same.txt")]
    hashes = [r.data.params["spec.prompts_sha256"] for r in same]
    assert hashes[0] == hashes[1]  # one text, two runs
    assert main(["compare", "--experiment", "evals", "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert all(r.info.run_name in out for r in runs)


def test_compare_pairs_two_evals_on_the_same_users(tmp_path, fake, capsys):
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    assert main(eval_args(tmp_path, fake, POLICIES / "awi.yaml", "a", uri)) == 0
    first = capsys.readouterr().out.split("MLflow: run ")[1].split()[0]
    assert main(eval_args(tmp_path, fake, POLICIES / "native.yaml", "n", uri)) == 0
    capsys.readouterr()
    assert (
        main(["compare", "--experiment", "evals", "--tracking-uri", uri, "--baseline", first]) == 0
    )
    out = capsys.readouterr().out
    # the paired difference computed here from both runs' records, user by user
    mlc = tracker.client(uri, create=False)
    exp = mlc.get_experiment_by_name("evals").experiment_id
    per_user = {}
    for run in mlc.search_runs([exp]):
        text = tracker.artifact_text(mlc, run.info.run_id, "cycle/cycle_00.json")
        per_user[run.info.run_name] = CycleRecord.from_json(text).splits["test"].per_user
    (second,) = set(per_user) - {first}
    users = sorted(per_user[first])
    assert len(users) == 3 and sorted(per_user[second]) == users
    diff = [
        per_user[second][u]["state_accuracy"] - per_user[first][u]["state_accuracy"] for u in users
    ]
    row = next(line for line in out.splitlines() if second in line and "state_acc  3" in line)
    assert f"{sum(diff) / 3:+.3f}" in row
    assert f"paired with the baseline eval/{first} on the same users" in out


def test_compare_shows_two_evals_of_one_prompt_under_different_settings(tmp_path, fake, capsys):
    """The same AWI prompt under update_freq 2 and 1 (issue 57): not `same prompt`, but the
    paired numbers, labelled by the setting that differs."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    other = tmp_path / "awi-freq1.yaml"
    other.write_text("type: awi\nupdate_freq: 1\nshort_term_len: 4\n")
    assert main(eval_args(tmp_path, fake, POLICIES / "awi.yaml", "a", uri)) == 0
    first = capsys.readouterr().out.split("MLflow: run ")[1].split()[0]
    assert main(eval_args(tmp_path, fake, other, "b", uri)) == 0
    second = capsys.readouterr().out.split("MLflow: run ")[1].split()[0]
    argv = ["compare", "--experiment", "evals", "--tracking-uri", uri, "--baseline", first]
    assert main(argv) == 0
    out = capsys.readouterr().out
    paired = out.split(f"paired with the baseline eval/{first}")[1]
    row = next(line for line in paired.splitlines() if second in line)
    assert "[update_freq 1 vs 2]" in row and "mem_score" in row  # the objective's row first
    table = paired.split("\n\n")[0]  # the one paired run's rows: every metric, numbers
    assert "same prompt" not in table and "state_acc" in table


def test_eval_ranks_on_the_objective_given_on_the_command_line(tmp_path, fake, capsys):
    """Issue 59: `--objective` in place of the default rule (the fake's default: memory_score);
    the printed metrics put it first and the run records it."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    args = eval_args(tmp_path, fake, POLICIES / "awi.yaml", "a", uri)
    assert main([*args, "--objective", "state_accuracy"]) == 0
    printed = capsys.readouterr().out
    mlc = tracker.client(uri)
    (run,) = mlc.search_runs([mlc.get_experiment_by_name("evals").experiment_id])
    assert run.data.tags["memloop.objective"] == "state_accuracy"
    header = next(line for line in printed.splitlines() if line.startswith("period"))
    assert header.split()[1] == "state_acc"  # first (the default rule puts mem_score first)
