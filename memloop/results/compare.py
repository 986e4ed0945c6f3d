"""`memloop compare`: the runs of an MLflow experiment side by side, and a prompt diff.

The rows come from rows.py, the tables from tables.py; here: `compare`, the prompt diff and
the curves of a run's cycles.

Each run's cycles are read back as `CycleRecord`s (the `cycle/` artifacts), the run's prompt is
selected on validation users with `cycles.select_cycle` (the rule the run itself used), and its
numbers are that prompt's on the test users, never a maximum over test cycles.

Two tables:
- marginal: each condition's own numbers (memory score, state accuracy, memory gain, recall,
  tokens), labelled as marginal: they carry no interval, since conditions are compared paired;
- paired: each condition minus the baseline condition (default: the run without evolution) on the
  same test users, one row per metric (`core.stats.Paired`): n, the mean per-user difference,
  its Student t 95% interval (or why there is none: one user, or every difference equal), the
  two-sided sign-flip permutation p and the users up/tied/down; a warning below 10 users. Also
  within each run: the selected prompt minus cycle 0 on the same users.

Runs are paired only within a group of runs sharing their settings: the `memloop.like` tag
(`RunSpec.like_key`: environment, users, models and endpoint settings, policy settings, starting
prompts, evaluation settings, scorer version; everything but what the optimizer chooses). An
experiment holding runs of several settings is shown group by group, each headed by the `spec.*`
params that differ between the groups and paired with its own baseline; a group without a
baseline run is shown unpaired, with a note. Runs logged before run specs existed (no
`memloop.like` tag) cannot be known to share anything: they form a group of their own, shown
but never paired.

Where the two prompts a row compares are identical (the sha256 of the logged
`prompts/cycle_NN.json` of the selected cycles, or of cycle 0 and the selected cycle), the row says
`same prompt` instead of numbers: any difference there comes from the draws, not the prompt.
"""

from __future__ import annotations

import difflib
from typing import Any

from memloop.core.errors import UserError
from memloop.core.tables import (
    printable,
)
from memloop.feedback.metrics import metric, paired_metrics
from memloop.feedback.objective import LEGACY_OBJECTIVE
from memloop.results.rows import (
    RunRow,
    experiment_rows,
    group_rows,
    logged_prompts,
    user_scores,
)
from memloop.results.tables import (
    format_rows,
)
from memloop.runs import tracker
from memloop.runs.cycles import CycleRecord, Selection


def default_diff_run(rows: list[RunRow]) -> RunRow:
    """The run whose prompts `prompt_diff` shows unless told.

    The evolving run (neither its feedback mode nor its evolver `none`) with the best headline
    score, the first on a tie; a no-evolution run only when there is no other.
    """
    evolving = [r for r in rows if "none" not in (r.evolver, r.feedback_mode)]
    return max(evolving or rows, key=lambda r: -1e9 if r.selected is None else r.selected)


def prompt_diff(tracking_uri: str, rows: list[RunRow], which: str | None, to: str = "best") -> str:
    """Unified diff between the first cycle's prompts and the selected (or last) cycle's.

    The run is `which`, by default the evolving run (one whose prompts a step may change) with
    the best headline score; a no-evolution run only when there is no other. `to="best"` is the
    cycle selected on validation users.
    """
    candidates = [r for r in rows if r.cycles]
    if not candidates:
        return "(no cycles logged yet)"
    if which:
        chosen = [r for r in candidates if which in (r.run_id, r.name) or r.name.startswith(which)]
        if not chosen:
            raise UserError(f"no run {which!r}; runs: {', '.join(r.name for r in candidates)}")
        row = chosen[0]
    else:
        row = default_diff_run(candidates)
    mlc = tracker.client(tracking_uri, create=False)  # read only: never a new store

    if to == "best" and row.selection is not None:
        target, label = row.selection.cycle, "selected"
    else:
        target, label = row.cycles - 1, "last"
    first, best = logged_prompts(mlc, row.run_id, 0), logged_prompts(mlc, row.run_id, target)
    within = f" ({row.settings})" if row.settings else ""
    out = [f"run {printable(row.name)}{within}: prompts of cycle 0 -> {label} cycle {target}"]
    for name in sorted(set(first) | set(best)):
        diff = difflib.unified_diff(
            first.get(name, "").splitlines(),
            best.get(name, "").splitlines(),
            f"{name} (cycle 0)",
            f"{name} (cycle {target})",
            lineterm="",
        )
        text = "\n".join(diff)
        out.append(
            text
            or f"{name}: the same prompt in cycle 0 and cycle {target} (what each step tried and "
            "why it was refused: the run's cycle_NN/evolve.json, printed by evolve and quickstart)"
        )
    return "\n".join(out)


