"""The response cache gives the same request the same record, and its faults are one line.

- An answer cut off at max_tokens (finish_reason "length") is cached like any other and served
  back identically (text, finish_reason, json_error), so a server that does not repeat itself at
  temperature 0 cannot change a record; a complete answer that ignores its schema still is not.
- The JSON schemas memloop sends bound their free strings and arrays, so a grammar-constrained
  repetition loop ends inside valid JSON.
- A full disk, an I/O error or a lock file that cannot be made under the response cache ends in
  one line naming the cache file, exit 2, never a traceback.

The endpoint here is a loopback fake that, like a real server, gives a different runaway answer
each time it is asked.
"""

from __future__ import annotations

import errno
import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from memloop.environment.datafile import save_items
from memloop.environment.policy_check import PROBE_SCHEMA
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.llm.cache import ResponseCache
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.policies.external import FACTS_SCHEMA, memory_actions_schema
from memloop.testing import FakeOpenAIServer, request_schema, schema_valid_reply
from memloop.testing.commands import eval_argv
from memloop.testing.paths import REPO

EXAMPLE = REPO / "examples" / "keyword_memory" / "policy.yaml"
MSGS = [{"role": "user", "content": "Which city do I live in?"}]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


class RunawayServer:
    """An OpenAI-compatible fake whose every answer is new: JSON requests get a repetition loop
    cut off at max_tokens (finish_reason "length"), one word longer each time; chat requests a
    numbered sentence. Records every request body."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.requests.append(body)
                    n = len(fake.requests)
                if body.get("response_format"):
                    text, finish = '{"city": "Lisbon, Portugal' + ", Europa" * n, "length"
                else:
                    text, finish = f"You live in Lisbon (answer {n}).", "stop"
                data = json.dumps(
                    {
                        "id": "runaway",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "fake"),
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": finish,
                                "message": {"role": "assistant", "content": text},
                            }
                        ],
                        "usage": {"prompt_tokens": 10, "completion_tokens": 7 + n},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> RunawayServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def runaway():
    with RunawayServer() as server:
        yield server


def client_on(server: Any, cache: Path) -> ChatClient:
    return ChatClient(Endpoint(model="fake", base_url=server.base_url, max_retries=0), cache=cache)


def endpoint_file(tmp_path: Path, server: Any) -> Path:
    path = tmp_path / "fake.yaml"
    path.write_text(f"model: fake\nbase_url: {server.base_url}\n")
    return path


def check_example(tmp_path: Path, server: Any) -> int:
    """`memloop policy check` of the README's plug-in example on `server`."""
    endpoint = endpoint_file(tmp_path, server)
    cache = tmp_path / "c.sqlite"
    return main(
        ["policy", "check", str(EXAMPLE), "--endpoint", str(endpoint), "--cache", str(cache)]
    )


# -- 1. the same request, the same record ------------------------------------------------------


def test_an_answer_cut_at_max_tokens_is_cached_and_served_back_identically(runaway, tmp_path):
    first = client_on(runaway, tmp_path / "c.sqlite").chat_json(MSGS, SCHEMA, component="probe")
    assert first.finish_reason == "length" and not first.cached
    assert first.text == '{"city": "Lisbon, Portugal, Europa'
    assert first.parsed is None
    assert first.json_error == (
        "cut off at max_tokens (finish_reason 'length'), "
        "not JSON: Unterminated string starting at at char 9"
    )
    # the same request, by the same client and by a new one on the same cache (a rerun)
    same = client_on(runaway, tmp_path / "c.sqlite")
    for client in (same, same, client_on(runaway, tmp_path / "c.sqlite")):
        again = client.chat_json(MSGS, SCHEMA, component="probe")
        assert again.cached
        assert (again.text, again.finish_reason, again.parsed, again.json_error) == (
            first.text,
            first.finish_reason,
            None,
            first.json_error,
        )
        assert (again.prompt_tokens, again.completion_tokens) == (10, 8)
    assert len(runaway.requests) == 1  # the server, which would have answered differently


def test_a_retry_of_a_cut_answer_with_a_new_sample_is_asked_and_then_replayed(runaway, tmp_path):
    # what a caller that retries does (a new sample index): a new request, itself cached
    client = client_on(runaway, tmp_path / "c.sqlite")
    texts = [client.chat_json(MSGS, SCHEMA, component="p", sample=s).text for s in (0, 1, 0, 1)]
    assert texts[0] != texts[1] and texts[2:] == texts[:2]
    assert len(runaway.requests) == 2


