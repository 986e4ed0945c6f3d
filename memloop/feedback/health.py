"""Memory health: per user and period, what the writer did with what the user said; and alarms.

The state read (feedback/probes.py) scores what memory believes. This module watches the writes
that lead there, from the records every run keeps (the period's `record.json`: sessions, which
session revealed which variable, the memory at probe time; its `turns.json`: the memory lines
each turn added and removed, the model calls, the policy's counters). No model is asked.

Series, per (user, period) (`PeriodHealth`):
- `revealed`: facts (variable values) the period's sessions revealed; `stored`: those the memory
  at the period's end holds: an entry has two of the words only that session of the user's said
  (`covers`; the simulated user's recurring phrases are no fact's; a session that revealed two
  facts counts both when either is held);
- `added`: memory entries added by the period's turns; `assistant_added`: those that hold the
  assistant's words (words the user never said: the quickstart's writer stored its advice);
- `collisions`: entries whose label was rewritten with a value that drops a fact another session
  revealed (that session's variable not revealed again): one label reused for two facts;
- `updates_lost`: variables whose change this period memory missed while it still holds the
  session of their old value;
- `write_errors` (the policy's `stats()` counter, where it keeps one) and `truncated` (model calls
  cut at max_tokens while the turns wrote);
- `entries`, `chars`: memory volume at the period's end; `duplicates`: entries whose words are
  mostly another entry's (redundant).

Alarms (`ALARMS`), per user: the first period a rule holds over the periods so far. Thresholds were
set on the evidence benchmark's recorded arms (issue 56) before the measured run of
benchmarks/health_alarms.py, which gives each alarm's false-alarm rate on healthy writers and its
detection rate on planted broken ones (memloop/testing/broken_writers.py):
benchmarks/results/health_alarms.json. Alarm lines name counts, never a user's words.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from memloop.core.words import content_words
from memloop.environment.episode import TURNS_FILE, PeriodRecord, period_dir
from memloop.feedback.write_failures import holds, memory_entries

# name -> (what it means, threshold): fixed before the measured run (see the module docstring)
NOTHING_STORED = "nothing_stored"
ASSISTANT_WORDS = "assistant_words"
LABEL_REUSE = "label_reuse"
WRITE_ERRORS = "write_errors"
ALARMS: dict[str, tuple[str, float]] = {
    NOTHING_STORED: ("sessions in a row that revealed facts, none of them stored", 3),
    ASSISTANT_WORDS: ("share of a period's new entries in the assistant's words (2+ new)", 0.5),
    LABEL_REUSE: ("facts overwritten under a reused label, so far", 2),
    WRITE_ERRORS: ("failed or truncated writes, so far", 2),
}
DUPLICATE = 0.8  # an entry whose content words are this share of an earlier entry's: redundant


@dataclass
class PeriodHealth:
    """One user's memory health in one period (see the module docstring for each series)."""

    user_id: str
    period: int
    revealed: int = 0
    stored: int = 0
    added: int = 0
    assistant_added: int = 0
    collisions: int = 0
    updates_lost: int = 0
    write_errors: int = 0
    truncated: int = 0
    entries: int = 0
    chars: int = 0
    duplicates: int = 0
    unstored_sessions: list[bool] = field(default_factory=list)  # per session with facts

    @property
    def stored_share(self) -> float | None:
        return self.stored / self.revealed if self.revealed else None

    @property
    def assistant_share(self) -> float | None:
        return self.assistant_added / self.added if self.added else None


@dataclass(frozen=True)
class Alarm:
    name: str
    user_id: str
    period: int  # the first period the rule held
    value: float  # the series' value then

    def text(self) -> str:
        return f"{self.name} (period {self.period}: {self.value:g})"


def _stems(text: str) -> set[str]:
    return {w[:5] for w in content_words(text)}


def _label(line: str) -> str | None:
    return line.split(": ", 1)[0].strip() if ": " in line else None


def _value(line: str) -> str:
    return line.split(": ", 1)[1] if ": " in line else line.strip()


def _entry_lines(lines: list[str]) -> list[str]:
    """`lines` without a memory view's header line ("Memory (label: value):")."""
    return [x for x in lines if memory_entries(x)]


def _duplicates(entries: list[str]) -> int:
    seen: list[set[str]] = []
    count = 0
    for entry in entries:
        mine = _stems(entry)
        if mine and any(len(mine & other) >= DUPLICATE * len(mine) for other in seen):
            count += 1
        seen.append(mine)
    return count


