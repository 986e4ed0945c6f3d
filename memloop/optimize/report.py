"""Printed summaries of evolution outcomes: every cycle per split, then the headline."""

from __future__ import annotations

import json
from typing import Any

from memloop.core.tables import format_table, printable, wrap_prose
from memloop.feedback.metrics import metric_column


def print_outcomes(config: Any, outcomes: list[Any]) -> None:
    """Print the objective per cycle and split, and how each run's cycle was selected.

    Also why a prompt stayed unchanged and the command that compares the runs.
    """
    from memloop.feedback.objective import LEGACY_OBJECTIVE, Objective

    objective = next(
        (o.selection.objective for o in outcomes if o.selection is not None), LEGACY_OBJECTIVE
    )
    metric = Objective(objective).value
    print()
    name = printable(config.experiment_name)
    say(f"experiment {name} (MLflow: {printable(config.tracking_uri)})")
    rows = []
    for o in outcomes:
        chosen = o.selection.cycle if o.selection else None
        for c in o.cycles:
            rows.append(
                [
                    f"{o.mode}/{o.evolver}",
                    f"{c.cycle}{'*' if c.cycle == chosen else ''}",
                    *(c.score(s, metric) for s in ("train", "val", "test")),
                    c.score("test", "factual_recall"),
                    *(c.score("test", k) for k in ("write", "read", "utilization")),
                    c.leaks_rejected,
                ]
            )
    column = metric_column(metric, objective=True)
    headers = ["condition", "cycle", "train", "val", "test", "recall"]
    headers += ["write", "read", "util", "leaks"]
    say(
        f"{column} on the train / val / test users per cycle; on the test users: factual recall "
        "and the write / read / utilization failure shares; leaks: candidate prompts refused"
    )
    print(format_table(headers, rows, align="ll" + "r" * 8))
    say("* the cycle selected on validation users (its test score is the headline)")
    for o in outcomes:
        say(f"{o.mode}/{o.evolver}: {selection_line(o)}")
        for line in step_lines(o):
            say(f"  {line}", indent="    ")
    refused = sum(c.leaks_rejected for o in outcomes for c in o.cycles)
    if refused:
        say(
            f"leaks refused: {refused} candidate prompts named a user's private value and were "
            "not taken (core/leaks.py)"
        )
    print("run folders:")
    for o in outcomes:
        print(f"  {o.run_dir}")
    resumed = [o for o in outcomes if o.resumed]
    if resumed:
        say(
            f"{len(resumed)} of {len(outcomes)} runs resumed an earlier MLflow run "
            "(finished cycles were read back, not redone)"
        )
    print("compare (paired, on the test users):")
    print(f"  memloop compare --experiment {name} --tracking-uri {printable(config.tracking_uri)}")


def say(text: str, indent: str = "  ") -> None:
    """A line of prose, wrapped to the tables' width."""
    print(wrap_prose(text, indent))


def selection_line(outcome: Any) -> str:
    from memloop.core.stats import decision_text

    selection = outcome.selection
    if selection is None:
        return "no finished cycle"
    value = "" if selection.val_objective is None else f" = {selection.val_objective:.3f}"
    line = f"cycle {selection.cycle} stands for the run ({selection.rule}{value})"
    if selection.gate is not None:
        line += (
            f"; the gate on {selection.gate_users} users, cycle {selection.candidate} - seed: "
            f"{decision_text(selection.gate)}"
        )
    null = getattr(getattr(outcome, "confirmation", None), "null", None)
    if null is not None:
        line += f"; null control ({null['what']}) - seed: {decision_text(null['gate'])}"
    health = health_line(getattr(outcome, "cycles", []), selection.cycle)
    return line if health is None else f"{line}; {health}"


def health_line(cycles: list[Any], cycle: int) -> str | None:
    """The memory-health line of cycle `cycle`'s writer on its test users (else val, train)."""
    from memloop.runs.cycles import alarm_line

    record = next((c for c in cycles if c.cycle == cycle), None)
    for split in ("test", "val", "train"):
        result = None if record is None else record.splits.get(split)
        if result is not None and result.health:
            return alarm_line(result, f"{split} users of cycle {cycle}")
    return None


def step_lines(outcome: Any) -> list[str]:
    """What each cycle's evolver did (its evolve.json), per predictor.

    A change: the edit chosen and the failures it addressed (when the evolver names them), the
    screen's verdict and the prompt's sentences removed (-) and added (+). No change: why. Then
    the edits refused, each with its stage and reason (an evolver with a tabu memory records
    them), so a run that changed nothing says what it tried.
    """
    from memloop.runs.store import CycleStore

    store = CycleStore(outcome.run_dir)
    lines = []
    for record in outcome.cycles:
        step = store.step(record.cycle)
        if step is None:
            continue
        k = record.cycle
        path = store.cycle_dir(k) / "prompts.json"
        before = json.loads(path.read_text()) if path.is_file() else {}
        for predictor, reason in step.errors.items():
            lines.append(f"cycle {k}: {predictor} unchanged: {_short(reason)}")
        for predictor, changes in step.changes.items():
            if predictor in step.errors:
                continue
            chosen = [c for c in changes if c.startswith(("chose ", "replay screen"))]
            lines += [f"cycle {k}: {predictor}: {_short(c)}" for c in chosen]
            old = before.get(predictor)
            new = step.prompts.get(predictor)
            if old is not None and new is not None and old != new:
                lines += [f"  {d}" for d in sentence_diff(old, new)]
        for r in step.rejected[:MAX_REFUSED]:
            lines.append(
                f"cycle {k}: {r.get('predictor')}: refused {r.get('edit')} "
                f"({r.get('stage')}: {_short(str(r.get('reason', '')), 100)})"
            )
        if len(step.rejected) > MAX_REFUSED:
            lines.append(
                f"cycle {k}: {len(step.rejected) - MAX_REFUSED} more refused edits in "
                f"cycle_{k:02d}/evolve.json"
            )
    return lines


MAX_REFUSED = 4  # refused edits printed per step


def _short(text: str, limit: int = 160) -> str:
    return " ".join(text.split())[:limit]


def sentence_diff(old: str, new: str) -> list[str]:
    """The sentences `new` drops from `old` (- ...) and adds (+ ...), in order."""
    from memloop.optimize.evolvers.playbook import core_units

    before = [t for _, t, _ in core_units(old)]
    after = [t for _, t, _ in core_units(new)]
    return [f"- {t}" for t in before if t not in after] + [
        f"+ {t}" for t in after if t not in before
    ]
