"""The four policies on the embedded 0.5B model (the session's one shared server).

On a tiny two-period conversation: every policy passes check_policy (probes leave memory
byte-identical, prompts / with_prompts / save / load round-trip), AWE retrieves a planted fact,
and AWI's memory follows a change of city. Replies are capped at a few tokens to keep the suite
fast; memory writes keep the endpoint's cap.
"""

from __future__ import annotations

import pytest

from memloop.environment.policy_check import check_policy
from memloop.policies import AWEConfig, AWIConfig, NativeConfig, RAGConfig, build_policy
from memloop.testing.paths import REPO

pytestmark = pytest.mark.real_model

PERIOD_1 = [
    "[Current Time: 2024-01-06 19:40:00]\nHi! I just moved to Lisbon. I live in Lisbon "
    "now and work as a nurse.",
    "Can you suggest a weekend hobby?",
]
PERIOD_2 = [
    "[Current Time: 2024-04-03 20:15:00]\nBig change: I moved again. I live in Oslo now, "
    "not Lisbon.",
    "Can you suggest a winter hobby?",
]
REPLY_TOKENS = 24
# The same configurations and conversation as the check_policy runs below, so the scenario tests
# reuse their cached calls: (2, 2) writes the oldest turn once two newer messages wait.
AWI = AWIConfig(update_freq=2, short_term_len=2, reply_max_tokens=REPLY_TOKENS)
AWE = AWEConfig(update_freq=2, short_term_len=2, top_k=5, reply_max_tokens=REPLY_TOKENS)
RAG = RAGConfig(update_freq=2, short_term_len=2, top_k=5, reply_max_tokens=REPLY_TOKENS)
NATIVE = NativeConfig(reply_max_tokens=REPLY_TOKENS)
PROBE = "Which city do I live in?"


@pytest.mark.parametrize("config", [NATIVE, AWI, AWE, RAG], ids=lambda c: c.type)
def test_check_policy_on_the_embedded_model(local_client, tmp_path, config):
    # Two turns (one memory write), then ten probes (two distinct requests: with and without a
    # JSON schema), save/load, with_prompts, an ingest replay and a second identical run.
    report = check_policy(
        lambda: build_policy(config, local_client, tmp_path / "work"),
        conversation=PERIOD_1,
        probes=(PROBE,),
        probe_rounds=10,
        workdir=tmp_path,
    )
    assert report.ok


def test_the_example_plugin_on_the_embedded_model(local_client, tmp_path):
    # examples/keyword_memory through the registry (type: file.py:Class), on the real model

    from memloop.policies import load_policy_config

    example = REPO / "examples" / "keyword_memory"
    policy = tmp_path / "keyword.yaml"
    policy.write_text(
        f"type: {example / 'keyword_memory.py'}:KeywordMemory\ntop_k: 2\n"
        f"max_tokens: {REPLY_TOKENS}\n"
    )
    config = load_policy_config(policy)
    report = check_policy(
        lambda: build_policy(config, local_client, tmp_path / "work"),
        conversation=PERIOD_1,
        probes=(PROBE,),
        probe_rounds=3,
        workdir=tmp_path,
    )
    assert report.ok
    plugin = build_policy(config, local_client, tmp_path / "work")
    plugin.respond(PERIOD_2[0])
    answer = plugin.answer("Where do I live now, after moving again?")
    assert "Oslo" in answer.retrieved_memories[0]  # shares most words (live, now, again)
    assert answer.text.strip()
    plugin.close()


def test_awi_memory_follows_a_change_of_city(local_client, tmp_path):
    # Off-policy replay with fixed replies: the writer sees exactly the user's statements.
    # (4, 0): one write per period, of both its turns.
    policy = build_policy(AWIConfig(update_freq=4, short_term_len=0), local_client, tmp_path)
    for message in PERIOD_1:
        policy.ingest(message, "Got it, thanks for letting me know.")
    first = {label: fact["value"] for label, fact in policy.facts.items()}
    # the 0.5B model writes the city as "Lisboa" (its Portuguese name): either spelling is Lisbon
    assert any("lisbo" in v.lower() for v in first.values()), first
    for message in PERIOD_2:
        policy.ingest(message, "Got it, thanks for letting me know.")
    now = {label: fact["value"] for label, fact in policy.facts.items()}
    assert any("oslo" in v.lower() for v in now.values()), now
    # The label that held Lisbon now holds Oslo: overwritten, not duplicated.
    city_label = next(label for label, v in first.items() if "lisbo" in v.lower())
    assert "oslo" in now.get(city_label, "").lower(), now
    assert policy.stats()["write_errors"] == 0 and policy.writes == 2
    policy.close()


