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

from dataclasses import dataclass, field
from pathlib import Path

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