def covers(entry: str, fact: set[str]) -> bool:
    """Whether `entry` holds a fact: two of its distinctive stems (one of a one-word fact)."""
    return bool(fact) and len(_stems(entry) & fact) >= min(2, len(fact))


def _distinct(records: list[PeriodRecord]) -> list[set[str]]:
    """Per session of `records` (in order): its user's stems no other session of them has.

    What a session says that no other does is its fact; the simulated user's phrases that recur
    ("quick question", "how should I plan around that") are no one fact's.
    """
    said = [
        _stems(" ".join(m["content"] for m in s.messages if m["role"] == "user"))
        for r in records
        for s in r.sessions
    ]
    out = []
    for i, mine in enumerate(said):
        others = set().union(*(x for j, x in enumerate(said) if j != i))
        out.append(mine - others)
    return out


def user_health(
    records: list[PeriodRecord], turns: list[dict[str, Any] | None]
) -> list[PeriodHealth]:
    """The health series of one user's period records (`turns`: each period's turns.json).

    Period p is computed from the periods up to p only, as it would be when p ends.
    """
    out: list[PeriodHealth] = []
    ordered = sorted(records, key=lambda r: r.period)
    errors_before = 0
    for k, (record, log) in enumerate(zip(ordered, turns, strict=True)):
        h = PeriodHealth(record.user_id, record.period)
        view = str(record.probes.get("memory_view") or _end_memory(log))
        memory = memory_entries(view)
        facts = _distinct(ordered[: k + 1])
        earlier = [
            (dict(s.exposed_states), facts[i])
            for i, s in enumerate(x for r in ordered[:k] for x in r.sessions)
        ]
        first = len(earlier)
        sessions_log = (log or {}).get("sessions", [])
        everything_said: set[str] = set()
        for r in ordered[: k + 1]:
            for s in r.sessions:
                everything_said |= _stems(
                    " ".join(m["content"] for m in s.messages if m["role"] == "user")
                )
        told = list(earlier)
        for index, session in enumerate(record.sessions):
            fact = facts[first + index]
            exposed = dict(session.exposed_states)
            if exposed:
                h.revealed += len(exposed)
                held = any(covers(e, fact) for e in memory)
                h.stored += len(exposed) if held else 0
                h.unstored_sessions.append(not held)
                for variable, value in exposed.items():
                    old = [f for e, f in told if e.get(variable) not in (None, value)]
                    if old and any(covers(e, old[-1]) for e in memory) and not held:
                        h.updates_lost += 1
            said = " ".join(m["content"] for m in session.messages if m["role"] == "assistant")
            theirs = _stems(said) - everything_said
            turn_list = sessions_log[index] if index < len(sessions_log) else []
            for turn in turn_list:
                added = _entry_lines(turn.get("added", []))
                removed = _entry_lines(turn.get("removed", []))
                for line in added:
                    h.added += 1
                    if holds(_value(line), theirs):
                        h.assistant_added += 1
                old_values = {_label(x): _value(x) for x in removed if _label(x)}
                for line in added:
                    label = _label(line)
                    if label in old_values:
                        h.collisions += _dropped(old_values[label], _value(line), told, exposed)
                h.truncated += sum(
                    1 for c in turn.get("calls", []) if c.get("finish_reason") == "length"
                )
            told.append((exposed, fact))
        errors = int(((log or {}).get("stats") or {}).get("write_errors", errors_before))
        h.write_errors, errors_before = max(0, errors - errors_before), errors
        h.entries = len(memory)
        h.chars = len(view)
        h.duplicates = _duplicates(memory)
        out.append(h)
    return out


def _dropped(
    old: str, new: str, told: list[tuple[dict[str, str], set[str]]], exposed: dict[str, str]
) -> int:
    """1 when `old` held an earlier session's fact that `new` drops (a label reused).

    Not when this session revealed that variable again: then the rewrite is an update.
    """
    for earlier, fact in told:
        if not earlier or set(earlier) & set(exposed):
            continue
        if covers(old, fact) and not covers(new, fact):
            return 1
    return 0


def _end_memory(log: dict[str, Any] | None) -> str:
    """The memory at the period's end from turns.json (where the probes recorded none)."""
    if not log:
        return ""
    lines = str(log.get("memory_before", "")).splitlines()
    for session in log.get("sessions", []):
        for turn in session:
            for line in turn.get("removed", []):
                if line in lines:
                    lines.remove(line)
            lines.extend(turn.get("added", []))
    return "\n".join(lines)


