"""A loopback fake of the OpenAI chat-completions API, for tests and benchmarks.

It answers with a fixed or computed text after an optional delay, can inject a scripted fault
into each of the first requests (`failures`: an HTTP status or a named fault, see FAULTS), and
records every request (with the Authorization header it saw), the faults it served and the peak
number of requests in flight.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memloop.llm.client import ChatClient
    from memloop.llm.embedded_server import DecodeProgress
    from memloop.llm.roles import RoleClients


# Named faults a request can be answered with (besides an int: that HTTP status with an error
# body; 429 and 503 carry `Retry-After: retry_after_s`).
FAULTS = {
    "ok": "the normal reply",
    "hang": "no answer for hang_s seconds, then the normal reply (a slow server: its decode "
    "count at /metrics moves meanwhile)",
    "stall": "no answer for hang_s seconds, then the normal reply, while the decode count at "
    "/metrics stands still (a stuck server)",
    "html": "HTTP 200 with an HTML page",
    "cut": "HTTP 200 with a chat completion cut in the middle of its JSON",
    "short": "HTTP 200 announcing the whole completion; half is sent, then the connection closes",
    "empty_choices": "HTTP 200 with a completion whose choices list is empty",
    "schema_violation": "a completion whose text is JSON that breaks any answer schema",
    "prose": "a completion whose text is prose, not JSON",
}


class _Server(ThreadingHTTPServer):
    # listen()'s backlog is read in the constructor: set on an instance it would stay at 5, and
    # hundreds of clients connecting at once were reset by the kernel
    request_queue_size = 1024
    daemon_threads = True


class FakeOpenAIServer:
    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        reply: Callable[[dict[str, Any]], str] | str = '{"ok": true}',
        failures: list[int | str] | None = None,
        hang_s: float = 60.0,
        retry_after_s: float = 0.0,
        logprobs: Callable[[dict[str, Any], str], list[tuple[str, float]]] | None = None,
    ):
        self.latency_s = latency_s
        self.reply = reply
        # (request, reply text) -> the first token's top alternatives, sent when a request asks
        # for `logprobs` (None: the server returns none, as many endpoints do)
        self.logprobs = logprobs
        self.hang_s = hang_s
        self.retry_after_s = retry_after_s
        unknown = [f for f in failures or [] if isinstance(f, str) and f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown faults {unknown}; known: {', '.join(FAULTS)}")
        self.failures: deque[int | str] = deque(failures or [])
        self.served: list[int | str] = []  # the fault (or 200) each request got, in order
        self.requests: list[dict[str, Any]] = []
        self.auth_headers: list[str] = []
        self.in_flight = 0
        self.stalled = 0  # requests in flight under the "stall" fault
        self.decode_steps = 0  # llama.cpp's n_decode_total: moves while a request progresses
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        self._httpd = _Server(("127.0.0.1", 0), self._handler())
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

            def _send(self, status: int, body: dict[str, Any] | bytes, **headers: str) -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", headers.pop("content_type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name.replace("_", "-"), value)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout): nothing to answer

            def _completion(self, body: dict[str, Any], text: str) -> dict[str, Any]:
                return {
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
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }

            def do_GET(self) -> None:
                if not self.path.endswith("/metrics"):
                    self._send(404, {"error": {"message": "not found"}})
                    return
                with fake._lock:  # each look at a progressing server sees a step more
                    if fake.in_flight > fake.stalled:
                        fake.decode_steps += 1
                    text = f"llamacpp:n_decode_total {fake.decode_steps}\n"
                self._send(200, text.encode(), content_type="text/plain")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with fake._lock:
                    fake.requests.append(body)
                    fake.auth_headers.append(self.headers.get("Authorization", ""))
                    fake.in_flight += 1
                    fake.peak_in_flight = max(fake.peak_in_flight, fake.in_flight)
                    fault = fake.failures.popleft() if fake.failures else 200
                    fake.served.append(fault)
                    fake.stalled += fault == "stall"
                try:
                    if fake.latency_s:
                        time.sleep(fake.latency_s)
                    if fault in ("hang", "stall"):
                        time.sleep(fake.hang_s)
                    if isinstance(fault, int) and fault != 200:
                        extra = {}
                        if fault in (429, 503):
                            extra["Retry_After"] = f"{fake.retry_after_s:g}"
                        self._send(
                            fault,
                            {
                                "error": {
                                    "message": f"scripted {fault}",
                                    "type": "fake",
                                    "code": fault,
                                }
                            },
                            **extra,
                        )
                        return
                    if fault == "html":
                        page = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
                        self._send(200, page, content_type="text/html")
                        return
                    if fault == "schema_violation":
                        text = '{"unexpected": [1, 2, 3]}'
                    elif fault == "prose":
                        text = "Sure! I would go with the second option, it fits you best."
                    else:
                        text = fake.reply(body) if callable(fake.reply) else fake.reply
                    completion = self._completion(body, text)
                    if body.get("logprobs") and fake.logprobs is not None:
                        top = fake.logprobs(body, text)
                        completion["choices"][0]["logprobs"] = {
                            "content": [
                                {
                                    "token": text,
                                    "logprob": top[0][1] if top else 0.0,
                                    "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top],
                                }
                            ]
                        }
                    if fault == "empty_choices":
                        completion["choices"] = []
                    if fault == "cut":
                        data = json.dumps(completion).encode()
                        self._send(200, data[: len(data) // 2])
                        return
                    if fault == "short":
                        data = json.dumps(completion).encode()
                        self.send_response(200)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data[: len(data) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self._send(200, completion)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1
                        fake.stalled -= fault == "stall"

        return Handler


def serve_in_subprocess(
    latency_s: float = 0.0, reply: Callable[[dict[str, Any]], str] | str = '{"ok": true}'
):
    """Run a FakeOpenAIServer in its own process (so it does not share the caller's GIL).

    `reply` as for FakeOpenAIServer; a function must be importable (module level), e.g.
    `schema_valid_reply`. The result is (process, base_url). Terminate the process when done.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_serve, args=(latency_s, reply, queue), daemon=True)
    proc.start()
    return proc, queue.get(timeout=60)


