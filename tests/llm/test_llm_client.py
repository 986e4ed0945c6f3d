"""ChatClient against a loopback fake OpenAI server: cache keys, retry policy, concurrency bound,
JSON validation and usage accounting."""

from __future__ import annotations

import json
import threading

import pytest

from memloop.llm.cache import ResponseCache, cache_key
from memloop.llm.client import ChatClient, LLMRequestError
from memloop.llm.endpoint import Endpoint
from memloop.llm.errors import EndpointUnreachable
from memloop.testing.fake_server import FakeOpenAIServer

MSGS = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


@pytest.fixture(autouse=True)
def both_transports(transport):
    """Every test here runs on both request paths (see conftest.transport)."""
    return transport


@pytest.fixture
def fake():
    with FakeOpenAIServer() as server:
        yield server


def make_client(server: FakeOpenAIServer, tmp_path, **endpoint_kwargs) -> ChatClient:
    endpoint = Endpoint(model="fake-model", base_url=server.base_url, **endpoint_kwargs)
    return ChatClient(endpoint, cache=tmp_path / "cache.sqlite", backoff_base_s=0.01)


# ---------------------------------------------------------------- cache keys

BASE = dict(
    base_url="http://x/v1",
    model="m",
    messages=MSGS,
    params={"temperature": 0.0, "max_tokens": 10},
    sample=0,
)


@pytest.mark.parametrize(
    "change",
    [
        {"base_url": "http://y/v1"},
        {"model": "m2"},
        {"messages": [{"role": "user", "content": "hi!"}]},
        {"messages": [{"role": "system", "content": "hi"}]},
        {"params": {"temperature": 0.7, "max_tokens": 10}},
        {"params": {"temperature": 0.0, "max_tokens": 11}},
        {
            "params": {
                "temperature": 0.0,
                "max_tokens": 10,
                "response_format": {"type": "json_object"},
            }
        },
        {"params": {"temperature": 0.0, "max_tokens": 10, "stop": ["\n"]}},
        {"sample": 1},
    ],
)
def test_cache_key_changes_with_every_input(change):
    assert cache_key(**BASE) != cache_key(**(BASE | change))


def test_cache_key_is_stable_and_ignores_param_order_and_nones():
    reordered = dict(BASE, params={"max_tokens": 10, "temperature": 0.0, "stop": None})
    assert cache_key(**BASE) == cache_key(**reordered)
    assert len(cache_key(**BASE)) == 64


def test_repeat_call_is_served_from_cache(fake, tmp_path):
    client = make_client(fake, tmp_path)
    first = client.chat(MSGS, component="agent")
    second = client.chat(MSGS, component="agent")
    assert not first.cached and second.cached
    assert second.text == first.text
    assert len(fake.requests) == 1
    # a different sample index is a distinct draw: a new request
    client.chat(MSGS, component="agent", sample=1)
    assert len(fake.requests) == 2
    # a new client on the same cache file (a rerun) sends nothing
    rerun = make_client(fake, tmp_path)
    assert rerun.chat(MSGS, component="agent").cached
    assert len(fake.requests) == 2


def test_a_draw_is_a_new_sample_only_when_the_endpoint_samples(fake, tmp_path):
    from memloop.llm.client import DRAW_SEED_STRIDE

    greedy = make_client(fake, tmp_path)
    greedy.chat(MSGS, component="agent")
    # at temperature 0 a draw cannot change the answer: the cached one is reused
    assert greedy.with_draw(2).chat(MSGS, component="agent").cached
    assert len(fake.requests) == 1 and "seed" not in fake.requests[0]

    sampled = make_client(fake, tmp_path, temperature=0.7)
    sampled.chat(MSGS, component="agent", sample=1)
    sampled.with_draw(2).chat(MSGS, component="agent", sample=1)
    assert [b["seed"] for b in fake.requests[1:]] == [1, 2 * DRAW_SEED_STRIDE + 1]
    # each draw replays from the cache on a rerun; forks keep their draw
    assert sampled.with_draw(2).fork().chat(MSGS, component="agent", sample=1).cached
    assert len(fake.requests) == 3
    with pytest.raises(ValueError):
        sampled.with_draw(-1)


def test_refresh_bypasses_cache_read(fake, tmp_path):
    client = make_client(fake, tmp_path)
    client.chat(MSGS, component="probe")
    assert not client.chat(MSGS, component="probe", refresh=True).cached
    assert len(fake.requests) == 2


