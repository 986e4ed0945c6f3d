"""feedback/health.py: memory-health series computed on hand-made records, and the alarms seen on
planted broken writers (memloop/testing/broken_writers.py) and never on healthy ones."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from memloop.core.stats import rate_interval
from memloop.environment.episode import PeriodRecord, SessionLog, run_episodes
from memloop.environment.procedural import generate_procedural
from memloop.environment.simulator import SimulatorConfig
from memloop.feedback.health import ALARMS, alarms, health_of, user_health
from memloop.policies import AWIConfig, build_policy
from memloop.testing import FakeOpenAIServer, evolve_loop_reply
from memloop.testing.broken_writers import BROKEN
from memloop.testing.fake_server import fake_roles, request_schema

HEADER = "Memory (label: value):"


def session(index: int, exposed: dict[str, str], user: str, assistant: str) -> SessionLog:
    return SessionLog(
        session_index=index,
        session_time="2020-10-01 10:00:00",
        exposed_states=exposed,
        messages=[{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
    )


def turn(added: list[str] = (), removed: list[str] = (), **more) -> dict:
    return {"user": "", "assistant": "", "added": list(added), "removed": list(removed), **more}


def hand_made():
    """Two periods of one user: what each session revealed and what each turn wrote."""
    home = "home: moved to Berlin last spring for work"
    pet = "home: adopted tabby cat named Whiskers"
    advice = "advice: plant based cooking offers delicious recipes worth exploring"
    p0 = PeriodRecord(
        user_id="u",
        period=0,
        mode="on_policy",
        sessions=[
            session(0, {"home_city": "berlin"}, "I moved to Berlin last spring for work.", "Ok."),
            # the label `home` is reused: Berlin is overwritten by the cat
            session(1, {"pet": "cat"}, "I adopted a tabby cat named Whiskers.", "Lovely."),
            # the assistant's words stored, not the user's
            session(
                2,
                {"diet": "vegetarian"},
                "I stopped eating meat entirely this year.",
                "Plant based cooking offers delicious recipes worth exploring.",
            ),
        ],
    )
    t0 = {
        "memory_before": "",
        "sessions": [[turn([HEADER, home])], [turn([pet], [home])], [turn([advice])]],
        "stats": {"write_errors": 1},
    }
    p1 = PeriodRecord(
        user_id="u",
        period=1,
        mode="on_policy",
        sessions=[
            # the pet changed; memory keeps the cat and adds a copy of it
            session(0, {"pet": "none"}, "Sadly we gave the animal away to friends.", "Ok."),
            session(1, {"job": "nurse"}, "I work night shifts as a nurse.", "Ok."),
        ],
    )
    copy = "pet_again: adopted tabby cat named Whiskers"
    truncated = {"component": "memory", "finish_reason": "length"}
    t1 = {
        "memory_before": "\n".join([HEADER, pet, advice]),
        "sessions": [[turn([copy])], [turn(calls=[truncated])]],
        "stats": {"write_errors": 3},
    }
    return [p0, p1], [t0, t1]


def test_each_series_counts_what_the_turns_wrote():
    records, turns = hand_made()
    p0, p1 = user_health(records, turns)
    # period 0: 3 facts revealed; the end memory holds the cat only (Berlin overwritten, the diet
    # never written); 3 entries added, the advice in the assistant's words; one label reused
    assert (p0.revealed, p0.stored, p0.added, p0.assistant_added) == (3, 1, 3, 1)
    assert (p0.collisions, p0.updates_lost, p0.write_errors, p0.truncated) == (1, 0, 1, 0)
    assert p0.unstored_sessions == [True, False, True]
    assert (p0.entries, p0.duplicates) == (2, 0)
    assert p0.stored_share == pytest.approx(1 / 3)
    assert p0.assistant_share == pytest.approx(1 / 3)
    assert p0.chars == len(
        "\n".join(
            [
                HEADER,
                records and "home: adopted tabby cat named Whiskers",
                "advice: plant based cooking offers delicious recipes worth exploring",
            ]
        )
    )
    # period 1: the pet changed and memory holds the old pet only (update lost); the job never
    # written; the copy of the cat is redundant; 3 - 1 = 2 write errors, one truncated call
    assert (p1.revealed, p1.stored, p1.added, p1.assistant_added) == (2, 0, 1, 0)
    assert (p1.collisions, p1.updates_lost, p1.write_errors, p1.truncated) == (0, 1, 2, 1)
    assert p1.unstored_sessions == [True, True]
    assert (p1.entries, p1.duplicates) == (3, 1)


def test_an_alarm_fires_once_at_the_first_period_its_rule_holds():
    records, turns = hand_made()
    fired = alarms(user_health(records, turns))
    # unstored sessions in a row: T, F, T | T, T -> 3 at period 1; write errors + truncated:
    # 1 at period 0, 1 + 2 + 1 = 4 at period 1; one collision (< 2); assistant share 1/3 (<= .5)
    assert [(a.name, a.period, a.value) for a in fired] == [
        ("nothing_stored", 1, 3),
        ("write_errors", 1, 4),
    ]
    assert ALARMS["nothing_stored"][1] == 3 and ALARMS["write_errors"][1] == 2


def test_a_rate_has_its_wilson_interval():
    low, high = rate_interval(3, 26)["ci95"]
    # Wilson: centre (p + z^2/2n) / (1 + z^2/n), half-width z sqrt(p(1-p)/n + z^2/4n^2) / (...)
    z, n, p = 1.959963984540054, 26, 3 / 26
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / (1 + z * z / n)
    assert (low, high) == pytest.approx((centre - half, centre + half))
    assert rate_interval(0, 48)["ci95"][1] == pytest.approx(0.0741, abs=1e-4)
    with pytest.raises(ValueError, match="runs > 0"):
        rate_interval(0, 0)


def distinct_writer(body: dict) -> str:
    """A healthy fake writer: the user's last message under a label of its own."""
    if "edits" not in (request_schema(body) or {}).get("properties", {}):
        return evolve_loop_reply(body)  # replies: "Interesting, tell me more."
    text = str(body["messages"][-1].get("content", ""))
    said = re.findall(r"(?m)^user: (?:\[Current Time:[^\]]*\]\s*)?(.*)$", text)
    if not said:
        return json.dumps({"edits": []})
    label = "fact_" + hashlib.sha256(said[-1].encode()).hexdigest()[:6]
    return json.dumps({"edits": [{"label": label, "value": said[-1]}]})


