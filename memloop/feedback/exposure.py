"""What memory could hold at probe time: the revealed values handed to the memory writer by then.

A user reveals state values in the opening message of a session (`SessionLog.exposed_states`).
After each period the probe records how many of the messages the policy took in are still
unwritten (`Policy.unwritten_messages`: held raw in a buffer, not yet handed to the writer); every
earlier message has been handed to the writer. A revealed value is *writable* at a period's probe
when some session that revealed it had its opening message handed to the writer by then: a
perfect writer could have stored it. It is *raw only* when it was revealed but no revealing
session has been handed over yet: the state query, which reads written memory only, cannot know
it whatever the write prompt does.

Two numbers follow, both pure over the period records:
- `state_raw_only_share`: of the state pairs (question x required variable) scored, the share
  whose current value was raw only at probe time;
- `factual_recall_ceiling`: the factual recall a perfect writer would reach: of the claims
  factual recall judges (each revealed variable's latest revealed value, at the user's last
  period), the share that is writable.

Both are None when a period lacks the unwritten count (a record written before it was kept).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from memloop.environment.episode import PeriodRecord
from memloop.feedback.records import PeriodRecall, question_records

Pair = tuple[str, str]  # (variable, value)


def _by_user(period_records: Iterable[PeriodRecord]) -> dict[str, list[PeriodRecord]]:
    by_user: dict[str, list[PeriodRecord]] = defaultdict(list)
    for rec in period_records:
        by_user[rec.user_id].append(rec)
    return by_user


def _user_exposures(
    records: list[PeriodRecord],
) -> tuple[dict[int, set[Pair]], dict[int, set[Pair]], dict[int, dict[str, str]]] | None:
    """One user's records -> per period: revealed pairs, writable pairs, latest revealed values.

    Periods are taken in order from the first record; None when a record has no unwritten count.
    """
    starts: list[tuple[int, dict[str, str]]] = []  # (index of a session's first message, exposed)
    total = 0
    revealed: dict[int, set[Pair]] = {}
    writable: dict[int, set[Pair]] = {}
    latest: dict[int, dict[str, str]] = {}
    current: dict[str, str] = {}
    for rec in sorted(records, key=lambda r: r.period):
        for session in rec.sessions:
            starts.append((total, dict(session.exposed_states)))
            current.update(session.exposed_states)
            total += len(session.messages)
        unwritten = rec.probes.get("unwritten_messages")
        if not isinstance(unwritten, int) or isinstance(unwritten, bool) or unwritten < 0:
            return None
        written = total - unwritten  # messages handed to the writer by this probe
        revealed[rec.period] = {pair for _, exposed in starts for pair in exposed.items()}
        writable[rec.period] = {
            pair for start, exposed in starts if start < written for pair in exposed.items()
        }
        latest[rec.period] = dict(current)
    return revealed, writable, latest


def exposure_fields(
    period_records: Iterable[PeriodRecord], period: int | None = None
) -> dict[str, Any]:
    """`state_raw_only_share` (with its pair count) and `factual_recall_ceiling`.

    Over every period, or only `period` (judged with the history before it; later records are
    left out).
    """
    if period is not None:
        period_records = [r for r in period_records if r.period <= period]
    pairs = raw_only = claims = reachable = 0
    for records in _by_user(period_records).values():
        exposures = _user_exposures(records)
        if exposures is None:
            return {
                "state_raw_only_share": None,
                "state_raw_only_pairs": None,
                "factual_recall_ceiling": None,
            }
        revealed, writable, latest = exposures
        for rec in records:
            if period is not None and rec.period != period:
                continue
            for q in question_records(rec.probes):
                for variable in q.required_info:
                    pair = (variable, q.true_values[variable])
                    pairs += 1
                    if pair in revealed[q.period] and pair not in writable[q.period]:
                        raw_only += 1
        last = period if period is not None else max(latest)
        if last in latest:
            for variable, value in latest[last].items():
                claims += 1
                reachable += (variable, value) in writable[last]
    return {
        "state_raw_only_share": raw_only / pairs if pairs else None,
        "state_raw_only_pairs": raw_only,
        "factual_recall_ceiling": reachable / claims if claims else None,
    }


def cap_recalls(period_records: Iterable[PeriodRecord], recalls: list[PeriodRecall]) -> int:
    """Mark unsupported every claim memory could not hold; returns how many were marked.

    A claim whose value no session handed to the writer by that period's probe cannot be in
    written memory: a checker saying "supported" to it is wrong by construction. So factual
    recall never exceeds `factual_recall_ceiling`. Users whose records lack the unwritten count
    are left as judged.
    """
    writable = {}
    for uid, records in _by_user(period_records).items():
        exposures = _user_exposures(records)
        if exposures is not None:
            writable[uid] = exposures[1]
    capped = 0
    for recall in recalls:
        pairs = writable.get(recall.user_id, {}).get(recall.period)
        if pairs is None:
            continue
        for claim in recall.claims:
            if claim.supported and (claim.variable, claim.value) not in pairs:
                claim.supported = False
                capped += 1
    return capped
