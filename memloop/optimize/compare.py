"""`memloop compare`: the runs of an MLflow experiment side by side, and a prompt diff.

Each run's cycles are read back as `CycleRecord`s (the `cycle/` artifacts), the run's prompt is
selected on validation users with `cycles.select_cycle` (the rule the run itself used), and the
headline is that prompt's memory score on the test users, never a maximum over test cycles. Next
to it: cycle 0 (the initial prompt) on the same test users, and the paired difference with a
bootstrap 95% interval over test users.
"""

from __future__ import annotations

import difflib
import json
import random
from dataclasses import dataclass
from typing import Any

from memloop.core.errors import UserError
from memloop.core.tables import format_table
from memloop.optimize import tracking
from memloop.optimize.cycles import CycleRecord, Selection, select_cycle

HEADLINE_SPLIT = "test"


@dataclass
class RunRow:
    run_id: str
    name: str
    feedback_mode: str
    evolver: str
    search: str
    records: list[CycleRecord]
    selection: Selection | None
    split: str  # the split the numbers below are on ("test"; "val" or "train" without one)
    n_users: int
    first: float | None
    selected: float | None
    delta: float | None  # selected - first, mean over users defined in both
    ci_first: tuple[float, float] | None
    ci_selected: tuple[float, float] | None
    ci_delta: tuple[float, float] | None
    factual_recall: float | None
    tokens: int

    @property
    def cycles(self) -> int:
        return len(self.records)


