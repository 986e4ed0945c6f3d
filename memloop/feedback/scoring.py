"""Pure scoring over QuestionRecords (no model calls).

Definitions (docs/experiments.md "What the numbers mean"; SCORER_VERSION 3):
- overall = accuracy of the multiple-choice answers; random = mean of 1/#choices;
- upper bound (UB) = accuracy of the policy's LLM handed the true required values, per question;
- no_memory = accuracy of the policy's LLM given the question alone (no conversation, no memory);
  memory_gain = overall - no_memory. Random is not a memory-free floor: when no_memory clearly
  exceeds random the choice set gives answers away (a `NoMemoryAboveRandom` warning);
- memory score (the headline) = (sum correct - sum random) / (sum UB - sum random) over every
  question of the group (all its users and periods; a user's own score: that user's questions);
  None when sum UB <= sum random. A period's score is the same ratio over the period's questions.
  `memory_score_cell_mean` keeps the earlier mean of per-(user, period) ratios, which is biased at
  2-3 questions per cell: simulated at a true 0.43 (12 users x 4 periods x 3 questions), the cell
  mean averages 0.78, the mean of per-period ratios 0.49, the ratio over all questions 0.45
  (tests/feedback/test_feedback_scoring.py);
- state accuracy = share of (question, required variable) state-query answers equal to the truth
  (with the letter read: of the (period, variable) reads); state_prob = the mean probability the
  letter read gave the true value (probes.py `option_probabilities`); none for the JSON read;
  state_chance = mean of 1/#values of those variables; state_score = (accuracy - chance) /
  (1 - chance). It measures memory without the multiple-choice reasoning step;
- every wrong answer is exactly one of: format (the answer did not parse: never blamed on
  memory), utilization (the state query got all required variables right), write (some wrongly
  believed variable was also wrong at the end of the period its value was set in), read
  (otherwise). format + write + read + utilization = 1 - overall.
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Iterable
from statistics import mean
from typing import Literal

from pydantic import BaseModel, Field

from memloop.feedback.records import PeriodRecall, QuestionRecord, StateRead

Failure = Literal["format", "write", "read", "utilization"]
FAILURES: tuple[Failure, ...] = ("format", "write", "read", "utilization")
MIN_QUESTIONS_PER_PERIOD = 10  # below this many questions per period (on average), warn


class MemoryScoreUndefined(UserWarning):
    """The upper bound does not exceed the random baseline, so the memory score is undefined."""


class MemoryScoreUnstable(UserWarning):
    """Fewer than MIN_QUESTIONS_PER_PERIOD questions per period: the ratio is noisy."""


class NoMemoryAboveRandom(UserWarning):
    """Answering without memory beats random: the choice set gives answers away."""


def classify_failure(
    record: QuestionRecord, by_key: dict[tuple[str, int, int], QuestionRecord]
) -> Failure | None:
    """None for a right answer; otherwise the single failure class of this wrong answer.

    `by_key` maps (user, period, question) to records, to look up the state query at write time.
    An answer that did not parse is a `format` failure whatever the memory held. (The published
    AMemGym code picks a random option for it instead, which scores it right 1/#choices of the
    time and otherwise blames memory.)
    """
    if record.correct:
        return None
    if record.unparsed:
        return "format"
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
    format: float = 0.0
    write: float = 0.0
    read: float = 0.0
    utilization: float = 0.0


class StateAccuracy(BaseModel):
    """The state query scored: memory itself, without the multiple-choice reasoning step.

    With the letter read (`probes.state_read: letters`) the pairs are (period, variable) reads and
    `prob` is the mean probability the read gave the true value over the `prob_pairs` reads that
    have one; without (the JSON read, or an endpoint giving no log-probabilities) `prob` is None
    and `prob_null_reason` says why. Never a stand-in.
    """

    pairs: int  # (question, required variable) answers, or (period, variable) letter reads
    accuracy: float
    chance: float | None  # None when the number of values is unknown (old records)
    score: float | None  # (accuracy - chance) / (1 - chance)
    prob: float | None = None
    prob_pairs: int = 0
    prob_null_reason: str | None = None


class Scores(BaseModel):
    """One group's scores (a period, a user, or the whole run)."""

    n_questions: int
    overall: float
    random: float
    upper_bound: float
    no_memory: float
    memory_gain: float  # overall - no_memory
    memory_score: float | None  # the ratio of sums over all of the group's questions
    memory_score_undefined: int = 0  # periods whose own ratio is undefined (sum UB <= sum random)
    memory_score_cell_mean: float | None = None  # the old per-(user, period) mean of ratios
    memory_score_cells_undefined: int = 0  # (user, period) cells the cell mean leaves out
    questions_per_period: float = 0.0  # the mean number of questions pooled per period
    state: StateAccuracy
    json_errors: int = 0
    diagnosis: Diagnosis = Field(default_factory=Diagnosis)


