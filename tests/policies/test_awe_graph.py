"""AWE's mem0 graph memory (`graph_store: {provider: kuzu}`) on real mem0 and a real embedded Kùzu
graph, with a scripted loopback LLM answering mem0's tool calls as JSON: relations are written,
updated and deleted by mem0's own graph code, reach the reply's context and the memory view, a
checkpoint restores the graph exactly, parallel users never share one, and a bad option is one
line naming the key."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from memloop.core.errors import UserError
from memloop.environment.policy_check import check_policy
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.policies import AWEConfig, build_policy, load_policy_config
from memloop.policies.external import as_tool_calls, tool_calls_schema
from memloop.testing import FakeOpenAIServer
from memloop.testing.policies import refused_in_one_line
from memloop.testing.scripted_llm import (
    ScriptedMemoryLLM,
    actions_of,
    called_functions,
    conversation_of,
    facts_of,
    loopback_client,
)

GRAPH = {"provider": "kuzu"}
CITY = "Which city do I live in?"
CITIES = ("Lisbon", "Oslo")


def graph_calls(text: str, body) -> list[dict]:
    """mem0's three graph requests, answered like a careful model."""
    (function,) = called_functions(body)
    said = conversation_of(body)
    if function == "extract_entities":
        entities = (
            [{"entity": "user", "entity_type": "person"}] if re.search(r"\bI\b", said) else []
        )
        entities += [{"entity": c, "entity_type": "city"} for c in CITIES if c in said]
        if "cello" in said:
            entities.append({"entity": "cello", "entity_type": "instrument"})
        return [{"entities": entities}]
    if function == "establish_relationships":
        said = said.split("Text:", 1)[-1]
        relations = [
            {"source": "user", "relationship": "lives_in", "destination": c}
            for c in CITIES
            if f"live in {c}" in said or f"moved to {c}" in said
        ]
        if "cello" in said:
            relations.append({"source": "user", "relationship": "plays", "destination": "cello"})
        return [{"entities": relations}]
    assert function == "delete_graph_memory"
    existing, new = said.split("New Information:", 1)
    return [
        {"source": "user", "relationship": "lives_in", "destination": old}
        for old in re.findall(r"user -- lives_in -- (\w+)", existing)
        if "moved to" in new and old.capitalize() not in new
    ]


@pytest.fixture
def fake():
    script = ScriptedMemoryLLM(facts=facts_of, actions=actions_of, tools=graph_calls)
    with FakeOpenAIServer(reply=script) as server:
        server.script = script
        yield server


@pytest.fixture
def client(fake, tmp_path):
    return loopback_client(fake, tmp_path)


def chat(policy, *texts: str) -> None:
    for text in texts:
        policy.respond(text)


def test_awe_writes_reads_and_checkpoints_a_graph(fake, client, tmp_path):
    config = AWEConfig(update_freq=2, short_term_len=0, graph_store=GRAPH)
    policy = build_policy(config, client, tmp_path / "w")
    chat(policy, "Hi, I live in Lisbon.", "I play the cello.")
    assert policy.relation_lines() == ["user -- lives_in -- lisbon", "user -- plays -- cello"]
    assert policy.memory_texts() == ["Lives in Lisbon", "Plays the cello"]  # the vector store too
    assert policy.memory_view() == (
        "Stored memories (2):\n- Lives in Lisbon\n- Plays the cello\n"
        "Graph relations (2):\n- user -- lives_in -- lisbon\n- user -- plays -- cello"
    )
    assert policy.stats()["relations"] == 2
    # the graph's relations of the entities in the message follow the memories in context
    assert policy.retrieve(CITY)[-2:] == ["user -- lives_in -- lisbon", "user -- plays -- cello"]
    policy.respond("Where should I eat tonight?")
    assert "user -- lives_in -- lisbon" in json.dumps(fake.script.requests("chat")[-1])

    # mem0's tool calls went through our client as JSON answers: no `tools` in any request
    tool_requests = fake.script.requests("tools")
    asked = [called_functions(b) for b in tool_requests]
    assert ["delete_graph_memory"] in asked and ["establish_relationships"] in asked
    assert not any("tools" in body for _, body in fake.script.log)

    policy.save(tmp_path / "ckpt")
    restored = build_policy(config, client, tmp_path / "w").load(tmp_path / "ckpt")
    assert restored.relation_lines() == policy.relation_lines()
    assert restored.retrieve(CITY) == policy.retrieve(CITY)
    restored.save(tmp_path / "again")  # nodes, embeddings, counts and times, byte for byte
    assert (tmp_path / "again" / "graph.json").read_bytes() == (
        tmp_path / "ckpt" / "graph.json"
    ).read_bytes()
    saved = json.loads((tmp_path / "ckpt" / "graph.json").read_text())
    assert [n["name"] for n in saved["nodes"]] == ["user", "lisbon", "cello"]
    assert len(saved["nodes"][0]["embedding"]) == saved["dims"] == 384

    # resuming equals going on: the move deletes lives_in lisbon and adds lives_in oslo
    for p in (policy, restored):
        chat(p, "[Current Time: 2024-04-03 20:15:00]\nI just moved to Oslo!")
    assert restored.relation_lines() == ["user -- lives_in -- oslo", "user -- plays -- cello"]
    assert restored.memory_view() == policy.memory_view()
    assert restored.retrieve(CITY) == policy.retrieve(CITY)
    for p in (policy, restored):
        p.close()
        p.close()  # twice is safe


