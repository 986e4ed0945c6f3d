"""Cheap candidate scoring by replay: a write prompt screened on recorded conversations.

A cycle's training users held their conversations once, on-policy (the cycle's `episodes/`). A
candidate prompt is screened by replaying them off-policy to a fresh policy with the candidate's
prompts: the policy ingests the recorded turns (its memory writes run as they would have), and
after each period only the state queries are asked (`feedback.probes.StateProber`). No
simulated user, no chat replies, no multiple-choice, upper-bound, no-memory or recall call. The
screening number is the state accuracy on those users.

It is a screen, not a result: the conversation was held under the prompts of the cycle, not the
candidate's (off-policy), and it uses training users only. Reported numbers stay on-policy, on
test users; selection stays on validation users.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memloop.environment.data import UserItem
from memloop.environment.episode import PolicyFactory, requests_sent, run_episodes
from memloop.feedback.probes import ProbeSettings, StateProber
from memloop.feedback.records import QuestionRecord, StateRead
from memloop.feedback.report import collect_reads, cost_by_component, usage_by_component
from memloop.feedback.scoring import state_accuracy
from memloop.llm.client import ChatClient


@dataclass
class Screening:
    state_accuracy: float | None  # over every (question, variable) of the users, every period
    pairs: int
    tokens: int  # the model tokens the screening took (served from the cache or not)
    requests: int  # requests sent to the endpoint (0 on a rerun)
    cost_usd: float | None = None  # dollars of those tokens; None: no call had a price
    by_user: dict[str, float | None] = field(default_factory=dict)  # each user's state accuracy
    # with the letter read: each user's state_prob (None: no probability), and the whole's
    prob_by_user: dict[str, float | None] = field(default_factory=dict)
    state_prob: float | None = None
    tokens_by_component: dict[str, int] = field(default_factory=dict)  # memory writes, reads


def replay_screen(
    items: list[UserItem],
    policy_factory: PolicyFactory,
    agent_client: ChatClient,
    recording: Path,
    out: Path,
    *,
    periods: int | None = None,
    parallel_users: int = 2,
    probes: ProbeSettings | None = None,
) -> Screening:
    """Screen the policies `policy_factory` builds on `items`' conversations under `recording`.

    `recording` is an episodes folder of an on-policy run of those users; the screening is
    checkpointed under `out`, so a rerun asks nothing again.
    """
    episodes = run_episodes(
        items,
        policy_factory,
        agent_client,
        Path(out),
        probe=StateProber(probes or ProbeSettings()),
        periods=periods,
        max_users_in_parallel=parallel_users,
        replay_from=Path(recording),
        progress=False,
    )
    by_user = {
        e.user_id: [
            QuestionRecord.model_validate(q)
            for r in e.records
            for q in (r.probes or {}).get("questions", [])
        ]
        for e in episodes
    }
    reads = {e.user_id: collect_reads(e.records) for e in episodes}
    accuracy = state_accuracy(
        [q for user in by_user.values() for q in user], [r for rs in reads.values() for r in rs]
    )
    records = [r for e in episodes for r in e.records]
    components = usage_by_component(records)
    tokens = sum(components.values())
    cost = cost_by_component(records)
    requests = requests_sent(episodes)
    return Screening(
        state_accuracy=accuracy.accuracy if accuracy.pairs else None,
        pairs=accuracy.pairs,
        tokens=tokens,
        requests=requests,
        cost_usd=sum(cost.values()) if cost else None,
        by_user={user: _accuracy(qs, reads[user]) for user, qs in by_user.items()},
        prob_by_user={user: state_accuracy(qs, reads[user]).prob for user, qs in by_user.items()},
        state_prob=accuracy.prob,
        tokens_by_component=components,
    )


def _accuracy(records: list[QuestionRecord], reads: list[StateRead]) -> float | None:
    """The state accuracy of `records` (or of their letter `reads`); None without a pair."""
    accuracy = state_accuracy(records, reads)
    return accuracy.accuracy if accuracy.pairs else None


ScreenTakes = Literal["improved", "explore"]


def screen_takes_field() -> Any:
    """The `screen_takes` setting of an evolver that screens candidates (`screen_options`)."""
    return Field(
        "explore",
        description="what the replay screen takes: only a candidate the gate calls improved, or "
        "also (explore) the best candidate above the current prompt that the gate does not call "
        "degraded; the step records which",
    )


def _by_user(result: Screening) -> dict[str, float]:
    """A screening's per-user scores: P(true value) with the letter read, else state accuracy."""
    scores = result.prob_by_user if result.state_prob is not None else result.by_user
    return {u: v for u, v in scores.items() if v is not None}


def _score(result: Screening) -> float | None:
    return result.state_prob if result.state_prob is not None else result.state_accuracy


@dataclass
class ScreenChoice:
    """What a replay screen of candidate prompts decided (`screen_options`)."""

    chosen: int | None  # the index of the option taken, or None
    note: str  # one line: the scores, the gate's verdict, what was taken
    tokens: int = 0
    cost_usd: float | None = None
    decision: dict | None = None  # the gate log entry (runs/gate_log.py), None without a gate
    scores: list[float | None] = field(default_factory=list)  # per option
    current: float | None = None  # the current prompt's score
    # successive halving: the options dropped at the first rung (screened on the first half of
    # the users only; `scores` then holds their score there) and the current prompt's on it
    halved: list[int] = field(default_factory=list)
    current_half: float | None = None


