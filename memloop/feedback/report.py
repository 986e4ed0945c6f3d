"""Evaluation outputs from finished episodes.

The outputs are metrics.json, records.jsonl, a per-period plot and a printed table. Pure over the
records, except for writing the files.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memloop.core.files import atomic_savefig, atomic_write_json
from memloop.core.tables import (
    format_cost,
    format_number,
    format_table,
    wrap_prose,
)
from memloop.environment.episode import PeriodRecord
from memloop.feedback.calibration import recall_null_reason
from memloop.feedback.exposure import cap_recalls, exposure_fields
from memloop.feedback.metrics import metric_column, objective_first
from memloop.feedback.records import (
    SCORER_VERSION,
    PeriodRecall,
    QuestionRecord,
    StateRead,
    period_recall,
    question_records,
    state_reads,
)
from memloop.feedback.scoring import (
    SCORING_WARNINGS,
    Scores,
    factual_recall,
    index_records,
    period_factual_recall,
    quiet_score,
    score,
    score_by_period,
)


def collect(period_records: Iterable[PeriodRecord]):
    """(question records, recall records) of finished periods that carry probe results.

    A claim memory could not hold by its probe is not supported, whatever the checker said
    (`exposure.cap_recalls`): recall never exceeds its ceiling.
    """
    period_records = list(period_records)
    questions, recalls = [], []
    for rec in period_records:
        questions.extend(question_records(rec.probes))
        recall = period_recall(rec.probes)
        if recall is not None:
            recalls.append(recall)
    cap_recalls(period_records, recalls)
    return questions, recalls


def collect_reads(period_records: Iterable[PeriodRecord]) -> list[StateRead]:
    """The letter reads of finished periods ([] when the state queries were JSON)."""
    return [read for rec in period_records for read in state_reads(rec.probes)]


def score_fields(s: Scores) -> dict[str, Any]:
    """A Scores as the flat metrics.json keys (one naming for every group: run, period, user)."""
    return {
        "questions": s.n_questions,
        "overall": s.overall,
        "random": s.random,
        "upper_bound": s.upper_bound,
        "no_memory": s.no_memory,
        "memory_gain": s.memory_gain,
        "memory_score": s.memory_score,
        "memory_score_undefined_periods": s.memory_score_undefined,
        "memory_score_cell_mean": s.memory_score_cell_mean,
        "memory_score_undefined_cells": s.memory_score_cells_undefined,
        "questions_per_period": s.questions_per_period,
        "state_accuracy": s.state.accuracy,
        "state_chance": s.state.chance,
        "state_score": s.state.score,
        "state_pairs": s.state.pairs,
        "state_prob": s.state.prob,
        "state_prob_pairs": s.state.prob_pairs,
        "json_errors": s.json_errors,
        "diagnosis": s.diagnosis.model_dump(),
    }


def build_metrics(
    period_records: list[PeriodRecord], calibration: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """metrics.json content and the warnings raised while scoring.

    `calibration` is the run's `checker_calibration` (None: no checker was measured); a checker
    failing it nulls every factual-recall figure (`with_calibration`).
    """
    period_records = list(period_records)
    questions, recalls = collect(period_records)
    reads = collect_reads(period_records)
    with warnings.catch_warnings(record=True) as caught:
        for category in SCORING_WARNINGS:
            warnings.simplefilter("always", category)
        total = score(questions, reads=reads)
    usage = usage_by_component(period_records)
    per_period = []
    for p, s in score_by_period(questions, reads).items():
        mine = [r for r in recalls if r.period == p]
        per_period.append(
            {
                "period": p,
                **score_fields(s),
                "factual_recall": factual_recall(mine),
                "factual_recall_per_period": period_factual_recall(mine),
                **exposure_fields(period_records, p),
            }
        )
    metrics = {
        "scorer_version": SCORER_VERSION,
        "users": len({q.user_id for q in questions}),
        "periods": len({q.period for q in questions}),
        **score_fields(total),
        "state_prob_null_reason": total.state.prob_null_reason,
        "factual_recall": factual_recall(recalls),
        "factual_recall_per_period": period_factual_recall(recalls),
        **exposure_fields(period_records),
        "per_period": per_period,
        "per_user": _per_user(questions, recalls, reads=reads),
        "usage": dict(sorted(usage.items())),
        "usage_cached": dict(sorted(usage_by_component(period_records, "cached_tokens").items())),
        "cost_usd": cost_by_component(period_records),
    }
    return with_calibration(metrics, calibration), [str(w.message) for w in caught]


# the figures the recall checker judges (not `factual_recall_ceiling`: no checker computes it)
CHECKER_KEYS = ("factual_recall", "factual_recall_per_period")


def with_calibration(metrics: dict[str, Any], calibration: dict[str, Any] | None) -> dict[str, Any]:
    """`metrics` with `checker_calibration` and `factual_recall_null_reason` after its recall keys.

    When the checker fails its calibration (`recall_null_reason`), every factual-recall figure is
    null: the run's, each period's (`per_period`) and each user's (`per_user`).
    """
    reason = recall_null_reason(calibration)
    if reason is not None:
        for row in [metrics, *metrics.get("per_period", []), *metrics.get("per_user", {}).values()]:
            for key in CHECKER_KEYS:
                if key in row:
                    row[key] = None
    added = {"checker_calibration": calibration, "factual_recall_null_reason": reason}
    keys = list(metrics)
    recall_keys = [i for i, k in enumerate(keys) if k in CHECKER_KEYS]
    at = recall_keys[-1] + 1 if recall_keys else len(keys)
    out = {k: metrics[k] for k in keys[:at]}
    out.update(added)
    out.update({k: metrics[k] for k in keys[at:]})
    return out


def usage_by_component(
    period_records: Iterable[PeriodRecord], key: str = "total_tokens"
) -> dict[str, int]:
    """Tokens per component summed over `period_records` (`key`: the work, or `cached_tokens`).

    Both count every answer the work needed, served from the endpoint or the response cache; a
    period checkpointed before cached answers were counted (no `cached_tokens` row) counted
    requests sent only.
    """
    usage: dict[str, int] = {}
    for rec in period_records:
        for component, row in rec.usage.items():
            if component != "total":
                usage[component] = usage.get(component, 0) + int(row.get(key, 0))
    return usage


def cost_by_component(period_records: Iterable[PeriodRecord]) -> dict[str, float]:
    """US dollars per component summed over `period_records`, for components with a price.

    Empty when no call was priced (no endpoint had `price_per_mtok`). The cost prices the tokens
    the work needed, as the token counts do, cached answers included.
    """
    cost: dict[str, float] = {}
    for rec in period_records:
        for component, row in rec.usage.items():
            if component != "total" and "cost_usd" in row:
                cost[component] = cost.get(component, 0.0) + float(row["cost_usd"])
    return dict(sorted(cost.items()))


def _per_user(
    questions: list[QuestionRecord],
    recalls: list[PeriodRecall],
    lookup: dict[tuple[str, int, int], QuestionRecord] | None = None,
    reads: list[StateRead] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per user: the numbers paired comparisons take differences of (same users, same draws)."""
    out = {}
    for uid in sorted({q.user_id for q in questions}):
        mine = [q for q in questions if q.user_id == uid]
        s = quiet_score(mine, lookup, [r for r in reads or [] if r.user_id == uid])
        out[uid] = {
            "memory_score": s.memory_score,
            "overall": s.overall,
            "no_memory": s.no_memory,
            "memory_gain": s.memory_gain,
            "state_accuracy": s.state.accuracy,
            "state_score": s.state.score,
            "state_prob": s.state.prob,
            "factual_recall": factual_recall(r for r in recalls if r.user_id == uid),
        }
    return out


