"""Pure scoring over QuestionRecords (no model calls).

Computes accuracy, random baseline, upper bound, normalized memory score, the
write/read/utilization diagnosis and factual recall.

Definitions (design.md "Metrics"):
- random = expected accuracy of a uniform pick = mean of 1/#choices;
- upper bound = accuracy of the policy's LLM handed the true required values, per question;
- memory score = (overall - random) / (UB - random) per (user, period), then averaged; undefined
  (None, with a warning) when UB <= random;
- every wrong answer is exactly one of: utilization (the state query got all required variables
  right), write (some wrongly believed variable was also wrong at the end of the period its value
  was set in), read (otherwise). write + read + utilization = 1 - overall.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from collections.abc import Iterable
from statistics import mean
from typing import Literal

from pydantic import BaseModel, Field

from memloop.feedback.records import PeriodRecall, QuestionRecord

Failure = Literal["write", "read", "utilization"]


class MemoryScoreUndefined(UserWarning):
    """The upper bound does not exceed the random baseline, so the memory score is undefined."""


def classify_failure(
    record: QuestionRecord, by_key: dict[tuple[str, int, int], QuestionRecord]
) -> Failure | None:
    """None for a right answer; otherwise the single failure class of this wrong answer.

    `by_key` maps (user, period, question) to records, to look up the state query at write time.
    """
    if record.correct:
        return None
    wrong = [v for v in record.required_info if not record.variable_right(v)]
    if not wrong:
        return "utilization"
    for variable in wrong:
        at_write = by_key.get(
            (record.user_id, record.write_periods[variable], record.question_index)
        )
        if (
            at_write is None
            or variable not in at_write.true_values
            or not at_write.variable_right(variable)
        ):
            return "write"
    return "read"


def index_records(records: Iterable[QuestionRecord]) -> dict[tuple[str, int, int], QuestionRecord]:
    return {(r.user_id, r.period, r.question_index): r for r in records}


class Diagnosis(BaseModel):
    write: float = 0.0
    read: float = 0.0
    utilization: float = 0.0


class Scores(BaseModel):
    """One group's scores (a period, or the whole run)."""

    n_questions: int
    overall: float
    random: float
    upper_bound: float
    memory_score: float | None
    memory_score_undefined: int = 0  # (user, period) cells where UB <= random
    json_errors: int = 0
    diagnosis: Diagnosis = Field(default_factory=Diagnosis)


def _cell_memory_score(cell: list[QuestionRecord]) -> float | None:
    overall = mean(r.correct for r in cell)
    rand = mean(1.0 / r.n_choices for r in cell)
    ub = mean(r.ub_correct for r in cell)
    if ub - rand <= 1e-12:
        return None
    return (overall - rand) / (ub - rand)


def score(
    records: list[QuestionRecord],
    all_records: dict[tuple[str, int, int], QuestionRecord] | None = None,
) -> Scores:
    """Scores of `records`.

    `all_records` (defaults to these) supplies state queries at write time for the diagnosis.
    """
    if not records:
        raise ValueError("no records to score")
    lookup = all_records if all_records is not None else index_records(records)
    cells: dict[tuple[str, int], list[QuestionRecord]] = defaultdict(list)
    counts = {"write": 0, "read": 0, "utilization": 0}
    for r in records:
        cells[(r.user_id, r.period)].append(r)
        failure = classify_failure(r, lookup)
        if failure is not None:
            counts[failure] += 1
    cell_scores = [_cell_memory_score(c) for _, c in sorted(cells.items())]
    defined = [s for s in cell_scores if s is not None]
    undefined = len(cell_scores) - len(defined)
    if undefined:
        warnings.warn(
            f"memory score undefined for {undefined} of {len(cell_scores)} "
            "(user, period) cells: the upper bound does not exceed random there",
            MemoryScoreUndefined,
            stacklevel=2,
        )
    n = len(records)
    return Scores(
        n_questions=n,
        overall=mean(r.correct for r in records),
        random=mean(1.0 / r.n_choices for r in records),
        upper_bound=mean(r.ub_correct for r in records),
        memory_score=mean(defined) if defined else None,
        memory_score_undefined=undefined,
        json_errors=sum(1 for r in records if r.json_error is not None),
        diagnosis=Diagnosis(**{k: v / n for k, v in counts.items()}),
    )


def score_by_period(records: list[QuestionRecord]) -> dict[int, Scores]:
    lookup = index_records(records)
    periods: dict[int, list[QuestionRecord]] = defaultdict(list)
    for r in records:
        periods[r.period].append(r)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryScoreUndefined)  # reported once, for the whole run
        return {p: score(rs, lookup) for p, rs in sorted(periods.items())}


def factual_recall(recalls: Iterable[PeriodRecall]) -> float | None:
    """Share of newly revealed states judged supported by memory.

    Unparsed judgments count as not supported; None when nothing was revealed.
    """
    claims = [c for r in recalls for c in r.claims]
    if not claims:
        return None
    return sum(1 for c in claims if c.supported) / len(claims)
