"""Episodic feedback summaries handed to an evolver, in four modes (pure, deterministic).

- none:          {} (no evolution)
- question_only: each question without choices, with the memories retrieved to answer it
- complete:      each question with lettered choices, the assistant's pick, the ground truth and
                 the retrieved memories, plus the user-state updates revealed in the period(s)
                 (the paper's Appendix C.7 format; the assistant's letter is not off by one)
- diagnostic:    complete + each question's failure class and the state-query answers against
                 the truth, and (several users) the state accuracy over all of their questions

An evolver gets the summary of several users within a size budget (`budgeted_summary`): whole
users and whole questions enter in a fixed priority until the next would not fit; what is left
out is listed, never a cut JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, Field

from memloop.environment.data import UserItem
from memloop.feedback.objective import Mode
from memloop.feedback.records import QuestionRecord
from memloop.feedback.scoring import classify_failure, index_records, state_accuracy

FeedbackMode = Mode  # the name configs use
MODES: tuple[str, ...] = tuple(m.value for m in Mode)
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _letter(index: int | None) -> str | None:
    return None if index is None else LETTERS[index]


def _question_text(r: QuestionRecord, with_choices: bool) -> str:
    text = f"Question: {r.question};"
    if with_choices:
        text += "".join(f"\n({LETTERS[i]}) {c};" for i, c in enumerate(r.choices))
    return text


def summarize(
    records: Iterable[QuestionRecord],
    mode: str,
    updates: dict[str, str] | None = None,
    all_records: Iterable[QuestionRecord] | None = None,
) -> dict[str, Any]:
    """The feedback summary of `records` (typically one period's, or one cycle's) in `mode`.

    `updates` = {variable: new value} revealed in the same span; `all_records` supplies earlier
    periods for the diagnosis (defaults to `records`).
    """
    if mode not in MODES:
        raise ValueError(f"unknown feedback mode {mode!r}; use one of {', '.join(MODES)}")
    records = sorted(records, key=lambda r: (r.user_id, r.period, r.question_index))
    if not Mode(mode).evolves:
        return {}
    if mode == "question_only":
        return {
            "question_answer_history": [
                {
                    "question": _question_text(r, with_choices=False),
                    "retrieved_memories": list(r.retrieved_memories),
                }
                for r in records
            ]
        }
    lookup = index_records(all_records if all_records is not None else records)
    history = []
    for r in records:
        entry: dict[str, Any] = {
            "question": _question_text(r, with_choices=True),
            "assistant_response": _letter(r.chosen_index) or f"(unparseable: {r.json_error})",
            "ground_truth": _letter(r.gold_index),
            "retrieved_memories": list(r.retrieved_memories),
        }
        if mode == "diagnostic":
            entry["failure"] = classify_failure(r, lookup) or "none"
            entry["state_query"] = {
                v: {"believed": r.state_answers.get(v), "actual": r.true_values[v]}
                for v in r.required_info
            }
        history.append(entry)
    return {
        "question_answer_history": history,
        "user_information_updates": dict(sorted((updates or {}).items())),
    }


# ---------------------------------------------------------------- several users, within a budget


def render_summary(summary: dict[str, Any]) -> str:
    """The text an evolver reads; the budget is measured on exactly this."""
    return json.dumps(summary, ensure_ascii=False, indent=1)


def select_questions(records: Iterable[QuestionRecord], mode: str) -> list[QuestionRecord]:
    """`records` in the order they enter a summary.

    Wrong answers first when the mode reveals correctness anyway, otherwise the latest periods
    first (so the order leaks nothing); then latest period, user, question.
    """
    reveals = mode in ("complete", "diagnostic")
    return sorted(
        records,
        key=lambda r: (r.correct if reveals else False, -r.period, r.user_id, r.question_index),
    )


def latest_updates(item: UserItem, periods: int) -> dict[str, str]:
    """{variable: its value at the end} for every variable revealed in the first `periods`."""
    revealed = {v for p in range(periods) for exposed in item.exposed_values(p) for v in exposed}
    state = item.state_at(periods - 1)
    return {v: state[v] for v in sorted(revealed)}


class Omitted(BaseModel):
    """A question the summary left out, and why."""

    user: str
    period: int
    question: int
    reason: Literal["max_questions", "max_chars"]


class SummaryReport(BaseModel):
    """What a budgeted summary holds and what it left out."""

    max_chars: int
    max_questions: int
    chars: int = 0
    questions: int = 0
    users: int = 0
    omitted: list[Omitted] = Field(default_factory=list)


def budgeted_summary(
    records: Iterable[QuestionRecord],
    mode: str,
    updates: dict[str, dict[str, str]],
    *,
    max_questions: int,
    max_chars: int,
    history: Iterable[QuestionRecord] | None = None,
) -> tuple[dict[str, Any], SummaryReport]:
    """The feedback summary of several users within `max_questions` and `max_chars`.

    The result is {"users": [{"user": id, **summarize(...)}, ...]} (plus "state_accuracy" in
    diagnostic mode); its rendering
    (`render_summary`) is at most `max_chars` characters. Questions are taken in
    `select_questions` order; each enters whole, together with its user's block (id and
    `updates[user]`) the first time one of that user's questions enters, if the result still
    fits. A question that does not fit is skipped (a later, smaller one may fit) and recorded in
    the report. `history` (default: `records`) supplies the earlier periods for the diagnosis.
    """
    records = list(records)
    report = SummaryReport(max_chars=max_chars, max_questions=max_questions)
    if not Mode(mode).evolves:
        return {}, report
    history = list(history) if history is not None else records
    chosen: dict[str, list[QuestionRecord]] = {}

    header: dict[str, Any] = {}
    if mode == "diagnostic" and records:
        state = state_accuracy(records)
        chance = "unknown" if state.chance is None else f"{state.chance:.2f}"
        header["state_accuracy"] = (
            f"{state.accuracy:.2f} of {state.pairs} believed values right (chance {chance})"
        )

    def build(selection: dict[str, list[QuestionRecord]]) -> dict[str, Any]:
        return {
            **header,
            "users": [
                {
                    "user": uid,
                    **summarize(mine, mode, updates.get(uid, {}), all_records=history),
                }
                for uid, mine in sorted(selection.items())
            ],
        }

    summary = build(chosen)
    for r in select_questions(records, mode):
        where = dict(user=r.user_id, period=r.period, question=r.question_index)
        if report.questions >= max_questions:
            report.omitted.append(Omitted(**where, reason="max_questions"))
            continue
        trial = {**chosen, r.user_id: [*chosen.get(r.user_id, []), r]}
        candidate = build(trial)
        if len(render_summary(candidate)) > max_chars:
            report.omitted.append(Omitted(**where, reason="max_chars"))
            continue
        chosen, summary = trial, candidate
        report.questions += 1
    report.chars = len(render_summary(summary))
    report.users = len(chosen)
    return summary, report


def episode_summary(
    items: list[UserItem],
    records: Iterable[QuestionRecord],
    mode: str,
    *,
    max_questions: int,
    max_chars: int,
    periods: int | None = None,
) -> tuple[dict[str, Any], SummaryReport]:
    """The budgeted summary of whole episodes (the first `periods` of each) of `items`."""
    updates = {
        item.id: latest_updates(item, min(periods or item.num_periods, item.num_periods))
        for item in items
    }
    return budgeted_summary(
        records, mode, updates, max_questions=max_questions, max_chars=max_chars
    )
