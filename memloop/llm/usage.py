"""Token accounting per component tag.

The tags are user_sim, agent, memory, probe, checker, optimizer and generator. Tokens count the
work: an answer served from the response cache counts the tokens it took when it was made, so a
resumed or repeated run reports what an uninterrupted one does; `cached_tokens` is the share of
them served from the cache.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass


@dataclass
class ComponentUsage:
    calls: int = 0  # requests sent to the endpoint
    cached_calls: int = 0  # answers served from the response cache
    prompt_tokens: int = 0  # tokens of every answer, sent or served from the cache
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt + completion tokens, those served from the cache

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageTracker:
    """Thread-safe counters; `summary()` gives {component: {...}} plus a `total` row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_component: dict[str, ComponentUsage] = {}

    def record(
        self, component: str, *, prompt_tokens: int, completion_tokens: int, cached: bool
    ) -> None:
        with self._lock:
            row = self._by_component.setdefault(component, ComponentUsage())
            if cached:
                row.cached_calls += 1
                row.cached_tokens += prompt_tokens + completion_tokens
            else:
                row.calls += 1
            row.prompt_tokens += prompt_tokens
            row.completion_tokens += completion_tokens

    def component(self, name: str) -> ComponentUsage:
        with self._lock:
            return ComponentUsage(**asdict(self._by_component.get(name, ComponentUsage())))

    def summary(self) -> dict[str, dict[str, int]]:
        with self._lock:
            rows = {
                name: asdict(u) | {"total_tokens": u.total_tokens}
                for name, u in sorted(self._by_component.items())
            }
        total = ComponentUsage()
        for r in rows.values():
            total.calls += r["calls"]
            total.cached_calls += r["cached_calls"]
            total.prompt_tokens += r["prompt_tokens"]
            total.completion_tokens += r["completion_tokens"]
            total.cached_tokens += r["cached_tokens"]
        rows["total"] = asdict(total) | {"total_tokens": total.total_tokens}
        return rows

    def tokens_by_component(self) -> dict[str, int]:
        return {k: v["total_tokens"] for k, v in self.summary().items() if k != "total"}
