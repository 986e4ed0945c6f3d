"""The one chat client every component uses.

It provides the OpenAI HTTP API, JSON-schema constrained output, retries with backoff, a
concurrency bound per endpoint, a persistent response cache and token accounting per component
tag.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx2
import jsonschema
import openai

from memloop.core import interrupt
from memloop.core.errors import UserError
from memloop.core.settings import cache_root
from memloop.llm import plain_http, request_log
from memloop.llm.cache import ResponseCache, cache_key
from memloop.llm.calls import note_call
from memloop.llm.embedded_server import DecodeProgress, ServerSettings, shared_server
from memloop.llm.endpoint import MAX_TIMEOUT_S, Endpoint
from memloop.llm.errors import EndpointUnreachable
from memloop.llm.model_files import resolve_packaged_model
from memloop.llm.plain_http import PlainHTTP
from memloop.llm.runtime import ComputeTurn
from memloop.llm.usage import UsageTracker


class NotACompletion(Exception):
    """HTTP 200 whose body is not a chat completion (HTML, cut JSON, no choices): retried."""


RETRYABLE = (
    NotACompletion,
    openai.APITimeoutError,
    openai.APIConnectionError,
    openai.RateLimitError,
    openai.InternalServerError,
)


class LLMRequestError(UserError):
    """The endpoint rejected a request for a reason retrying cannot fix (a 4xx other than 429)."""


@dataclass
class ChatResult:
    """One answer.

    `parsed` is set when a schema was given and the text validated against it; otherwise
    `json_error` says why not (never silently replaced).
    """

    text: str
    cached: bool
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    latency_s: float = 0.0
    parsed: Any = None
    json_error: str | None = None
    # with `top_logprobs` asked: per generated token, its top alternatives [(token, logprob)];
    # None when not asked or when the endpoint returned none
    top_logprobs: list[list[tuple[str, float]]] | None = None

    @property
    def ok(self) -> bool:
        return self.json_error is None


def _result_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """ChatResult's fields from a `_send` answer or a cached one (old entries lack some keys)."""
    top = raw.get("top_logprobs")
    return {
        "text": raw["text"],
        "model": raw["model"],
        "prompt_tokens": raw["prompt_tokens"],
        "completion_tokens": raw["completion_tokens"],
        "finish_reason": raw.get("finish_reason"),
        "latency_s": raw.get("latency_s", 0.0),
        "top_logprobs": None if top is None else [[(t, float(lp)) for t, lp in pos] for pos in top],
    }


def _top_logprobs(choice: dict[str, Any]) -> list[list[list[Any]]] | None:
    """Per generated token its top alternatives [[token, logprob], ...] (OpenAI's `logprobs`).

    None when the endpoint returned no log-probabilities.
    """
    content = (choice.get("logprobs") or {}).get("content")
    if not content:
        return None
    out = []
    for position in content:
        top = position.get("top_logprobs") or []
        out.append([[str(t.get("token", "")), float(t["logprob"])] for t in top if "logprob" in t])
    return out


class LocalServer(Protocol):
    """What the client uses of the embedded model's server (EmbeddedServer, or a test's fake)."""

    @property
    def ident(self) -> str: ...  # its compute turn (runtime.ComputeTurn)

    @property
    def base_url(self) -> str | None: ...

    @property
    def progress(self) -> DecodeProgress: ...

    @property
    def key(self) -> str: ...  # the secret every request to it carries


@dataclass
class _EndpointGate:
    semaphore: threading.BoundedSemaphore
    in_flight: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


_gates: dict[tuple[str, str], _EndpointGate] = {}
_gates_lock = threading.Lock()


def _gate_for(endpoint: Endpoint) -> _EndpointGate:
    """One concurrency bound per (base_url, model) in this process, shared by all clients."""
    key = (endpoint.base_url, endpoint.model)
    with _gates_lock:
        gate = _gates.get(key)
        if gate is None:
            gate = _EndpointGate(threading.BoundedSemaphore(endpoint.max_concurrency))
            _gates[key] = gate
        return gate


DRAW_SEED_STRIDE = 100_003  # seed = draw * stride + sample: draws never share a seed


def default_cache_path() -> Path:
    return cache_root() / "responses.sqlite"


CONNECTIONS_PER_POOL = 16
"""Connections per HTTP pool: httpcore scans its whole pool under one lock for every request,
so with hundreds of requests in flight one pool costs more CPU per call than the call itself
(issue 32); a ChatClient spreads its calling threads over ceil(max_concurrency / 16) pools."""


