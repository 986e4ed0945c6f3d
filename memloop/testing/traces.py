"""Session traces made up for the trace-store tests: no episode folder behind them."""

from __future__ import annotations

from memloop.runs.traces import SessionTrace, Span

SPANS = 6  # spans per made-up trace: a root and five children


def made_up_traces(count: int) -> list[SessionTrace]:
    """`count` traces keyed k0, k1, ..., each a root span with five children."""
    return [
        SessionTrace(
            key=f"k{i}",
            session_id="s",
            user="u",
            tags={"memloop.user": "u"},
            root=Span(
                "root",
                "AGENT",
                {"i": i},
                "out",
                children=[Span(f"c{j}", "MEMORY") for j in range(SPANS - 1)],
            ),
        )
        for i in range(count)
    ]
