"""`memloop eval --replay DIR`: off-policy evaluation on a recorded run, refused when it does not
match the users, periods and sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memloop
from memloop.environment.datafile import save_items
from memloop.environment.episode import load_record
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import FakeOpenAIServer, schema_valid_reply

POLICIES = Path(memloop.__file__).parent / "experiments" / "policies"


reply = schema_valid_reply


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAIServer(reply=reply) as server:
        yield server


def eval_files(tmp_path, fake) -> tuple[Path, list[str]]:
    """A 2-user environment and the eval arguments naming it, the fake endpoint and a cache."""
    env = tmp_path / "env.json"
    save_items(generate_procedural(users=2, periods=1, questions=1, seed=3), env)
    endpoint = tmp_path / "fake.yaml"
    endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
    return env, ["--env", str(env), "--endpoint", str(endpoint), "--cache", str(tmp_path / "c.db")]


@pytest.fixture
def recorded(tmp_path, fake):
    env, base = eval_files(tmp_path, fake)
    out = tmp_path / "onpolicy"
    before = len(fake.requests)
    assert main(["eval", *base, "--policy", str(POLICIES / "native.yaml"), "--out", str(out)]) == 0
    assert simulator_requests(fake.requests[before:]) > 0  # the on-policy run simulated the user
    return env, base, out


def simulator_requests(requests) -> int:
    return sum(r["messages"][0]["content"].startswith("You play a human user") for r in requests)


def user_turns(run: Path) -> list[str]:
    records = sorted((run / "episodes").glob("*/period_*/record.json"))
    assert records
    return [
        m["content"]
        for path in records
        for s in load_record(path).sessions
        for m in s.messages
        if m["role"] == "user"
    ]


def test_replay_feeds_the_recorded_conversation(recorded, tmp_path, fake):
    env, base, out = recorded
    before = len(fake.requests)
    replayed = tmp_path / "replayed"
    args = ["eval", *base, "--policy", str(POLICIES / "awi.yaml"), "--out", str(replayed)]
    assert main([*args, "--replay", str(out)]) == 0
    modes = {load_record(p).mode for p in (replayed / "episodes").glob("*/period_*/record.json")}
    assert modes == {"off_policy"}
    assert user_turns(replayed) == user_turns(out)
    spec = json.loads((replayed / "spec.json").read_text())
    assert spec["spec"]["evaluation"]["replay"] == str(out / "episodes")
    assert simulator_requests(fake.requests[before:]) == 0


def test_replay_refuses_a_recording_of_other_users(recorded, tmp_path, capsys):
    _, base, out = recorded
    other = tmp_path / "other.json"
    save_items(generate_procedural(users=3, periods=1, questions=1, seed=3), other)
    args = ["eval", "--env", str(other), *base[2:], "--policy", str(POLICIES / "awi.yaml")]
    assert main([*args, "--out", str(tmp_path / "x"), "--replay", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no recording of user" in err
    assert not (tmp_path / "x").exists()  # nothing written


def test_replay_refuses_a_session_count_mismatch(recorded, tmp_path, capsys):
    _, base, out = recorded
    path = sorted((out / "episodes").glob("*/period_01/record.json"))[0]
    data = json.loads(path.read_text())
    data["sessions"] = data["sessions"][:-1]
    path.write_text(json.dumps(data))
    args = ["eval", *base, "--policy", str(POLICIES / "awi.yaml"), "--out", str(tmp_path / "y")]
    assert main([*args, "--replay", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "sessions recorded" in err


def test_replay_into_its_own_folder_is_refused(recorded, capsys):
    _, base, out = recorded
    args = ["eval", *base, "--policy", str(POLICIES / "awi.yaml"), "--out", str(out)]
    assert main([*args, "--replay", str(out)]) == 2
    assert "must differ from --out" in capsys.readouterr().err


def test_record_only_records_conversations_and_nothing_else(tmp_path, fake):
    _, base = eval_files(tmp_path, fake)
    base += ["--rounds-update", "1"]  # scripted sessions: the user's turns are the environment's
    awi = tmp_path / "awi.yaml"
    awi.write_text("type: awi\nupdate_freq: 2\nshort_term_len: 0\nreply_memory: false\n")
    before = len(fake.requests)
    rec = tmp_path / "recording"
    assert main(["eval", *base, "--policy", str(awi), "--out", str(rec), "--record-only"]) == 0
    sent = fake.requests[before:]
    assert sent and all("response_format" not in r for r in sent)  # replies only: no write, probe
    assert not (rec / "metrics.json").exists()
    records = [load_record(p) for p in sorted((rec / "episodes").glob("*/period_*/record.json"))]
    assert len(records) == 2 * 2 and all(r.probes == {} for r in records)
    # scored by replay, an AWI policy whose replies see only the current message gives exactly
    # its on-policy evaluation: the same records and metrics
    onpolicy, replayed = tmp_path / "onpolicy", tmp_path / "replayed"
    assert main(["eval", *base, "--policy", str(awi), "--out", str(onpolicy)]) == 0
    assert (
        main(["eval", *base, "--policy", str(awi), "--out", str(replayed), "--replay", str(rec)])
        == 0
    )
    assert (replayed / "records.jsonl").read_text() == (onpolicy / "records.jsonl").read_text()
    on, off = (json.loads((d / "metrics.json").read_text()) for d in (onpolicy, replayed))
    assert on["state_accuracy"] == off["state_accuracy"] and on["per_user"] == off["per_user"]
    assert (
        main(
            [
                "eval",
                *base,
                "--policy",
                str(awi),
                "--out",
                str(tmp_path / "x"),
                "--record-only",
                "--replay",
                str(rec),
            ]
        )
        == 2
    )