def test_cache_shared_by_threads_and_processes(tmp_path):
    import multiprocessing as mp

    path = tmp_path / "c.sqlite"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(str(path), p)) for p in range(3)]
    for p in procs:
        p.start()
    threads = [threading.Thread(target=_write_many, args=(str(path), 10 + t)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    cache = ResponseCache(path)
    assert len(cache) == 6 * 50
    assert cache.get("w11-7") == {"v": 7} and cache.get("w2-49") == {"v": 49}


def _write_many(path: str, writer: int) -> None:
    cache = ResponseCache(path)
    for i in range(50):
        cache.put(f"w{writer}-{i}", {"v": i})
        assert cache.get(f"w{writer}-{i}") == {"v": i}


# ---------------------------------------------------------------- retries


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_retries_transient_statuses_then_succeeds(tmp_path, status):
    with FakeOpenAIServer(failures=[status, status]) as fake:
        client = make_client(fake, tmp_path, max_retries=3)
        result = client.chat(MSGS, component="agent")
    assert result.text == '{"ok": true}'
    assert len(fake.requests) == 3


@pytest.mark.parametrize("status", [400, 404, 422])
def test_no_retry_on_other_client_errors(tmp_path, status):
    with FakeOpenAIServer(failures=[status]) as fake:
        client = make_client(fake, tmp_path, max_retries=3)
        with pytest.raises(LLMRequestError, match=f"HTTP {status}"):
            client.chat(MSGS, component="agent")
    assert len(fake.requests) == 1


def test_gives_up_after_max_retries(tmp_path):
    with FakeOpenAIServer(failures=[503] * 10) as fake:
        client = make_client(fake, tmp_path, max_retries=2)
        with pytest.raises(Exception, match="failed 3 times"):
            client.chat(MSGS, component="agent")
    assert len(fake.requests) == 3


def test_timeout_is_retried(tmp_path):
    with FakeOpenAIServer(latency_s=0.5) as fake:
        client = make_client(fake, tmp_path, max_retries=1, timeout_s=0.1)
        with pytest.raises(Exception, match="failed 2 times"):
            client.chat(MSGS, component="agent")
    assert len(fake.requests) == 2


def test_refused_connection_is_retried_then_named(tmp_path):
    from memloop.testing.servers import free_port

    port = free_port()  # closed again: nothing listens there
    endpoint = Endpoint(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=2)
    client = ChatClient(endpoint, cache=tmp_path / "c.sqlite", backoff_base_s=0.01)
    with pytest.raises(EndpointUnreachable, match=f"127.0.0.1:{port}"):
        client.chat(MSGS, component="agent")
    assert client.requests_sent == 3


# ---------------------------------------------------------------- concurrency bound


def test_concurrency_bound_per_endpoint(tmp_path):
    with FakeOpenAIServer(latency_s=0.15) as fake:
        # two clients on the same endpoint share one bound
        a = make_client(fake, tmp_path, max_concurrency=3)
        b = make_client(fake, tmp_path, max_concurrency=3)
        threads = [
            threading.Thread(
                target=(a if i % 2 else b).chat,
                args=([{"role": "user", "content": str(i)}],),
                kwargs={"component": "agent"},
            )
            for i in range(12)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(fake.requests) == 12
    assert fake.peak_in_flight == 3


# ---------------------------------------------------------------- JSON and usage


def test_schema_output_parsed_and_request_constrained(fake, tmp_path):
    client = make_client(fake, tmp_path)
    result = client.chat_json(MSGS, SCHEMA, component="probe")
    assert result.ok and result.parsed == {"ok": True}
    sent = fake.requests[0]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"] == SCHEMA


@pytest.mark.parametrize(
    "reply,needle", [("not json", "not JSON"), ('{"ok": "yes"}', "does not match the schema")]
)
def test_invalid_json_is_reported_not_hidden(tmp_path, reply, needle):
    with FakeOpenAIServer(reply=reply) as fake:
        result = make_client(fake, tmp_path).chat_json(MSGS, SCHEMA, component="probe")
    assert result.parsed is None and needle in result.json_error and result.text == reply


def test_usage_counts_the_work_whether_sent_or_cached(fake, tmp_path):
    client = make_client(fake, tmp_path)
    client.chat(MSGS, component="agent")
    client.chat(MSGS, component="agent")  # cache hit: the same work, served from the cache
    client.chat([{"role": "user", "content": "x"}], component="memory")
    summary = client.usage.summary()
    assert summary["agent"] == {
        "calls": 1,
        "cached_calls": 1,
        "prompt_tokens": 2 * 10,  # the fake server reports 10 prompt + 5 completion per answer
        "completion_tokens": 2 * 5,
        "cached_tokens": 15,
        "total_tokens": 30,
    }
    assert summary["memory"]["calls"] == 1
    assert summary["total"]["total_tokens"] == 45 and summary["total"]["cached_tokens"] == 15
    assert client.usage.tokens_by_component() == {"agent": 30, "memory": 15}
    # a rerun on the cache reports the same tokens as the run that sent the requests
    rerun = make_client(fake, tmp_path)
    rerun.chat(MSGS, component="agent")
    rerun.chat(MSGS, component="agent")
    assert rerun.usage.tokens_by_component() == {"agent": 30}
    assert rerun.usage.summary()["agent"]["cached_tokens"] == 30


@pytest.mark.parametrize("junk", ["not json at all", '{"ok": "yes"}'])
def test_an_answer_that_breaks_its_schema_is_never_cached(tmp_path, junk):
    with FakeOpenAIServer(reply=junk) as server:
        client = make_client(server, tmp_path)
        first = client.chat_json(MSGS, SCHEMA, component="probe")
        assert first.json_error is not None
        assert client.chat_json(MSGS, SCHEMA, component="probe").cached is False  # asked again
        assert len(server.requests) == 2
        server.reply = '{"ok": true}'  # the endpoint is fixed: the next run gets a valid answer
        fixed = make_client(server, tmp_path).chat_json(MSGS, SCHEMA, component="probe")
        assert fixed.parsed == {"ok": True} and not fixed.cached
        again = make_client(server, tmp_path).chat_json(MSGS, SCHEMA, component="probe")
        assert again.cached and again.parsed == {"ok": True}
        assert len(server.requests) == 3


def test_dspy_lm_goes_through_client(fake, tmp_path):
    import dspy

    from memloop.llm.dspy_lm import make_dspy_lm

    fake.reply = json.dumps({"answer": "42"})
    client = make_client(fake, tmp_path)
    lm = make_dspy_lm(client, component="optimizer")
    predict = dspy.Predict("question -> answer")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = predict(question="six times seven?")
    assert out.answer == "42"
    assert client.usage.component("optimizer").calls == 1
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        predict(question="six times seven?")
    assert len(fake.requests) == 1  # the repeat came from memloop's cache


def test_extra_body_is_sent_and_null_temperature_and_max_tokens_are_not(fake, tmp_path):
    body = {"reasoning_effort": "low", "provider": {"order": ["a"]}}
    reasoning = Endpoint(
        model="m",
        base_url=fake.base_url,
        temperature=None,
        max_tokens=None,
        extra_body=body,
    )
    client = ChatClient(reasoning, cache=tmp_path / "c.sqlite")
    client.chat(MSGS, component="agent")
    sent = fake.requests[0]
    assert sent["reasoning_effort"] == "low" and sent["provider"] == {"order": ["a"]}
    assert "temperature" not in sent and "max_tokens" not in sent
    # other extra_body: another cache entry; the default endpoint still sends both fields
    other = ChatClient(reasoning.model_copy(update={"extra_body": {}}), cache=tmp_path / "c.sqlite")
    assert not other.chat(MSGS, component="agent").cached
    plain = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "d.sqlite")
    plain.chat(MSGS, component="agent")
    assert (fake.requests[-1]["temperature"], fake.requests[-1]["max_tokens"]) == (0.0, 512)
    assert "reasoning_effort" not in fake.requests[-1]
    # the run identity holds extra_body only when it is set (earlier runs keep their keys)
    assert reasoning.result_settings()["extra_body"] == body
    assert "extra_body" not in Endpoint().result_settings()


def test_each_path_is_the_one_taken(fake, tmp_path, transport):
    client = make_client(fake, tmp_path)
    client.chat(MSGS, component="agent")
    assert (client._connection.plain is not None) == (transport == "plain-http")


def test_https_to_a_plain_http_server_names_the_tls_handshake(fake, tmp_path):
    """An https:// address of a plain-HTTP server: the SDK's connection error, caused by its HTTP
    client's ConnectError (httpx2's since openai 3), is told as a failed TLS handshake."""
    from memloop.core.errors import UserError

    endpoint = Endpoint(
        model="fake-model", base_url=fake.base_url.replace("http://", "https://"), max_retries=0
    )
    client = ChatClient(endpoint, cache=tmp_path / "c.sqlite", backoff_base_s=0.01)
    with pytest.raises(UserError, match="the TLS handshake failed .*is the server plain HTTP"):
        client.chat([{"role": "user", "content": "hi"}], component="agent")
    assert fake.requests == []  # no request was read as HTTP
