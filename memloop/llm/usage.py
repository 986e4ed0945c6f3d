"""Token accounting per component tag.

The tags are user_sim, agent, memory, probe, checker, optimizer and generator. Tokens count the
work: an answer served from the response cache counts the tokens it took when it was made, so a
resumed or repeated run reports what an uninterrupted one does; `cached_tokens` is the share of
them served from the cache.

A call to an endpoint with a price (`price_per_mtok`) also adds its cost in US dollars, priced by
the client that made it, so roles on differently priced endpoints add up right; `cost_usd` is
absent from a component's row when none of its calls had a price (a cost of 0 is a price of 0).
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass

# a usage summary: per component (and `total`), counter name -> value (`cost_usd` a float)
UsageRows = dict[str, dict[str, int | float]]


@dataclass
class ComponentUsage:
    calls: int = 0  # requests sent to the endpoint
    cached_calls: int = 0  # answers served from the response cache
    prompt_tokens: int = 0  # tokens of every answer, sent or served from the cache
    completion_tokens: int = 0
    cached_tokens: int = 0  # of prompt + completion tokens, those served from the cache
    cost_usd: float | None = None  # price of the tokens above; None: no call had a price

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageTracker:
    """Thread-safe counters; `summary()` gives {component: {...}} plus a `total` row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_component: dict[str, ComponentUsage] = {}

    def record(
        self,
        component: str,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        cached: bool,
        cost_usd: float | None = None,
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
            row.cost_usd = add_costs(row.cost_usd, cost_usd)

    def component(self, name: str) -> ComponentUsage:
        with self._lock:
            return ComponentUsage(**asdict(self._by_component.get(name, ComponentUsage())))

    def summary(self) -> UsageRows:
        """Per component (and `total`): the counters, `total_tokens`, and `cost_usd` if priced."""
        with self._lock:
            usages = [(name, ComponentUsage(**asdict(u))) for name, u in self._by_component.items()]
        total = ComponentUsage()
        for _, u in usages:
            total.calls += u.calls
            total.cached_calls += u.cached_calls
            total.prompt_tokens += u.prompt_tokens
            total.completion_tokens += u.completion_tokens
            total.cached_tokens += u.cached_tokens
            total.cost_usd = add_costs(total.cost_usd, u.cost_usd)
        usages.sort(key=lambda item: item[0])
        return {name: _row(u) for name, u in [*usages, ("total", total)]}

    def mark(self, component: str) -> Mark:
        """A mark now: `Mark.tokens()` and `Mark.cost_usd()` give what `component` used since."""
        return Mark(self, component, self.component(component))

    def tokens_by_component(self) -> dict[str, int]:
        return {k: int(v["total_tokens"]) for k, v in self.summary().items() if k != "total"}


@dataclass(frozen=True)
class Mark:
    """One component's counters at a moment (`UsageTracker.mark`)."""

    tracker: UsageTracker
    name: str
    before: ComponentUsage

    def tokens(self) -> int:
        return self.tracker.component(self.name).total_tokens - self.before.total_tokens

    def cost_usd(self) -> float | None:
        """Dollars since the mark; None when no call of the component had a price."""
        now = self.tracker.component(self.name).cost_usd
        return None if now is None else now - (self.before.cost_usd or 0.0)


def add_costs(*costs: float | None) -> float | None:
    """The sum of the known costs; None when none is known (nothing had a price)."""
    known = [c for c in costs if c is not None]
    return sum(known) if known else None


def usage_delta(before: UsageRows, after: UsageRows) -> UsageRows:
    """What was used between two summaries, per component; components that used nothing omitted."""
    delta = {}
    for component, row in after.items():
        base = before.get(component, {})
        diff = {k: v - base.get(k, 0) for k, v in row.items()}
        if any(diff.values()):
            delta[component] = diff
    return delta


def _row(usage: ComponentUsage) -> dict[str, int | float]:
    row: dict[str, int | float] = {k: v for k, v in asdict(usage).items() if v is not None}
    row["total_tokens"] = usage.total_tokens
    return row
