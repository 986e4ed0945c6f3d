"""`memloop compare`: the runs of an MLflow experiment side by side, and a prompt diff.

The table shows the memory score at the first, last and best cycle with a bootstrap 95%
interval over users, factual recall and tokens; the diff is a unified diff of a run's first and
best prompt.
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


@dataclass
class RunRow:
    run_id: str
    name: str
    feedback_mode: str
    evolver: str
    cycles: int
    first: float | None
    last: float | None
    best: float | None
    best_cycle: int | None
    ci_first: tuple[float, float] | None
    ci_last: tuple[float, float] | None
    ci_best: tuple[float, float] | None
    factual_recall: float | None
    tokens: int


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


def _user_scores(mlc, run_id: str, cycle: int | None) -> list[float]:
    if cycle is None:
        return []
    try:
        text = _download_text(mlc, run_id, f"per_user/cycle_{cycle:02d}.json")
    except Exception:
        return []
    data = json.loads(text)
    return [v["memory_score"] for v in data.values() if v.get("memory_score") is not None]


def _download_text(mlc, run_id: str, path: str) -> str:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        local = mlc.download_artifacts(run_id, path, tmp)
        return Path(local).read_text()


def _history(mlc, run_id: str, key: str) -> dict[int, float]:
    return {m.step: m.value for m in mlc.get_metric_history(run_id, key)}


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
        tags = run.data.tags
        if "memloop.feedback_mode" not in tags:
            continue
        scores = _history(mlc, run.info.run_id, "memory_score")
        # every cycle logs `overall`; the memory score is missing where it is undefined
        steps = sorted(_history(mlc, run.info.run_id, "overall"))
        first = steps[0] if steps else None
        last = steps[-1] if steps else None
        best = max(scores, key=lambda s: (scores[s], -s)) if scores else None
        recall = _history(mlc, run.info.run_id, "factual_recall")
        tokens = sum(
            int(sum(_history(mlc, run.info.run_id, k).values()))
            for k in run.data.metrics
            if k.startswith("tokens_")
        )
        rid = run.info.run_id
        rows.append(
            RunRow(
                run_id=rid,
                name=tags.get("mlflow.runName", rid),
                feedback_mode=tags["memloop.feedback_mode"],
                evolver=tags.get("memloop.evolver", "?"),
                cycles=len(steps),
                first=scores.get(first),
                last=scores.get(last),
                best=scores.get(best),
                best_cycle=best,
                ci_first=bootstrap_ci(_user_scores(mlc, rid, first)),
                ci_last=bootstrap_ci(_user_scores(mlc, rid, last)),
                ci_best=bootstrap_ci(_user_scores(mlc, rid, best)),
                factual_recall=recall.get(last) if last is not None else None,
                tokens=tokens,
            )
        )
    return rows


def _cell(value: float | None, ci: tuple[float, float] | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" + (f" [{ci[0]:.2f},{ci[1]:.2f}]" if ci else "")


def format_rows(rows: list[RunRow]) -> str:
    cells = [
        [
            r.feedback_mode,
            r.evolver,
            r.cycles,
            _cell(r.first, r.ci_first),
            _cell(r.last, r.ci_last),
            _cell(r.best, r.ci_best) + (f" ({r.best_cycle})" if r.best_cycle is not None else ""),
            r.factual_recall,
            r.tokens,
        ]
        for r in rows
    ]
    lines = [
        format_table(
            ["feedback", "evolver", "cycles", "first", "last", "best (cycle)", "recall", "tokens"],
            cells,
            align="llrlllrr",
        )
    ]
    lines.append(
        "memory score per cycle (mean over evaluation users) with a bootstrap 95% "
        "interval over users"
    )
    return "\n".join(lines)


def prompt_diff(tracking_uri: str, rows: list[RunRow], which: str | None, to: str = "best") -> str:
    """Unified diff between the first cycle's prompts and the best (or last) cycle's of one run.

    The run is `which`, by default the run with the best memory score.
    """
    candidates = [r for r in rows if r.cycles]
    if to == "best":
        candidates = [r for r in candidates if r.best_cycle is not None] or candidates
    if not candidates:
        return "(no cycles logged yet)"
    if which:
        chosen = [r for r in candidates if which in (r.run_id, r.name) or r.name.startswith(which)]
        if not chosen:
            raise UserError(f"no run {which!r}; runs: {', '.join(r.name for r in candidates)}")
        row = chosen[0]
    else:
        row = max(candidates, key=lambda r: r.best or float("-inf"))
    mlc = tracking.client(tracking_uri)

    def prompts(cycle: int) -> dict[str, str]:
        return json.loads(_download_text(mlc, row.run_id, f"prompts/cycle_{cycle:02d}.json"))

    if to == "best" and row.best_cycle is None:
        to = "last"  # no cycle of this run has a defined memory score
    target = row.best_cycle if to == "best" else row.cycles - 1
    first, best = prompts(0), prompts(target)
    out = [f"run {row.name}: prompts of cycle 0 -> {to} cycle {target}"]
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


def run_histories(tracking_uri: str, rows: list[RunRow]) -> list[Any]:
    """Per-cycle memory score and factual recall of each run.

    Each is shaped like evolve's RunOutcome (mode, evolver, cycles) for
    `optimize.plots.plot_cycles`.
    """
    from types import SimpleNamespace

    mlc = tracking.client(tracking_uri)
    out = []
    for r in rows:
        scores = _history(mlc, r.run_id, "memory_score")
        recall = _history(mlc, r.run_id, "factual_recall")
        steps = sorted(_history(mlc, r.run_id, "overall"))
        cycles = [
            {"cycle": k, "memory_score": scores.get(k), "factual_recall": recall.get(k)}
            for k in steps
        ]
        out.append(SimpleNamespace(mode=r.feedback_mode, evolver=r.evolver, cycles=cycles))
    return out


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
