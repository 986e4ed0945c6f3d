"""The one catalogue of memloop's metrics: what each is called, where it is shown, which way is up.

A metric is registered once, as a `Metric` row of `CATALOGUE`; every reader takes its names from
here when it reads (a row added at run time is seen everywhere): the cycle records and MLflow
curves (`cycle`), compare's paired tables (`paired`), the run figures (`plotted`), tune's trial
metrics (`trial`), a run's description and the quickstart's table (`headline`), and every
table's column header (`column`, `metric_column`). A new metric touches its computation
(feedback/report.py's metrics dict, overall and per user) and one row here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric and where it is shown.

    `probability`: a probability read from the model's answer-letter log-probabilities; only
    runs with that read have it, so tables show it only when a run does.
    """

    name: str
    column: str  # its header in every table
    title: str  # its name on a figure's axis
    cycle: bool = True  # in each cycle record's split and the MLflow curves `<split>/<name>`
    paired: bool = False  # compare pairs it user by user against a baseline
    plotted: bool = False  # the run figures draw it (memory gain only as a run's objective)
    headline: bool = False  # named beside the objective in a run's description
    trial: bool = False  # one of a tune trial's metrics
    higher_is_better: bool = True
    probability: bool = False


CATALOGUE: tuple[Metric, ...] = (
    Metric(
        "memory_score",
        "mem_score",
        "normalized memory score",
        paired=True,
        plotted=True,
        headline=True,
        trial=True,
    ),
    Metric(
        "state_accuracy",
        "state_acc",
        "state accuracy",
        paired=True,
        plotted=True,
        headline=True,
        trial=True,
    ),
    Metric(
        "state_prob",
        "state_prob",
        "state probability (P of the true value)",
        paired=True,
        plotted=True,
        probability=True,
    ),
    Metric("memory_gain", "mem_gain", "memory gain", paired=True, trial=True),
    Metric("overall", "overall", "overall accuracy", trial=True),
    Metric("no_memory", "no_mem", "accuracy without memory"),
    Metric(
        "factual_recall",
        "recall",
        "memory factual recall",
        paired=True,
        plotted=True,
        headline=True,
        trial=True,
    ),
    Metric("format", "format", "share of answers unparsed", higher_is_better=False),
    Metric("write", "write", "share of write failures", higher_is_better=False),
    Metric("read", "read", "share of read failures", higher_is_better=False),
    Metric("utilization", "util", "share of utilization failures", higher_is_better=False),
    Metric(
        "memory_score_undefined_periods",
        "undef_periods",
        "periods without a memory score",
        higher_is_better=False,
    ),
    # the reference points of a memory score: in eval's table, not cycle curves
    Metric("upper_bound", "upper_bd", "accuracy with the true state", cycle=False),
    Metric("random", "random", "accuracy of a random option", cycle=False),
    Metric("state_chance", "chance", "chance of a state question", cycle=False),
)


def names(**where: bool) -> tuple[str, ...]:
    """The catalogue's names, in its order, of the metrics whose fields equal `where`.

    `names(paired=True)`; `names(paired=True, probability=False)`.
    """
    for key in where:  # a misspelt field would silently select nothing
        if key not in Metric.__dataclass_fields__:
            raise TypeError(f"a Metric has no field {key!r}")
    return tuple(m.name for m in CATALOGUE if all(getattr(m, k) == v for k, v in where.items()))


def metric(name: str) -> Metric:
    """The catalogue's row of `name` (KeyError naming the known metrics when there is none)."""
    for row in CATALOGUE:
        if row.name == name:
            return row
    raise KeyError(f"no metric {name!r} in the catalogue: {', '.join(m.name for m in CATALOGUE)}")


def _find(name: str) -> Metric | None:
    return next((m for m in CATALOGUE if m.name == name), None)


OBJECTIVE_MARK = " (objective)"


def metric_column(name: str, *, objective: bool = False) -> str:
    """The header of `name` (``state_acc``), marked ``state_acc (objective)`` when it is one."""
    found = _find(name)
    column = found.column if found else name
    return column + OBJECTIVE_MARK if objective else column


def objective_first(metrics: Sequence[str], objective: str | None) -> list[str]:
    """`metrics` with `objective` moved to the front (unchanged when it is not among them)."""
    if objective is None or objective not in metrics:
        return list(metrics)
    return [objective, *(m for m in metrics if m != objective)]


def metric_title(name: str) -> str:
    """The name of `name` on a figure."""
    found = _find(name)
    return found.title if found else name


def cycle_metrics() -> tuple[str, ...]:
    """In each cycle record's split and the MLflow curves `<split>/<name>`."""
    return names(cycle=True)


def paired_metrics(*, probabilities: bool = True) -> tuple[str, ...]:
    """What compare pairs user by user; `probabilities=False`: those every run has."""
    return names(paired=True) if probabilities else names(paired=True, probability=False)


def trial_metrics() -> tuple[str, ...]:
    """A tune trial's metrics (its user attributes, `val/*` metrics, the best trial's tests)."""
    return names(trial=True)


def headline_metrics() -> tuple[str, ...]:
    """Named beside the objective in a run's description and the quickstart's table."""
    return names(headline=True)


def plotted_metrics() -> tuple[str, ...]:
    """The metrics a run figure draws, in their default order."""
    return names(plotted=True)
