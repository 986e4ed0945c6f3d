"""Named write failures: why each state variable the memory got wrong was wrong.

The objective an evolver serves is the state read (feedback/probes.py): per state variable, the
value the policy believes from its written memory against the true one. For every wrong pair
this module names the failure, from the period records alone (the sessions' messages, which
session revealed which variable, and the written memory at probe time):

- `misread`: an entry of the memory holds the user's own words about it; the reader still
  picked the wrong value;
- `assistant's words stored`: an entry holds words of the assistant's reply, not the user's;
- `update lost`: the variable changed and an entry still holds the user's words about the old
  value (the new one was never written over it);
- `overwritten (label collision)`: nothing holds it, while an entry holds the words of a fact
  revealed later and the memory has fewer entries than facts revealed (one label reused);
- `never written`: nothing in the memory holds the user's words about it;
- `not revealed`: no session of the conversation revealed the value (not a write failure).

"Holds the words of" is measured on content words (3 letters or more, not filler, compared by
their first 5 letters) that do not name the variable's kind (a topic label such as "fitness
goals" holds no fact): at least half of an entry's value words, and two of them (one for a
one-word value), come from the text. The tests
(tests/feedback/test_feedback_write_failures.py) compute each name on hand-made records.

`failure_block` groups the pairs by variable kind and by failure with counts: the block the
feedback summary shows (feedback/summary.py) in every mode that shows answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from memloop.core.words import content_words
from memloop.environment.data import UserItem
from memloop.environment.episode import PeriodRecord
from memloop.feedback.records import question_records, state_reads

MISREAD = "misread"
ASSISTANT_WORDS = "assistant's words stored"
UPDATE_LOST = "update lost"
COLLISION = "overwritten (label collision)"
NEVER_WRITTEN = "never written"
NOT_REVEALED = "not revealed"
FAILURES = (NEVER_WRITTEN, UPDATE_LOST, COLLISION, ASSISTANT_WORDS, MISREAD, NOT_REVEALED)
HOLDS = 0.5  # share of an entry's value words that come from a text for it to hold that text


@dataclass(frozen=True)
class StatePair:
    """One state variable read after one period: believed vs true, and why it is wrong."""

    user_id: str
    period: int
    variable: str
    believed: str | None
    true: str
    failure: str | None  # None: right


def memory_entries(view: str) -> list[str]:
    """The values of a memory view's entries (`label: value` lines; other lines whole)."""
    lines = [ln.strip() for ln in view.splitlines() if ln.strip()]
    if lines and lines[0].rstrip().endswith(":") and lines[0].lower().startswith("memory"):
        lines = lines[1:]
    return [ln.split(": ", 1)[1] if ": " in ln else ln for ln in lines]


def _stems(words: Iterable[str]) -> set[str]:
    return {w[:5] for w in words}


def holds(entry: str, source: set[str]) -> bool:
    """Whether HOLDS of `entry`'s content words, and two of them (one of one), are in `source`."""
    mine = _stems(content_words(entry))
    shared = len(mine & source)
    return bool(mine) and shared >= min(2, len(mine)) and shared >= HOLDS * len(mine)


def _said(records: list[PeriodRecord], upto: int) -> list[tuple[int, dict[str, str], str, str]]:
    """(order, exposed states, user words, assistant words) of every session up to `upto`."""
    out: list[tuple[int, dict[str, str], str, str]] = []
    for record in records:
        if record.period > upto:
            continue
        for s in record.sessions:
            user = " ".join(m["content"] for m in s.messages if m["role"] == "user")
            assistant = " ".join(m["content"] for m in s.messages if m["role"] == "assistant")
            out.append((len(out), dict(s.exposed_states), user, assistant))
    return out


def name_failure(
    variable: str, true: str, memory: list[str], sessions: list[tuple[int, dict, str, str]]
) -> str:
    """The failure of a wrong pair (see the module's docstring for each name)."""
    current = [s for s in sessions if s[1].get(variable) == true]
    if not current:
        return NOT_REVEALED
    kind = _stems(content_words(variable.replace("_", " ")))
    user = _stems(content_words(" ".join(s[2] for s in current))) - kind
    if any(holds(e, user) for e in memory):
        return MISREAD
    assistant = _stems(content_words(" ".join(s[3] for s in current))) - user
    if any(holds(e, assistant) for e in memory):
        return ASSISTANT_WORDS
    old = [s for s in sessions if variable in s[1] and s[1][variable] != true]
    if old:
        before = _stems(content_words(" ".join(s[2] for s in old))) - user - kind
        if any(holds(e, before) for e in memory):
            return UPDATE_LOST
    first = min(s[0] for s in current)
    later = [s for s in sessions if s[0] > first and variable not in s[1] and s[1]]
    revealed = {v for s in sessions for v in s[1]}
    if len(memory) < len(revealed):
        for s in later:
            theirs = _stems(content_words(s[2])) - user - kind
            if any(holds(e, theirs) for e in memory):
                return COLLISION
    return NEVER_WRITTEN


