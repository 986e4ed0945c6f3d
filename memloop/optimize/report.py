"""Printed summaries of evolution outcomes: every cycle per split, then the headline."""

from __future__ import annotations

from typing import Any

from memloop.core.tables import format_table


def print_outcomes(config: Any, outcomes: list[Any]) -> None:
    """Print the objective per cycle and split, and how each run's cycle was selected.

    Also why a prompt stayed unchanged and the command that compares the runs.
    """
    from memloop.feedback.objective import LEGACY_OBJECTIVE, Objective

    objective = next(
        (o.selection.objective for o in outcomes if o.selection is not None), LEGACY_OBJECTIVE
    )
    metric = Objective(objective).value
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
                    *(c.score(s, metric) for s in ("train", "val", "test")),
                    c.score("test", "factual_recall"),
                    *(c.score("test", k) for k in ("write", "read", "utilization")),
                    c.leaks_rejected,
                ]
            )
    headers = ["feedback", "evolver", "cycle", "train", "val", "test", "test recall"]
    headers += ["test write", "test read", "test util", "leaks refused"]
    print(f"{Objective(objective).label} (the objective) per split; failure shares on test users")
    print(format_table(headers, rows, align="ll" + "r" * 9))
    print("* the cycle selected on validation users (its test score is the headline)")
    for o in outcomes:
        print(f"{o.mode}/{o.evolver}: {_selection_line(o)}")
        for line in _unchanged_lines(o):
            print(f"  {line}")
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
    print(
        f"compare (paired, on the test users): memloop compare --experiment "
        f"{config.experiment_name} --tracking-uri {config.tracking_uri}"
    )


def _selection_line(outcome: Any) -> str:
    selection = outcome.selection
    if selection is None:
        return "no finished cycle"
    if selection.val_objective is None:
        return (
            f"cycle {selection.cycle} stands for the run: no validation "
            f"{selection.objective.label} was defined, so the last cycle was taken (no choice made)"
        )
    return f"cycle {selection.cycle} selected ({selection.rule} = {selection.val_objective:.3f})"


def _unchanged_lines(outcome: Any) -> list[str]:
    """Why a cycle's evolver left a prompt as it was (its evolve.json), one line per predictor."""
    from memloop.optimize.store import CycleStore

    store = CycleStore(outcome.run_dir)
    lines = []
    for record in outcome.cycles:
        step = store.step(record.cycle)
        if step is None:
            continue
        for predictor, reason in step.errors.items():
            lines.append(
                f"cycle {record.cycle}: {predictor} unchanged: {' '.join(reason.split())[:160]}"
            )
    return lines