class _Connection:
    """The HTTP clients (pools) of a ChatClient and its forks, made on first use.

    Each calling thread keeps the pool it was first given (round robin), so its keep-alive
    connection is reused; the endpoint's concurrency bound stays the one gate over all pools.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.clients: list[openai.OpenAI] = []
        self.plain: PlainHTTP | None = None  # plain-HTTP endpoints: the standard library's
        self.local = threading.local()
        self.turn = 0

    def pick(self) -> openai.OpenAI | None:
        clients = self.clients
        if not clients:
            return None
        index = getattr(self.local, "index", None)
        if index is None:
            with self.lock:
                index = self.local.index = self.turn
                self.turn += 1
        return clients[index % len(clients)]


class ChatClient:
    """Chat completions against one Endpoint. Safe to share between threads."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        cache: ResponseCache | str | Path | None = "default",
        usage: UsageTracker | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 20.0,
        server_settings: ServerSettings | None = None,
    ):
        endpoint.api_key()  # an unset key variable is refused before the cache file is made
        self.endpoint = endpoint
        if cache == "default":
            cache = ResponseCache(default_cache_path())
        elif isinstance(cache, (str, Path)):
            cache = ResponseCache(cache)
        self.cache: ResponseCache | None = cache
        self.usage = usage or UsageTracker()
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._server_settings = server_settings
        self._gate = _gate_for(endpoint)
        self._connection = _Connection()  # shared by every fork: one HTTP client and pool
        self._resolved_base_url: str | None = None
        self._server: LocalServer | None = None  # the embedded model's, once started
        self.requests_sent = 0
        self.draw = 0  # which repeat of a whole run this client's sampled answers belong to

    def fork(self, usage: UsageTracker | None = None) -> ChatClient:
        """A client on the same endpoint, cache, connection and concurrency bound.

        It counts its tokens in its own tracker (e.g. one per simulated user).
        """
        twin = copy.copy(self)
        twin.usage = usage or UsageTracker()
        twin.requests_sent = 0
        return twin

    def with_draw(self, draw: int) -> ChatClient:
        """A fork whose sampled answers are repeat `draw` of a run (`repeats:` in evolve).

        At temperature > 0 every request of draw d gets its own seed and cache entry, so a repeat
        draws the simulated user and the agent afresh and a rerun replays it exactly; at
        temperature 0 a draw cannot change an answer, and the cache entry is shared.
        """
        if draw < 0:
            raise ValueError(f"draw must be >= 0, got {draw}")
        twin = self.fork()
        twin.draw = draw
        return twin

    # -- connection ---------------------------------------------------------------------------

    @property
    def cache_identity(self) -> tuple[str, str]:
        """(base_url, model) as they enter cache keys.

        For the embedded model, the model file's hash instead of the random port, so a rerun hits
        the cache.
        """
        if self.endpoint.is_local:
            packaged = resolve_packaged_model(self.endpoint.model)
            return ("local", f"{packaged.key}@{packaged.sha256[:16]}")
        return (self.endpoint.base_url.rstrip("/"), self.endpoint.model)

    @property
    def api_model_name(self) -> str:
        if self.endpoint.is_local:
            return resolve_packaged_model(self.endpoint.model).key
        return self.endpoint.model

    def preflight(self, timeout_s: float = 10.0) -> None:
        """Refuse, in one line and before any work starts, an endpoint that cannot serve.

        One GET of the OpenAI-compatible `/models` list (no tokens spent): an unreachable server,
        a rejected key (401/403) and a model the server does not list are refused; a server
        that has no such list (any other answer) is taken as it is. The embedded model is not
        asked (it starts on first use, from files already checked).
        """
        if self.endpoint.is_local:
            return
        base = self.endpoint.base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {self.endpoint.api_key()}"}
        try:
            response = httpx2.get(f"{base}/models", headers=headers, timeout=timeout_s)
        except httpx2.HTTPError as exc:
            raise EndpointUnreachable(
                f"cannot reach {base} ({_short(exc)}); start the server or fix base_url in the "
                "endpoint file"
            ) from None
        if response.status_code in (401, 403):
            raise self._key_rejected(response.status_code)
        if response.status_code != 200:
            return
        try:
            listed = [str(m["id"]) for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError):
            return  # not OpenAI's list: nothing to check against
        if listed and self.endpoint.model not in listed:
            shown = ", ".join(sorted(listed)[:8]) + (", ..." if len(listed) > 8 else "")
            raise UserError(f"{base} serves no model {self.endpoint.model!r} (it lists: {shown})")

    def _key_rejected(self, status: int) -> UserError:
        """The one line for a key the server refused, naming its variable (never the key)."""
        key_variable = self.endpoint.api_key_env or "(none configured: set api_key_env)"
        return UserError(
            f"{self.endpoint.base_url} rejected the API key (HTTP {status}); check "
            f"the variable {key_variable}"
        )

    def resolved_base_url(self) -> str:
        """The URL requests go to; starts the embedded model on first use."""
        if self._resolved_base_url is None:
            if self.endpoint.is_local:
                settings = self._server_settings or ServerSettings(
                    slots=self.endpoint.max_concurrency,
                    ctx_per_slot=self.endpoint.effective_context_window or 8192,
                )
                server = shared_server(resolve_packaged_model(self.endpoint.model), settings)
                assert server.base_url is not None
                self._server = server
                self._resolved_base_url = server.base_url
            else:
                self._resolved_base_url = self.endpoint.base_url.rstrip("/")
        return self._resolved_base_url

    def _api_key(self) -> str:
        """The key requests carry: the embedded server's secret, else the endpoint's key."""
        if self.endpoint.is_local and self._server is not None:
            return self._server.key
        return self.endpoint.api_key()

    def _openai(self) -> openai.OpenAI:
        """This thread's OpenAI client of the endpoint.

        The pools are made once and shared by every fork, with one SSL context for all of them;
        no lock once they exist.
        """
        connection = self._connection
        client = connection.pick()
        if client is not None:
            return client
        with connection.lock:
            if not connection.clients:
                base_url = self.resolved_base_url()
                # the embedded server on 127.0.0.1 is always reached directly, proxy or not
                plain = self.endpoint.is_local or plain_http.usable(base_url)
                # the embedded model: no deadline per request; the watchdog in _send gives up
                # on a request only when the server has stopped making progress
                timeout = MAX_TIMEOUT_S if self.endpoint.is_local else self.endpoint.timeout_s
                # on the plain path the SDK client only builds status errors: one is enough
                pools = 1 if plain else -(-self.endpoint.max_concurrency // CONNECTIONS_PER_POOL)
                size = self.endpoint.max_concurrency + 4  # the gate bounds the sum, not a pool
                limits = httpx2.Limits(max_connections=size, max_keepalive_connections=size)
                ssl_context = httpx2.create_ssl_context()
                api_key = self._api_key()
                connection.clients = [
                    openai.OpenAI(
                        base_url=base_url,
                        api_key=api_key,
                        timeout=timeout,
                        max_retries=0,  # retries are ours: one policy for every endpoint
                        http_client=httpx2.Client(
                            limits=limits,
                            timeout=timeout,
                            verify=ssl_context,
                            # the embedded server: never through a proxy (its secret with it)
                            trust_env=not self.endpoint.is_local,
                        ),
                    )
                    for _ in range(pools)
                ]
                if plain:
                    connection.plain = PlainHTTP(
                        base_url,
                        api_key,
                        timeout,
                        sdk=connection.clients[0],
                    )
        client = connection.pick()
        assert client is not None
        return client

    def close(self) -> None:
        """Close the shared HTTP clients (a later request opens new ones)."""
        connection = self._connection
        with connection.lock:
            clients, connection.clients = connection.clients, []
            connection.plain = None
        for client in clients:
            client.close()

    # -- calls --------------------------------------------------------------------------------

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        component: str,
        schema: dict[str, Any] | None = None,
        schema_name: str = "answer",
        sample: int = 0,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stop: list[str] | None = None,
        use_cache: bool = True,
        refresh: bool = False,
        top_logprobs: int | None = None,
    ) -> ChatResult:
        """One chat completion.

        `sample` distinguishes repeated draws of the same request; `refresh` asks the endpoint even
        on a cache hit (and stores the new answer). Every answer enters the response cache but a
        complete one that breaks `schema` (see `cacheable`). `top_logprobs`: ask for that many
        alternatives of each generated token with their log-probabilities (`result.top_logprobs`;
        None when the endpoint gives none).
        """
        params: dict[str, Any] = {
            "temperature": self.endpoint.temperature if temperature is None else temperature,
            "max_tokens": self.endpoint.max_tokens if max_tokens is None else max_tokens,
            "stop": stop,
        }
        if top_logprobs:  # only when asked: the cache keys of other calls stay
            params["logprobs"] = True
            params["top_logprobs"] = top_logprobs
        if self.endpoint.extra_body:  # only when set: the cache keys of other calls stay
            params["extra_body"] = self.endpoint.extra_body
        if schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name, "schema": schema, "strict": True},
            }
        draw = 0
        if (params["temperature"] or 0) > 0:
            draw = self.draw
            # reproducible distinct draws where the server honours seeds
            params["seed"] = draw * DRAW_SEED_STRIDE + sample
        base, model = self.cache_identity
        started_ns = time.time_ns()
        key = cache_key(
            base_url=base, model=model, messages=messages, params=params, sample=sample, draw=draw
        )
        if use_cache and not refresh and self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.usage.record(
                    component,
                    prompt_tokens=hit["prompt_tokens"],
                    completion_tokens=hit["completion_tokens"],
                    cached=True,
                    cost_usd=self.endpoint.cost_usd(hit["prompt_tokens"], hit["completion_tokens"]),
                )
                request_log.write(
                    component,
                    self.api_model_name,
                    self.endpoint.is_local,
                    "cache_hit",
                    0,
                    0.0,
                    hit["prompt_tokens"],
                    hit["completion_tokens"],
                )
                result = self._finish(ChatResult(cached=True, **_result_fields(hit)), schema)
                note_call(component, model, messages, result, started_ns, time.time_ns())
                return result
        raw = self._send(messages, params, component)
        result = ChatResult(cached=False, **_result_fields(raw))
        self.usage.record(
            component,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            cached=False,
            cost_usd=self.endpoint.cost_usd(result.prompt_tokens, result.completion_tokens),
        )
        result = self._finish(result, schema)
        if use_cache and self.cache is not None and cacheable(result):
            self.cache.put(key, raw)
        note_call(component, model, messages, result, started_ns, time.time_ns())
        return result

    def chat_json(
        self,
        messages: list[dict[str, Any]],
        schema: dict[str, Any],
        *,
        component: str,
        **kwargs: Any,
    ) -> ChatResult:
        return self.chat(messages, component=component, schema=schema, **kwargs)

    @staticmethod
    def _finish(result: ChatResult, schema: dict[str, Any] | None) -> ChatResult:
        """Parse and validate `result.text` against `schema`.

        A function of the stored answer alone: one served from the cache gets the same parsed /
        json_error again.
        """
        if schema is None:
            return result
        cut = (
            "cut off at max_tokens (finish_reason 'length'), "
            if result.finish_reason == "length"
            else ""
        )
        try:
            value = json.loads(result.text)
        except json.JSONDecodeError as exc:
            result.json_error = f"{cut}not JSON: {exc.msg} at char {exc.pos}"
            return result
        problem = schema_problem(value, schema)
        if problem is not None:
            result.json_error = f"{cut}does not match the schema: {problem}"
        else:
            result.parsed = value
        return result

    def _send(
        self, messages: list[dict[str, Any]], params: dict[str, Any], component: str = ""
    ) -> dict[str, Any]:
        client = self._openai()
        plain = self._connection.plain
        if self.endpoint.is_local:
            self.resolved_base_url()  # a fork made before the first request resolves here
        server = self._server  # None when a test points the client at a fake
        kwargs = {k: v for k, v in params.items() if v is not None}
        extra = kwargs.pop("extra_body", None) or {}
        body = {"model": self.api_model_name, "messages": messages, **kwargs, **extra}
        attempt = 0
        while True:
            gate = self._gate
            with gate.semaphore:
                with gate.lock:
                    gate.in_flight += 1
                    gate.peak = max(gate.peak, gate.in_flight)
                    self.requests_sent += 1
                started = time.perf_counter()
                conn = plain.connection() if plain is not None else None  # this thread's
                watchdog = None
                try:
                    with contextlib.ExitStack() as turn:
                        if server is not None:  # one embedded server computes at a time
                            turn.enter_context(ComputeTurn(server.ident))
                            # its clock starts once the turn is ours: waiting for another
                            # server's requests to end is not this server stalling
                            watchdog = _Watchdog(server, self.endpoint, conn)
                        if plain is not None and conn is not None:
                            resp = _interruptible(
                                functools.partial(plain.post, conn, body), watchdog
                            )
                        else:
                            resp = _interruptible(
                                # The SDK's post, not its typed `create`: `create` walks every
                                # request (messages, the JSON schema) against its TypedDicts
                                # and parses every answer into models, about half of
                                # memloop's CPU per call (issue 32). Errors are the SDK's.
                                lambda: client.post(
                                    "/chat/completions", body=body, cast_to=httpx2.Response
                                ),
                                watchdog,
                            )
                    latency = time.perf_counter() - started
                    completion = _completion(resp)
                except RETRYABLE as exc:
                    error: Exception | None = exc
                    request_log.write(
                        component,
                        self.api_model_name,
                        self.endpoint.is_local,
                        "cancelled" if isinstance(exc, openai.APITimeoutError) else "failed",
                        attempt,
                        time.perf_counter() - started,
                    )
                except openai.AuthenticationError:
                    raise self._key_rejected(401) from None
                except openai.APIStatusError as exc:
                    raise LLMRequestError(
                        f"{self.endpoint.base_url} refused the request for model "
                        f"{self.endpoint.model!r}: HTTP {exc.status_code}: {_short(exc)}"
                    ) from None
                else:
                    error = None
                finally:
                    with gate.lock:
                        gate.in_flight -= 1
            if error is None:
                break
            attempt += 1
            if attempt > self.endpoint.max_retries:
                if isinstance(error, openai.APIConnectionError) and not isinstance(
                    error, openai.APITimeoutError
                ):
                    cause = error.__cause__
                    if isinstance(cause, httpx2.ConnectError) and "SSL" in str(cause):
                        raise UserError(
                            f"{self.resolved_base_url()}: the TLS handshake failed ({cause}); "
                            "is the server plain HTTP (use http://)?"
                        ) from None
                    if cause is not None and not isinstance(cause, httpx2.ConnectError):
                        # reached: the server broke off its answers (a crash, a proxy, a restart)
                        raise UserError(
                            f"{self.resolved_base_url()} was reached but broke off its answer "
                            f"{attempt} times for model {self.endpoint.model!r} "
                            f"({type(cause).__name__}: {_short(cause)}); check the server's log"
                        ) from None
                    if self.endpoint.is_local:  # there is no endpoint file to fix
                        log = getattr(server, "log_path", None)
                        raise EndpointUnreachable(
                            f"the embedded model server at {self.resolved_base_url()} stopped "
                            f"answering ({_short(error)}): it crashed or was stopped"
                            + (f" (its log: {log})" if log else "")
                            + "; rerun to resume: a new server starts"
                        ) from None
                    raise EndpointUnreachable(
                        f"cannot reach {self.resolved_base_url()} ({_short(error)}); start the "
                        "server or fix base_url in the endpoint file"
                    ) from None
                if isinstance(error, NotACompletion):
                    raise UserError(
                        f"{self.resolved_base_url()} answered {attempt} times for model "
                        f"{self.endpoint.model!r} with {error}; is base_url the OpenAI-compatible "
                        "API (often ending in /v1)?"
                    ) from None
                raise UserError(
                    f"{self.resolved_base_url()} failed {attempt} times for model "
                    f"{self.endpoint.model!r}: {type(error).__name__}: {_short(error)}"
                ) from None
            interrupt.sleep(self._backoff(attempt, error))
        choice = completion["choices"][0]
        usage = completion.get("usage") or {}
        request_log.write(
            component,
            self.api_model_name,
            self.endpoint.is_local,
            "ok",
            attempt,
            latency,
            usage.get("prompt_tokens") or 0,
            usage.get("completion_tokens") or 0,
            completion.get("timings"),
        )
        out = {
            "text": (choice.get("message") or {}).get("content") or "",
            "model": completion.get("model") or self.api_model_name,
            "prompt_tokens": usage.get("prompt_tokens") or 0,
            "completion_tokens": usage.get("completion_tokens") or 0,
            "finish_reason": choice.get("finish_reason"),
            "latency_s": latency,
        }
        if params.get("top_logprobs"):
            out["top_logprobs"] = _top_logprobs(choice)
        return out

    def _backoff(self, attempt: int, error: Exception) -> float:
        retry_after = None
        response = getattr(error, "response", None)
        if response is not None:
            try:
                retry_after = float(response.headers.get("retry-after", ""))
            except ValueError:
                retry_after = None
        delay = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        delay *= 0.5 + random.random() / 2  # jitter so parallel callers do not retry in step
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff_max_s))
        return delay


