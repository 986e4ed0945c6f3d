"""AWE's and RAG's mem0 options against real mem0 and real vector stores (qdrant on disk, faiss),
with the scripted loopback LLM of memloop.testing.scripted_llm: memories land in each user's folder,
checkpoints restore them (a store that lists no vectors gets them from the embedder), parallel
users never share a store, bad options are one line naming the key, and a policy without the
option keeps its identity (graph memory: test_awe_graph)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import memloop
from memloop.core.errors import UserError
from memloop.core.files import json_sha256
from memloop.environment.policy_check import check_policy
from memloop.policies import AWEConfig, RAGConfig, build_policy, load_policy_config
from memloop.policies.mem0_options import collection_for, mem0_vector_store
from memloop.testing.policies import refused_in_one_line

SHIPPED = Path(memloop.__file__).parent / "experiments" / "policies"
QDRANT_ON_DISK = {"provider": "qdrant", "config": {"on_disk": True}}
FAISS = {"provider": "faiss"}
CITY = "Which city do I live in?"


def chat(policy, *texts: str) -> None:
    for text in texts:
        policy.respond(text)


def same_memory(a, b, question: str = CITY) -> None:
    assert a.memory_texts() == b.memory_texts()
    assert a.memory_view() == b.memory_view()
    assert a.retrieve(question) == b.retrieve(question)


def test_awe_on_qdrant_on_disk_checkpoint_and_resume(mem0_fake, mem0_client, tmp_path):
    config = AWEConfig(update_freq=2, short_term_len=0, vector_store=QDRANT_ON_DISK)
    workdir = tmp_path / "alice" / "workdir"
    policy = build_policy(config, mem0_client, workdir)
    chat(policy, "[Current Time: 2024-01-06 19:40:00]\nHi, I live in Lisbon.", "I play the cello.")
    assert policy.memory_texts() == ["Lives in Lisbon", "Plays the cello"]
    # on disk, in this user's folder: qdrant's local storage of the collection "memories"
    store = policy._private_dir / "vector-store"
    assert store.parent.parent == workdir
    assert (store / "collection" / "memories" / "storage.sqlite").is_file()
    assert policy.memory.vector_store.client.count("memories").count == 2
    assert "[2024-01-06 19:40:00] Lives in Lisbon" in policy.retrieve(CITY)
    assert policy.stats()["memories"] == 2

    policy.save(tmp_path / "ckpt")
    restored = build_policy(config, mem0_client, workdir).load(tmp_path / "ckpt")
    same_memory(restored, policy)
    restored.save(tmp_path / "again")  # the same points, ids and vectors
    assert (tmp_path / "again" / "memories.json").read_bytes() == (
        tmp_path / "ckpt" / "memories.json"
    ).read_bytes()
    # resuming from the checkpoint equals going on without one (an UPDATE included)
    for p in (policy, restored):
        chat(p, "[Current Time: 2024-04-03 20:15:00]\nI just moved to Oslo!")
    assert restored.memory_texts() == ["Lives in Oslo", "Plays the cello"]
    same_memory(restored, policy)
    folders = [p._private_dir for p in (policy, restored)]
    for p in (policy, restored):
        p.close()
    assert not any(f.exists() for f in folders)


def test_awe_on_faiss_checkpoints_re_embed_the_stored_vectors(mem0_fake, mem0_client, tmp_path):
    import faiss  # noqa: F401  (the dev extra's: a missing install fails here, never skips)

    config = AWEConfig(update_freq=2, short_term_len=0, top_k=1, vector_store=FAISS)
    policy = build_policy(config, mem0_client, tmp_path / "bob" / "workdir")
    chat(policy, "Hi, I live in Lisbon.", "I play the cello.", "I just moved to Oslo!")
    assert policy.memory_texts() == ["Lives in Oslo", "Plays the cello"]
    assert policy.stats()["events_update"] == 1
    files = sorted(p.name for p in (policy._private_dir / "vector-store").iterdir())
    assert files == ["memories.faiss", "memories.pkl"]
    assert policy.retrieve(CITY) == ["Lives in Oslo"]

    policy.save(tmp_path / "ckpt")
    saved = json.loads((tmp_path / "ckpt" / "memories.json").read_text())
    # faiss lists no vectors: the checkpoint's, from the embedder, are the ones faiss holds
    # (mem0 embeds the very text it stores, for an ADD and for an UPDATE)
    index = policy.memory.vector_store
    held = {vid: index.index.reconstruct(i).tolist() for i, vid in index.index_to_id.items()}
    assert {p["id"]: p["vector"] for p in saved["points"]} == held

    restored = build_policy(config, mem0_client, tmp_path / "bob" / "workdir").load(
        tmp_path / "ckpt"
    )
    same_memory(restored, policy)
    for p in (policy, restored):
        chat(p, "I moved to Lisbon again.", "My cello needs new strings.")
    same_memory(restored, policy)
    for p in (policy, restored):
        p.close()


def test_parallel_users_on_a_local_store_never_share_memories(mem0_client, tmp_path):
    config = RAGConfig(update_freq=2, short_term_len=0, top_k=5, vector_store=QDRANT_ON_DISK)
    said = {"alice": "I live in Lisbon.", "bob": "I live in Oslo."}
    policies = {u: build_policy(config, mem0_client, tmp_path / u / "workdir") for u in said}
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda u: chat(policies[u], said[u], "Tell me a joke."), said))
    for user, policy in policies.items():
        other = "Oslo" if user == "alice" else "Lisbon"
        assert f"user: {said[user]}" in policy.memory_texts()
        assert not any(other in m for m in policy.memory_texts() + policy.retrieve(CITY))
        assert policy._private_dir.parent == tmp_path / user / "workdir"
        policy.close()


def test_a_server_store_gets_a_collection_per_user_and_its_secret_from_the_environment(
    tmp_path, monkeypatch
):
    option = {"provider": "pgvector", "config": {"host": "db", "port": 5432, "user": "u"}}
    option["config"]["password_env"] = "MEMLOOP_TEST_PG"
    monkeypatch.setenv("MEMLOOP_TEST_PG", "s3cret")
    config = AWEConfig(vector_store=option)
    assert "s3cret" not in json.dumps(config.model_dump(mode="json"))
    made = {
        u: mem0_vector_store(config.vector_store, dims=384, folder=tmp_path / u, kind="awe")
        for u in ("alice", "bob")
    }
    names = {u: m["config"]["collection_name"] for u, m in made.items()}
    assert names["alice"] != names["bob"] and names["alice"] == collection_for(
        "awe", tmp_path / "alice"
    )
    assert names["alice"].replace("_", "").isalnum() and names["alice"].islower()
    assert made["alice"]["config"] == {
        "host": "db",
        "port": 5432,
        "user": "u",
        "password": "s3cret",
        "embedding_model_dims": 384,
        "collection_name": names["alice"],
    }
    qdrant = {"provider": "qdrant", "config": {"url": "https://q.example:6333"}}
    made = mem0_vector_store(
        AWEConfig(vector_store=qdrant).vector_store, dims=384, folder=tmp_path, kind="awe"
    )
    assert "path" not in made["config"]  # a server: no local folder
    assert made["config"]["collection_name"] == collection_for("awe", tmp_path)
    monkeypatch.delenv("MEMLOOP_TEST_PG")
    with pytest.raises(UserError, match="password_env: environment variable MEMLOOP_TEST_PG is"):
        mem0_vector_store(config.vector_store, dims=384, folder=tmp_path, kind="awe")


@pytest.mark.parametrize("store", [QDRANT_ON_DISK, FAISS], ids=["qdrant", "faiss"])
def test_rag_with_a_store_meets_the_policy_contract(mem0_fake, mem0_client, tmp_path, store):
    config = RAGConfig(vector_store=store)
    report = check_policy(
        lambda: build_policy(config, mem0_client, tmp_path / "work"), workdir=tmp_path
    )
    assert report.ok and len(report.checks) > 20
    assert list((tmp_path / "work").iterdir()) == []  # closed policies leave no files


BAD = [
    ("provider: pinecone2", "key 'vector_store.provider': mem0 has no vector store 'pinecone2'"),
    (
        "provider: qdrant\n  config: {on_disk: maybe}",
        "key 'vector_store.config.on_disk': Input should be a valid boolean",
    ),
    (
        "provider: qdrant\n  config: {ondisk: true}",
        "key 'vector_store.config.ondisk': not a setting of mem0's qdrant store (it has: api_key",
    ),
    (
        "provider: faiss\n  config: {distance_strategy: manhattan}",
        "key 'vector_store.config': Invalid distance_strategy. Must be one of:",
    ),
    (
        "provider: qdrant\n  embedder: {provider: openai}",
        "key 'vector_store.embedder': memloop routes mem0's embedder",
    ),
    (
        "provider: qdrant\n  config: {llm: {provider: openai}}",
        "key 'vector_store.config.llm': memloop routes mem0's LLM",
    ),
    (
        "provider: qdrant\n  config: {path: /tmp/mine}",
        "key 'vector_store.config.path': memloop keeps a local store in the policy's folder",
    ),
    (
        "provider: qdrant\n  config: {collection_name: mine}",
        "key 'vector_store.config.collection_name': memloop names one collection per user",
    ),
    (
        "provider: qdrant\n  config: {url: 'https://q.example', api_key: k-123}",
        "key 'vector_store.config.api_key': a secret in a policy file is copied into run records",
    ),
    (
        "provider: qdrant\n  config: {host: qdrant.example}",
        "key 'vector_store.config.host': mem0 opens a qdrant server only given url, api_key, or "
        "host and port; with host alone it would open a local store",
    ),
    ("qdrant", "key 'vector_store': expected a mapping {provider: NAME, config: {...}}"),
]


@pytest.mark.parametrize("option, message", BAD, ids=[m.split("'")[1] for _, m in BAD])
@pytest.mark.parametrize("kind", ["awe", "rag"])
def test_a_bad_option_is_one_line_naming_the_key(tmp_path, kind, option, message):
    refused_in_one_line(tmp_path, f"type: {kind}\nvector_store:\n  {option}\n", message)


def test_dimensions_other_than_the_embedders_are_refused(mem0_client, tmp_path):
    config = RAGConfig(vector_store={"provider": "qdrant", "config": {"embedding_model_dims": 768}})
    with pytest.raises(UserError) as caught:
        build_policy(config, mem0_client, tmp_path / "work")
    assert str(caught.value) == (
        "vector_store.config.embedding_model_dims: 768, but embedding_model gives "
        "384-dimensional vectors (leave it out: memloop sets it)"
    )
    assert list((tmp_path / "work").iterdir()) == []
    same = RAGConfig(vector_store={"provider": "qdrant", "config": {"embedding_model_dims": 384}})
    build_policy(same, mem0_client, tmp_path / "work").close()


def test_a_policy_without_the_option_keeps_its_identity(tmp_path):
    # sha256 of each shipped YAML's config as dumped before the option existed
    before = {
        "awe": "5b6163763865d6ca202912d4d71acdf44ddd89ac0296b7866644665bee5c06bd",
        "rag": "97138d1532c5b4572e6a75b45601bde492bd553e098abd59f6b33ef288589643",
    }
    for kind, sha in before.items():
        config = load_policy_config(SHIPPED / f"{kind}.yaml")
        dumped = config.model_dump(mode="json")
        assert "vector_store" not in dumped and json_sha256(dumped) == sha
        assert config.display_name == f"{kind}-2-4-30"
    path = tmp_path / "awe.yaml"
    path.write_text("type: awe\nvector_store: {provider: qdrant, config: {on_disk: true}}\n")
    config = load_policy_config(path)
    assert config.display_name == "awe-2-4-30"  # the store is in the identity, not the name
    dumped = config.model_dump(mode="json")
    assert dumped["vector_store"] == QDRANT_ON_DISK
    assert AWEConfig.model_validate(dumped) == config  # what tune and checkpoints rebuild from