def period_metrics(
    history: list[PeriodRecord], period: int, calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The metrics of period `period`'s probes, diagnosed against the whole `history`.

    A wrong answer in period p whose state query was right when the fact was written (an earlier
    period) is a read failure; scoring the period's records alone would lose that earlier query
    and call it a write failure. Same keys as build_metrics' totals, `usage` of that period only.
    """
    questions, recalls = collect(history)
    lookup = index_records(questions)
    mine = [q for q in questions if q.period == period]
    mine_recalls = [r for r in recalls if r.period == period]
    mine_reads = [r for r in collect_reads(history) if r.period == period]
    s = quiet_score(mine, lookup, mine_reads)
    usage = usage_by_component(rec for rec in history if rec.period == period)
    cost = cost_by_component(rec for rec in history if rec.period == period)
    out = {
        "scorer_version": SCORER_VERSION,
        "users": len({q.user_id for q in mine}),
        **score_fields(s),
        "factual_recall": factual_recall(mine_recalls),
        "factual_recall_per_period": period_factual_recall(mine_recalls),
        **exposure_fields(history, period),
        "per_user": _per_user(mine, mine_recalls, lookup, mine_reads),
        "usage": dict(sorted(usage.items())),
        "cost_usd": cost,
    }
    return with_calibration(out, calibration)


def write_outputs(
    out_dir: Path,
    period_records: list[PeriodRecord],
    extra: dict[str, Any] | None = None,
    calibration: dict[str, Any] | None = None,
    *,
    plot: bool = True,
) -> dict[str, Any]:
    """metrics.json (with `calibration`, see build_metrics), records.jsonl and per_period.png.

    `plot=False` leaves the figure out (evolve's and tune's inner evaluations: a figure takes about
    0.3 s of CPU, and the run's own figures are made from its records).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics, notes = build_metrics(period_records, calibration)
    if extra:
        metrics.update(extra)
    if notes:
        metrics["warnings"] = notes
    questions, _ = collect(period_records)
    with open(out_dir / "records.jsonl.tmp", "w", encoding="utf-8") as fh:
        for q in sorted(questions, key=lambda r: (r.user_id, r.period, r.question_index)):
            row = q.model_dump(mode="json")
            row["correct"] = q.correct
            row["ub_correct"] = q.ub_correct
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out_dir / "records.jsonl.tmp").replace(out_dir / "records.jsonl")
    atomic_write_json(out_dir / "metrics.json", metrics, indent=2)
    if plot:
        plot_per_period(metrics, out_dir / "per_period.png")
    return metrics


def style_memory_score_axis(ax: Any, values: list[float]) -> None:
    """A fixed scale from -1 to 1 (stretched for values beyond it) with two reference levels.

    The reference levels are 0 = the random baseline, 1 = the upper bound. Flat lines then read as
    such instead of being magnified by matplotlib's autoscaling.
    """
    lo = min([-1.0, *values]) - 0.08
    hi = max([1.0, *values]) + 0.08
    ax.set_ylim(lo, hi)
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    ax.axhline(1, color="grey", lw=0.8, ls=":")
    ax.annotate(
        "random",
        (1.0, 0),
        xycoords=("axes fraction", "data"),
        ha="right",
        va="bottom",
        fontsize=7,
        color="grey",
    )
    ax.annotate(
        "upper bound",
        (1.0, 1),
        xycoords=("axes fraction", "data"),
        ha="right",
        va="top",
        fontsize=7,
        color="grey",
    )


def plot_per_period(metrics: dict[str, Any], path: Path, title: str | None = None) -> None:
    """Accuracy, upper bound, random, no memory, state accuracy and memory score per period."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = metrics["per_period"]
    periods = [r["period"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot(periods, [r["overall"] for r in rows], "o-", label="overall")
    ax1.plot(periods, [r["upper_bound"] for r in rows], "s--", label="upper bound")
    ax1.plot(periods, [r["random"] for r in rows], ":", color="grey", label="random")
    ax1.plot(periods, [r["no_memory"] for r in rows], "x:", color="tab:red", label="no memory")
    ax1.plot(
        periods, [r["state_accuracy"] for r in rows], "d-", color="tab:purple", label="state acc."
    )
    probs = [(p, r.get("state_prob")) for p, r in zip(periods, rows, strict=True)]
    if any(v is not None for _, v in probs):  # the letter read: P(true value), its own line
        shown = [(p, v) for p, v in probs if v is not None]
        ax1.plot(
            [p for p, _ in shown],
            [v for _, v in shown],
            "d--",
            color="tab:pink",
            label="state prob.",
        )
    ax1.set(xlabel="period", ylabel="accuracy", ylim=(-0.02, 1.02), title="accuracy")
    ax1.legend(fontsize=8)
    ms = [
        (p, r["memory_score"])
        for p, r in zip(periods, rows, strict=True)
        if r["memory_score"] is not None
    ]
    if ms:
        ax2.plot([p for p, _ in ms], [v for _, v in ms], "o-", color="tab:green")
    style_memory_score_axis(ax2, [v for _, v in ms])
    ax2.set(xlabel="period", ylabel="normalized memory score", title="memory score")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title or f"{metrics['users']} users, {metrics['questions']} answers")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


# the columns of eval's table: the scores, then where the wrong answers failed (the diagnosis)
SCORE_COLUMNS = (
    "memory_score",
    "state_accuracy",
    "overall",
    "no_memory",
    "random",
    "upper_bound",
    "state_chance",
    "factual_recall",
)
DIAGNOSIS_COLUMNS = {k: metric_column(k) for k in ("format", "write", "read", "utilization")}


def format_metrics(metrics: dict[str, Any], fmt: str = "table", *, first: str | None = None) -> str:
    """A run's numbers per period and overall, with the totals below.

    `first`: the metric shown first (the measure runs on this agent are ranked on). As text two
    tables, the scores and the failure shares, each within 100 columns; as CSV one table and
    nothing else; as Markdown one table and the totals.
    """
    columns: tuple[str, ...] = SCORE_COLUMNS
    if metrics.get("state_prob") is not None:  # the letter read: its probability beside it
        at = columns.index("state_accuracy") + 1
        columns = (*columns[:at], "state_prob", *columns[at:])
    scores = objective_first(columns, first)

    def row(label: Any, m: dict[str, Any], diagnosis: bool = True) -> list[Any]:
        values = [label, *(m[k] for k in scores)]
        return values + [m["diagnosis"][k] for k in DIAGNOSIS_COLUMNS] if diagnosis else values

    periods = [*metrics["per_period"], {**metrics, "period": "all"}]
    score_heads = ["period", *(metric_column(k) for k in scores)]
    failure_heads = ["period", *DIAGNOSIS_COLUMNS.values()]
    if fmt == "csv" or fmt == "md":
        rows = [row(r["period"], r) for r in periods]
        heads = score_heads + failure_heads[1:]
        lines = [format_table(heads, rows, align="r" * len(heads), fmt=fmt)]
        if fmt == "csv":
            return lines[0]
    else:
        failures = [[r["period"], *(r["diagnosis"][k] for k in DIAGNOSIS_COLUMNS)] for r in periods]
        lines = [
            format_table(
                score_heads,
                [row(r["period"], r, diagnosis=False) for r in periods],
                align="r" * len(score_heads),
            ),
            "failures: shares of the answers wrong at each step (they add up to 1 - overall)",
            format_table(failure_heads, failures, align="r" * len(failure_heads)),
        ]
    notes = [
        f"memory gain (overall - no_mem) {format_number(metrics['memory_gain'])}; recall = "
        "revealed states supported by the written memory at the end of the period (episode: "
        f"{format_number(metrics['factual_recall'])})",
    ]
    usage = ", ".join(f"{k} {v}" for k, v in metrics["usage"].items())
    cached = sum(metrics.get("usage_cached", {}).values())
    work = sum(metrics["usage"].values())
    notes.append(
        f"tokens: {work} ({cached} of {work} served from the response cache): {usage or 'none'}"
    )
    cost = metrics.get("cost_usd") or {}
    if cost:  # an endpoint had a price
        each = ", ".join(f"{k} {format_cost(v)}" for k, v in cost.items())
        notes.append(f"cost: ${format_cost(sum(cost.values()))} at the endpoints' prices: {each}")
    sep = "\n\n" if fmt == "md" else "\n"
    return sep.join(lines + [wrap_prose(n) for n in notes])
