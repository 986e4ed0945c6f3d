"""Consistency checks of parsed user items.

Values are choices, gold answers exist, exposures match the state, dates are ordered; each problem
is one string starting with its JSON path.
"""

from __future__ import annotations

from collections import Counter
from datetime import date, datetime

from memloop.environment.data import Period, QuestionAnswer, UserItem
from memloop.environment.paths import join

DATE_FORMAT = "%Y-%m-%d"
SESSION_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def parse_date(text: str | None) -> date | None:
    """A `YYYY-MM-DD` date, or None if `text` is not one."""
    try:
        return datetime.strptime(text, DATE_FORMAT).date() if text is not None else None
    except ValueError:
        return None


def parse_session_time(text: str | None) -> datetime | None:
    """A `YYYY-MM-DD HH:MM:SS` timestamp, or None if `text` is not one."""
    try:
        return datetime.strptime(text, SESSION_TIME_FORMAT) if text is not None else None
    except ValueError:
        return None


def check_items(items: list[UserItem], positions: list[int] | None = None) -> list[str]:
    """Every consistency violation in `items`.

    Item i is reported as ``[positions[i]]`` (default: i), so items parsed out of a file with broken
    neighbours keep their file positions.
    """
    positions = list(range(len(items))) if positions is None else positions
    problems: list[str] = []
    first_seen: dict[str, int] = {}
    for i, item in zip(positions, items, strict=True):
        problems.extend(check_item(item, i))
        if item.id in first_seen:
            problems.append(
                f"{join([i, 'id'])}: duplicate id {item.id!r} (also {join([first_seen[item.id]])})"
            )
        else:
            first_seen[item.id] = i
    return problems


def check_item(item: UserItem, index: int) -> list[str]:
    """Every consistency violation in one item, reported under ``[index]``."""
    problems: list[str] = []
    problems += _check_schema(item, index)
    if not item.periods:
        problems.append(
            f"{join([index, 'periods'])}: no periods (period 0 must hold the initial state)"
        )
    for p, period in enumerate(item.periods):
        previous = item.periods[p - 1] if p > 0 else None
        problems += _check_period(item, index, p, period, previous)
    for q, qa in enumerate(item.qas):
        problems += _check_question(item, index, q, qa)
    problems += _check_dates(item, index)
    return problems


def _check_schema(item: UserItem, index: int) -> list[str]:
    problems = []
    for var, choices in item.state_schema.items():
        where = join([index, "state_schema", var])
        if not choices:
            problems.append(f"{where}: variable {var!r} has no choices")
        for choice, count in sorted(Counter(choices).items()):
            if count > 1:
                problems.append(f"{where}: choice {choice!r} is listed {count} times")
    return problems


def _value_problem(item: UserItem, where: str, var: str, value: str | None) -> str | None:
    """The violation for assigning `value` to `var`, or None if it is a valid choice."""
    if var not in item.state_schema:
        return f"{where}: unknown variable {var!r} (not in state_schema)"
    if value not in item.state_schema[var]:
        return f"{where}: {value!r} is not a choice of {var}"
    return None


def _check_period(
    item: UserItem, index: int, p: int, period: Period, previous: Period | None
) -> list[str]:
    problems: list[str] = []
    base: list[str | int] = [index, "periods", p]
    for var, value in period.state.items():
        problem = _value_problem(item, join(base + ["state", var]), var, value)
        if problem:
            problems.append(problem)
    missing = [var for var in item.state_schema if var not in period.state]
    if missing:
        names = ", ".join(repr(var) for var in missing)
        problems.append(
            f"{join(base + ['state'])}: missing variable(s) {names} "
            "(the state must assign every variable)"
        )

    for var, update in period.updates.items():
        where = join(base + ["updates", var])
        if var not in item.state_schema:
            problems.append(f"{where}: unknown variable {var!r} (not in state_schema)")
            continue
        if var in period.state and update.new != period.state[var]:
            problems.append(
                f"{where}.new: {update.new!r} differs from the period's state value "
                f"{period.state[var]!r}"
            )
        if previous is None:
            if update.old is not None:
                problems.append(f"{where}.old: must be null in period 0 (got {update.old!r})")
        else:
            if update.old != previous.state.get(var):
                problems.append(
                    f"{where}.old: {update.old!r} differs from the previous period's value "
                    f"{previous.state.get(var)!r}"
                )
            if update.old == update.new:
                problems.append(f"{where}: old and new are both {update.new!r}, which is no change")
    if previous is not None:
        for var in item.state_schema:
            before, after = previous.state.get(var), period.state.get(var)
            if (
                before is not None
                and after is not None
                and before != after
                and var not in period.updates
            ):
                problems.append(
                    f"{join(base + ['updates'])}: {var!r} changed from {before!r} to {after!r} but "
                    "has no update entry"
                )

    for var, count in (period.update_cnts or {}).items():
        where = join(base + ["update_cnts", var])
        if var not in item.state_schema:
            problems.append(f"{where}: unknown variable {var!r} (not in state_schema)")
        elif count < 0:
            problems.append(f"{where}: a change count cannot be negative (got {count})")

    for s, session in enumerate(period.sessions):
        for var, value in session.exposed_states.items():
            where = join(base + ["sessions", s, "exposed_states", var])
            if var not in item.state_schema:
                problems.append(f"{where}: unknown variable {var!r} (not in state_schema)")
            elif value != period.state.get(var):
                problems.append(
                    f"{where}: {value!r} does not match the period's state value "
                    f"{period.state.get(var)!r}"
                )
    return problems