def by_period(records: Iterable[QuestionRecord]) -> dict[int, list[QuestionRecord]]:
    """`records` grouped by period, in period order."""
    periods: dict[int, list[QuestionRecord]] = defaultdict(list)
    for r in records:
        periods[r.period].append(r)
    return dict(sorted(periods.items()))


def ratio_score(records: list[QuestionRecord]) -> float | None:
    """(sum correct - sum random) / (sum UB - sum random) over `records`; None when UB <= random."""
    overall = sum(r.correct for r in records)
    rand = sum(1.0 / r.n_choices for r in records)
    ub = sum(r.ub_correct for r in records)
    if ub - rand <= 1e-12:
        return None
    return (overall - rand) / (ub - rand)


def cell_mean_memory_score(records: list[QuestionRecord]) -> tuple[float | None, int]:
    """(mean over (user, period) cells of each cell's ratio, number of undefined cells)."""
    cells: dict[tuple[str, int], list[QuestionRecord]] = defaultdict(list)
    for r in records:
        cells[(r.user_id, r.period)].append(r)
    values = [ratio_score(c) for _, c in sorted(cells.items())]
    defined = [v for v in values if v is not None]
    return (mean(defined) if defined else None), len(values) - len(defined)


JSON_READ = "the JSON state query gives no probabilities (probes: {state_read: letters} does)"


def state_accuracy(
    records: list[QuestionRecord], reads: list[StateRead] | None = None
) -> StateAccuracy:
    """The state pairs scored: the letter `reads` when there are any, else the questions' pairs."""
    if reads:
        return _read_accuracy(reads)
    pairs = [(r, v) for r in records for v in r.required_info]
    if not pairs:
        return StateAccuracy(
            pairs=0, accuracy=0.0, chance=None, score=None, prob_null_reason=JSON_READ
        )
    accuracy = mean(r.variable_right(v) for r, v in pairs)
    chance: float | None = None
    score: float | None = None
    if all(v in r.state_choices for r, v in pairs):
        chance = mean(1.0 / r.state_choices[v] for r, v in pairs)
        if chance < 1.0 - 1e-12:
            score = (accuracy - chance) / (1.0 - chance)
    return StateAccuracy(
        pairs=len(pairs),
        accuracy=accuracy,
        chance=chance,
        score=score,
        prob_null_reason=JSON_READ,
    )


def _read_accuracy(reads: list[StateRead]) -> StateAccuracy:
    accuracy = mean(r.right for r in reads)
    chance = mean(1.0 / len(r.choices) for r in reads)
    score = (accuracy - chance) / (1.0 - chance) if chance < 1.0 - 1e-12 else None
    probs = [r.prob_true for r in reads if r.prob_true is not None]
    reason = None
    if not probs:
        reason = next((r.error for r in reads if r.error), "no read gave probabilities")
    return StateAccuracy(
        pairs=len(reads),
        accuracy=accuracy,
        chance=chance,
        score=score,
        prob=mean(probs) if probs else None,
        prob_pairs=len(probs),
        prob_null_reason=reason,
    )


def no_memory_excess(records: list[QuestionRecord]) -> float:
    """The z statistic of the no-memory right answers above random (sum of 1/#choices).

    The count of right answers of a uniform pick is a sum of independent Bernoulli(1/n_i).
    """
    p = [1.0 / r.n_choices for r in records]
    var = sum(x * (1 - x) for x in p)
    if var <= 0:
        return 0.0
    return (sum(r.nm_correct for r in records) - sum(p)) / math.sqrt(var)