Screen = Callable[..., Screening]
"""A replay screen: `screen(prompts)` on every training user, `screen(prompts, users=n)` on the
first n of them (the same folders: a later screen on every user replays only the others)."""


def _mean_gain(result: Screening, current: dict[str, float]) -> float | None:
    """The mean paired difference of `result` over the current prompt on their common users."""
    mine = _by_user(result)
    common = [u for u in mine if u in current]
    return sum(mine[u] - current[u] for u in common) / len(common) if common else None


def first_rung(
    name: str,
    base: dict[str, str],
    options: list[str],
    screen: Screen,
    current: Screening,
    budget: int,
) -> tuple[list[int], dict[int, Screening], float | None]:
    """Successive halving's first rung: every option on the first half of the users.

    Returns the indices of the `budget` options with the largest mean paired gain over the
    current prompt there (ties: the earlier option), every option's screening on the half, and
    the current prompt's score on the half.
    """
    users = _by_user(current)
    half = len(users) // 2
    halves = {i: screen({**base, name: option}, users=half) for i, option in enumerate(options)}
    screened = {u for r in halves.values() for u in r.by_user}
    on_half = {u: v for u, v in users.items() if u in screened}
    gains = {i: _mean_gain(r, users) for i, r in halves.items()}
    ranked = sorted(halves, key=lambda i: (gains[i] is None, -(gains[i] or 0.0), i))
    now = sum(on_half.values()) / len(on_half) if on_half else None
    return sorted(ranked[:budget]), halves, now


def screen_options(
    name: str,
    base: dict[str, str],
    options: list[str],
    screen: Screen,
    *,
    cycle: int = 0,
    takes: str = "explore",
    budget: int | None = None,
) -> ScreenChoice:
    """Replay each option for predictor `name` and the current prompts; the gate decides.

    The score is the users' mean P(true value) with the letter read (`state_read: letters`),
    else their state accuracy. The option with the best score is tested against the current
    prompt by the gate (core/stats.py, per-user paired differences, level ALPHA / the number of
    options). It is taken when the gate says `improved`; with `takes="explore"` also when it
    scores above the current prompt and the gate does not say `degraded` (an exploration step,
    so noted).

    Successive halving: with more options than `budget` (and at least 4 users), every option
    is first screened on the first half of the users and only the `budget` with the largest
    mean gain there go on to every user. The gate still divides its level by the number of
    options proposed, not of those left: the union bound over every option holds whatever
    chose the survivors, so the screen's false-accept rate stays at most ALPHA.
    """
    from memloop.core.stats import Verdict, gate_of
    from memloop.core.tables import format_number
    from memloop.llm.usage import add_costs
    from memloop.runs import gate_log

    if not options:
        return ScreenChoice(None, "")
    current = screen(base)
    tokens, cost = current.tokens, current.cost_usd
    out = ScreenChoice(None, "", 0, None, None, [], _score(current))
    going_on = list(range(len(options)))
    results: dict[int, Screening] = {}
    rung = ""
    if budget is not None and len(options) > budget and len(_by_user(current)) >= 4:
        going_on, halves, out.current_half = first_rung(
            name, base, options, screen, current, budget
        )
        for result in halves.values():
            tokens += result.tokens
            cost = add_costs(cost, result.cost_usd)
        out.halved = [i for i in halves if i not in going_on]
        results.update({i: halves[i] for i in out.halved})
        rung = (
            f"first rung on {len(_by_user(current)) // 2} users: "
            f"{len(going_on)} of {len(options)} candidates go on; "
        )
    for i in going_on:
        result = screen({**base, name: options[i]})
        tokens += result.tokens
        cost = add_costs(cost, result.cost_usd)
        results[i] = result
    out.tokens, out.cost_usd = tokens, cost
    out.scores = [_score(results[i]) for i in range(len(options))]
    now = out.current
    shown = ", ".join(
        format_number(out.scores[i]) + ("*" if i in out.halved else "") for i in range(len(options))
    )
    if out.halved:
        shown += " (*: half the users)"
    said_now = format_number(now)
    defined = [i for i in going_on if out.scores[i] is not None]
    if not defined or now is None:
        out.chosen = going_on[0]
        out.note = f"{rung}replay screen undefined ({shown} vs {said_now}); took the first"
        return out
    best = max(defined, key=lambda i: out.scores[i])  # type: ignore[arg-type,return-value]
    decision = gate_of(_by_user(results[best]), _by_user(current), comparisons=len(options))
    mine = set(_by_user(results[best])) & set(_by_user(current))
    out.decision = gate_log.entry(
        "screen",
        f"cycle {cycle} {name}: best of {len(options)} candidates vs current",
        sorted(mine),
        decision.to_dict(),
    )
    said = f"{rung}replay screen {shown} vs current {said_now}: gate {decision.verdict.value}"
    if decision.verdict is Verdict.IMPROVED:
        out.chosen, out.note = best, f"{said}; taken (improved)"
    elif (
        takes == "explore" and decision.verdict is not Verdict.DEGRADED and out.scores[best] > now  # type: ignore[operator]
    ):
        out.chosen, out.note = best, f"{said}; taken as an exploration step (not shown better)"
    else:
        out.note = f"{said}; no candidate taken"
    return out
