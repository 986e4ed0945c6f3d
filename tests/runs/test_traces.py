"""Episodes as MLflow traces: what a turn did to memory (turns.json), the traces built from an
episode folder, and the traces in a real MLflow store (linked to the run, grouped by session,
logged once)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.core.files import atomic_write_json
from memloop.environment.episode import (
    EpisodeRunner,
    PeriodRecord,
    SessionLog,
    TurnLog,
    line_changes,
    load_replay,
    run_episodes,
)
from memloop.environment.procedural import generate_procedural
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.runs import tracker
from memloop.runs.traces import episode_traces, user_traces
from memloop.testing import FakeOpenAIServer, ScriptedPolicy
from memloop.testing.load import busy_cores

pytestmark = pytest.mark.usefixtures("traces_on")  # the suite logs none (conftest)


def test_line_changes_counts_each_line_as_often_as_it_occurs():
    assert line_changes("a\nb", "b\nc\nc") == (["c", "c"], ["a"])
    assert line_changes("x\nx\ny", "x\ny\nz") == (["z"], ["x"])
    assert line_changes("", "") == ([], [])


class Stepped:
    """A policy seen only through memory_view / unwritten_messages, set by the test."""

    def __init__(self) -> None:
        self.view, self.held = "", 0

    def memory_view(self) -> str:
        return self.view

    def unwritten_messages(self) -> int:
        return self.held


def test_turn_log_records_what_each_turn_handed_to_memory_and_the_lines_it_changed():
    policy = Stepped()
    log = TurnLog(policy)  # type: ignore[arg-type]
    log.session()
    policy.held = 2  # turn 1: both messages held in the buffer, nothing written
    log.turn("I moved to Oslo.", "Noted.")
    policy.view, policy.held = "home: Oslo", 2  # turn 2: the first turn written, the second held
    log.turn("I walk to work.", "Nice.")
    policy.view, policy.held = "commute: walk", 0  # turn 3: four messages written, a line replaced
    log.turn("Bye.", "Bye.")
    assert log.dump() == {
        "memory_before": "",
        "sessions": [
            [
                {"user": "I moved to Oslo.", "assistant": "Noted.", "written": 0, "unwritten": 2},
                {
                    "user": "I walk to work.",
                    "assistant": "Nice.",
                    "written": 2,
                    "unwritten": 2,
                    "added": ["home: Oslo"],
                    "removed": [],
                },
                {
                    "user": "Bye.",
                    "assistant": "Bye.",
                    "written": 4,
                    "unwritten": 0,
                    "added": ["commute: walk"],
                    "removed": ["home: Oslo"],
                },
            ]
        ],
    }


@pytest.fixture
def item():
    return generate_procedural(users=1, periods=2, questions=2, seed=7)[0]


def test_the_runner_writes_each_period_turns_on_and_off_policy(tmp_path, item):
    """ScriptedPolicy's memory is every user message it took in, written at once (0 held)."""
    with FakeOpenAIServer(reply="Tell me more.") as fake:
        client = ChatClient(Endpoint(model="sim", base_url=fake.base_url))
        run_episodes(
            [item],
            lambda uid, wd, c: ScriptedPolicy(),
            client,
            tmp_path / "on",
            periods=2,
            progress=False,
        )
    replay = load_replay(tmp_path / "on", item.id)
    EpisodeRunner(item, ScriptedPolicy(), tmp_path / "off", replay=replay, periods=2).run()
    for user_dir in (tmp_path / "on" / item.id, tmp_path / "off"):
        seen: list[str] = []
        for p in (0, 1):
            turns = json.loads((user_dir / f"period_{p:02d}/turns.json").read_text())
            assert turns["memory_before"] == "\n".join(seen)
            assert [len(s) for s in turns["sessions"]] == [len(s) // 2 for s in replay[p]]
            for session, recorded in zip(turns["sessions"], replay[p], strict=True):
                for n, turn in enumerate(session):
                    said = recorded[2 * n]["content"]
                    assert turn["user"] == said
                    assert turn["assistant"] == recorded[2 * n + 1]["content"]
                    assert turn["written"] == 2 and turn["unwritten"] == 0
                    assert turn["added"] == said.splitlines() and turn["removed"] == []
                    seen.append(said)


def write_period(user_dir: Path) -> None:
    """One period, one session of two turns: the writer holds turn 1, then writes both turns."""
    messages = [
        {"role": "user", "content": "I moved to Oslo."},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "I walk to work."},
        {"role": "assistant", "content": "Nice."},
    ]
    question = {
        "user_id": "u-1234567890",
        "period": 0,
        "question_index": 0,
        "question": "Where should I look for a flat?",
        "choices": ["Bergen", "Oslo"],
        "required_info": ["home"],
        "gold_index": 1,
        "true_values": {"home": "Oslo"},
        "write_periods": {"home": 0},
        "chosen_index": 0,
        "state_answers": {"home": "Bergen"},
        "state_probs": {"home": 0.25},
    }
    record = PeriodRecord(
        user_id="u-1234567890",
        period=0,
        mode="on_policy",
        sessions=[
            SessionLog(session_index=0, session_time="t0", exposed_states={}, messages=messages)
        ],
        probes={"questions": [question], "memory_view": "home: Oslo\ncommute: walk"},
    )
    folder = user_dir / "period_00"
    turns = {
        "memory_before": "",
        "sessions": [
            [
                {"user": "I moved to Oslo.", "assistant": "Noted.", "written": 0, "unwritten": 2},
                {
                    "user": "I walk to work.",
                    "assistant": "Nice.",
                    "written": 4,
                    "unwritten": 0,
                    "added": ["home: Oslo", "commute: walk"],
                    "removed": [],
                },
            ]
        ],
    }
    atomic_write_json(folder / "turns.json", turns)
    atomic_write_json(folder / "record.json", record.model_dump(mode="json"))