def _beliefs(record: PeriodRecord) -> dict[str, tuple[str | None, str]]:
    """{variable: (believed, true)} of one period's state reads (letters) or state query."""
    reads = state_reads(record.probes)
    if reads:
        return {r.variable: (r.picked, r.true_value) for r in reads}
    out: dict[str, tuple[str | None, str]] = {}
    for q in question_records(record.probes):
        for v in q.required_info:
            if q.state_answers or q.state_json_error is not None:
                out.setdefault(v, (q.state_answers.get(v), q.true_values[v]))
    return out


def state_pairs(records: list[PeriodRecord]) -> list[StatePair]:
    """Every state pair of one user's period records, each wrong one with its failure named."""
    pairs = []
    for record in sorted(records, key=lambda r: r.period):
        memory = memory_entries(str(record.probes.get("memory_view", "")))
        sessions = _said(records, record.period)
        for variable, (believed, true) in sorted(_beliefs(record).items()):
            failure = None
            if believed != true:
                failure = name_failure(variable, true, memory, sessions)
            pairs.append(
                StatePair(record.user_id, record.period, variable, believed, true, failure)
            )
    return pairs


def episode_pairs(items: list[UserItem], episodes: Iterable[Any]) -> list[StatePair]:
    """The state pairs of `episodes` (EpisodeResult) of the users in `items`."""
    ids = {item.id for item in items}
    return [p for e in episodes if e.user_id in ids for p in state_pairs(list(e.records))]


def failure_block(pairs: list[StatePair]) -> dict[str, Any]:
    """The feedback's view of `pairs`: counts by failure, and per variable kind its pairs."""
    wrong = [p for p in pairs if p.failure is not None]
    kinds: dict[str, dict[str, Any]] = {}
    for p in pairs:
        kind = kinds.setdefault(
            p.variable.replace("_", " "), {"right": 0, "wrong": 0, "failures": Counter()}
        )
        if p.failure is None:
            kind["right"] += 1
            continue
        kind["wrong"] += 1
        kind["failures"][p.failure] += 1
        kind.setdefault("believed_vs_true", []).append([p.believed, p.true])
    for kind in kinds.values():
        kind["failures"] = dict(kind["failures"].most_common())
    return {
        "state_pairs": len(pairs),
        "right": len(pairs) - len(wrong),
        "wrong_by_failure": failure_counts(pairs),
        "by_kind": dict(sorted(kinds.items(), key=lambda kv: (-kv[1]["wrong"], kv[0]))),
    }


def fit_block(block: dict[str, Any], max_chars: int) -> dict[str, Any] | None:
    """`block` within `max_chars` rendered characters, or None when not even its counts fit.

    Whole if it fits, else without the believed vs true values, else its counts only.
    """
    import json

    lean = {
        **block,
        "by_kind": {
            k: {x: y for x, y in v.items() if x != "believed_vs_true"}
            for k, v in block.get("by_kind", {}).items()
        },
    }
    counts = {k: v for k, v in block.items() if k != "by_kind"}
    for option in (block, lean, counts):
        if len(json.dumps(option, ensure_ascii=False, indent=1)) <= max_chars:
            return option
    return None


def block_values(block: dict[str, Any]) -> set[str]:
    """The users' values a `failure_block` shows (believed and true): private to them."""
    return {
        str(v)
        for kind in block.get("by_kind", {}).values()
        for pair in kind.get("believed_vs_true", [])
        for v in pair
        if v is not None
    }


def failure_counts(pairs: list[StatePair]) -> dict[str, int]:
    """{failure: wrong pairs} of `pairs` (only the failures that occur)."""
    found = Counter(p.failure for p in pairs if p.failure is not None)
    return {f: found[f] for f in FAILURES if found[f]}
