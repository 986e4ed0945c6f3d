"""One embedded runtime per machine: compute turns, the core budget, and the watchdog that lets
a slow embedded server finish instead of cancelling and re-asking (issue 46)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from memloop.core.errors import UserError
from memloop.llm import runtime
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.testing.fake_server import FakeOpenAIServer, as_embedded

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def request_log(tmp_path, monkeypatch):
    path = tmp_path / "requests.jsonl"
    monkeypatch.setenv("MEMLOOP_REQUEST_LOG", str(path))
    monkeypatch.setenv("MEMLOOP_MODELS_DIR", str(tmp_path / "models"))  # the turn files
    return path


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _local(timeout_s: float) -> ChatClient:
    endpoint = Endpoint(model="local-0.5b", timeout_s=timeout_s, max_retries=2)
    return ChatClient(endpoint, cache=None, backoff_base_s=0.01)


def test_a_slow_embedded_server_that_progresses_is_waited_for(request_log):
    # 4 s per answer against a 1 s timeout: before, the client cancelled at 1 s and asked again
    # (the same 4 s each time) until it gave up; the decode count moves, so it now waits
    with FakeOpenAIServer(latency_s=4.0) as fake:
        client = as_embedded(_local(timeout_s=1.0), fake)
        result = client.chat(MESSAGES, component="agent")
        assert result.text == '{"ok": true}'
        assert fake.served == [200]
    lines = _lines(request_log)
    assert [(x["outcome"], x["attempt"], x["component"]) for x in lines] == [("ok", 0, "agent")]
    assert lines[0]["latency_s"] >= 4.0


def test_a_stuck_embedded_server_is_given_up_on_and_asked_again(request_log):
    # the first request hangs 60 s while the decode count stands still: given up once the
    # count has not moved for max(timeout_s, MIN_STALL_S) = 3 s, then asked again
    with FakeOpenAIServer(failures=["stall"], hang_s=60.0) as fake:
        client = as_embedded(_local(timeout_s=1.0), fake)
        started = time.monotonic()
        result = client.chat(MESSAGES, component="memory")
        took = time.monotonic() - started
        assert result.text == '{"ok": true}'
        assert fake.served == ["stall", 200]
    assert 3.0 <= took < 10.0
    outcomes = [(x["outcome"], x["attempt"]) for x in _lines(request_log)]
    assert outcomes == [("cancelled", 0), ("ok", 1)]


def test_the_wait_for_the_compute_turn_is_not_counted_as_a_stall(request_log):
    # another server's request holds the machine for 5 s; then this server's count stands still
    # for 2 s before it answers. Before, the watchdog's clock ran from before the turn: at its
    # first look, 5 s of "no progress" > 3 s, and the request was cancelled (with no retry, an
    # error); now 2 s < 3 s since the turn was taken
    with FakeOpenAIServer(failures=["stall"], hang_s=2.0) as fake:
        client = as_embedded(
            ChatClient(Endpoint(model="local-0.5b", timeout_s=1.0, max_retries=0), cache=None),
            fake,
        )
        held = threading.Event()

        def hold_the_machine() -> None:
            with runtime.ComputeTurn("another-server"):
                held.set()
                time.sleep(5.0)

        threading.Thread(target=hold_the_machine, daemon=True).start()
        assert held.wait(5.0)
        started = time.monotonic()
        assert client.chat(MESSAGES, component="agent").text == '{"ok": true}'
        assert time.monotonic() - started >= 7.0  # the 5 s turn, then the 2 s answer
        assert fake.served == ["stall"]
    assert [(x["outcome"], x["attempt"]) for x in _lines(request_log)] == [("ok", 0)]


@pytest.mark.parametrize("server_works", [True, False])
def test_a_long_step_is_told_from_a_stuck_server_by_the_servers_cpu_time(request_log, server_works):
    # the decode count stands still for 6 s (one long prompt batch, during which llama.cpp's
    # /metrics cannot answer) against a 3 s stall limit: a server process spending CPU is waited
    # for; one that spends none (stuck) is given up on at 3 s and asked again
    work = "while True: pass" if server_works else "import time; time.sleep(60)"
    server = subprocess.Popen([sys.executable, "-c", work])
    try:
        with FakeOpenAIServer(failures=["stall"], hang_s=6.0) as fake:
            client = as_embedded(_local(timeout_s=1.0), fake, pid=server.pid)
            started = time.monotonic()
            assert client.chat(MESSAGES, component="agent").text == '{"ok": true}'
            took = time.monotonic() - started
    finally:
        server.kill()
        server.wait()
    outcomes = [(x["outcome"], x["attempt"]) for x in _lines(request_log)]
    if server_works:
        assert outcomes == [("ok", 0)] and took >= 6.0
        assert fake.served == ["stall"]
    else:
        assert outcomes == [("cancelled", 0), ("ok", 1)] and 3.0 <= took < 6.0
        assert fake.served == ["stall", 200]


def test_an_endpoint_elsewhere_keeps_its_timeout(request_log):
    endpoint = Endpoint(model="m", base_url="http://127.0.0.1:1/v1", timeout_s=0.5, max_retries=0)
    with FakeOpenAIServer(latency_s=3.0) as fake:
        endpoint = endpoint.model_copy(update={"base_url": fake.base_url})
        client = ChatClient(endpoint, cache=None)
        with pytest.raises(UserError, match="failed 1 times"):
            client.chat(MESSAGES, component="agent")
    assert [x["outcome"] for x in _lines(request_log)] == ["cancelled"]


def test_cache_hits_are_logged_as_such(request_log, tmp_path):
    with FakeOpenAIServer() as fake:
        client = as_embedded(
            ChatClient(Endpoint(model="local-0.5b"), cache=tmp_path / "c.sqlite"), fake
        )
        client.chat(MESSAGES, component="probe")
        client.chat(MESSAGES, component="probe")
    lines = _lines(request_log)
    assert [x["outcome"] for x in lines] == ["ok", "cache_hit"]
    assert [x["prompt_tokens"] for x in lines] == [10, 10]
    assert all(x["model"] == "qwen2.5-coder-0.5b-instruct-q4_k_m" and x["local"] for x in lines)


def _enter_in_thread(turn: runtime.ComputeTurn) -> threading.Event:
    entered = threading.Event()

    def run() -> None:
        with turn:
            entered.set()

    threading.Thread(target=run, daemon=True).start()
    return entered


def test_two_servers_never_compute_at_once(tmp_path):
    with runtime.ComputeTurn("a", tmp_path):
        with runtime.ComputeTurn("a", tmp_path):  # the same server: its slots run together
            other = _enter_in_thread(runtime.ComputeTurn("b", tmp_path))
            assert not other.wait(0.5)  # another server waits for a's requests in flight
        assert not other.wait(0.3)
    assert other.wait(5.0)


def test_a_waiting_server_goes_before_new_requests_of_the_busy_one(tmp_path):
    first = runtime.ComputeTurn("a", tmp_path).__enter__()
    waiting_b = _enter_in_thread(runtime.ComputeTurn("b", tmp_path))
    time.sleep(0.3)  # b holds turn.lock, waiting for a to drain
    late_a = threading.Event()

    def hold_a() -> None:
        with runtime.ComputeTurn("a", tmp_path):
            late_a.set()

    threading.Thread(target=hold_a, daemon=True).start()
    assert not late_a.wait(0.3)  # a new request to a does not overtake b's
    first.__exit__()
    assert waiting_b.wait(5.0)
    assert late_a.wait(5.0)


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("", None), ("64", None), (" 2 ", None)])
def test_memloop_threads_caps_the_cores(monkeypatch, value, expected):
    import os

    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("MEMLOOP_THREADS", value)
    want = expected if expected is not None else min(int(value.strip() or cores), cores)
    assert runtime.available_cores() == want


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_memloop_threads_refuses_what_is_not_a_count(monkeypatch, value):
    monkeypatch.setenv("MEMLOOP_THREADS", value)
    with pytest.raises(UserError, match="MEMLOOP_THREADS"):
        runtime.available_cores()


def test_the_servers_files_sit_next_to_the_models_unless_told(monkeypatch, tmp_path):
    monkeypatch.delenv(runtime.RUNTIME_ENV, raising=False)
    monkeypatch.setenv("MEMLOOP_MODELS_DIR", str(tmp_path / "models"))
    assert runtime.runtime_dir() == tmp_path / "models" / "servers"
    monkeypatch.setenv(runtime.RUNTIME_ENV, str(tmp_path / "own"))
    assert runtime.runtime_dir() == tmp_path / "own"