def test_a_session_trace_reads_as_the_conversation_its_writes_and_its_probes(tmp_path):
    write_period(tmp_path / "u")
    (trace,) = user_traces(tmp_path / "u", run_label="run-a", cycle=2)
    assert trace.key == "cycle 2 · u-1234567890 · period 0 · session 0"
    assert trace.session_id == "run-a · cycle 2 · u-123456"
    assert trace.user == "u-1234567890"
    assert trace.tags == {
        "memloop.user": "u-1234567890",
        "memloop.cycle": "2",
        "memloop.period": "0",
        "memloop.session": "0",
    }
    root = trace.root
    assert root.name == "u-123456 · period 0 · session 0" and root.kind == "AGENT"
    assert root.inputs == {
        "messages": [{"role": "user", "content": "I moved to Oslo."}],
        "session_time": "t0",
        "turns": 2,
    }
    assert [c.name for c in root.children] == ["turn 1", "turn 2", "probes after period 0"]
    turn1, turn2, probes = root.children
    assert turn1.children == []  # nothing written at turn 1
    assert turn2.inputs == {"messages": [{"role": "user", "content": "I walk to work."}]}
    assert turn2.outputs["choices"][0]["message"] == {"role": "assistant", "content": "Nice."}
    (write,) = turn2.children
    assert write.kind == "MEMORY"
    # the four messages the writer took: both turns
    assert [m["content"] for m in write.inputs["messages handed to memory"]] == [
        "I moved to Oslo.",
        "Noted.",
        "I walk to work.",
        "Nice.",
    ]
    assert write.outputs == {"added": ["home: Oslo", "commute: walk"], "removed": []}
    assert probes.inputs == {"memory": "home: Oslo\ncommute: walk"}
    assert probes.outputs == {"right": 0, "questions": 1}
    (question,) = probes.children
    assert question.name == "question 1 · wrong"
    assert question.outputs == {
        "answer": "(A) Bergen",  # letters: Markdown would renumber "2. Oslo" as "1. Oslo"
        "truth": "(B) Oslo",
        "state (from written memory)": {
            "home": {"answer": "Bergen", "truth": "Oslo", "P(truth)": 0.25}
        },
    }
    summary = "+2 / -0 memory lines; first added: home: Oslo; probes 0/1 right"
    assert root.outputs == {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": summary}}],
        "memory lines added": ["home: Oslo", "commute: walk"],
        "memory lines removed": [],
        "probes": {"right": 0, "questions": 1},
    }
    assert trace.request_preview == "I moved to Oslo."
    assert trace.response_preview == summary