def _completion(response: httpx2.Response) -> dict[str, Any]:
    """The chat completion (a JSON object) of a response, or NotACompletion quoting what came."""
    text = response.text
    try:
        parsed = json.loads(text)
    except ValueError:  # HTML, cut JSON, ...
        parsed = None
    choices = parsed.get("choices") if isinstance(parsed, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return parsed
    received = " ".join(text.split())[:80]
    if choices == []:
        raise NotACompletion(f"a completion with no choices: {received!r}")
    raise NotACompletion(f"a body that is not a chat completion: {received!r}")


def _interruptible(call: Callable[[], Any], watchdog: _Watchdog | None = None) -> Any:
    """`call()` on a daemon thread, waited for in slices: Ctrl-C ends the wait at once.

    With a `watchdog` (the embedded model), the request is abandoned (APITimeoutError) only once
    the server has made no progress for the endpoint's timeout_s. The abandoned request dies with
    the process or its closed connection (its answer was never cached).
    """
    interrupt.check()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="memloop-request", daemon=True).start()
    if watchdog is None:
        interrupt.wait(done)
    else:
        while not done.wait(interrupt.POLL_S):
            interrupt.check()
            if watchdog.stalled():
                watchdog.abandon()
                raise openai.APITimeoutError(request=httpx2.Request("POST", watchdog.url))
    if "error" in box:
        raise box["error"]
    return box["value"]