@pytest.mark.parametrize("junk", ["Sure! Lisbon, I think.", '{"town": "Lisbon"}'])
def test_a_complete_answer_that_ignores_its_schema_is_still_asked_again(tmp_path, junk):
    # finish_reason "stop": the endpoint ignored the schema; once fixed, the next run must ask
    with FakeOpenAIServer(reply=junk) as server:
        client = client_on(server, tmp_path / "c.sqlite")
        first = client.chat_json(MSGS, SCHEMA, component="probe")
        second = client.chat_json(MSGS, SCHEMA, component="probe")
        assert first.json_error is not None and first.json_error == second.json_error
        assert not first.json_error.startswith("cut off")
        assert (first.cached, second.cached, len(server.requests)) == (False, False, 2)


def test_policy_check_of_the_example_passes_on_an_endpoint_that_never_repeats_itself(
    runaway, tmp_path, capsys
):
    # the README's plug-in on a server whose JSON answers run away and differ on every request
    code = check_example(tmp_path, runaway)
    out = capsys.readouterr().out
    assert "  ok  the same conversation and probes give the same answers" in out
    assert "FAIL" not in out
    assert code == 0
    # every distinct request went to the server once: the repeats came from the cache
    distinct = {json.dumps(r, sort_keys=True) for r in runaway.requests}
    assert len(distinct) == len(runaway.requests)


# -- 2. bounded schemas ------------------------------------------------------------------------


