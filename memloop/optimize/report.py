"""Printed summaries of evolution outcomes: every cycle per split, then the headline."""

from __future__ import annotations

from typing import Any

from memloop.core.tables import format_table


def print_outcomes(config: Any, outcomes: list[Any]) -> None:
    print(f"\nexperiment {config.experiment_name} (MLflow: {config.tracking_uri})")
    rows = []
    for o in outcomes:
        chosen = o.selection.cycle if o.selection else None
        for c in o.cycles:
            rows.append(
                [
                    o.mode,
                    o.evolver,
                    f"{c.cycle}{'*' if c.cycle == chosen else ''}",
                    *(c.score(s) for s in ("train", "val", "test")),
                    c.score("test", "factual_recall"),
                    *(c.score("test", k) for k in ("write", "read", "utilization")),
                    c.leaks_rejected,
                ]
            )
    headers = ["feedback", "evolver", "cycle", "train", "val", "test", "test recall"]
    headers += ["test write", "test read", "test util", "leaks refused"]
    print("memory score per split; failure shares on test users")
    print(format_table(headers, rows, align="ll" + "r" * 9))
    print("* the cycle selected on validation users (its test score is the headline)")
    refused = sum(c.leaks_rejected for o in outcomes for c in o.cycles)
    if refused:
        print(
            f"leaks refused: {refused} candidate prompts named a user's private value and were "
            "not taken (optimize/leaks.py)"
        )
    print("run folders: " + ", ".join(str(o.run_dir) for o in outcomes))
    resumed = [o for o in outcomes if o.resumed]
    if resumed:
        print(
            f"{len(resumed)} of {len(outcomes)} runs resumed an earlier MLflow run "
            "(finished cycles were read back, not redone)"
        )