MIN_STALL_S = 3.0


class _Watchdog:
    """Whether a request to the embedded server still progresses.

    A request is not given a deadline (on a busy machine it may wait minutes behind other
    requests and still be answered): it is given up only when neither the server's decode-step
    count nor its CPU time (`DecodeProgress.marks`) has moved for the endpoint's timeout_s since
    the request got its compute turn, i.e. the server is stuck or gone. A retry then goes to the
    same server, whose slots keep the prompt prefix it had.
    """

    def __init__(
        self, server: LocalServer, endpoint: Endpoint, conn: http.client.HTTPConnection | None
    ):
        self.progress = server.progress
        self.url = f"{server.base_url}/chat/completions"
        # at least a few looks at the count (it is read at most once a second)
        self.stall_s = max(endpoint.timeout_s, MIN_STALL_S)
        self.conn = conn
        self.seen = self.progress.marks()
        self.moved_at = time.monotonic()

    def stalled(self) -> bool:
        marks = self.progress.marks()
        now = time.monotonic()
        # either mark moving is progress: the decode count between steps, the server's CPU time
        # during one long step (a long prompt batch, when /metrics waits for the step to end)
        pairs = list(zip(marks, self.seen, strict=True))
        if any(new is not None and new != old for new, old in pairs):
            count, ticks = (old if new is None else new for new, old in pairs)
            self.seen, self.moved_at = (count, ticks), now
            return False
        return now - self.moved_at > self.stall_s

    def abandon(self) -> None:
        """Close the request's connection: the server stops working on it."""
        sock = None if self.conn is None else self.conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@functools.lru_cache(maxsize=512)
def _validator(schema_json: str) -> Any:
    """The checked validator of a schema (given as its JSON text), made once.

    `jsonschema.validate` checks the schema against its metaschema and builds a validator on
    every call: an eighth of memloop's CPU per model call at scale (issue 32).
    """
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def cacheable(result: ChatResult) -> bool:
    """Whether a new answer enters the response cache.

    Every answer the model gave does, so the same request gives the same record on every run, a
    reply cut off at max_tokens included: that is what this request (its max_tokens is part of
    the key) gives, and served again from the cache it fails its schema with the same json_error,
    so a caller's treatment of it (a retry with another sample, a parse failure, an error) is the
    same on every run. Servers do not repeat themselves exactly even at temperature 0 (batching),
    so asking again would give another record. Only a complete reply that breaks its schema stays
    out: the endpoint ignored the JSON schema (prose, another shape), and once it is fixed the
    next run must ask again.
    """
    return result.json_error is None or result.finish_reason == "length"


def schema_problem(value: Any, schema: dict[str, Any]) -> str | None:
    """Why `value` breaks `schema` (jsonschema's best-matching error message), or None."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return None if error is None else error.message


def _short(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text[:200]
