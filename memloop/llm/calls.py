"""The model calls made while a block runs: what an episode's turns keep for their traces.

`recorded_calls()` collects, for the block (in its thread: a context variable), every
`ChatClient.chat` answer: the component that asked, the model, the messages, the raw output,
tokens, latency, whether the answer came from the response cache, and when it started and
ended. environment/episode.py wraps each turn and each period's probes in it and stores the
calls in turns.json; runs/traces.py makes each a span of the session's trace. A call made in
another thread (a policy's own thread pool) is not seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_CALLS: ContextVar[list[dict[str, Any]] | None] = ContextVar("memloop_calls", default=None)


@contextmanager
def recorded_calls() -> Iterator[list[dict[str, Any]]]:
    """The list the block's model calls are appended to (nested blocks: the innermost)."""
    calls: list[dict[str, Any]] = []
    token = _CALLS.set(calls)
    try:
        yield calls
    finally:
        _CALLS.reset(token)


def note_call(
    component: str,
    model: str,
    messages: list[dict[str, Any]],
    result: Any,
    started_ns: int,
    ended_ns: int,
) -> None:
    """Append one answered call to the running block's list (nothing outside a block)."""
    calls = _CALLS.get()
    if calls is None:
        return
    calls.append(
        {
            "component": component,
            "model": model,
            "messages": [{"role": m.get("role"), "content": m.get("content")} for m in messages],
            "output": result.text,
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
            "latency_s": round((ended_ns - started_ns) / 1e9, 4),
            "cached": result.cached,
            "start_ns": started_ns,
            "end_ns": ended_ns,
            # a call cut at max_tokens (feedback/health.py counts truncated writes)
            **(
                {"finish_reason": "length"}
                if getattr(result, "finish_reason", None) == "length"
                else {}
            ),
        }
    )