def _child_serve(latency_s: float, reply: Callable[[dict[str, Any]], str] | str, queue) -> None:
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
    base_url: str,
    cache: str | Path | None = None,
    temperature: float = 0.0,
    logprobs: bool | None = None,
) -> RoleClients:
    """RoleClients whose four roles share one client on `base_url`, cached at `cache`.

    `logprobs`: the endpoint's declaration (`Endpoint.logprobs`).
    """
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint
    from memloop.llm.roles import RoleClients

    endpoint = Endpoint(model="m", base_url=base_url, temperature=temperature, logprobs=logprobs)
    client = ChatClient(endpoint, cache=cache)
    return RoleClients(client, client, client, client)


@dataclass
class FakeEmbedded:
    """What the chat client uses of the embedded model's server, played by a fake."""

    ident: str  # its compute turn's name (memloop.llm.runtime.ComputeTurn)
    base_url: str
    progress: DecodeProgress  # read from the fake's /metrics (and /proc of `pid`, if given)
    key: str = "fake-embedded-key"  # the secret its requests carry (FakeOpenAIServer.auth_headers)


def as_embedded(client: ChatClient, fake: FakeOpenAIServer, pid: int | None = None) -> ChatClient:
    """Point a `base_url: local` client at `fake` as if the fake were the embedded server.

    The client then waits for answers as it does for the embedded model (compute turns, no
    deadline while the decode count moves). `pid`: a process whose CPU time stands for the
    server's (None: the decode count alone).
    """
    from memloop.llm.embedded_server import DecodeProgress

    assert client.endpoint.is_local, "as_embedded is for a base_url: local endpoint"
    client._resolved_base_url = fake.base_url
    port = fake.base_url.split(":")[-1].split("/")[0]
    client._server = FakeEmbedded(
        f"fake-{port}", fake.base_url, DecodeProgress(fake.base_url, pid=pid)
    )
    return client
