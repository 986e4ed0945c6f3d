"""State accuracy is memory-isolated: the state query reads written memory only.

Checked where the property can be seen: in the requests the state queries send. Also the values
of `state_raw_only_share` and `factual_recall_ceiling` (feedback.exposure) on hand-built records.
"""

from __future__ import annotations

import json

import pytest

from memloop.environment.episode import PeriodRecord, SessionLog, load_record
from memloop.environment.procedural import generate_procedural
from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
from memloop.feedback.exposure import exposure_fields
from memloop.feedback.probes import MC_PROMPT, STATE_PROMPT
from memloop.feedback.records import QuestionRecord
from memloop.feedback.report import build_metrics
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.policies import build_policy
from memloop.policies.config import AWIConfig
from memloop.testing import FakeOpenAIServer, ScriptedMemoryLLM

STATE_MARK = STATE_PROMPT.splitlines()[0][:40]
MC_MARK = MC_PROMPT.splitlines()[0][:15]


def _text(body):
    return "\n".join(str(m.get("content", "")) for m in body["messages"])


def _probe_answer(text, body):
    props = body["response_format"]["json_schema"]["schema"]["properties"]
    if "answer" in props:
        return {"answer": 1}
    return {k: (spec["enum"][0] if "enum" in spec else "no") for k, spec in props.items()}


def test_no_state_query_carries_the_users_raw_words(tmp_path):
    # AWI(2,4) with a writer that stores nothing: everything the user said stays raw or is lost
    items = generate_procedural(users=1, periods=2, questions=2, seed=5, choices_per_state=4)
    llm = ScriptedMemoryLLM(writer=lambda text, body: [], probe=_probe_answer)
    with FakeOpenAIServer(reply=llm) as fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "c")
        config = AWIConfig(update_freq=2, short_term_len=4)
        run_evaluation(
            items,
            lambda uid, wd, c: build_policy(config, c, wd),
            tmp_path / "out",
            clients=RoleClients.single(client),
            settings=EvaluationSettings(progress=False),
        )
        bodies = list(fake.requests)
    said = [s.query for p in items[0].periods for s in p.sessions]
    state_queries = [b for b in bodies if STATE_MARK in _text(b)]
    choices = [b for b in bodies if MC_MARK in _text(b) and "Here is my current" not in _text(b)]
    # 2 questions; nothing is ever written, so a question's state query is the same request in
    # every period and the response cache answers the repeats: the raw buffer would have made
    # them differ
    assert len(state_queries) == 2
    for body in state_queries:
        assert not any(words in _text(body) for words in said)
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
    # multiple choice keeps the paper's full context: the raw recent turns are there
    assert any(any(words in _text(b) for words in said) for b in choices)
    # AWI(2,4) hands the oldest 2 messages to the writer once 6 wait: after n messages (n even)
    # min(n, 4) are unwritten; the probe records exactly that
    total = 0
    for path in sorted((tmp_path / "out" / "episodes").glob("*/period_*/record.json")):
        record = load_record(path)
        total += sum(len(s.messages) for s in record.sessions)
        assert record.probes["unwritten_messages"] == min(total, 4)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    records = [load_record(p) for p in (tmp_path / "out" / "episodes").glob("*/*/record.json")]
    assert {k: metrics[k] for k in exposure_fields(records)} == exposure_fields(records)
    assert 0 < metrics["state_raw_only_share"] < 1


def _question(period, values):
    return QuestionRecord(
        user_id="u",
        period=period,
        question_index=0,
        question="q",
        choices=["a", "b"],
        required_info=list(values),
        gold_index=0,
        true_values=values,
        write_periods=dict.fromkeys(values, 0),
        state_answers=dict(values),
    ).model_dump(mode="json")


def _session(i, exposed):
    return SessionLog(
        session_index=i,
        session_time="",
        exposed_states=exposed,
        messages=[{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
    )


def _records():
    # period 0: session 0 reveals a=x, session 1 reveals b=y; 2 of 4 messages unwritten at the
    # probe, so session 0 was handed to the writer and session 1 was not
    p0 = PeriodRecord(
        user_id="u",
        period=0,
        mode="on_policy",
        sessions=[_session(0, {"a": "x"}), _session(1, {"b": "y"})],
        probes={"questions": [_question(0, {"a": "x", "b": "y"})], "unwritten_messages": 2},
    )
    # period 1: a becomes z, revealed in session 0; everything written by the probe
    p1 = PeriodRecord(
        user_id="u",
        period=1,
        mode="on_policy",
        sessions=[_session(0, {"a": "z"})],
        probes={"questions": [_question(1, {"a": "z"})], "unwritten_messages": 0},
    )
    return [p0, p1]


def test_raw_only_share_and_recall_ceiling_values():
    records = _records()
    # over both periods: 3 state pairs, one raw only (b=y at period 0); at the end a=z and b=y
    # were both handed to the writer
    assert exposure_fields(records) == {
        "state_raw_only_share": pytest.approx(1 / 3),
        "state_raw_only_pairs": 1,
        "factual_recall_ceiling": 1.0,
    }
    # period 0 alone: 1 of 2 pairs raw only; of the claims a=x, b=y only a=x was writable
    assert exposure_fields(records[:1], 0) == {
        "state_raw_only_share": 0.5,
        "state_raw_only_pairs": 1,
        "factual_recall_ceiling": 0.5,
    }
    metrics, _ = build_metrics(records)
    assert metrics["state_raw_only_share"] == pytest.approx(1 / 3)
    assert [row["state_raw_only_share"] for row in metrics["per_period"]] == [0.5, 0.0]
    assert [row["factual_recall_ceiling"] for row in metrics["per_period"]] == [0.5, 1.0]


def test_a_record_without_the_unwritten_count_gives_no_number():
    records = _records()
    del records[1].probes["unwritten_messages"]
    assert exposure_fields(records) == {
        "state_raw_only_share": None,
        "state_raw_only_pairs": None,
        "factual_recall_ceiling": None,
    }


def test_recall_never_exceeds_what_memory_could_hold():
    from memloop.feedback.records import PeriodRecall, RecallClaim

    records = _records()
    # a checker that supports every claim, at period 0: b=y was never handed to the writer
    records[0].probes["recall"] = PeriodRecall(
        user_id="u",
        period=0,
        claims=[
            RecallClaim(variable="a", value="x", supported=True, period=0),
            RecallClaim(variable="b", value="y", supported=True, period=0),
        ],
    ).model_dump(mode="json")
    metrics, _ = build_metrics(records[:1])
    assert metrics["factual_recall"] == 0.5 == metrics["factual_recall_ceiling"]
