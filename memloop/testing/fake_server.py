"""A loopback fake of the OpenAI chat-completions API, for tests and benchmarks.

It answers with a fixed or computed text after an optional delay, can fail with scripted HTTP
statuses first, and records every request (with the Authorization header it saw) and the peak
number of requests in flight.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memloop.llm.roles import RoleClients


class FakeOpenAIServer:
    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        reply: Callable[[dict[str, Any]], str] | str = '{"ok": true}',
        failures: list[int] | None = None,
    ):
        self.latency_s = latency_s
        self.reply = reply
        self.failures: deque[int] = deque(failures or [])
        self.requests: list[dict[str, Any]] = []
        self.auth_headers: list[str] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._httpd.request_queue_size = 128
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def start(self) -> FakeOpenAIServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body in one segment: avoids the 40 ms Nagle/delayed-ACK stall.
            disable_nagle_algorithm = True
            wbufsize = 1 << 16

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    fake.requests.append(body)
                    fake.auth_headers.append(self.headers.get("Authorization", ""))
                    fake.in_flight += 1
                    fake.peak_in_flight = max(fake.peak_in_flight, fake.in_flight)
                    status = fake.failures.popleft() if fake.failures else 200
                try:
                    if fake.latency_s:
                        time.sleep(fake.latency_s)
                    if status != 200:
                        self._send(
                            status,
                            {
                                "error": {
                                    "message": f"scripted {status}",
                                    "type": "fake",
                                    "code": status,
                                }
                            },
                        )
                        return
                    text = fake.reply(body) if callable(fake.reply) else fake.reply
                    self._send(
                        200,
                        {
                            "id": "fake-1",
                            "object": "chat.completion",
                            "created": 0,
                            "model": body.get("model", "fake"),
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": text},
                                }
                            ],
                            "usage": {
                                "prompt_tokens": 10,
                                "completion_tokens": 5,
                                "total_tokens": 15,
                            },
                        },
                    )
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

        return Handler


def serve_in_subprocess(latency_s: float = 0.0, reply: str = '{"ok": true}'):
    """Run a FakeOpenAIServer in its own process (so it does not share the caller's GIL).

    The result is (process, base_url). Terminate the process when done.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_serve, args=(latency_s, reply, queue), daemon=True)
    proc.start()
    return proc, queue.get(timeout=60)


def _child_serve(latency_s: float, reply: str, queue) -> None:
    server = FakeOpenAIServer(latency_s=latency_s, reply=reply)
    queue.put(server.base_url)
    server._httpd.serve_forever()


def request_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON schema a chat request's `response_format` asks for; None for plain chat."""
    return ((body.get("response_format") or {}).get("json_schema") or {}).get("schema")


def schema_valid_reply(body: dict[str, Any]) -> str:
    """A reply that fits any request: a short line for chat, schema-valid JSON otherwise.

    Multiple choice picks option 1; an enum its first value; any other property is "yes".
    """
    schema = request_schema(body)
    if schema is None:
        return "Noted, thanks."
    props = schema["properties"]
    if "answer" in props:
        return json.dumps({"answer": 1})
    return json.dumps({k: (p["enum"][0] if "enum" in p else "yes") for k, p in props.items()})


def fake_roles(
    base_url: str, cache: str | Path | None = None, temperature: float = 0.0
) -> RoleClients:
    """RoleClients whose four roles share one client on `base_url`, cached at `cache`."""
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint
    from memloop.llm.roles import RoleClients

    endpoint = Endpoint(model="m", base_url=base_url, temperature=temperature)
    client = ChatClient(endpoint, cache=cache)
    return RoleClients(client, client, client, client)
