"""Native and AWI policies against a scripted loopback LLM: when memory writes happen, how AWI
merges, overwrites and deletes facts, native's recorded truncation, probes that never write, and
checkpoints without secrets."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memloop.core.errors import UserError
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.policies import AWIConfig, NativeConfig, build_policy
from memloop.policies.awi import apply_edits, grounded, normalize_label
from memloop.policies.base import MessageBuffer, estimate_messages_tokens, estimate_tokens
from memloop.policies.native import _ranges
from memloop.testing.fake_server import FakeOpenAIServer
from memloop.testing.scripted_llm import ScriptedMemoryLLM, conversation_of


def _excerpt(text: str) -> str:
    """The conversation part of an AWI writer request."""
    match = re.search(r"\[\[ ## conversation ## \]\]\n(.*?)(\n\n|\Z)", text, re.S)
    return match.group(1) if match else ""


def city_writer(text: str, body) -> list[dict]:
    """Writes what a perfect writer would for the test conversations."""
    excerpt = _excerpt(conversation_of(body))
    edits = []
    for city in ("Lisbon", "Oslo"):
        if f"live in {city}" in excerpt or f"moved to {city}" in excerpt:
            edits.append({"label": "Home City", "value": city})
    if "sold my car" in excerpt:
        edits.append({"label": "car", "value": None})
    if "drive a" in excerpt:
        edits.append({"label": "car", "value": "a red Fiat"})
    return edits


@pytest.fixture
def fake():
    script = ScriptedMemoryLLM(writer=city_writer)
    with FakeOpenAIServer(reply=script) as server:
        server.script = script
        yield server


def _client(server, tmp_path, **endpoint) -> ChatClient:
    return ChatClient(
        Endpoint(model="m", base_url=server.base_url, **endpoint), cache=tmp_path / "c.sqlite"
    )


# -- the message buffer -------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(update_freq=st.integers(1, 6), short_term_len=st.integers(0, 8), n_turns=st.integers(0, 25))
def test_buffer_writes_every_message_once_in_order(update_freq, short_term_len, n_turns):
    buffer = MessageBuffer(update_freq, short_term_len)
    written = []
    for turn in range(n_turns):
        buffer.append("user", f"u{turn}", time=f"t{turn}")
        buffer.append("assistant", f"a{turn}", time=f"t{turn}")
        for batch, time in buffer.due_batches():
            assert len(batch) == update_freq
            assert time == f"t{int(batch[-1]['content'][1:])}"
            written.extend(m["content"] for m in batch)
        assert len(buffer.messages) < update_freq + short_term_len
        assert len(buffer.messages) >= min(short_term_len, 2 * (turn + 1))
    everything = [f"{p}{t}" for t in range(n_turns) for p in "ua"]
    assert written + [m["content"] for m in buffer.messages] == everything


def test_paper_schedule_first_write_after_three_turns(fake, tmp_path):
    policy = build_policy(AWIConfig(), _client(fake, tmp_path))  # (2, 4): 6 messages wait
    writes = []
    for turn in range(5):
        policy.respond(f"message {turn}")
        writes.append(len(fake.script.requests("writer")))
    assert writes == [0, 0, 1, 2, 3]
    first = _excerpt(conversation_of(fake.script.requests("writer")[0]))
    assert first.startswith("user: message 0\nassistant: ") and "message 1" not in first
    assert len(policy.buffer.messages) == 4


@pytest.mark.parametrize(
    "update_freq, short_term_len, expected",
    [
        (1, 0, [2, 4, 6, 8]),  # every message on its own, nothing kept raw
        (4, 0, [0, 1, 1, 2]),  # two turns per write
        (3, 4, [0, 0, 0, 1]),  # 7 messages must wait: the 4th turn triggers the first write
    ],
)
def test_write_schedule_follows_hyperparameters(
    fake, tmp_path, update_freq, short_term_len, expected
):
    policy = build_policy(
        AWIConfig(update_freq=update_freq, short_term_len=short_term_len), _client(fake, tmp_path)
    )
    seen = []
    for turn in range(4):
        policy.ingest(f"u{turn}", f"a{turn}")
        seen.append(len(fake.script.requests("writer")))
    assert seen == expected


# -- AWI merging --------------------------------------------------------------------------------


def test_apply_edits_sets_overwrites_deletes_and_ignores():
    facts: dict = {}
    apply_edits(
        facts,
        [{"label": "Home City", "value": "Lisbon"}, {"label": "pet", "value": "a cat"}],
        step=1,
        time="t1",
    )
    assert facts["home_city"] == {"value": "Lisbon", "step": 1, "time": "t1"}
    counts = apply_edits(
        facts,
        [
            {"label": "home-city", "value": "Oslo"},
            {"label": "pet", "value": None},
            {"label": "ghost", "value": None},
            {"label": "  ", "value": "x"},
            {"label": "mood", "value": "  "},
        ],
        step=2,
        time="t2",
    )
    assert facts == {"home_city": {"value": "Oslo", "step": 2, "time": "t2"}}
    assert counts == {"set": 1, "deleted": 1, "ignored": 3}
    apply_edits(facts, [{"label": "home_city", "value": " Oslo "}], step=3, time="t3")
    assert facts["home_city"]["step"] == 2  # unchanged value keeps when it was learned
    assert normalize_label("Weekly running (km)") == "weekly_running_km"


def test_awi_overwrites_a_changed_fact_and_deletes_a_stale_one(fake, tmp_path):
    client = _client(fake, tmp_path)
    # the scripted writer embellishes "a small car" as "a red Fiat": the grounding check is off
    # here (test_awi_drops_values_the_user_never_gave has it on)
    config = AWIConfig(update_freq=2, short_term_len=0, grounded_values=False)
    policy = build_policy(config, client)
    policy.respond("[Current Time: 2024-01-06 19:40:00]\nI just moved to Lisbon.")
    policy.respond("I drive a small car to work.")
    assert policy.facts["home_city"]["value"] == "Lisbon"
    assert policy.facts["car"]["value"] == "a red Fiat"
    policy.respond("[Current Time: 2024-04-02 20:00:00]\nNews: I moved to Oslo, and I sold my car.")
    assert policy.memory_view() == "Memory (label: value):\nhome_city: Oslo"
    assert policy.facts["home_city"] == {"value": "Oslo", "step": 3, "time": "2024-04-02 20:00:00"}
    # The memory is in the system prompt of the next reply and of probes.
    policy.respond("What should I pack?")
    system = fake.script.requests("chat")[-1]["messages"][0]["content"]
    assert "- home_city: Oslo" in system and "Lisbon" not in system
    answer = policy.answer("Where do I live?")
    assert answer.retrieved_memories == ["home_city: Oslo"]
    assert client.usage.component("memory").calls == 4
    assert client.usage.component("agent").calls == 4
    assert client.usage.component("probe").calls == 1


def test_writer_runs_through_dspy_with_a_json_schema_and_the_evolved_instructions(fake, tmp_path):
    policy = build_policy(AWIConfig(update_freq=2, short_term_len=0), _client(fake, tmp_path))
    evolved = policy.with_prompts({"writer": "Only ever record the user's favourite colour."})
    evolved.ingest("I live in Lisbon", "Nice!")
    request = fake.script.requests("writer")[-1]
    assert request["response_format"]["type"] == "json_schema"
    assert "Only ever record the user's favourite colour." in request["messages"][0]["content"]
    assert policy.prompts()["writer"] != evolved.prompts()["writer"]
    assert evolved.memory_view() == "Memory (label: value):\nhome_city: Lisbon"
    assert policy.memory_view() == ""  # empty memory renders as nothing


def test_with_prompts_rejects_unknown_names(fake, tmp_path):
    policy = build_policy(AWIConfig(), _client(fake, tmp_path))
    with pytest.raises(UserError, match="unknown prompt 'reader'.*writer"):
        policy.with_prompts({"reader": "x"})
    with pytest.raises(UserError, match="non-empty"):
        policy.with_prompts({"writer": "  "})
    native = build_policy(NativeConfig(), _client(fake, tmp_path))
    assert native.prompts() == {}
    with pytest.raises(UserError, match="no memory-write prompts"):
        native.with_prompts({"writer": "x"})


def test_unparseable_writer_answer_is_counted_not_fatal(tmp_path):
    script = ScriptedMemoryLLM(writer=lambda text, body: "this is not JSON")
    with FakeOpenAIServer(reply=script) as server:
        policy = build_policy(AWIConfig(update_freq=2, short_term_len=0), _client(server, tmp_path))
        policy.respond("I live in Lisbon")
        policy.respond("hello again")
    assert policy.stats()["write_errors"] == 2 and policy.writes == 0
    assert "AdapterParseError" in policy.last_write_error


def test_endpoint_failure_in_a_write_is_raised(tmp_path):
    with FakeOpenAIServer(reply=ScriptedMemoryLLM(), failures=[400]) as server:
        policy = build_policy(
            AWIConfig(update_freq=2, short_term_len=0), _client(server, tmp_path, max_retries=0)
        )
        with pytest.raises(UserError, match="HTTP 400"):
            policy.ingest("I live in Lisbon", "Nice!")


def test_probes_never_write(fake, tmp_path):
    policy = build_policy(AWIConfig(update_freq=2, short_term_len=2), _client(fake, tmp_path))
    for text in ("I live in Lisbon", "ok", "fine"):
        policy.respond(text)
    view, writes = policy.memory_view(), len(fake.script.requests("writer"))
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "integer"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    for i in range(10):
        answer = policy.answer(f"Question {i}: where do I live?", schema=schema if i % 2 else None)
        if i % 2:
            assert answer.parsed == {"answer": 1} and answer.json_error is None
    assert policy.memory_view() == view
    assert len(fake.script.requests("writer")) == writes


def test_awi_checkpoint_round_trip_without_secrets(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLOOP_TEST_KEY", "sk-very-secret-123")
    client = _client(fake, tmp_path, api_key_env="MEMLOOP_TEST_KEY")
    policy = build_policy(AWIConfig(update_freq=2, short_term_len=2), client)
    policy = policy.with_prompts({"writer": "Record where the user lives."})
    for text in ("[Current Time: 2024-01-01 10:00:00]\nI live in Lisbon", "ok", "fine"):
        policy.respond(text)
    policy.save(tmp_path / "ckpt")
    files = {p.name: p.read_text() for p in (tmp_path / "ckpt").iterdir()}
    assert set(files) == {"policy.json", "program.json"}
    for text in files.values():
        assert "sk-very-secret" not in text and "127.0.0.1" not in text
    program = json.loads(files["program.json"])
    assert program["writer"]["signature"]["instructions"] == "Record where the user lives."
    restored = build_policy(AWIConfig(update_freq=2, short_term_len=2), client).load(
        tmp_path / "ckpt"
    )
    assert restored.memory_view() == policy.memory_view()
    assert restored.prompts() == policy.prompts()
    assert restored.sim_time == "2024-01-01 10:00:00" and restored.turns == 3
    # The restored buffer keeps writing on the same schedule.
    restored.respond("one more")
    policy.respond("one more")
    assert restored.memory_view() == policy.memory_view()


def test_load_rejects_another_policy_type(fake, tmp_path):
    client = _client(fake, tmp_path)
    build_policy(NativeConfig(), client).save(tmp_path / "native")
    with pytest.raises(UserError, match="'native' policy"):
        build_policy(AWIConfig(), client).load(tmp_path / "native")
    with pytest.raises(UserError, match="no such file"):
        build_policy(AWIConfig(), client).load(tmp_path / "nothing-here")


# -- native -------------------------------------------------------------------------------------


def test_token_estimate_is_conservative():
    assert estimate_tokens("a" * 30) == 10
    assert estimate_tokens("住在里斯本") == 5
    assert estimate_messages_tokens([{"role": "user", "content": "abc"}]) == 9


def test_native_drops_oldest_turns_and_records_them(fake, tmp_path):
    # window 700, reply 100, safety 64 -> 536 estimated tokens for each request.
    client = _client(fake, tmp_path, context_window=700, max_tokens=100)
    policy = build_policy(NativeConfig(), client)
    for turn in range(8):
        policy.respond(f"turn {turn}: " + "lorem ipsum dolor " * 20)  # ~125 tokens each
    dropped = policy.dropped
    assert dropped and dropped == list(range(len(dropped)))
    assert policy.stats()["dropped_turns"] == len(dropped)
    assert [t["index"] for t in policy.kept] == list(range(len(dropped), 8))
    assert policy.memory_view().startswith(
        f"[{len(dropped)} earlier turns no longer fit the context window and were dropped: "
        f"turns 0-{len(dropped) - 1}]"
    )
    for request in fake.script.requests("chat"):
        assert estimate_messages_tokens(request["messages"]) <= 700 - 100 - 64
    # A replay of the same turns drops the same turns.
    replay = build_policy(NativeConfig(), client)
    for request in fake.script.requests("chat")[:8]:
        replay.ingest(request["messages"][-1]["content"], "Noted, thanks for telling me.")
    assert replay.memory_view() == policy.memory_view()


def test_native_probe_trims_only_its_own_copy(fake, tmp_path):
    client = _client(fake, tmp_path, context_window=700, max_tokens=100)
    policy = build_policy(NativeConfig(), client)
    for turn in range(3):
        policy.respond(f"turn {turn}: " + "lorem ipsum dolor " * 10)
    view = policy.memory_view()
    answer = policy.answer("Summarise: " + "sit amet " * 120)
    assert policy.memory_view() == view and not policy.dropped
    sent = fake.script.requests("chat")[-1]["messages"]
    assert len(sent) < 2 + 2 * 3 and estimate_messages_tokens(sent) <= 536
    assert len(answer.retrieved_memories) == len(sent) - 2


def test_native_without_a_known_window_keeps_everything(fake, tmp_path):
    policy = build_policy(NativeConfig(), _client(fake, tmp_path))  # hosted: no window known
    for _ in range(30):
        policy.ingest("x" * 3000, "y" * 3000)
    assert not policy.dropped and len(policy.kept) == 30


def test_ranges():
    assert _ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert _ranges([4]) == "4"


def test_reply_cap_applies_to_replies_and_free_text_probes_only(fake, tmp_path):
    policy = build_policy(
        AWIConfig(update_freq=2, short_term_len=0, reply_max_tokens=7),
        _client(fake, tmp_path, max_tokens=300),
    )
    policy.respond("I live in Lisbon")
    policy.answer("Where do I live?")
    policy.answer("Where do I live?", schema={"type": "object"})
    chat = [r["max_tokens"] for r in fake.script.requests("chat")]
    assert chat == [7, 7]
    assert [r["max_tokens"] for r in fake.script.requests("probe")] == [300]
    assert [r["max_tokens"] for r in fake.script.requests("writer")] == [300]


def notes_checker(body) -> str:
    """A recall checker that supports a claim iff its value appears in the notes."""
    text = body["messages"][-1]["content"]
    notes = text.split("<notes>")[1].split("</notes>")[0].lower()
    verdicts = {}
    for line in text.split("Claims about the user's current situation:")[1].splitlines():
        match = re.match(r"(\d+)\. The user's .* is: (.*)\.$", line.strip())
        if match:
            verdicts[match.group(1)] = "yes" if match.group(2).lower() in notes else "no"
    return json.dumps(verdicts)


def test_recall_is_judged_on_written_memory_never_the_raw_buffer(tmp_path):
    from memloop.environment.procedural import generate_procedural
    from memloop.feedback.probes import Prober, revealed_states, words

    item = generate_procedural(users=1, periods=1, questions=1, seed=3)[0]
    latest = revealed_states(item, 0)
    said = {words(v): words(value) for v, (value, _) in latest.items()}

    def writer(text, body):
        excerpt = _excerpt(conversation_of(body))
        return [{"label": k, "value": v} for k, v in said.items() if f"is {v}" in excerpt]

    with (
        FakeOpenAIServer(reply=ScriptedMemoryLLM(writer=writer)) as agent,
        FakeOpenAIServer(reply=notes_checker) as checker_server,
    ):
        policy = build_policy(AWIConfig(), _client(agent, tmp_path))  # (2, 4): 3 turns wait
        checker = _client(checker_server, tmp_path / "checker")
        prober = Prober(ub_client=checker, checker_client=checker)
        for label, value in said.items():
            policy.respond(f"my {label} is {value}")
        # every statement is still in the buffer: nothing written, nothing supported
        assert policy.writes == 0 and policy.buffer.messages
        view = policy.memory_view()
        assert all(value not in view for value in said.values())
        before = prober.recall(item, 0, view)
        for turn in range(3):  # push the statements out of the buffer into memory
            policy.respond(f"small talk {turn}")
        after = prober.recall(item, 0, policy.memory_view())
    assert len(before.claims) == len(said) > 0
    assert [c.supported for c in before.claims] == [False] * len(said)
    assert [c.supported for c in after.claims] == [True] * len(said)


def test_awi_drops_values_the_user_never_gave(fake, tmp_path):
    client = _client(fake, tmp_path)
    policy = build_policy(AWIConfig(update_freq=2, short_term_len=0), client)
    policy.respond("[Current Time: 2024-01-06 19:40:00]\nI just moved to Lisbon.")
    policy.respond("I drive a small car to work.")
    # "a red Fiat" shares no word with "I drive a small car to work.": dropped and counted
    assert policy.memory_view() == "Memory (label: value):\nhome_city: Lisbon"
    assert policy.stats()["ungrounded_values"] == 1


def test_grounded_compares_words_up_to_their_endings():
    said = "Hello. I share a house with several housemates. I read everything on my e-reader."
    assert grounded("housemates", "several housemates", said)
    assert grounded("reading", "reads on an e-reader", said)  # "reader" was said
    assert grounded("shared_housing", "yes", said)  # a bare "yes" leans on its label: "share"
    assert not grounded("has_pets", "yes", said)  # neither label nor value was said
    assert not grounded("home_city", "New York", said)
    assert not grounded("capital_of_france", "Paris", "What is the capital of France?")
    assert grounded("weekly_runs", "3 runs a week", "I run 3 times a week now")


@pytest.mark.parametrize("verbatim", ["user", "user+edits"])
def test_awi_verbatim_stores_the_users_own_messages(fake, tmp_path, verbatim):
    client = _client(fake, tmp_path)
    config = AWIConfig(update_freq=2, short_term_len=0, verbatim=verbatim)
    assert (
        config.default_name()
        == {"user": "awi-2-0-verbatim", "user+edits": "awi-2-0-verbatim-edits"}[verbatim]
    )
    policy = build_policy(config, client)
    policy.respond("[Current Time: 2024-01-06 19:40:00]\nI just moved to Lisbon.")
    policy.respond("I walk to work now.")
    said = {k: v["value"] for k, v in policy.facts.items() if k.startswith("said_")}
    assert said == {"said_1": "I just moved to Lisbon.", "said_2": "I walk to work now."}
    if verbatim == "user":
        # nothing but the user's messages, and no writer call
        assert set(policy.facts) == {"said_1", "said_2"}
        assert client.usage.component("memory").calls == 0
    else:
        assert policy.facts["home_city"]["value"] == "Lisbon"
        assert client.usage.component("memory").calls == 2
    assert "said_2: I walk to work now." in policy.memory_view()