def _check_question(item: UserItem, index: int, q: int, qa: QuestionAnswer) -> list[str]:
    problems: list[str] = []
    base: list[str | int] = [index, "qas", q]
    required = qa.required_info
    if not required:
        problems.append(f"{join(base + ['required_info'])}: lists no variables")
    for r, var in enumerate(required):
        if var not in item.state_schema:
            problems.append(
                f"{join(base + ['required_info', r])}: unknown variable {var!r} "
                "(not in state_schema)"
            )
    for var, count in sorted(Counter(required).items()):
        if count > 1:
            problems.append(
                f"{join(base + ['required_info'])}: variable {var!r} is listed {count} times"
            )
    if not qa.answer_choices:
        problems.append(f"{join(base + ['answer_choices'])}: no answer choices")
        return problems

    choices_ok = True
    seen: dict[tuple, int] = {}
    for c, choice in enumerate(qa.answer_choices):
        where = base + ["answer_choices", c, "state"]
        if isinstance(choice.state, dict):
            if set(choice.state) != set(required):
                choices_ok = False
                problems.append(
                    f"{join(where)}: has variables {sorted(choice.state)} but required_info is "
                    f"{required}"
                )
                continue
            pairs = [(var, choice.state[var], where + [var]) for var in required]
        else:
            if len(choice.state) != len(required):
                choices_ok = False
                problems.append(
                    f"{join(where)}: has {len(choice.state)} values but required_info has "
                    f"{len(required)} variables"
                )
                continue
            pairs = [
                (var, value, where + [r])
                for r, (var, value) in enumerate(zip(required, choice.state, strict=True))
            ]
        for var, value, steps in pairs:
            if var in item.state_schema and value not in item.state_schema[var]:
                problems.append(f"{join(steps)}: {value!r} is not a choice of {var}")
        values = choice.values(required)
        if values in seen:
            problems.append(
                f"{join(where)}: same state variant {list(values)} as "
                f"answer_choices[{seen[values]}]"
            )
        else:
            seen[values] = c
    if not choices_ok or not required:
        return problems

    for p, period in enumerate(item.periods):
        gold = tuple(period.state.get(var) for var in required)
        if None in gold:
            continue  # the missing state variable is already reported
        matches = qa.matching_choices(gold)
        if not matches:
            problems.append(
                f"{join(base + ['answer_choices'])}: no choice matches the gold state {list(gold)} "
                f"of period {p}"
            )
        elif len(matches) > 1:
            problems.append(
                f"{join(base + ['answer_choices'])}: choices {matches} all match the gold state "
                f"{list(gold)} of period {p}; exactly one must"
            )
    return problems


def _check_dates(item: UserItem, index: int) -> list[str]:
    problems: list[str] = []
    start = parse_date(item.start_time)
    if start is None:
        problems.append(
            f"{join([index, 'start_time'])}: {item.start_time!r} is not a date (YYYY-MM-DD)"
        )

    previous_end: date | None = None
    previous_session: tuple[datetime, str] | None = None
    for p, period in enumerate(item.periods):
        base: list[str | int] = [index, "periods", p]
        end = parse_date(period.period_end)
        if end is None:
            problems.append(
                f"{join(base + ['period_end'])}: {period.period_end!r} is not a date (YYYY-MM-DD)"
            )
        begin = None
        if period.period_start is not None:
            begin = parse_date(period.period_start)
            if begin is None:
                problems.append(
                    f"{join(base + ['period_start'])}: {period.period_start!r} "
                    "is not a date (YYYY-MM-DD)"
                )
        if p == 0 and start is not None and end is not None and end < start:
            problems.append(
                f"{join(base + ['period_end'])}: {period.period_end} is before start_time "
                f"{item.start_time}"
            )
        if previous_end is not None and end is not None and end <= previous_end:
            problems.append(
                f"{join(base + ['period_end'])}: {period.period_end} is not after the previous "
                f"period's end {previous_end.isoformat()}"
            )
        if begin is not None and end is not None and begin > end:
            problems.append(
                f"{join(base + ['period_start'])}: {period.period_start} is after period_end "
                f"{period.period_end}"
            )
        if begin is not None and previous_end is not None and begin < previous_end:
            problems.append(
                f"{join(base + ['period_start'])}: {period.period_start} is before the previous "
                f"period's end {previous_end.isoformat()}"
            )

        for s, session in enumerate(period.sessions):
            where = join(base + ["sessions", s, "session_time"])
            when = parse_session_time(session.session_time)
            if when is None:
                problems.append(
                    f"{where}: {session.session_time!r} is not a time (YYYY-MM-DD HH:MM:SS)"
                )
                continue
            if end is not None and when.date() > end:
                problems.append(
                    f"{where}: {session.session_time} is after period_end {period.period_end}"
                )
            if begin is not None and when.date() < begin:
                problems.append(
                    f"{where}: {session.session_time} is before period_start {period.period_start}"
                )
            if previous_session is not None and when < previous_session[0]:
                problems.append(
                    f"{where}: {session.session_time} is earlier than the preceding session "
                    f"({previous_session[1]})"
                )
            previous_session = (when, session.session_time)
        if end is not None:
            previous_end = end
    return problems