def score(
    records: list[QuestionRecord],
    all_records: dict[tuple[str, int, int], QuestionRecord] | None = None,
    reads: list[StateRead] | None = None,
) -> Scores:
    """Scores of `records`.

    `all_records` (defaults to these) supplies state queries at write time for the diagnosis;
    `reads`: the letter reads of the same users and periods (state accuracy and state_prob).
    """
    if not records:
        raise ValueError("no records to score")
    lookup = all_records if all_records is not None else index_records(records)
    counts = dict.fromkeys(FAILURES, 0)
    for r in records:
        failure = classify_failure(r, lookup)
        if failure is not None:
            counts[failure] += 1
    memory_score = ratio_score(records)
    cell_mean, cells_undefined = cell_mean_memory_score(records)
    periods = by_period(records)
    undefined = sum(1 for rs in periods.values() if ratio_score(rs) is None)
    per_period = len(records) / len(periods)
    if memory_score is None or undefined:
        warnings.warn(
            f"memory score undefined for {undefined} of {len(periods)} periods"
            + (" and overall" if memory_score is None else "")
            + ": the upper bound does not exceed random there",
            MemoryScoreUndefined,
            stacklevel=2,
        )
    if per_period < MIN_QUESTIONS_PER_PERIOD:
        warnings.warn(
            f"the memory score pools {per_period:.1f} questions per period (fewer than "
            f"{MIN_QUESTIONS_PER_PERIOD}): treat it and its per-period values as noisy",
            MemoryScoreUnstable,
            stacklevel=2,
        )
    z = no_memory_excess(records)
    overall = mean(r.correct for r in records)
    no_memory = mean(r.nm_correct for r in records)
    rand = mean(1.0 / r.n_choices for r in records)
    if z > 2.0:
        warnings.warn(
            f"answering with no memory scores {no_memory:.2f} against random {rand:.2f} "
            f"(z = {z:.1f}): the answer choices give answers away, so compare with no_memory "
            "(memory_gain), not with random",
            NoMemoryAboveRandom,
            stacklevel=2,
        )
    n = len(records)
    return Scores(
        n_questions=n,
        overall=overall,
        random=rand,
        upper_bound=mean(r.ub_correct for r in records),
        no_memory=no_memory,
        memory_gain=overall - no_memory,
        memory_score=memory_score,
        memory_score_undefined=undefined,
        memory_score_cell_mean=cell_mean,
        memory_score_cells_undefined=cells_undefined,
        questions_per_period=per_period,
        state=state_accuracy(records, reads),
        json_errors=sum(1 for r in records if r.json_error is not None),
        diagnosis=Diagnosis(**{k: v / n for k, v in counts.items()}),
    )


SCORING_WARNINGS = (MemoryScoreUndefined, MemoryScoreUnstable, NoMemoryAboveRandom)


def quiet_score(
    records: list[QuestionRecord],
    all_records: dict[tuple[str, int, int], QuestionRecord] | None = None,
    reads: list[StateRead] | None = None,
) -> Scores:
    """`score` without its warnings (for parts of a run whose warnings are reported as a whole)."""
    with warnings.catch_warnings():
        for category in SCORING_WARNINGS:
            warnings.simplefilter("ignore", category)
        return score(records, all_records, reads)


def score_by_period(
    records: list[QuestionRecord], reads: list[StateRead] | None = None
) -> dict[int, Scores]:
    lookup = index_records(records)
    # warnings are reported once, for the whole run
    return {
        p: quiet_score(rs, lookup, [r for r in reads or [] if r.period == p])
        for p, rs in by_period(records).items()
    }


def _supported_share(claims: list) -> float | None:
    """Share of claims judged supported (an unparsed judgment is not); None without claims."""
    if not claims:
        return None
    return sum(1 for c in claims if c.supported) / len(claims)


def factual_recall(recalls: Iterable[PeriodRecall]) -> float | None:
    """Episode factual recall: every revealed state against the written memory at the end.

    Per user, the recall record of the user's last period in `recalls` (it holds every state the
    user revealed up to then); the claims of all users pooled. None when nothing was revealed.
    """
    last: dict[str, PeriodRecall] = {}
    for r in recalls:
        if r.user_id not in last or r.period > last[r.user_id].period:
            last[r.user_id] = r
    return _supported_share([c for r in last.values() for c in r.claims])


def period_factual_recall(recalls: Iterable[PeriodRecall]) -> float | None:
    """Per-period factual recall (secondary), pooled over periods.

    Each period's newly revealed states, judged on the written memory at the end of that period.
    """
    return _supported_share([c for r in recalls for c in r.new_claims()])