def test_traces_in_a_real_store_are_linked_to_the_run_grouped_by_session_and_logged_once(
    tmp_path,
):
    write_period(tmp_path / "episodes" / "u")
    traces = episode_traces(
        tmp_path / "episodes", run_label="run-a", cycle=0, splits={"u-1234567890": "test"}
    )
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "traces", uri)
    run_id = mlc.create_run(exp, run_name="run-a").info.run_id
    with pytest.MonkeyPatch.context() as off:
        off.setenv("MEMLOOP_TRACES", "0")
        assert tracker.log_traces(mlc, run_id, traces) == 0  # switched off: none
    assert not mlc.search_traces(locations=[exp], run_id=run_id)
    assert tracker.log_traces(mlc, run_id, traces) == 1
    assert tracker.log_traces(mlc, run_id, traces) == 0  # a resumed run logs nothing twice
    (found,) = mlc.search_traces(locations=[exp], run_id=run_id)
    meta, tags = found.info.trace_metadata, found.info.tags
    # linked to the run (MLflow's link_traces_to_run): the run's search finds it, another's not
    other = mlc.create_run(exp, run_name="run-b").info.run_id
    assert not mlc.search_traces(locations=[exp], run_id=other)
    assert meta["mlflow.trace.session"] == "run-a · cycle 0 · u-123456"
    assert meta["mlflow.trace.user"] == "u-1234567890"
    assert tags["memloop.split"] == "test" and tags["memloop.cycle"] == "0"
    assert tags["memloop.trace"] == traces[0].key
    spans = {s.name: s for s in found.data.spans}
    assert set(spans) == {
        "u-123456 · period 0 · session 0",
        "turn 1",
        "turn 2",
        "memory write",
        "probes after period 0",
        "question 1 · wrong",
    }
    assert spans["memory write"].outputs == {
        "added": ["home: Oslo", "commute: walk"],
        "removed": [],
    }
    assert spans["memory write"].parent_id == spans["turn 2"].span_id
    assert found.info.request_preview == "I moved to Oslo."
    # the question's result as feedback: the Traces page and the search API filter by it
    truth = "question 1: answered (A) Bergen; truth (B) Oslo"
    assert sorted(
        (a.name, a.value, a.rationale) for a in mlc.get_trace(found.info.trace_id).info.assessments
    ) == [
        ("P(truth)", 0.25, f"{truth}; mean of 1 variable(s)"),
        ("result", "write", truth),  # wrong: the state read in the fact's own period was wrong
    ]
    for condition, hits in (
        ("feedback.result = 'write'", 1),
        ("feedback.result = 'right'", 0),
        ("feedback.result = 'read'", 0),
    ):
        assert len(mlc.search_traces(locations=[exp], filter_string=condition)) == hits, condition


def write_sessions(user_dir: Path, openings: list[str]) -> None:
    """One period of a session per opening message; each session's writer stores its opening."""
    sessions, turns = [], []
    for s, opening in enumerate(openings):
        messages = [
            {"role": "user", "content": opening},
            {"role": "assistant", "content": f"Reply {s}."},
            {"role": "user", "content": f"Later message {s}."},
            {"role": "assistant", "content": "Noted."},
        ]
        sessions.append(
            SessionLog(session_index=s, session_time=f"t{s}", exposed_states={}, messages=messages)
        )
        turns.append(
            [
                {"user": opening, "assistant": f"Reply {s}.", "written": 0, "unwritten": 2},
                {
                    "user": f"Later message {s}.",
                    "assistant": "Noted.",
                    "written": 4,
                    "unwritten": 0,
                    "added": [f"fact_{s}: {opening[:40]}"] if s % 3 else [],
                    "removed": [],
                },
            ]
        )
    record = PeriodRecord(
        user_id="u-1234567890", period=0, mode="on_policy", sessions=sessions, probes={}
    )
    folder = user_dir / "period_00"
    atomic_write_json(folder / "turns.json", {"memory_before": "", "sessions": turns})
    atomic_write_json(folder / "record.json", record.model_dump(mode="json"))


OPENINGS = [
    "[Current Time: 2021-03-01 10:00:00]\nI moved to Oslo.",
    "  spaced   out\n\n words  ",
    "x" * 1500,  # longer than MLflow's own preview limit
    '{"messages": [{"role": "user", "content": "a JSON-looking message"}]}',
    "42",
    "",
    "Ünïcødé and emoji 🙂 in a message",
] + [f"Plain opening number {i}." for i in range(13)]


def test_mlflow_derives_from_a_root_span_exactly_the_previews_memloop_computes(tmp_path):
    """MLflow derives a trace's previews from its root span's inputs and outputs, in the client
    (dicts) and in its store (the same as JSON text); either gives memloop's previews."""
    from mlflow.tracing.utils.truncation import _get_truncated_preview

    write_sessions(tmp_path / "u", OPENINGS)
    traces = user_traces(tmp_path / "u", run_label="run-a")
    assert len(traces) == 20
    requests = [t.request_preview for t in traces]
    assert requests[:3] == [
        "[Current Time: 2021-03-01 10:00:00] I moved to Oslo.",
        "spaced out words",
        "x" * 300,
    ]
    assert requests[5] == "(no message)"
    assert traces[0].response_preview == "+0 / -0 memory lines"
    assert (
        traces[1].response_preview
        == "+1 / -0 memory lines; first added: fact_1:   spaced   out\n\n words  "
    )
    for t in traces:
        inputs, outputs = t.root.inputs, t.root.outputs
        assert _get_truncated_preview(inputs, role="user") == t.request_preview
        assert _get_truncated_preview(json.dumps(inputs), role="user") == t.request_preview
        assert _get_truncated_preview(outputs, role="assistant") == t.response_preview
        assert _get_truncated_preview(json.dumps(outputs), role="assistant") == t.response_preview


