"""AWE and RAG (mem0 1.x + in-memory Qdrant + the packaged MiniLM embedder) against a scripted
loopback LLM: what gets stored, UPDATE of a changed fact, top-k retrieval of a planted fact,
mem0's LLM calls routed through the ChatClient, failures not swallowed, and checkpoints."""

from __future__ import annotations

import json

import pytest

from memloop.core.errors import UserError
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.policies import AWEConfig, RAGConfig, build_policy
from memloop.testing.fake_server import FakeOpenAIServer
from memloop.testing.scripted_llm import (
    ScriptedMemoryLLM,
    actions_of,
    facts_of,
)


def test_awe_updates_a_changed_fact_through_our_client(mem0_fake, mem0_client, tmp_path):
    policy = build_policy(AWEConfig(update_freq=2, short_term_len=0), mem0_client, tmp_path / "w")
    policy.respond("[Current Time: 2024-01-06 19:40:00]\nHi, I live in Lisbon.")
    policy.respond("I play the cello on weekends.")
    assert policy.memory_texts() == ["Lives in Lisbon", "Plays the cello"]
    policy.respond("[Current Time: 2024-04-03 20:15:00]\nI just moved to Oslo!")
    assert policy.memory_texts() == ["Lives in Oslo", "Plays the cello"]
    assert policy.stats()["events_update"] == 1
    # mem0's extraction used our prompt as the system message, and its calls went through the
    # ChatClient with the "memory" tag and a JSON schema whose ids mem0 can resolve.
    extraction = mem0_fake.script.requests("facts")[0]
    assert extraction["messages"][0]["content"] == policy.prompts()["fact_extraction"]
    update = mem0_fake.script.requests("actions")[-1]
    id_schema = update["response_format"]["json_schema"]["schema"]["properties"]["memory"]["items"][
        "properties"
    ]["id"]
    assert id_schema["enum"] == ["0", "1", "new"]
    assert mem0_client.usage.component("memory").calls == len(
        mem0_fake.script.requests("facts")
    ) + len(mem0_fake.script.requests("actions"))
    answer = policy.answer("Which city do I live in?")
    assert "[2024-04-03 20:15:00] Lives in Oslo" in answer.retrieved_memories
    assert not any("Lisbon" in m for m in answer.retrieved_memories)
    policy.close()


def test_awe_with_prompts_reaches_mem0(mem0_fake, mem0_client, tmp_path):
    policy = build_policy(AWEConfig(update_freq=2, short_term_len=0), mem0_client, tmp_path)
    evolved = policy.with_prompts(
        {
            "fact_extraction": "Note the user's hobbies as JSON facts.",
            "memory_update": "Prefer UPDATE over ADD.",
        }
    )
    evolved.ingest("I play the cello.", "Lovely.")
    assert mem0_fake.script.requests("facts")[-1]["messages"][0]["content"] == (
        "Note the user's hobbies as JSON facts."
    )
    assert mem0_fake.script.requests("actions")[-1]["messages"][0]["content"].startswith(
        "Prefer UPDATE over ADD."
    )
    assert policy.prompts()["fact_extraction"] != evolved.prompts()["fact_extraction"]
    assert policy.memory_texts() == []
    for p in (policy, evolved):
        p.close()


def test_endpoint_failure_in_reconciliation_is_not_swallowed(tmp_path):
    script = ScriptedMemoryLLM(facts=facts_of, actions=actions_of)
    # The extraction call succeeds; mem0 would swallow the failure of the reconciliation call.
    with FakeOpenAIServer(reply=script, failures=[200, 400]) as server:
        client = ChatClient(
            Endpoint(model="m", base_url=server.base_url, max_retries=0), cache=None
        )
        policy = build_policy(AWEConfig(update_freq=2, short_term_len=0), client, tmp_path)
        with pytest.raises(UserError, match="HTTP 400"):
            policy.ingest("I live in Lisbon", "Nice.")
        policy.close()


