"""`memloop env check`: exposure agreement per user and overall, against a scripted checker."""

from __future__ import annotations

import json

from memloop.environment.exposure_check import check_exposure
from memloop.environment.procedural import generate_procedural
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.testing.fake_server import FakeOpenAIServer


def test_agreement_counts_recovered_values(tmp_path):
    items = generate_procedural(users=2, periods=1, questions=2, seed=5)

    def reply(body):
        # the checker gets every variable right except the alphabetically first of each session
        props = body["response_format"]["json_schema"]["schema"]["properties"]
        text = body["messages"][-1]["content"]
        out = {}
        for i, (var, spec) in enumerate(sorted(props.items())):
            truth = next(
                item.state_at(p)[var]
                for item in items
                for p in range(2)
                for s in item.periods[p].sessions
                if s.query in text and var in s.exposed_states
            )
            out[var] = truth if i else next(v for v in spec["enum"] if v != truth)
        return json.dumps(out)

    with FakeOpenAIServer(reply=reply) as fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "c.db")
        report = check_exposure(items, client, progress=False)
    sessions = sum(len(p.sessions) for it in items for p in it.periods)
    assert len(report.sessions) == sessions == len(fake.requests)
    values = sum(len(s.intended) for s in report.sessions)
    assert report.rate() == (values - sessions) / values
    for item in items:
        assert report.rate(item.id) is not None
