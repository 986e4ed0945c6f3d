"""The gate log of a run: every decision the gate (core/stats.py) made, one JSON line each.

`gate_log.jsonl` in the run folder. A line holds the stage (`screen`, `selection`,
`registration`), what was compared (e.g. "cycle 2 vs cycle 0"), the users the paired differences
came from, and the gate's decision (`GateResult.to_dict()`: verdict, n, mean, interval, sign-flip
p, level, detectable effect). A decision is keyed by (stage, compared): a resumed run that makes
it again replaces its line rather than adding one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memloop.core.files import atomic_write_text

FILE = "gate_log.jsonl"


def entry(stage: str, compared: str, users: list[str], decision: dict[str, Any]) -> dict[str, Any]:
    """One line of the log."""
    return {"stage": stage, "compared": compared, "users": sorted(users), **decision}


def read(run_dir: Path) -> list[dict[str, Any]]:
    """The run's decisions, in the order they were first made ([] without a log)."""
    path = Path(run_dir) / FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def record(run_dir: Path, *entries: dict[str, Any]) -> None:
    """Add `entries` to the run's log, replacing a decision of the same (stage, compared)."""
    rows = read(run_dir)
    index = {(r["stage"], r["compared"]): i for i, r in enumerate(rows)}
    for e in entries:
        key = (e["stage"], e["compared"])
        if key in index:
            rows[index[key]] = e
        else:
            index[key] = len(rows)
            rows.append(e)
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
    atomic_write_text(Path(run_dir) / FILE, text)