def test_rag_stores_raw_messages_and_retrieves_a_planted_fact(mem0_fake, mem0_client, tmp_path):
    policy = build_policy(
        RAGConfig(update_freq=2, short_term_len=2, top_k=2), mem0_client, tmp_path
    )
    chatter = [
        "What a lovely day.",
        "I live in Lisbon, near the river.",
        "Any good films?",
        "I like jazz music.",
        "How do I cook rice?",
    ]
    for text in chatter:
        policy.respond(text)
    assert mem0_client.usage.component("memory").calls == 0  # RAG writes without any LLM
    stored = policy.memory_texts()
    assert "user: I live in Lisbon, near the river." in stored and len(stored) == 8
    view = policy.memory_view()
    answer = policy.answer("Which city do I live in?")
    assert len(answer.retrieved_memories) == 2
    assert "user: I live in Lisbon, near the river." in answer.retrieved_memories
    assert policy.memory_view() == view
    system = mem0_fake.script.requests("chat")[-1]["messages"][0]["content"]
    assert "I live in Lisbon" in system
    policy.close()


def test_rag_checkpoint_round_trip(mem0_fake, mem0_client, tmp_path):
    policy = build_policy(
        RAGConfig(update_freq=2, short_term_len=2, top_k=3), mem0_client, tmp_path
    )
    for text in (
        "[Current Time: 2024-01-01 09:00:00]\nI live in Lisbon.",
        "I play the cello.",
        "Tell me a joke.",
    ):
        policy.respond(text)
    policy.save(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["memories.json", "policy.json"]
    restored = build_policy(
        RAGConfig(update_freq=2, short_term_len=2, top_k=3), mem0_client, tmp_path
    ).load(tmp_path / "ckpt")
    assert restored.memory_view() == policy.memory_view()
    question = "What instrument do I play?"
    assert (
        restored.answer(question).retrieved_memories == policy.answer(question).retrieved_memories
    )
    for p in (policy, restored):
        p.close()


def test_awe_checkpoint_keeps_memories_and_prompts(mem0_fake, mem0_client, tmp_path):
    config = AWEConfig(update_freq=2, short_term_len=2)
    policy = build_policy(config, mem0_client, tmp_path).with_prompts(
        {"memory_update": "Prefer UPDATE."}
    )
    for text in ("I live in Lisbon.", "I play the cello.", "ok"):
        policy.respond(text)
    policy.save(tmp_path / "ckpt")
    restored = build_policy(config, mem0_client, tmp_path).load(tmp_path / "ckpt")
    assert restored.memory_view() == policy.memory_view()
    assert restored.prompts() == policy.prompts()
    assert restored.memory.config.custom_update_memory_prompt == "Prefer UPDATE."
    program = json.loads((tmp_path / "ckpt" / "program.json").read_text())
    assert set(program) >= {"fact_extraction", "memory_update"}
    assert "127.0.0.1" not in (tmp_path / "ckpt" / "program.json").read_text()
    for p in (policy, restored):
        p.close()


def test_close_removes_private_files(mem0_client, tmp_path):
    policy = build_policy(RAGConfig(), mem0_client, tmp_path / "work")
    private = policy._private_dir
    assert private.parent == tmp_path / "work" and (private / "mem0-history.sqlite").exists()
    policy.close()
    assert not private.exists()


def test_embedder_is_loaded_once(mem0_client, tmp_path):
    a = build_policy(RAGConfig(), mem0_client, tmp_path)
    b = build_policy(AWEConfig(), mem0_client, tmp_path)
    assert a.embedder.model is b.embedder.model and a.embedder.dims == 384
    for p in (a, b):
        p.close()


@pytest.mark.parametrize("config_type", [RAGConfig, AWEConfig])
def test_a_memory_only_answer_leaves_the_raw_buffer_out(
    mem0_fake, mem0_client, tmp_path, config_type
):
    policy = build_policy(
        config_type(update_freq=2, short_term_len=2, top_k=5), mem0_client, tmp_path
    )
    policy.respond("I live in Lisbon, near the river.")
    policy.respond("I work as a nurse on night shifts.")  # the newest turn, still raw
    assert policy.unwritten_messages() == 2
    policy.answer("Where do I live?")
    full = mem0_fake.script.requests("chat")[-1]["messages"]
    policy.answer("Where do I live?", memory_only=True)
    isolated = mem0_fake.script.requests("chat")[-1]["messages"]
    assert [m["content"] for m in full[1:3]] == [
        "I work as a nurse on night shifts.",
        full[2]["content"],
    ]
    assert [m["role"] for m in isolated] == ["system", "user"]
    assert not any("night shifts" in m["content"] for m in isolated)
    policy.close()
