"""One embedded runtime per machine, on the real embedded 0.5B model (issue 46): two processes
share one server, a slowed server is waited for instead of cancelled, and a request asked again
reuses the prompt prefix the server's slot kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from memloop.llm import runtime

pytestmark = pytest.mark.real_model

SHARE = """
import json, sys
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
endpoint = Endpoint(model="local-0.5b", max_concurrency=1, context_window=2048, max_tokens=4)
client = ChatClient(endpoint, cache=None)
def ask():
    return bool(client.chat([{"role": "user", "content": "Say hi."}], component="agent").text)
ok = ask()
server = client._server
print(json.dumps({"pid": server.pid, "url": server.base_url, "started": server.started,
                  "ok": ok}), flush=True)
sys.stdin.readline()
print(json.dumps({"ok": ask()}), flush=True)
"""


def _spawn(runtime_dir) -> subprocess.Popen:
    # servers of their own: a server of the same settings another test (or a user's command)
    # keeps running would be shared too, and neither process would have started it
    return subprocess.Popen(
        [sys.executable, "-c", SHARE],
        env={**os.environ, runtime.RUNTIME_ENV: str(runtime_dir)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_two_processes_share_one_server_and_it_ends_with_the_last(tmp_path):
    first = _spawn(tmp_path)
    time.sleep(0.5)  # the second arrives while the first is starting the model
    second = _spawn(tmp_path)
    try:
        one = json.loads(first.stdout.readline())
        two = json.loads(second.stdout.readline())
        assert one["ok"] and two["ok"]
        assert one["pid"] == two["pid"] and one["url"] == two["url"]
        assert sorted([one["started"], two["started"]]) == [False, True]
        starter, other = (first, second) if one["started"] else (second, first)
        starter.stdin.write("\n")
        starter.stdin.flush()
        assert json.loads(starter.stdout.readline())["ok"]
        starter.wait(30)
        time.sleep(1.5)  # the server looks for users twice a second: the other is one
        assert runtime.is_server_process(one["pid"])
        root = one["url"].removesuffix("/v1")
        with urllib.request.urlopen(root + "/health", timeout=5) as resp:
            assert resp.status == 200
        other.stdin.write("\n")
        other.stdin.flush()
        assert json.loads(other.stdout.readline())["ok"]
        other.wait(30)
        deadline = time.monotonic() + 10
        while runtime.is_server_process(one["pid"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not runtime.is_server_process(one["pid"]), "the server outlived its last user"
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()


def test_a_slowed_server_is_waited_for_and_a_repeat_reuses_the_prefix(tmp_path, monkeypatch):
    from memloop.llm.client import MIN_STALL_S, ChatClient
    from memloop.llm.embedded_server import ServerSettings
    from memloop.llm.endpoint import Endpoint

    log = tmp_path / "requests.jsonl"
    monkeypatch.setenv("MEMLOOP_REQUEST_LOG", str(log))
    # one thread: slowed to about half its speed; a 1 s timeout and no retries, so a request
    # cancelled at its timeout (what the client did before) fails the test
    endpoint = Endpoint(
        model="local-0.5b",
        timeout_s=1.0,
        max_retries=0,
        max_tokens=160,
        max_concurrency=1,
        context_window=2048,
    )
    client = ChatClient(
        endpoint,
        cache=None,
        server_settings=ServerSettings(slots=1, ctx_per_slot=2048, threads=1),
    )
    messages = [
        {"role": "system", "content": "You are a storyteller. " * 20},
        {"role": "user", "content": "Tell a long story about a lighthouse keeper and a cat."},
    ]
    client.chat(messages, component="agent", temperature=0.0)
    client.chat(messages, component="agent", temperature=0.0, max_tokens=1)  # asked again
    first, again = (json.loads(line) for line in log.read_text().splitlines())
    assert (first["outcome"], first["attempt"]) == ("ok", 0)
    assert first["latency_s"] > 2 * MIN_STALL_S  # long past any per-request deadline
    assert first["timings"]["predicted_n"] > 50
    prompt = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
    assert again["outcome"] == "ok"
    assert again["timings"]["cache_n"] >= prompt - 1  # all but the last token kept


def test_the_real_server_requires_its_secret_and_proves_itself(local_client):
    """Issue 57, point 3, on the real server: a request without the secret is refused (401), the
    secret is in a file only its user can read, never on the command line, and the server
    proves itself by it."""
    import urllib.error

    from memloop.llm import embedded_server

    local_client.resolved_base_url()
    server = local_client._server
    root = server.base_url.removesuffix("/v1")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(root + "/metrics", timeout=30)
    assert refused.value.code == 401
    asked = urllib.request.Request(
        root + "/metrics", headers={"Authorization": f"Bearer {server.key}"}
    )
    with urllib.request.urlopen(asked, timeout=30) as resp:
        assert resp.status == 200
    assert server.key_path.stat().st_mode & 0o777 == 0o600
    assert server.key_path.read_text() == server.key and len(server.key) >= 40
    with open(f"/proc/{server.pid}/cmdline", "rb") as fh:
        assert server.key.encode() not in fh.read()
    assert embedded_server.proves_itself(server.pid, server.base_url, server.key)
    count, ticks = server.progress.marks()
    assert count is not None  # the decode count is read with the secret
    assert ticks is not None  # and the server process's CPU time
    assert local_client.chat([{"role": "user", "content": "Say hi."}], component="agent").text