def test_each_planted_writer_trips_its_alarm_and_the_healthy_writers_none(tmp_path: Path):
    items = generate_procedural(
        users=3, periods=2, questions=2, choices_per_state=4, changes_per_period=1, seed=5
    )
    awi = AWIConfig(update_freq=2, short_term_len=0, reply_memory=False)
    arms = {
        "writer": lambda uid, wd, c: build_policy(awi, c, wd),
        "verbatim": lambda uid, wd, c: build_policy(
            awi.model_copy(update={"verbatim": "user"}), c, wd
        ),
        **{name: (lambda uid, wd, c, cls=cls: cls(awi, c, wd)) for name, cls in BROKEN.items()},
    }
    found = {}
    with FakeOpenAIServer(reply=distinct_writer) as fake:
        clients = fake_roles(fake.base_url, cache=tmp_path / "cache.sqlite")
        for arm, factory in arms.items():
            episodes = run_episodes(
                items,
                factory,
                clients.agent,
                tmp_path / arm,
                sim_client=clients.user_sim,
                sim_config=SimulatorConfig(rounds_init=1, rounds_update=1),
                progress=False,
            )
            found[arm] = health_of(episodes, tmp_path / arm)
    assert set(BROKEN) == set(ALARMS)
    for name in ALARMS:
        assert found["writer"].tripped(name) == [], name
        assert found["verbatim"].tripped(name) == [], name
        assert sorted(found[name].tripped(name)) == sorted(it.id for it in items), name
    assert found["writer"].line() == "memory health: no alarm on 3 users"
    silent = found["nothing_stored"]
    assert silent.line("test users") == "memory health: ALARM nothing_stored on 3/3 test users"
    errors = found["write_errors"].line()
    assert errors == "memory health: ALARM nothing_stored on 3/3 users, write_errors on 3/3 users"
    # the healthy fake stored every revealed fact; the silent writer none
    assert found["writer"].metrics()["health/stored_share"] == 1.0
    assert silent.metrics()["health/stored_share"] == 0.0
    assert found["assistant_words"].metrics()["health/assistant_share"] == 1.0


