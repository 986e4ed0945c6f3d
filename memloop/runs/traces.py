"""A user's episode as MLflow traces: one trace per conversation session, read as a person would.

Built from an episode folder (`environment/episode.py`'s layout: each period's record.json and
turns.json) into plain `SessionTrace` values; `tracker.log_traces` sends them. A trace holds:

    <user> · period p · session s                       the session (agent span): its opening
                                                        message in, what it left in memory out
        turn 1 · user → assistant                       the user's message, the reply
            agent · <model>, writer · <model>, ...      each model call the turn made (the
                                                        user simulator's next message too): its
                                                        messages, raw output, tokens, latency,
                                                        cache hit, at the times it ran
            memory write                                the messages handed to memory, the lines
                                                        it added and removed
        ...
        probes after period p                           (the period's last session) the memory
            question 1 · right / wrong / unparsed       the question, the choices, the answer,
                                                        the truth, the state read per variable
            probe · <model>, ...                        the probes' model calls

Traces carry the conversation itself: they are a record of the run, like its episode folders,
never a prompt (an evolved prompt holds no user's value; optimize/context.py checks).
A trace's tags name its run's cycle, split, user, period and session; `memloop.trace` is its key
in the run, so a resumed run logs only the traces it has not logged whole yet (`memloop.spans`
says how many spans a whole one holds): what a kill left of a batch (traces in progress, keyed
traces without their spans) is deleted and logged again (`tracker.logged_traces`).

The trace list's Request and Response previews are memloop's (the opening message; what memory
gained and lost, then the probes). MLflow derives a trace's previews from its root span's inputs
and outputs (when `log_spans` makes the trace; MLflow's live tracing API also at the end of the
trace, asynchronously). So the root span's inputs and outputs are chat-shaped (`messages` in,
`choices` out) holding exactly those previews: every derivation gives memloop's text
(tests/runs/test_traces.py holds MLflow's own derivation to that).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memloop.environment.episode import TURNS_FILE, PeriodRecord, load_record, period_dir
from memloop.feedback.records import QuestionRecord, option_text
from memloop.feedback.scoring import classify_failure, index_records

TRACE_TAG = "memloop.trace"
PREVIEW_CHARS = 300  # a preview's length; MLflow keeps up to 1,000 characters (OSS)


@dataclass
class Span:
    name: str
    kind: str  # an MLflow span type: AGENT, CHAT_MODEL, MEMORY, EVALUATOR
    inputs: Any = None
    outputs: Any = None
    attributes: dict[str, Any] = field(default_factory=dict)
    children: list[Span] = field(default_factory=list)
    start_ns: int | None = None  # when it ran (a model call); None: placed by its neighbours
    end_ns: int | None = None


@dataclass
class Assessment:
    """A question's result on its trace: an MLflow feedback the Traces page filters by.

    `result`: `right`, or the wrong answer's failure class (format / write / read /
    utilization); `P(truth)`: the letter read's probability of the true value, where it was read.
    """

    name: str
    value: bool | str | float
    rationale: str


@dataclass
class SessionTrace:
    key: str  # unique within the run: cycle, user, period, session
    session_id: str  # MLflow's session: one user's episode in one cycle of one run
    user: str
    tags: dict[str, str]
    root: Span
    request_preview: str = ""  # the trace list's Request column: the user's opening message
    response_preview: str = ""  # its Response column: memory lines added / removed, probes
    assessments: list[Assessment] = field(default_factory=list)  # its questions' results


def short_user(user_id: str) -> str:
    """A user id as a trace names it: its first 8 characters (uuids are long)."""
    return user_id[:8]


def user_traces(
    user_dir: Path,
    *,
    run_label: str,
    cycle: int | None = None,
) -> list[SessionTrace]:
    """Every finished period's sessions of the user whose episode folder is `user_dir`."""
    records = [load_record(p) for p in sorted(Path(user_dir).glob("period_*/record.json"))]
    if not records:
        return []
    user = records[0].user_id
    where = f"cycle {cycle} · " if cycle is not None else ""
    session_id = f"{run_label} · {where}{short_user(user)}"
    tags = {"memloop.user": user}
    if cycle is not None:
        tags["memloop.cycle"] = str(cycle)
    said: list[dict[str, str]] = []  # every message of the episode so far (the writer's source)
    out = []
    # every question of the episode: a wrong answer's failure class looks up the state query
    # of the period its fact was written in
    questions = {
        r.period: [QuestionRecord.model_validate(d) for d in r.probes.get("questions", [])]
        for r in records
    }
    lookup = index_records(q for qs in questions.values() for q in qs)
    logs: list[dict[str, Any] | None] = []  # each period's turns.json (health reads them too)
    for record in records:
        logged_turns = _turns(period_dir(Path(user_dir), record.period) / TURNS_FILE)
        logs.append(logged_turns)
        turns = list(logged_turns.get("sessions", []))
        for s, session in enumerate(record.sessions):
            logged = turns[s] if s < len(turns) else []
            opening = session.messages[0]["content"] if session.messages else ""
            request = " ".join(opening.split())[:PREVIEW_CHARS] or "(no message)"
            root = Span(
                f"{short_user(user)} · period {record.period} · session {s}",
                "AGENT",
                inputs={
                    "messages": [{"role": "user", "content": request}],
                    "session_time": session.session_time,
                    "turns": len(session.messages) // 2,
                },
                attributes={"period": record.period, "session": s, "mode": record.mode},
            )
            added: list[str] = []
            removed: list[str] = []
            for i in range(0, len(session.messages) - 1, 2):
                user_msg, reply = session.messages[i], session.messages[i + 1]
                said += [user_msg, reply]
                entry = logged[i // 2] if i // 2 < len(logged) else {}
                root.children.append(_turn(i // 2 + 1, user_msg, reply, entry, said))
                added += entry.get("added", [])
                removed += entry.get("removed", [])
            probes = None
            assessments: list[Assessment] = []
            if s == len(record.sessions) - 1 and record.probes:
                probes = probes_span(
                    record, questions[record.period], logged_turns.get("probe_calls", [])
                )
                root.children.append(probes)
                assessments = question_assessments(questions[record.period], lookup)
            response = _stored(added, removed, probes.outputs if probes else None)
            # what a reader looks for first: what this session left in memory
            root.outputs = {
                "choices": [{"index": 0, "message": {"role": "assistant", "content": response}}],
                "memory lines added": added,
                "memory lines removed": removed,
            }
            if probes is not None:
                root.outputs["probes"] = probes.outputs
            key = f"{where}{user} · period {record.period} · session {s}"
            out.append(
                SessionTrace(
                    key=key,
                    session_id=session_id,
                    user=user,
                    tags={**tags, "memloop.period": str(record.period), "memloop.session": str(s)},
                    root=root,
                    request_preview=request,
                    response_preview=response,
                    assessments=assessments,
                )
            )
    _health_assessments(records, logs, out)
    return out


def _health_assessments(
    records: list[Any], logs: list[dict[str, Any] | None], traces: list[SessionTrace]
) -> None:
    """Each memory-health alarm the user tripped, as a feedback on the trace where it fired.

    That is the last session of the period the alarm's rule first held in (feedback/health.py);
    `logs`: each period's turns.json, as the traces read them.
    """
    from memloop.feedback.health import ALARMS, alarms, user_health

    for alarm in alarms(user_health(records, logs)):
        last = [t for t in traces if t.root.attributes.get("period") == alarm.period][-1:]
        meaning, threshold = ALARMS[alarm.name]
        for trace in last:
            trace.assessments.append(
                Assessment(
                    "memory_health",
                    alarm.name,
                    f"{meaning}: {alarm.value:g} at period {alarm.period} "
                    f"(the alarm's threshold: {threshold:g})",
                )
            )


def _stored(added: list[str], removed: list[str], probes: dict[str, int] | None) -> str:
    """The trace list's Response column: what memory gained and lost, then the probes."""
    parts = [f"+{len(added)} / -{len(removed)} memory lines"]
    # a line ending in ':' is a view's heading ("Memory (label: value):"), not a stored fact
    facts = [line for line in added if not line.rstrip().endswith(":")]
    if facts:
        parts.append(f"first added: {facts[0][:120]}")
    if probes is not None:
        parts.append(f"probes {probes['right']}/{probes['questions']} right")
    return "; ".join(parts)


def _turns(path: Path) -> dict[str, Any]:
    """The period's turns.json (empty for a run made before it was written)."""
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()))


def _turn(
    n: int,
    user_msg: dict[str, str],
    reply: dict[str, str],
    entry: dict[str, Any],
    said: list[dict[str, str]],
) -> Span:
    span = Span(
        f"turn {n}",
        "CHAT_MODEL",
        inputs={"messages": [user_msg]},
        outputs={"choices": [{"index": 0, "message": reply, "finish_reason": "stop"}]},
    )
    span.children += [call_span(call) for call in entry.get("calls", [])]
    written = int(entry.get("written", 0))
    added, removed = entry.get("added", []), entry.get("removed", [])
    if written or added or removed:
        unwritten = int(entry.get("unwritten", 0))
        end = len(said) - unwritten
        span.children.append(
            Span(
                "memory write",
                "MEMORY",
                inputs={"messages handed to memory": said[max(0, end - written) : end]},
                outputs={"added": added, "removed": removed},
                attributes={"messages_written": written, "lines_added": len(added)},
            )
        )
    return span


def call_span(call: dict[str, Any]) -> Span:
    """One model call as it was made (llm/calls.py).

    Its messages in, its raw output out; its model, tokens (MLflow's own token usage too),
    latency and whether the response cache answered.
    """
    return Span(
        f"{call['component']} · {call['model']}",
        "CHAT_MODEL",
        inputs={"messages": call["messages"]},
        outputs={
            "choices": [{"index": 0, "message": {"role": "assistant", "content": call["output"]}}]
        },
        attributes={
            "component": call["component"],
            "model": call["model"],
            "prompt_tokens": call["prompt_tokens"],
            "completion_tokens": call["completion_tokens"],
            "latency_s": call["latency_s"],
            "cache_hit": call["cached"],
            "mlflow.chat.tokenUsage": {
                "input_tokens": call["prompt_tokens"],
                "output_tokens": call["completion_tokens"],
                "total_tokens": call["prompt_tokens"] + call["completion_tokens"],
            },
        },
        start_ns=call["start_ns"],
        end_ns=call["end_ns"],
    )


def probes_span(
    record: PeriodRecord,
    questions: list[QuestionRecord],
    calls: list[dict[str, Any]] | None = None,
) -> Span:
    """The period's evaluation: the memory the probes read and every question's outcome."""
    probes = record.probes
    span = Span(
        f"probes after period {record.period}",
        "EVALUATOR",
        inputs={"memory": probes.get("memory_view", "")},
    )
    right = 0
    for q in questions:
        verdict = "unparsed" if q.unparsed else ("right" if q.correct else "wrong")
        right += q.correct
        state = {
            var: {
                "answer": q.state_answers.get(var),
                "truth": truth,
                **({"P(truth)": q.state_probs[var]} if q.state_probs.get(var) is not None else {}),
            }
            for var, truth in q.true_values.items()
        }
        span.children.append(
            Span(
                f"question {q.question_index + 1} · {verdict}",
                "EVALUATOR",
                inputs={
                    "question": q.question,
                    "choices": [option_text(i, c) for i, c in enumerate(q.choices)],
                },
                outputs={
                    "answer": None
                    if q.chosen_index is None
                    else option_text(q.chosen_index, q.choices[q.chosen_index]),
                    "truth": option_text(q.gold_index, q.choices[q.gold_index]),
                    "state (from written memory)": state,
                },
                attributes={"correct": q.correct},
            )
        )
    span.outputs = {"right": right, "questions": len(span.children)}
    span.children += [call_span(call) for call in calls or []]
    return span


def question_assessments(
    questions: list[QuestionRecord], lookup: dict[tuple[str, int, int], QuestionRecord]
) -> list[Assessment]:
    """Each of the period's questions' results: right or its failure class, and P(truth).

    One feedback per question for both (each is a store transaction of its own): `right`, or
    the class of the wrong answer's failure.
    """
    out = []
    for q in questions:
        chosen = q.chosen_index
        answer = "no answer" if chosen is None else option_text(chosen, q.choices[chosen])
        truth = option_text(q.gold_index, q.choices[q.gold_index])
        where = f"question {q.question_index + 1}: answered {answer}; truth {truth}"
        out.append(Assessment("result", classify_failure(q, lookup) or "right", where))
        probs = [p for p in q.state_probs.values() if p is not None]
        if probs:
            mean = sum(probs) / len(probs)
            out.append(Assessment("P(truth)", mean, f"{where}; mean of {len(probs)} variable(s)"))
    return out


def episode_traces(
    episodes: Path,
    *,
    run_label: str,
    cycle: int | None = None,
    splits: dict[str, str] | None = None,
) -> list[SessionTrace]:
    """`user_traces` of every user folder in `episodes` (e.g. cycle_00/episodes).

    `splits` names each user's split (by user id).
    """
    out = []
    for user_dir in sorted(p for p in Path(episodes).iterdir() if p.is_dir()):
        traces = user_traces(user_dir, run_label=run_label, cycle=cycle)
        for t in traces:
            split = (splits or {}).get(t.user)
            if split is not None:
                t.tags["memloop.split"] = split
        out += traces
    return out
