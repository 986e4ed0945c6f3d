"""Turning one user's step results into a published `UserItem`.

Period dates, seeded session times spread over each period, updates and change counts, questions
with their choices.
"""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta
from typing import Any

from memloop.environment.data import (
    AnswerChoice,
    Period,
    QuestionAnswer,
    Session,
    StateUpdate,
    UserItem,
    UserProfile,
)
from memloop.environment.procedural import add_months

INITIAL_WINDOW_DAYS = 14
"""Period-0 sessions fall in the two weeks ending on the start date."""
DAY_START_S = 8 * 3600
DAY_END_S = 22 * 3600 + 59 * 60


def period_ends(start: str, periods: int, months: int) -> list[date]:
    """End date of periods 0..periods (period 0 ends on the start date)."""
    first = datetime.strptime(start, "%Y-%m-%d").date()
    return [add_months(first, k * months) for k in range(periods + 1)]


def session_times(rng: random.Random, first: date, last: date, count: int) -> list[str]:
    """`count` increasing timestamps between 08:00 on `first` and 22:59 on `last`.

    The window is cut into `count` equal slices and each session gets a random day and time in its
    own slice, so sessions spread over the whole period instead of piling up at its end.
    """
    span = (last - first).days + 1
    stamps: list[datetime] = []
    for i in range(count):
        lo = (i * span) // count
        hi = max(lo, ((i + 1) * span) // count - 1)
        day = first + timedelta(days=rng.randint(lo, hi))
        stamp = datetime.combine(day, datetime.min.time()) + timedelta(
            seconds=rng.randint(DAY_START_S, DAY_END_S)
        )
        if stamps and stamp <= stamps[-1]:
            stamp = stamps[-1] + timedelta(minutes=1)  # only when slices are shorter than a day
        stamps.append(stamp)
    return [s.strftime("%Y-%m-%d %H:%M:%S") for s in stamps]


def session_window(period: int, ends: list[date]) -> tuple[date, date]:
    """Days the sessions of `period` may fall on: after the previous period's end, up to its end."""
    if period == 0:
        return ends[0] - timedelta(days=INITIAL_WINDOW_DAYS - 1), ends[0]
    return ends[period - 1] + timedelta(days=1), ends[period]


def build_item(
    user_id: str,
    start: str,
    profile: dict[str, Any],
    schema: dict[str, list[str]],
    states: list[dict[str, str]],
    updates: list[dict[str, Any]],
    sessions: list[list[dict[str, Any]]],
    session_stamps: list[list[str]],
    questions: list[dict[str, Any]],
    answers: list[dict[str, Any]],
    ends: list[date],
) -> UserItem:
    """Assemble one user's step results into the published `UserItem`.

    `updates[k-1]` is period k's {"summary", "changes"}; `sessions[k]` and `session_stamps[k]`
    belong to period k (0 = initial); `answers[q]` holds question q's choices.
    """
    totals = {var: sum(var in update["changes"] for update in updates) for var in schema}
    periods = []
    for k, state in enumerate(states):
        if k == 0:
            period_updates = {var: StateUpdate(old=None, new=state[var]) for var in schema}
            summary, begin = None, None
        else:
            period_updates = {
                var: StateUpdate(old=states[k - 1][var], new=new)
                for var, new in updates[k - 1]["changes"].items()
            }
            summary, begin = updates[k - 1]["summary"], ends[k - 1].isoformat()
        period_sessions = [
            Session(
                event=s["event"],
                exposed_states=dict(s["exposed_states"]),
                query=s["query"],
                messages=[],
                session_time=when,
            )
            for s, when in zip(sessions[k], session_stamps[k], strict=True)
        ]
        periods.append(
            Period(
                period_start=begin,
                period_end=ends[k].isoformat(),
                period_summary=summary,
                sessions=period_sessions,
                state=dict(state),
                updates=period_updates,
                update_cnts=dict(totals),
            )
        )
    qas = [
        QuestionAnswer(
            query=q["question"],
            required_info=list(q["required_info"]),
            answer_choices=[
                AnswerChoice(state=list(c["state"]), answer=c["answer"], type=c["type"])
                for c in a["choices"]
            ],
        )
        for q, a in zip(questions, answers, strict=True)
    ]
    return UserItem(
        id=user_id,
        start_time=start,
        user_profile=UserProfile(**profile),
        state_schema={var: list(values) for var, values in schema.items()},
        periods=periods,
        qas=qas,
    )
