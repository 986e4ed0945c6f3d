"""Chat requests to a plain-HTTP endpoint over one keep-alive connection per calling thread.

For ``http://`` endpoints with no proxy (the embedded model, vLLM or SGLang on a local network,
the test fake) memloop sends each request with the standard library's ``http.client`` instead of
the OpenAI SDK over its HTTP client (httpx2 since openai 3): with hundreds of requests in flight
the SDK's request building and the client's pool took most of memloop's CPU per call (issue 32).
Every failure is raised as the OpenAI SDK's own exception (built by the SDK from the response for
an HTTP status), so the client's retry policy and its messages are the same on both paths.
``https://`` endpoints (TLS, certificates, proxies) keep the SDK.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai


def usable(base_url: str) -> bool:
    """Whether `base_url` is plain HTTP that no proxy setting routes elsewhere."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    proxies = urllib.request.getproxies()
    return "http" not in proxies or bool(urllib.request.proxy_bypass(parts.hostname))


class PlainHTTP:
    """POSTs JSON to ``<base_url>/chat/completions``; one connection per calling thread."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float, sdk: openai.OpenAI):
        parts = urlsplit(base_url.rstrip("/"))
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = f"{parts.path}/chat/completions"
        self.url = f"{base_url.rstrip('/')}/chat/completions"
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.sdk = sdk  # builds the SDK's status errors from a response
        self.local = threading.local()

    def connection(self) -> http.client.HTTPConnection:
        """This thread's connection (picked by the calling thread, used by its request thread)."""
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(
                self.host, self.port, timeout=self.timeout_s
            )
        return conn

    def drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        if getattr(self.local, "conn", None) is conn:
            self.local.conn = None

    def post(self, conn: http.client.HTTPConnection, body: dict[str, Any]) -> httpx2.Response:
        """Send `body` on `conn`; the answer as an httpx2.Response (what the caller parses).

        HTTP statuses >= 400 raise the SDK's status error; a timeout raises APITimeoutError; a
        refused connection APIConnectionError from httpx2.ConnectError; a connection the server
        broke off APIConnectionError from httpx2.ReadError, as the SDK path does.
        """
        request = httpx2.Request("POST", self.url)
        data = json.dumps(body).encode()
        for attempt in (0, 1):
            fresh = conn.sock is None
            try:
                conn.request("POST", self.path, body=data, headers=self.headers)
                answer = conn.getresponse()
                content = answer.read()
                break
            except TimeoutError as exc:
                self.drop(conn)
                raise openai.APITimeoutError(request=request) from exc
            except ConnectionRefusedError as exc:
                self.drop(conn)
                raise openai.APIConnectionError(request=request) from httpx2.ConnectError(str(exc))
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                # a kept-alive connection the server had closed: send again, once, on a new one
                if attempt == 0 and not fresh and _stale(exc):
                    continue
                self.drop(conn)
                raise openai.APIConnectionError(request=request) from httpx2.ReadError(
                    f"{type(exc).__name__}: {exc}"
                )
        response = httpx2.Response(
            answer.status, headers=answer.getheaders(), content=content, request=request
        )
        if answer.will_close:
            self.drop(conn)
        if answer.status >= 400:
            raise self.sdk._make_status_error_from_response(response)
        return response


def _stale(exc: BaseException) -> bool:
    return isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError))