def alarms(series: list[PeriodHealth]) -> list[Alarm]:
    """The alarms one user's series trips: each alarm once, at the first period it holds."""
    fired: dict[str, Alarm] = {}
    run, collisions, errors = 0, 0, 0
    for h in series:
        user, p = h.user_id, h.period
        for unstored in h.unstored_sessions:
            run = run + 1 if unstored else 0
            if run >= ALARMS[NOTHING_STORED][1] and NOTHING_STORED not in fired:
                fired[NOTHING_STORED] = Alarm(NOTHING_STORED, user, p, run)
        share = h.assistant_share
        if h.added >= 2 and share is not None and share > ALARMS[ASSISTANT_WORDS][1]:
            fired.setdefault(ASSISTANT_WORDS, Alarm(ASSISTANT_WORDS, user, p, round(share, 3)))
        collisions += h.collisions
        if collisions >= ALARMS[LABEL_REUSE][1]:
            fired.setdefault(LABEL_REUSE, Alarm(LABEL_REUSE, user, p, collisions))
        errors += h.write_errors + h.truncated
        if errors >= ALARMS[WRITE_ERRORS][1]:
            fired.setdefault(WRITE_ERRORS, Alarm(WRITE_ERRORS, user, p, errors))
    return [fired[name] for name in ALARMS if name in fired]


def alarm_summary(alarms: dict[str, list[str]], users: str = "users") -> str:
    """`memory health: ...`: per alarm tripped, on how many of the users (names, no values)."""
    n = len(alarms)
    names = [name for name in ALARMS if any(name in found for found in alarms.values())]
    if not names:
        return f"memory health: no alarm on {n} {users}"
    parts = ", ".join(
        f"{name} on {sum(name in found for found in alarms.values())}/{n} {users}" for name in names
    )
    return f"memory health: ALARM {parts}"


def read_turns(user_dir: Path, periods: Iterable[int]) -> list[dict[str, Any] | None]:
    """Each period's turns.json under a user's folder (None where there is none)."""
    out: list[dict[str, Any] | None] = []
    for p in periods:
        path = period_dir(user_dir, p) / TURNS_FILE
        out.append(json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None)
    return out


@dataclass
class Health:
    """A set of users' health: each user's series and alarms."""

    series: dict[str, list[PeriodHealth]]
    fired: dict[str, list[Alarm]]

    @property
    def users(self) -> int:
        return len(self.series)

    def tripped(self, name: str) -> list[str]:
        return [u for u, found in self.fired.items() if any(a.name == name for a in found)]

    def line(self, users: str = "users") -> str:
        """One line for a command's output: the alarms and how many users tripped each."""
        return alarm_summary({u: [a.name for a in f] for u, f in self.fired.items()}, users)

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: users tripping each alarm, and each series' mean over user periods."""
        out: dict[str, float] = {f"health/{n}_users": len(self.tripped(n)) for n in ALARMS}
        rows = [h for s in self.series.values() for h in s]
        for name in ("stored_share", "assistant_share"):
            values = [v for h in rows if (v := getattr(h, name)) is not None]
            if values:
                out[f"health/{name}"] = sum(values) / len(values)
        for name in ("collisions", "updates_lost", "write_errors", "truncated", "duplicates"):
            out[f"health/{name}"] = float(sum(getattr(h, name) for h in rows))
        if rows:
            out["health/entries"] = sum(h.entries for h in rows) / len(rows)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "alarms": {n: self.tripped(n) for n in ALARMS},
            "fired": {u: [asdict(a) for a in f] for u, f in self.fired.items()},
            "series": {
                u: [
                    {
                        **asdict(h),
                        "stored_share": h.stored_share,
                        "assistant_share": h.assistant_share,
                    }
                    for h in s
                ]
                for u, s in self.series.items()
            },
        }


def health_of(episodes: Iterable[Any], run_dir: Path | None = None) -> Health:
    """The health of `episodes` (EpisodeResult); `run_dir`: their folder, for turns.json."""
    from memloop.core.files import safe_name

    series: dict[str, list[PeriodHealth]] = {}
    for e in episodes:
        records = sorted(e.records, key=lambda r: r.period)
        turns: list[dict[str, Any] | None] = [None] * len(records)
        if run_dir is not None:
            turns = read_turns(Path(run_dir) / safe_name(e.user_id), [r.period for r in records])
        series[e.user_id] = user_health(records, turns)
    return Health(series, {u: alarms(s) for u, s in series.items()})
