"""A line per model request, for measuring where a run's time and tokens go.

When ``$MEMLOOP_REQUEST_LOG`` names a file, the chat client appends one JSON line per attempt
(and per answer served from the response cache): the component, the model, the outcome ("ok",
"cache_hit", "cancelled": the client gave up waiting, "failed": another retryable error), the
attempt (0 for the first send), the latency, the tokens and the server's own timings when it
gives them (llama.cpp: ``cache_n`` prompt tokens reused from the slot, ``prompt_n`` processed,
``prompt_ms``, ``predicted_n``, ``predicted_ms``). Several processes may append to one file:
each line is one ``write`` on a file opened for appending. benchmarks/embedded_cost.py reads it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

ENV = "MEMLOOP_REQUEST_LOG"


def write(
    component: str,
    model: str,
    local: bool,
    outcome: str,
    attempt: int,
    latency_s: float,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    timings: dict[str, Any] | None = None,
) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    line = {
        "t": round(time.time(), 3),
        "pid": os.getpid(),
        "component": component,
        "model": model,
        "local": local,
        "outcome": outcome,
        "attempt": attempt,
        "latency_s": round(latency_s, 4),
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "timings": timings if isinstance(timings, dict) else None,
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)
