"""Probes and the evaluation wiring against a loopback fake model: records, metrics.json
fields and identities, the plot, and a rerun that makes no model call."""

from __future__ import annotations

import json

import pytest

from memloop.environment.procedural import generate_procedural
from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.testing import FakeOpenAIServer, ScriptedPolicy, request_schema


def fake_reply(body):
    schema = request_schema(body)
    if schema is None:
        return "Tell me more about that."
    props = schema["properties"]
    if "answer" in props:
        return json.dumps({"answer": 2})  # the "upper bound" model always picks option 2
    return json.dumps({k: "yes" for k in props})  # the recall checker supports every claim


def test_evaluation_outputs_and_rerun_without_calls(tmp_path):
    items = generate_procedural(users=2, periods=2, questions=3, seed=11)
    with FakeOpenAIServer(reply=fake_reply) as fake:
        client = ChatClient(
            Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "c.sqlite"
        )
        factory = lambda uid, wd, c: ScriptedPolicy(garble_every=3)  # noqa: E731
        first = run_evaluation(
            items,
            factory,
            tmp_path / "out",
            clients=RoleClients.single(client),
            settings=EvaluationSettings(progress=False),
        )
        sent = len(fake.requests)
        again = run_evaluation(
            items,
            factory,
            tmp_path / "out",
            clients=RoleClients.single(client),
            settings=EvaluationSettings(progress=False),
        )
        assert len(fake.requests) == sent  # rerun: no model call at all
    assert first.new_requests == sent and again.new_requests == 0
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m == again.metrics == json.loads(json.dumps(first.metrics))
    for key in (
        "overall",
        "random",
        "upper_bound",
        "memory_score",
        "per_period",
        "diagnosis",
        "factual_recall",
        "usage",
    ):
        assert key in m
    assert m["users"] == 2 and m["periods"] == 3 and m["questions"] == 2 * 3 * 3
    d = m["diagnosis"]
    assert d["format"] + d["write"] + d["read"] + d["utilization"] == pytest.approx(
        1 - m["overall"]
    )
    assert m["json_errors"] > 0
    assert d["format"] == pytest.approx(m["json_errors"] / m["questions"])
    # the fake checker supports everything: it fails its calibration, so recall is not reported
    cal = m["checker_calibration"]
    assert (cal["false_positive_rate"], cal["false_negative_rate"]) == (1.0, 0.0)
    assert m["factual_recall"] is None and m["factual_recall_per_period"] is None
    assert m["factual_recall_null_reason"] == (
        f"checker false-positive rate 1.00 > 0.10 on {cal['n_negative']} known-false claims"
    )
    assert set(m["usage"]) >= {"probe", "checker"}
    rows = [
        json.loads(line) for line in (tmp_path / "out" / "records.jsonl").read_text().splitlines()
    ]
    assert len(rows) == m["questions"]
    assert all(r["chosen_index"] in (0, None) for r in rows)
    assert sum(r["correct"] for r in rows) / len(rows) == pytest.approx(m["overall"])
    assert all(r["ub_chosen_index"] == 1 for r in rows)
    # the no-memory control: the same fake LLM, so also option 2 every time
    assert all(r["nm_chosen_index"] == 1 for r in rows)
    no_memory = sum(r["gold_index"] == 1 for r in rows) / len(rows)
    assert m["no_memory"] == pytest.approx(no_memory)
    assert m["memory_gain"] == pytest.approx(m["overall"] - no_memory)
    pairs = [(r, v) for r in rows for v in r["required_info"]]
    right = sum(r["state_answers"][v] == r["true_values"][v] for r, v in pairs)
    assert m["state_pairs"] == len(pairs)
    assert m["state_accuracy"] == pytest.approx(right / len(pairs))
    chance = sum(1 / r["state_choices"][v] for r, v in pairs) / len(pairs)
    assert m["state_chance"] == pytest.approx(chance)
    ratio = (sum(r["correct"] for r in rows) - sum(1 / len(r["choices"]) for r in rows)) / (
        sum(r["ub_correct"] for r in rows) - sum(1 / len(r["choices"]) for r in rows)
    )
    assert m["memory_score"] == pytest.approx(ratio)
    assert (tmp_path / "out" / "per_period.png").stat().st_size > 5000
    for p in m["per_period"]:
        pd = p["diagnosis"]
        assert sum(pd.values()) == pytest.approx(1 - p["overall"])


def test_one_endpoint_rule_a_role_without_a_file_uses_the_agents(tmp_path, monkeypatch):
    """runs.inputs.roles, used by eval, policy check, evolve and tune: a role without an endpoint
    file is on the agent's endpoint (not on the embedded default model); no agent file is the
    embedded model. eval's --endpoint alone puts the simulator and the checker there too."""
    from memloop.environment.datafile import save_items
    from memloop.environment.procedural import generate_procedural
    from memloop.experiments.cli import main
    from memloop.llm.endpoint import Endpoint
    from memloop.llm.roles import ROLES
    from memloop.runs import inputs

    agent, sim = tmp_path / "e.yaml", tmp_path / "s.yaml"
    agent.write_text("model: hosted-a\nbase_url: http://127.0.0.1:9/v1\n")
    sim.write_text("model: hosted-s\nbase_url: http://127.0.0.1:9/v1\n")

    def models(c):
        return [getattr(c, role).endpoint.model for role in ROLES]

    assert models(inputs.roles(agent, cache=None)) == ["hosted-a"] * 4
    assert models(inputs.roles(agent, sim, cache=None)) == [
        "hosted-a",
        "hosted-s",
        "hosted-a",
        "hosted-a",
    ]
    assert models(inputs.roles(cache=None)) == [Endpoint().model] * 4
    both = inputs.roles(agent, cache=None)
    assert both.user_sim is both.agent  # one endpoint, one client (one cache, one bound)

    env = tmp_path / "env.json"
    save_items(generate_procedural(users=1, periods=1, questions=1, seed=0), env)
    seen = []

    class Stop(Exception):
        pass

    real = inputs.roles

    def record(*args, **kwargs):
        seen.append(models(real(*args, cache=None)))
        raise Stop

    monkeypatch.setattr(inputs, "roles", record)
    base = [
        "eval",
        "--env",
        str(env),
        "--policy",
        "memloop/experiments/policies/awi.yaml",
        "--out",
        str(tmp_path / "out"),
        "--endpoint",
        str(agent),
    ]
    for argv in (base, [*base, "--sim-endpoint", str(sim)]):
        with pytest.raises(Stop):
            main(argv)
    assert seen == [["hosted-a"] * 4, ["hosted-a", "hosted-s", "hosted-a", "hosted-a"]]
