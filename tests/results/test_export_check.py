"""`memloop export --check` (issue 59, point 2): one AWE run exported as text, a DSPy program
and a mem0 config, each re-scored where it runs (prompts_from:, dspy.load, mem0's own
Memory.from_config with its own OpenAI client) on the run's test users and paired with the run's
own scores; a runtime that stores other memories is not called identical: its gap is measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.runs.cycles import per_user_values
from memloop.runs.store import CycleStore
from memloop.testing import FakeOpenAIServer, awe_writing_reply, fake_roles
from memloop.testing.commands import small_evolve


class Reply:
    """`awe_writing_reply`, or, with `lose_mem0_facts`, one whose answers to mem0's own
    extraction requests (no schema, `json_object` only) hold no fact."""

    def __init__(self) -> None:
        self.lose_mem0_facts = False

    def __call__(self, body: dict) -> str:
        own = not (body.get("response_format") or {}).get("json_schema")
        if self.lose_mem0_facts and own and body["messages"][0]["role"] == "system":
            return '{"facts": []}'
        return awe_writing_reply(body)


@pytest.fixture(scope="module")
def awe_run(tmp_path_factory):
    """An AWE run (two cycles, two test users) on the fake model; the fake stays up."""
    from memloop.optimize.evolve import run_evolve

    root = tmp_path_factory.mktemp("check")
    (root / "awe.yaml").write_text("type: awe\n")
    config = small_evolve(
        root,
        "unit-check",
        (1, 1, 2),
        periods=2,
        questions=2,
        cycles=2,
        policy=str(root / "awe.yaml"),
    )
    reply = Reply()
    with FakeOpenAIServer(reply=reply) as fake:
        roles = fake_roles(fake.base_url, root / "c.sqlite")
        (outcome,) = run_evolve(config, progress=False, clients=roles)
        yield root, config, outcome, fake, reply


def export(root: Path, run: Path, fmt: str, out: Path, capsys, *more: str) -> str:
    """`memloop export RUN --cycle 1 --check` in `fmt` to `out` (the run's cache and store)."""
    from memloop.experiments.cli import main

    argv = ["export", str(run), "--format", fmt, "--out", str(out), "--cycle", "1", "--check"]
    cache = [] if "--cache" in more else ["--cache", str(root / "c.sqlite")]
    argv += [*cache, "--no-progress"]
    argv += ["--tracking-uri", f"sqlite:///{root}/mlruns/mlflow.db", *more]
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out


def test_each_export_scores_on_the_test_users_as_the_run_did(awe_run, tmp_path, capsys):
    from memloop.runs import tracker

    root, config, outcome, fake, _ = awe_run
    record = CycleStore(outcome.run_dir).record(1)
    ours = per_user_values(record.splits["test"].per_user, "memory_score")
    assert len(ours) == 2
    mean = sum(ours.values()) / 2
    prompts = CycleStore(outcome.run_dir).saved_prompts(1)
    assert prompts != CycleStore(outcome.run_dir).saved_prompts(0)  # an evolved prompt
    seen = len(fake.requests)
    outs = {
        "text": export(root, outcome.run_dir, "text", tmp_path / "p.txt", capsys),
        "dspy": export(root, outcome.run_dir, "dspy", tmp_path / "prog.json", capsys),
        "mem0": export(root, outcome.run_dir, "mem0", tmp_path / "mem0.json", capsys),
    }
    for fmt, out in outs.items():
        line = f"memory_score memloop {mean:.3f}, export {mean:.3f}; identical on every user"
        assert "on 2 test users: per-user mean " + line in out, (fmt, out)
        assert line in out, (fmt, out)
    # mem0's own client asked the fake (json_object, no schema): mem0 ran the exported config
    own = [
        b
        for b in fake.requests[seen:]
        if b.get("response_format") == {"type": "json_object"}
        and b["messages"][0]["content"].startswith(prompts["fact_extraction"])
    ]
    assert own, "mem0's own LLM client sent no extraction with the exported prompt"
    # each export records its check
    header = (tmp_path / "p.txt").read_text().splitlines()
    assert any(
        h.startswith("# export check: text (the run's policy with prompts_from:") for h in header
    )
    source = json.loads((tmp_path / "mem0.json").read_text())["memloop_source"]
    assert source["check"]["identical"] is True
    assert source["check"]["gap"]["n"] == 2 and source["check"]["gap"]["tied"] == 2
    assert source["check"]["memloop"] == ours == source["check"]["export"]
    assert json.loads((tmp_path / "mem0.json.check" / "check.json").read_text()) == source["check"]
    dspy_source = json.loads((tmp_path / "prog.source.json").read_text())
    assert dspy_source["check"]["format"] == "dspy" and dspy_source["check"]["identical"]
    # and it is an eval run in MLflow, tagged with what it checked
    mlc = tracker.client(config.tracking_uri, create=False)
    runs = tracker.experiment_runs(mlc, tracker.find_experiment(mlc, "export-check").experiment_id)
    assert sorted(r.data.tags["memloop.export_check.format"] for r in runs) == [
        "dspy",
        "mem0",
        "text",
    ]
    assert {r.data.tags["memloop.export_check.cycle"] for r in runs} == {"1"}
    assert all(r.data.metrics["export_check/gap"] == 0.0 for r in runs)


CANARY = "sk-check-canary-7f3a9e"  # a key the check reads from the environment


def test_a_runtime_that_loses_the_facts_is_measured_not_called_identical(
    awe_run, tmp_path, capsys, monkeypatch
):
    """mem0's own requests get no fact (memloop's still do): the memories, and so the answers,
    differ; the gap is the mean per-user difference, whatever its sign on the fake. The key
    --api-key-env names reaches the server and no file of the export, its check or the stores."""
    root, _, outcome, fake, reply = awe_run
    monkeypatch.setenv("CHECK_KEY", CANARY)
    seen = len(fake.auth_headers)
    reply.lose_mem0_facts = True
    try:
        more = ("--api-key-env", "CHECK_KEY")
        out = export(root, outcome.run_dir, "mem0", tmp_path / "mem0.json", capsys, *more)
    finally:
        reply.lose_mem0_facts = False
    assert f"Bearer {CANARY}" in fake.auth_headers[seen:]  # mem0's own client sent it
    assert CANARY not in out
    written = [p for folder in (root, tmp_path) for p in folder.rglob("*") if p.is_file()]
    assert written and not [p for p in written if CANARY.encode() in p.read_bytes()]
    check = json.loads((tmp_path / "mem0.json").read_text())["memloop_source"]["check"]
    assert not check["identical"]
    gap = check["gap"]
    diffs = [check["export"][u] - check["memloop"][u] for u in check["memloop"]]
    assert gap["mean"] == pytest.approx(sum(diffs) / len(diffs))
    assert gap["mean"] != 0 and gap["up"] + gap["down"] >= 1 and gap["n"] == 2
    assert f"gap {gap['mean']:+.3f}" in out


def test_an_awi_program_loaded_by_dspy_writes_as_the_run_did(tmp_path, capsys):
    """AWI's exported program, loaded by `dspy.load`, is the object that writes each edit in the
    check (`adopt_program`): its scores are the run's, as are those of the text export."""
    from memloop.optimize.evolve import run_evolve
    from memloop.testing import writing_reply

    config = small_evolve(tmp_path, "unit-check-awi", (1, 1, 2), periods=2, cycles=2)
    with FakeOpenAIServer(reply=writing_reply) as fake:
        (outcome,) = run_evolve(
            config, progress=False, clients=fake_roles(fake.base_url, tmp_path / "c.sqlite")
        )
        seen = len(fake.requests)
        fresh = ("--cache", str(tmp_path / "fresh.sqlite"))  # every request reaches the fake
        out = export(tmp_path, outcome.run_dir, "dspy", tmp_path / "prog.json", capsys, *fresh)
        writes = [b for b in fake.requests[seen:] if "edits" in str(b.get("response_format"))]
        text = export(tmp_path, outcome.run_dir, "text", tmp_path / "p.txt", capsys)
    assert "identical on every user" in out and "identical on every user" in text
    writer = CycleStore(outcome.run_dir).saved_prompts(1)["writer"]
    assert writes and all(writer.strip() in b["messages"][0]["content"] for b in writes)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--env", "data.json"], "--env: only with --check"),
        (["--cache", "c.db"], "--cache: only with --check"),
    ],
)
def test_check_options_without_check_are_one_line(awe_run, tmp_path, capsys, extra, needle):
    from memloop.experiments.cli import main

    _, _, outcome, _, _ = awe_run
    argv = ["export", str(outcome.run_dir), "--out", str(tmp_path / "p.txt"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.txt").exists()


def test_a_check_of_an_mlflow_run_asks_for_its_folder(awe_run, tmp_path, capsys):
    from memloop.experiments.cli import main

    root, config, outcome, _, _ = awe_run
    name = outcome.run_id
    argv = ["export", name, "--out", str(tmp_path / "p.txt"), "--check"]
    assert main([*argv, "--tracking-uri", config.tracking_uri]) == 2
    err = capsys.readouterr().err
    assert "is an MLflow run; the check re-runs its test users" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.txt").exists()  # refused before anything was written


def test_a_data_file_runs_users_come_from_env_with_the_runs_sha256(tmp_path):
    from types import SimpleNamespace

    from memloop.core.errors import UserError
    from memloop.environment.datafile import save_items
    from memloop.environment.procedural import generate_procedural
    from memloop.optimize.export_check import run_test_users
    from memloop.runs.inputs import describe_data_file

    items = generate_procedural(users=3, periods=1, questions=1, seed=4)
    save_items(items, tmp_path / "data.json")
    save_items(items[:2], tmp_path / "other.json")
    test = [items[2].id, items[0].id]
    spec = SimpleNamespace(
        environment=describe_data_file(tmp_path / "data.json"), users={"test": test}
    )
    with pytest.raises(UserError, match=r"comes? from data.json .*give that file: --env PATH"):
        run_test_users(spec, None)
    with pytest.raises(UserError, match="not the run's environment"):
        run_test_users(spec, str(tmp_path / "other.json"))
    assert [i.id for i in run_test_users(spec, str(tmp_path / "data.json"))] == test
    spec.users = {"test": []}
    with pytest.raises(UserError, match="no test users"):
        run_test_users(spec, str(tmp_path / "data.json"))
