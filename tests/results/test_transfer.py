"""`memloop transfer`: a run's selected prompts against its seed under other writer models, paired
on the run's test users; each cell an eval run in MLflow; `same prompt` when nothing changed."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from memloop.core.stats import Paired, gate_of
from memloop.experiments.cli import main
from memloop.runs import tracker
from memloop.testing import FakeOpenAIServer, awe_writing_reply, writing_reply
from memloop.testing.commands import write_small_evolve
from memloop.testing.fake_server import request_schema

EVOLVED = "Record every stated fact"  # the fake optimizer's rewrite (evolve_loop_reply)


def prompt_minded(body: dict) -> str:
    """A writer that stores the user's words only under the evolved prompt; the questions are
    answered from what memory holds (`awe_writing_reply`'s multiple choice)."""
    if "edits" in (request_schema(body) or {}).get("properties", {}):
        if EVOLVED not in json.dumps(body["messages"]):
            return json.dumps({"edits": []})
        return writing_reply(body)
    return awe_writing_reply(body)


def never_writes(body: dict) -> str:
    if "edits" in (request_schema(body) or {}).get("properties", {}):
        return json.dumps({"edits": []})
    return writing_reply(body)


@pytest.fixture
def run(tmp_path: Path):
    """An evolve run of 2 cycles on the fake (cycle 1: the reflective evolver's rewrite); its
    endpoint stays up (a transfer keeps the run's other roles)."""
    config = write_small_evolve(tmp_path, "t", (1, 1, 3), cycles=2, rounds={"init": 1, "update": 1})
    with FakeOpenAIServer(reply=prompt_minded) as fake:
        endpoint = tmp_path / "run.yaml"
        endpoint.write_text(f"model: run\nbase_url: {fake.base_url}\n")
        assert main(["evolve", str(config), "--endpoint", str(endpoint), "--no-progress"]) == 0
        (folder,) = (tmp_path / "runs").iterdir()
        yield folder


def test_each_writer_is_one_paired_row_and_each_cell_one_mlflow_run(run, tmp_path, capsys):
    capsys.readouterr()
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    out = tmp_path / "transfer"
    with FakeOpenAIServer(reply=prompt_minded) as a, FakeOpenAIServer(reply=never_writes) as b:
        writers = []
        for name, fake in (("a", a), ("b", b)):
            (tmp_path / f"{name}.yaml").write_text(f"model: {name}\nbase_url: {fake.base_url}\n")
            writers += ["--writer", str(tmp_path / f"{name}.yaml")]
        argv = ["transfer", str(run), *writers, "--cycle", "1", "--out", str(out)]
        assert main([*argv, "--tracking-uri", uri, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    matrix = json.loads((out / "transfer.json").read_text())
    assert matrix["cycle"] == 1 and len(matrix["test_users"]) == 3
    objective = matrix["objective"]
    for row in matrix["rows"]:
        # each arm's scores are its cell's per-user values of the run's objective
        for arm in ("seed", "selected"):
            cell = Path(row["folders"][arm])
            assert cell.parent == out
            per_user = json.loads((cell / "metrics.json").read_text())["per_user"]
            assert row["scores"][arm] == {u: v[objective] for u, v in per_user.items()}
        diffs = [
            row["scores"]["selected"][u] - row["scores"]["seed"][u] for u in matrix["test_users"]
        ]
        assert row["paired"]["mean"] == pytest.approx(statistics.fmean(diffs))
        assert row["paired"] == Paired.of_differences(diffs).to_dict()
        assert (
            row["gate"]["verdict"]
            == gate_of(row["scores"]["selected"], row["scores"]["seed"]).verdict.value
        )
    a_row, b_row = matrix["rows"]
    # writer a writes only under the evolved prompt, so its arms' memories and scores differ;
    # writer b never writes: its arms tie on every user
    assert a_row["paired"]["mean"] != 0
    assert b_row["paired"]["mean"] == 0 and b_row["paired"]["tied"] == 3
    assert "a " in printed and "b " in printed and "gate" in printed
    mlc = tracker.client(uri, create=False)
    exp = mlc.get_experiment_by_name("transfer").experiment_id
    runs = mlc.search_runs([exp])
    cells = {
        (r.data.tags["memloop.transfer.writer"], r.data.tags["memloop.transfer.arm"]) for r in runs
    }
    writers = [row["writer"] for row in matrix["rows"]]
    assert writers[0].startswith("a at http://127.0.0.1:") and writers[1].startswith("b at ")
    assert cells == {(w, arm) for w in writers for arm in ("seed", "selected")}
    like = {}
    for r in runs:
        like.setdefault(r.data.tags["memloop.transfer.writer"], set()).add(
            r.data.tags["memloop.like"]
        )
    assert all(len(v) == 1 for v in like.values()) and like[writers[0]] != like[writers[1]]


def test_a_selection_that_is_the_seed_is_same_prompt_and_runs_nothing(run, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "same"
    argv = ["transfer", str(run), "--writer", "local-0.5b", "--cycle", "0", "--out", str(out)]
    assert main([*argv, "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "same prompt: the run's selection is its seed" in printed
    (row,) = json.loads((out / "transfer.json").read_text())["rows"]
    assert row["same_prompt"] and row["scores"] == {} and row["paired"] is None
    assert sorted(p.name for p in out.iterdir()) == ["transfer.json"]
    assert main(["transfer", str(run), "--out", str(out)]) == 2  # no --writer: one line
    # a prompt file holding the seed's own prompts is the seed too
    from memloop.policies.prompt_files import render_text
    from memloop.results.export import from_folder

    seed = tmp_path / "seed.txt"
    seed.write_text(render_text(from_folder(run, 0).prompts))
    argv = ["transfer", str(run), "--writer", "local-1.5b", "--prompts", str(seed)]
    argv += ["--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "file")]) == 0
    matrix = json.loads((tmp_path / "file" / "transfer.json").read_text())
    assert matrix["rule"] == f"--prompts {seed}" and matrix["rows"][0]["same_prompt"]
