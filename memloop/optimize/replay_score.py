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
from memloop.feedback.records import QuestionRecord
from memloop.feedback.report import cost_by_component, usage_by_component
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
    accuracy = state_accuracy([q for user in by_user.values() for q in user])
    records = [r for e in episodes for r in e.records]
    tokens = sum(usage_by_component(records).values())
    cost = cost_by_component(records)
    requests = requests_sent(episodes)
    return Screening(
        state_accuracy=accuracy.accuracy if accuracy.pairs else None,
        pairs=accuracy.pairs,
        tokens=tokens,
        requests=requests,
        cost_usd=sum(cost.values()) if cost else None,
        by_user={user: _accuracy(questions) for user, questions in by_user.items()},
    )


def _accuracy(records: list[QuestionRecord]) -> float | None:
    """The state accuracy of `records`; None without a (question, variable) pair."""
    accuracy = state_accuracy(records)
    return accuracy.accuracy if accuracy.pairs else None