def test_eval_prints_the_alarm_logs_it_to_mlflow_and_marks_the_trace_where_it_fired(
    tmp_path: Path, capsys, traces_on
):
    from memloop.environment.datafile import save_items
    from memloop.environment.episode import finished_records
    from memloop.experiments.cli import main
    from memloop.runs import tracker
    from memloop.testing import writing_reply
    from memloop.testing.commands import eval_argv

    env = tmp_path / "env.json"
    save_items(generate_procedural(users=3, periods=2, questions=2, seed=3), env)
    policy = tmp_path / "reply.yaml"  # a plug-in: AWI that stores the assistant's reply
    policy.write_text(
        "type: memloop.testing.broken_writers:ReplyWriter\n"
        "update_freq: 2\nshort_term_len: 0\nreply_memory: false\n"
    )
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    with FakeOpenAIServer(reply=writing_reply) as fake:
        endpoint = tmp_path / "fake.yaml"
        endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
        argv = eval_argv(env, policy, endpoint, tmp_path / "c.db", tmp_path / "out")
        more = ["--tracking-uri", uri, "--experiment", "evals", "--no-progress"]
        # one round per session: the fake user's follow-up would say the fake reply's words
        assert main([*argv, *more, "--rounds-update", "1"]) == 0
    printed = capsys.readouterr().out
    (line,) = [x for x in printed.splitlines() if x.startswith("memory health:")]
    assert "assistant_words on 3/3 users" in line and line.startswith("memory health: ALARM")
    mlc = tracker.client(uri, create=False)
    exp = mlc.get_experiment_by_name("evals").experiment_id
    (run,) = mlc.search_runs([exp])
    assert run.data.metrics["test/health/assistant_words_users"] == 3
    assert run.data.metrics["test/health/assistant_share"] == 1.0
    assert run.data.metrics["test/health/label_reuse_users"] == 0
    # per user: the feedback `memory_health: assistant_words` on the last session of the period
    # the alarm fired in (the first period with 2+ new entries, here period 0), and nowhere else
    traces = mlc.search_traces(locations=[exp], run_id=run.info.run_id, max_results=500)
    marked = {}
    for t in traces:
        for a in mlc.get_trace(t.info.trace_id).info.assessments:
            if a.name == "memory_health" and a.value == "assistant_words":
                marked.setdefault(t.info.tags["memloop.user"], []).append(
                    (t.info.tags["memloop.period"], t.info.tags["memloop.session"])
                )
    episodes = tmp_path / "out" / "episodes"
    expected = {}
    for user_dir in episodes.iterdir():
        first = finished_records(user_dir, 9)[0]
        expected[first.user_id] = [("0", str(len(first.sessions) - 1))]
        assert sum(1 for s in first.sessions if s.exposed_states) >= 2
    assert marked == expected


def test_evolve_says_beside_its_verdict_that_the_selected_writer_tripped_an_alarm(
    tmp_path: Path, capsys
):
    from memloop.experiments.cli import main
    from memloop.runs.cycles import CycleRecord
    from memloop.testing import writing_reply
    from memloop.testing.commands import write_small_evolve

    policy = tmp_path / "reply.yaml"
    policy.write_text(
        "type: memloop.testing.broken_writers:ReplyWriter\n"
        "update_freq: 2\nshort_term_len: 0\nreply_memory: false\n"
    )
    config = write_small_evolve(
        tmp_path,
        "health",
        (1, 1, 2),
        policy=str(policy),
        evolvers=["none"],
        feedback_modes=["none"],
        cycles=1,
        rounds={"init": 1, "update": 1},
    )
    with FakeOpenAIServer(reply=writing_reply) as fake:
        endpoint = tmp_path / "fake.yaml"
        endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
        assert main(["evolve", str(config), "--endpoint", str(endpoint), "--no-progress"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "none/none: cycle 0 stands for the run (" in printed
        and "; memory health: ALARM nothing_stored on 2/2 test users of cycle 0, "
        "assistant_words on 2/2 test users of cycle 0"
        in printed
    )
    (path,) = (tmp_path / "runs").glob("*/cycle_00/cycle.json")
    record = CycleRecord.from_json(path.read_text())
    assert all(
        v == ["nothing_stored", "assistant_words"] for v in record.splits["test"].alarms.values()
    )
    assert record.metrics()["test/health/assistant_words_users"] == 2


def test_tune_names_the_trials_whose_writer_tripped_an_alarm():
    from memloop.optimize.tune import trials_health

    rows = [
        {"number": 0, "health": "memory health: no alarm on 2 val users"},
        {"number": 1, "health": "memory health: ALARM label_reuse on 1/2 val users"},
        {"number": 2},  # a trial recorded before health was
    ]
    assert trials_health(rows) == "memory health: ALARM in trial 1: label_reuse on 1/2 val users"
    assert trials_health(rows[:1]) == "memory health: no alarm in any trial (validation users)"
