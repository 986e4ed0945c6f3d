"""Printed summaries of evolution outcomes."""

from __future__ import annotations

from typing import Any

from memloop.core.tables import format_table


def print_outcomes(config: Any, outcomes: list[Any]) -> None:
    print(f"\nexperiment {config.experiment_name} (MLflow: {config.tracking_uri})")
    keys = ("memory_score", "overall", "factual_recall", "write", "read", "utilization")
    rows = [
        [o.mode, o.evolver, c["cycle"], *(c.get(k) for k in keys)]
        for o in outcomes
        for c in o.cycles
    ]
    print(
        format_table(
            [
                "feedback",
                "evolver",
                "cycle",
                "mem_score",
                "overall",
                "recall",
                "write",
                "read",
                "util",
            ],
            rows,
            align="ll" + "r" * 7,
        )
    )
    print("run folders: " + ", ".join(str(o.run_dir) for o in outcomes))
    resumed = [o for o in outcomes if o.resumed]
    if resumed:
        print(
            f"{len(resumed)} of {len(outcomes)} runs resumed an earlier MLflow run "
            "(finished cycles were read back, not redone)"
        )