def unbounded(schema: Any, path: str = "$") -> list[str]:
    """The paths of free strings without maxLength and arrays without maxItems in `schema`."""
    found = []
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "string" and not {"enum", "const", "maxLength"} & set(schema):
            found.append(path)
        if kind == "array" and "maxItems" not in schema:
            found.append(path)
        for key, value in schema.items():
            found += unbounded(value, f"{path}.{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found += unbounded(value, f"{path}[{i}]")
    return found


def test_the_walker_finds_unbounded_strings_and_arrays():
    assert unbounded(SCHEMA) == ["$.properties.city"]
    assert unbounded({"type": "array", "items": {"type": "string", "enum": ["a"]}}) == ["$"]
    assert unbounded({"type": "array", "maxItems": 3, "items": {"type": "integer"}}) == []


def test_the_schemas_policy_check_sends_bound_every_free_string(runaway, tmp_path):
    code = check_example(tmp_path, runaway)
    sent = [
        r["response_format"]["json_schema"]["schema"]
        for r in runaway.requests
        if "response_format" in r
    ]
    # two distinct JSON requests (one per probe; every repeat came from the cache)
    assert code == 0 and sent == [PROBE_SCHEMA, PROBE_SCHEMA]
    assert unbounded(PROBE_SCHEMA) == []
    assert PROBE_SCHEMA["properties"]["city"]["maxLength"] == 80


def test_mem0s_answer_schemas_bound_their_free_text_and_lists():
    assert unbounded(FACTS_SCHEMA) == []
    actions = memory_actions_schema(["0", "1", "2"])
    assert unbounded(actions) == []
    assert (
        actions["properties"]["memory"]["maxItems"]
        == 3 + FACTS_SCHEMA["properties"]["facts"]["maxItems"]
    )


# -- 3. faults of the cache file ---------------------------------------------------------------


class FailingConnection:
    """A sqlite connection whose statements starting with `verb` raise `error`."""

    def __init__(self, conn: sqlite3.Connection, verb: str, error: Exception):
        self.conn, self.verb, self.error = conn, verb, error

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.lstrip().upper().startswith(self.verb):
            raise self.error
        return self.conn.execute(sql, *args)

    def close(self) -> None:
        self.conn.close()


def fail_statements(monkeypatch, verb: str, error: Exception) -> None:
    real = ResponseCache._conn

    def conn(self):
        return FailingConnection(real(self), verb, error)

    monkeypatch.setattr(ResponseCache, "_conn", conn)


def valid_reply(body: dict[str, Any]) -> str:
    """Schema-valid JSON for any request, `memloop llm check`'s (numbers, booleans) included."""
    schema = request_schema(body)
    if schema and "population_millions" in schema.get("properties", {}):
        return '{"city": "Paris", "population_millions": 2.1, "is_capital": true}'
    return schema_valid_reply(body)


@pytest.fixture(scope="module")
def valid_server():
    with FakeOpenAIServer(reply=valid_reply) as server:
        yield server


def commands(kind: str, tmp_path: Path, server: Any) -> list[str]:
    endpoint = str(endpoint_file(tmp_path, server))
    cache = tmp_path / "cache" / "responses.sqlite"
    if kind == "llm check":
        return ["llm", "check", "--endpoint", endpoint, "--cache", str(cache)]
    if kind == "policy check":
        return ["policy", "check", str(EXAMPLE), "--endpoint", endpoint, "--cache", str(cache)]
    env = tmp_path / "env.json"
    save_items(generate_procedural(users=2, periods=1, questions=1, seed=0), env)
    native = REPO / "memloop/experiments/policies/native.yaml"
    return eval_argv(env, native, Path(endpoint), cache, tmp_path / "out")


def one_line(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.mark.parametrize("kind", ["llm check", "eval"])
def test_a_full_disk_under_the_response_cache_is_one_line_naming_it(
    kind, tmp_path, valid_server, monkeypatch, capsys, no_progress_bars
):
    argv = commands(kind, tmp_path, valid_server)
    fail_statements(monkeypatch, "INSERT", sqlite3.OperationalError("database or disk is full"))
    assert main(argv) == 2
    line = one_line(capsys, str(tmp_path / "cache" / "responses.sqlite"))
    assert line == (
        f"memloop: error: {tmp_path / 'cache' / 'responses.sqlite'}: cannot write to the response "
        "cache (database or disk is full); free space, or pass another --cache "
        "(or MEMLOOP_CACHE_DIR)"
    )


@pytest.mark.parametrize("kind", ["llm check", "eval"])
def test_an_io_error_reading_the_response_cache_is_one_line_naming_it(
    kind, tmp_path, valid_server, monkeypatch, capsys, no_progress_bars
):
    argv = commands(kind, tmp_path, valid_server)
    fail_statements(monkeypatch, "SELECT VALUE", sqlite3.OperationalError("disk I/O error"))
    assert main(argv) == 2
    line = one_line(capsys, str(tmp_path / "cache" / "responses.sqlite"))
    assert line.endswith(
        "cannot read the response cache (disk I/O error); pass another --cache (or "
        "MEMLOOP_CACHE_DIR)"
    )


def test_a_full_disk_during_policy_check_is_one_line_naming_the_cache(
    tmp_path, valid_server, monkeypatch, capsys
):
    # a cache fault is not the policy's: the usual one line on stderr, no FAIL line blaming it
    argv = commands("policy check", tmp_path, valid_server)
    fail_statements(monkeypatch, "INSERT", sqlite3.OperationalError("database or disk is full"))
    assert main(argv) == 2
    captured = capsys.readouterr()
    cache = tmp_path / "cache" / "responses.sqlite"
    assert [line for line in captured.out.splitlines() if line.startswith("FAIL")] == []
    assert captured.err.splitlines() == [
        f"memloop: error: {cache}: cannot write to the response cache (database or disk is full); "
        "free space, or pass another --cache (or MEMLOOP_CACHE_DIR)"
    ]


def test_a_cache_damaged_while_in_use_is_one_line_naming_it(
    tmp_path, valid_server, monkeypatch, capsys
):
    argv = commands("llm check", tmp_path, valid_server)
    fail_statements(
        monkeypatch, "INSERT", sqlite3.DatabaseError("database disk image is malformed")
    )
    assert main(argv) == 2
    line = one_line(capsys, str(tmp_path / "cache" / "responses.sqlite"))
    assert line.endswith(
        "cannot write to the response cache (database disk image is malformed); the file is "
        "damaged: delete it, or pass another --cache"
    )


@pytest.mark.parametrize(
    "error,hint",
    [
        (OSError(errno.EIO, "Input/output error"), "pass another --cache"),
        (OSError(errno.ENOSPC, "No space left on device"), "free space"),
    ],
)
def test_a_lock_file_that_cannot_be_made_beside_the_cache_is_one_line_naming_it(
    tmp_path, valid_server, monkeypatch, capsys, error, hint
):
    argv = commands("llm check", tmp_path, valid_server)
    cache = tmp_path / "cache" / "responses.sqlite"

    def no_lock(path, what):
        raise OSError(error.errno, error.strerror, str(path))

    monkeypatch.setattr("memloop.llm.cache.file_lock", no_lock)
    assert main(argv) == 2
    line = one_line(capsys, f"{cache}: cannot open the response cache ({error.strerror})", hint)
    assert line.startswith(f"memloop: error: {cache}: ")