def previews_in_a_fresh_store(root: Path, traces) -> dict[str, tuple[str, str]]:
    """Log `traces` into a new sqlite store under `root`: each trace's previews by its key."""
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "traces", uri)
    run_id = mlc.create_run(exp, run_name="run-a").info.run_id
    assert tracker.log_traces(mlc, run_id, traces) == len(traces)
    found = mlc.search_traces(locations=[exp], run_id=run_id, max_results=100)
    return {
        t.info.tags["memloop.trace"]: (t.info.request_preview, t.info.response_preview)
        for t in found
    }


def test_previews_are_memloops_in_two_fresh_stores_one_logged_with_both_cores_busy(tmp_path):
    write_sessions(tmp_path / "episodes" / "u", OPENINGS)
    traces = episode_traces(tmp_path / "episodes", run_label="run-a", cycle=0)
    expected = {t.key: (t.request_preview, t.response_preview) for t in traces}
    assert len(expected) == 20
    quiet = previews_in_a_fresh_store(tmp_path / "quiet", traces)
    with busy_cores(2):
        busy = previews_in_a_fresh_store(tmp_path / "busy", traces)
    assert quiet == expected
    assert busy == expected


# -- an interrupted batch heals (issue 57, point 5) ------------------------------------------

TRACES = 12
BATCH = """
import os, sys
from mlflow import MlflowClient
from mlflow.tracing.client import TracingClient
from memloop.runs import tracker
from memloop.testing.traces import made_up_traces

uri, run_id, how, sig = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
traces = made_up_traces(int(sys.argv[5]))
log_spans, link = TracingClient.log_spans, MlflowClient.link_traces_to_run


def spans(*args, **kwargs):  # stop as the spans are written
    if how == "mid-flush":
        os.kill(os.getpid(), sig)
    return log_spans(*args, **kwargs)


def linked(*args, **kwargs):  # stop between the spans and their link to the run
    if how == "mid-batch":
        os.kill(os.getpid(), sig)
    return link(*args, **kwargs)


TracingClient.log_spans, MlflowClient.link_traces_to_run = spans, linked
tracker.log_traces(tracker.client(uri), run_id, traces)
"""


def stored(mlc, experiment_id: str, run_id: str) -> tuple[list, int]:
    """(key, state, spans) of the run's traces whose spans can be read; all traces of the run."""
    with_spans = tracker._run_traces(mlc, experiment_id, run_id, spans=True)
    found = sorted(
        (t.info.tags.get("memloop.trace", ""), str(t.info.state), len(t.data.spans))
        for t in with_spans
    )
    return found, len(tracker._run_traces(mlc, experiment_id, run_id, spans=False))


@pytest.mark.parametrize(
    ("how", "signal_name"),
    # TERM at the other kill points: tests/runs/test_faults_store.py, tests/results/test_export.py
    [("mid-flush", "SIGKILL"), ("mid-batch", "SIGINT")],
)
def test_a_rerun_heals_a_trace_batch_interrupted_by_a_kill(tmp_path, how, signal_name):
    """kill -9, Ctrl-C and TERM during a batch left orphan partial traces and keyed traces
    without spans, which the rerun skipped; now the rerun's store equals an uninterrupted run's."""
    import signal
    import subprocess
    import sys

    from memloop.testing.traces import SPANS, made_up_traces

    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "heal", uri)
    cut, whole = (mlc.create_run(exp, run_name=n).info.run_id for n in ("cut", "whole"))
    script = tmp_path / "batch.py"
    script.write_text(BATCH)
    sig = getattr(signal, signal_name)
    argv = [sys.executable, str(script), uri, cut, how, str(int(sig)), str(TRACES)]
    done = subprocess.run(argv, capture_output=True)
    assert done.returncode in (-sig, 128 + sig, 1), done.stderr[-500:]  # it was stopped
    linked = mlc.search_traces(locations=[exp], run_id=cut, max_results=100)
    whole_and_linked = [
        t for t in linked if str(t.info.state) == "OK" and len(t.data.spans) == SPANS
    ]
    assert len(whole_and_linked) < TRACES  # cut short
    traces = made_up_traces(TRACES)
    tracker.log_traces(mlc, cut, traces)  # the rerun
    tracker.log_traces(mlc, whole, traces)  # a run never interrupted
    assert stored(mlc, exp, cut) == stored(mlc, exp, whole)
    found, total = stored(mlc, exp, cut)
    assert found == sorted((f"k{i}", "OK", SPANS) for i in range(TRACES)) and total == TRACES
    # every one linked to the run, and no copy left over in the experiment
    assert len(mlc.search_traces(locations=[exp], run_id=cut, max_results=100)) == TRACES
    assert len(mlc.search_traces(locations=[exp], max_results=100)) == 2 * TRACES
    assert tracker.log_traces(mlc, cut, traces) == 0  # healed: a third run logs nothing