def bootstrap_ci(
    values: list[float], *, resamples: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the mean; None for fewer than two values."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(resamples))
    lo = means[int((1 - level) / 2 * resamples)]
    hi = means[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


def _download_text(mlc, run_id: str, path: str) -> str:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        local = mlc.download_artifacts(run_id, path, tmp)
        return Path(local).read_text()


def run_records(mlc, run_id: str) -> list[CycleRecord]:
    """The run's CycleRecords, in cycle order, from its `cycle/` artifacts."""
    paths = sorted(a.path for a in mlc.list_artifacts(run_id, "cycle"))
    return [CycleRecord.model_validate_json(_download_text(mlc, run_id, p)) for p in paths]


def user_scores(record: CycleRecord, split: str) -> dict[str, float]:
    result = record.splits.get(split)  # type: ignore[call-overload]
    if result is None:
        return {}
    return {
        u: v["memory_score"] for u, v in result.per_user.items() if v["memory_score"] is not None
    }


def headline_split(records: list[CycleRecord]) -> str:
    present = set(records[0].splits) if records else set()
    return next((s for s in (HEADLINE_SPLIT, "val", "train") if s in present), HEADLINE_SPLIT)


def make_row(run: Any, records: list[CycleRecord]) -> RunRow:
    tags = run.data.tags
    selection = select_cycle(records)
    split = headline_split(records)
    first_rec = records[0] if records else None
    chosen = records[selection.cycle] if selection else None
    first_u = user_scores(first_rec, split) if first_rec else {}
    chosen_u = user_scores(chosen, split) if chosen else {}
    paired = [chosen_u[u] - first_u[u] for u in sorted(set(first_u) & set(chosen_u))]
    result = chosen.splits.get(split) if chosen else None  # type: ignore[call-overload]
    return RunRow(
        run_id=run.info.run_id,
        name=tags.get("mlflow.runName", run.info.run_id),
        feedback_mode=tags["memloop.feedback_mode"],
        evolver=tags.get("memloop.evolver", "?"),
        search=tags.get("memloop.search", "episode"),
        records=records,
        selection=selection,
        split=split,
        n_users=result.users if result else 0,
        first=first_rec.score(split) if first_rec else None,
        selected=chosen.score(split) if chosen else None,
        delta=sum(paired) / len(paired) if paired else None,
        ci_first=bootstrap_ci(list(first_u.values())),
        ci_selected=bootstrap_ci(list(chosen_u.values())),
        ci_delta=bootstrap_ci(paired),
        factual_recall=result.factual_recall if result else None,
        tokens=sum(sum(r.tokens.values()) for r in records),
    )


def experiment_rows(tracking_uri: str, experiment: str) -> list[RunRow]:
    mlc = tracking.client(tracking_uri)
    exp = mlc.get_experiment_by_name(experiment)
    if exp is None:
        names = ", ".join(e.name for e in mlc.search_experiments()) or "none yet"
        raise UserError(
            f"no MLflow experiment {experiment!r} in {tracking_uri} (experiments: {names})"
        )
    rows = []
    for run in mlc.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"]):
        if "memloop.feedback_mode" in run.data.tags:
            rows.append(make_row(run, run_records(mlc, run.info.run_id)))
    return rows


def _cell(value: float | None, ci: tuple[float, float] | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    number = "{:+.3f}" if signed else "{:.3f}"
    bound = "{:+.2f}" if signed else "{:.2f}"
    text = number.format(value)
    if ci:
        text += f" [{bound.format(ci[0])},{bound.format(ci[1])}]"
    return text


def format_rows(rows: list[RunRow]) -> str:
    cells = [
        [
            r.feedback_mode,
            r.evolver,
            r.search,
            r.cycles,
            f"{r.split} {r.n_users}",
            _cell(r.first, r.ci_first),
            _cell(r.selected, r.ci_selected)
            + (f" ({r.selection.cycle})" if r.selection is not None else ""),
            _cell(r.delta, r.ci_delta, signed=True),
            r.factual_recall,
            r.tokens,
        ]
        for r in rows
    ]
    lines = [
        format_table(
            [
                "feedback",
                "evolver",
                "search",
                "cycles",
                "users",
                "cycle 0",
                "selected (cycle)",
                "paired diff",
                "recall",
                "tokens",
            ],
            cells,
            align="lllrllllrr",
        ),
        "memory score on the users shown (test users unless none are configured) of the initial "
        "prompt (cycle 0) and of the prompt selected on validation users, with bootstrap 95% "
        "intervals over users; paired diff = selected - cycle 0 on the same users",
    ]
    small = min((r.n_users for r in rows), default=0)
    if small < 10:
        lines.append(f"only {small} users per cell: the intervals are wide (or absent below 2)")
    if any(r.split != HEADLINE_SPLIT for r in rows):
        lines.append("a run without test users shows validation/training numbers: not a headline")
    return "\n".join(lines)


def prompt_diff(tracking_uri: str, rows: list[RunRow], which: str | None, to: str = "best") -> str:
    """Unified diff between the first cycle's prompts and the selected (or last) cycle's.

    The run is `which`, by default the run with the best headline score. `to="best"` is the
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
        row = max(candidates, key=lambda r: -1e9 if r.selected is None else r.selected)
    mlc = tracking.client(tracking_uri)

    def prompts(cycle: int) -> dict[str, str]:
        return json.loads(_download_text(mlc, row.run_id, f"prompts/cycle_{cycle:02d}.json"))

    if to == "best" and row.selection is not None:
        target, label = row.selection.cycle, "selected"
    else:
        target, label = row.cycles - 1, "last"
    first, best = prompts(0), prompts(target)
    out = [f"run {row.name}: prompts of cycle 0 -> {label} cycle {target}"]
    for name in sorted(set(first) | set(best)):
        diff = difflib.unified_diff(
            first.get(name, "").splitlines(),
            best.get(name, "").splitlines(),
            f"{name} (cycle 0)",
            f"{name} (cycle {target})",
            lineterm="",
        )
        text = "\n".join(diff)
        out.append(text or f"{name}: unchanged")
    return "\n".join(out)


def curves(mode: str, evolver: str, records: list[CycleRecord], split: str) -> Any:
    """Per-cycle memory score and factual recall on `split`, shaped for plots.plot_cycles."""
    from types import SimpleNamespace

    cycles = [
        {
            "cycle": r.cycle,
            "memory_score": r.score(split),
            "factual_recall": r.score(split, "factual_recall"),
        }
        for r in records
    ]
    return SimpleNamespace(mode=mode, evolver=evolver, cycles=cycles)


def run_histories(rows: list[RunRow]) -> list[Any]:
    """`curves` of every row on its headline split."""
    return [curves(r.feedback_mode, r.evolver, r.records, r.split) for r in rows]


def compare(
    tracking_uri: str, experiment: str, run: str | None = None, to: str = "best"
) -> dict[str, Any]:
    rows = experiment_rows(tracking_uri, experiment)
    if not rows:
        raise UserError(f"experiment {experiment!r} has no evolution runs yet (run memloop evolve)")
    return {
        "rows": rows,
        "table": format_rows(rows),
        "diff": prompt_diff(tracking_uri, rows, run, to),
    }