def test_awe_retrieves_a_planted_fact(local_client, tmp_path):
    policy = build_policy(AWE, local_client, tmp_path)
    for message in PERIOD_1:
        policy.respond(message)
    assert policy.memory_texts(), "AWE stored nothing"
    view = policy.memory_view()
    answer = policy.answer(PROBE)
    assert any("lisbon" in m.lower() for m in answer.retrieved_memories), (
        answer.retrieved_memories,
        view,
    )
    assert policy.memory_view() == view
    policy.close()


def test_awi_writes_nothing_from_a_conversation_without_user_facts(local_client, tmp_path):
    # issue 16's "New York" case: the writer once stored the prompt's own example value whatever
    # the user said; a question, small talk and thanks give it no fact about the user
    policy = build_policy(AWI, local_client, tmp_path / "work")
    for message in (
        "Hi! Can you tell me a joke about cats?",
        "What is the capital of France?",
        "Thanks, that was funny. Which one is bigger, a lion or a tiger?",
    ):
        policy.respond(message)
    assert policy.writes >= 1  # the writer ran on the oldest turns and wrote nothing
    assert policy.memory_view() == ""


def test_awe_graph_memory_on_the_embedded_model(local_client, tmp_path):
    # mem0's own graph code on a real Kùzu graph, its tool calls answered by the embedded model
    # as JSON through memloop's client: each answer parses, and what it wrote survives a
    # checkpoint. (The 0.5B model's relations are poor; what they say is not asserted.)
    config = AWEConfig(update_freq=2, short_term_len=0, graph_store={"provider": "kuzu"})
    policy = build_policy(config, local_client, tmp_path / "work")
    before = local_client.usage.summary().get("memory", {}).get("calls", 0)
    policy.graph.add("I live in Lisbon and I play the cello.", {"user_id": "user"})
    # entities, relations, deletions (asked even of an empty graph)
    assert local_client.usage.summary()["memory"]["calls"] == before + 3
    assert policy.llm.schema_failures == 0
    relations = policy.relation_lines()
    assert relations, "the graph holds no relation"
    policy.save(tmp_path / "ckpt")
    restored = build_policy(config, local_client, tmp_path / "work").load(tmp_path / "ckpt")
    assert restored.relation_lines() == relations
    assert restored.memory_view() == policy.memory_view() != ""
    for p in (policy, restored):
        p.close()


def test_the_writer_with_dspys_chat_adapter_on_the_embedded_model(
    local_client, tmp_path, monkeypatch
):
    """`adapter: chat`: the writer's request carries DSPy's field markers and no JSON schema;
    the model's reply is parsed into edits or counted as a write error, on the real model."""
    from memloop.policies.config import AWIConfig

    sent: list[tuple[list, object]] = []
    real_chat = local_client.chat

    def noted(messages, *args, **kwargs):
        if kwargs.get("component") == "memory":
            sent.append((messages, kwargs.get("schema")))
        return real_chat(messages, *args, **kwargs)

    monkeypatch.setattr(local_client, "chat", noted)
    config = AWIConfig(adapter="chat", update_freq=2, short_term_len=0, reply_max_tokens=16)
    assert config.display_name == "awi-2-0-chat"
    policy = build_policy(config, local_client, tmp_path / "work")
    policy.ingest(PERIOD_1[0], "Nice to meet you.")
    stats = policy.stats()
    assert stats["writes"] + stats["write_errors"] == 1  # the writer was asked once
    ((messages, schema),) = sent
    assert schema is None
    assert "[[ ## edits ## ]]" in messages[0]["content"]