def test_parallel_users_each_have_their_own_graph(client, tmp_path):
    config = AWEConfig(update_freq=2, short_term_len=0, graph_store=GRAPH)

    def user(name: str, city: str) -> list[str]:
        policy = build_policy(config, client, tmp_path / name)
        try:
            chat(policy, f"Hi, I live in {city}.", "Nice to meet you.")
            return policy.relation_lines()
        finally:
            policy.close()

    with ThreadPoolExecutor(2) as pool:
        lines = list(pool.map(user, ["ana", "ola"], CITIES))
    assert lines == [["user -- lives_in -- lisbon"], ["user -- lives_in -- oslo"]]


def test_awe_with_a_graph_meets_the_policy_contract(client, tmp_path):
    config = AWEConfig(update_freq=2, short_term_len=0, graph_store=GRAPH)
    report = check_policy(lambda: build_policy(config, client, tmp_path / "work"), workdir=tmp_path)
    assert report.ok and len(report.checks) > 20
    assert list((tmp_path / "work").iterdir()) == []  # closed policies leave no files


def test_a_broken_graph_answer_counts_as_a_read_or_a_write_error(tmp_path):
    def broken_on_questions(text, body):
        if "?" in conversation_of(body):
            return '{"calls": "not a list"}'
        return graph_calls(text, body)

    script = ScriptedMemoryLLM(facts=facts_of, actions=actions_of, tools=broken_on_questions)
    with FakeOpenAIServer(reply=script) as server:
        client = ChatClient(Endpoint(model="m", base_url=server.base_url))
        config = AWEConfig(update_freq=2, short_term_len=0, graph_store=GRAPH)
        policy = build_policy(config, client, tmp_path / "w")
        chat(policy, "Hi, I live in Lisbon.", "Do you like music?")
        # two writes (one per turn): the second's excerpt holds a question, so its three graph
        # answers (entities, relations, deletions) broke; one retrieval (the question's) broke
        assert policy.relation_lines() == ["user -- lives_in -- lisbon"]
        assert (policy.stats()["write_errors"], policy.stats()["read_errors"]) == (3, 1)
        policy.retrieve(CITY)
        assert (policy.stats()["write_errors"], policy.stats()["read_errors"]) == (3, 2)
        policy.save(tmp_path / "ckpt")
        restored = build_policy(config, client, tmp_path / "w").load(tmp_path / "ckpt")
        assert (restored.stats()["write_errors"], restored.stats()["read_errors"]) == (3, 2)
        for p in (policy, restored):
            p.close()


def test_tool_calls_as_json_round_trip():
    one = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    two = [*one, {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}]
    assert tool_calls_schema(one)["properties"]["calls"]["items"] == {"type": "object"}
    assert as_tool_calls(one, {"calls": [{"a": 1}, {}]}) == [
        {"name": "f", "arguments": {"a": 1}},
        {"name": "f", "arguments": {}},
    ]
    names = [
        i["properties"]["name"]["enum"]
        for i in tool_calls_schema(two)["properties"]["calls"]["items"]["anyOf"]
    ]
    assert names == [["f"], ["g"]]
    assert as_tool_calls(two, {"calls": [{"name": "g", "arguments": {"b": 2}}]}) == [
        {"name": "g", "arguments": {"b": 2}}
    ]


@pytest.mark.parametrize(
    ("kind", "option", "message"),
    [
        (
            "awe",
            "{provider: neo4j, config: {url: u}}",
            "key 'graph_store.provider': mem0's neo4j graph lives on a server where every user "
            "would share one graph",
        ),
        ("awe", "{provider: kuzu, config: {db: g.kuzu}}", "key 'graph_store.config.db': memloop"),
        ("awe", "{provider: kuzu, threshold: 2}", "key 'graph_store.threshold': Input should be"),
        (
            "awe",
            "{provider: kuzu, llm: {provider: openai}}",
            "key 'graph_store.llm': memloop routes",
        ),
        ("awe", "{threshold: 0.5}", "key 'graph_store.provider': name the graph store"),
        ("awe", "{provider: nebula}", "key 'graph_store.provider': mem0 has no graph store"),
        ("awe", "{provider: kuzu, depth: 3}", "key 'graph_store.depth': unknown key"),
        ("rag", "{provider: kuzu}", "key 'graph_store': RAG writes raw messages without an LLM"),
    ],
)
def test_a_bad_graph_option_is_one_line_naming_the_key(tmp_path, kind, option, message):
    refused_in_one_line(tmp_path, f"type: {kind}\ngraph_store: {option}\n", message)


def test_the_graph_option_is_part_of_the_policy(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("type: awe\ngraph_store: {provider: kuzu, threshold: 0.9}\n")
    config = load_policy_config(path)
    assert config.model_dump()["graph_store"] == {"provider": "kuzu", "threshold": 0.9}
    assert "graph_store" not in AWEConfig().model_dump()
    assert (config.default_name(), AWEConfig().default_name()) == ("awe-2-4-30-graph", "awe-2-4-30")


def test_tune_can_search_the_graphs_threshold():
    from memloop.optimize.tune import apply_params

    tuned = apply_params(AWEConfig(graph_store=GRAPH), {"graph_store.threshold": 0.85}, "t.yaml")
    assert tuned.graph_store == {"provider": "kuzu", "threshold": 0.85}
    with pytest.raises(UserError, match="graph_store.threshold"):
        apply_params(AWEConfig(graph_store=GRAPH), {"graph_store.threshold": 1.5}, "t.yaml")
