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


def problem() -> str | None:
    """Why `$MEMLOOP_REQUEST_LOG` cannot be appended to (None: unset, or it can).

    Checked when a command starts, so that no request ends in a traceback from deep inside the
    chat client.
    """
    path = os.environ.get(ENV)
    if not path:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{ENV}={path}: is a folder; name a file to append the request lines to"
    if not os.path.isdir(folder):
        return f"{ENV}={path}: its folder {folder} does not exist; create it or name another file"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{ENV}={path}: cannot be written (permissions); name another file"
    return None


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