def curves(
    mode: str,
    evolver: str,
    records: list[CycleRecord],
    split: str,
    *,
    model: str | None = None,
    selection: Selection | None = None,
    objective: str | None = None,
    settings: str = "",
    repeat: int = 0,
) -> Any:
    """One run's numbers per cycle on `split`, what `plots.plot_cycles` draws.

    Each of `cycles` holds the split's own value of each paired metric of the catalogue
    (feedback/metrics.py: the pooled numbers of the tables), its `users`, its `state_chance`, and
    `per_user`: {metric: the defined per-user values, in user-id order} of the same metrics (a
    probability only where it was read; {} for a record without per-user values).
    Beside them: the split, the selected cycle (`selected`, None without selection) and its rule,
    the objective (the selection's, else `objective`, else the legacy one) and the legend label
    `mode / evolver / model` (`none (no evolution) / model` for the baseline; `settings`, what sets
    the run's group apart, in brackets when it is not the model; the repeat when above 0).
    """
    from types import SimpleNamespace

    cycles = []
    for r in records:
        result = r.splits.get(split)  # type: ignore[call-overload]
        per_user = {}
        if result is not None and result.per_user:
            for m in paired_metrics():
                values = [float(v) for _, v in sorted(user_scores(r, split, m).items())]
                if values or not metric(m).probability:  # a probability only where it was read
                    per_user[m] = values
        cycles.append(
            {
                "cycle": r.cycle,
                **{m: r.score(split, m) for m in paired_metrics()},
                "state_chance": result.state_chance if result is not None else None,
                "users": result.users if result is not None else 0,
                "per_user": per_user,
            }
        )
    label = "none (no evolution)" if mode == "none" else f"{mode} / {evolver}"
    if model:
        label += f" / {model}"
    if settings and settings != model:
        label += f" [{settings}]"
    if repeat:
        label += f", repeat {repeat}"
    return SimpleNamespace(
        mode=mode,
        evolver=evolver,
        model=model,
        label=label,
        split=split,
        objective=str(selection.objective if selection else objective or LEGACY_OBJECTIVE),
        selected=selection.cycle if selection else None,
        selection_rule=selection.rule if selection else "",
        cycles=cycles,
    )


def run_histories(rows: list[RunRow]) -> list[Any]:
    """`curves` of every row on its headline split, labelled with its agent model and group."""
    return [
        curves(
            r.feedback_mode,
            r.evolver,
            r.records,
            r.split,
            model=r.spec.get("endpoints.agent.model"),
            selection=r.selection,
            objective=r.spec.get("objective"),
            settings=r.settings_short,
            repeat=r.repeat,
        )
        for r in rows
    ]


def compare(
    tracking_uri: str,
    experiment: str,
    run: str | None = None,
    to: str = "best",
    baseline: str = "none",
) -> dict[str, Any]:
    rows = experiment_rows(tracking_uri, experiment, baseline)
    if not rows:
        raise UserError(f"experiment {experiment!r} has no evolution runs yet (run memloop evolve)")
    return {
        "rows": rows,
        "groups": group_rows(rows),
        "table": format_rows(rows),
        "diff": prompt_diff(tracking_uri, rows, run, to),
    }
