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

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from memloop.core.files import json_sha256
from memloop.environment.data import UserItem
from memloop.environment.episode import run_episodes
from memloop.feedback.probes import StateProber
from memloop.feedback.records import QuestionRecord
from memloop.feedback.scoring import state_accuracy

if TYPE_CHECKING:
    from memloop.optimize.context import RunContext


@dataclass
class Screening:
    state_accuracy: float | None  # over every (question, variable) of the users, every period
    pairs: int
    tokens: int  # the model tokens the screening took (served from the cache or not)
    requests: int  # requests sent to the endpoint (0 on a rerun)


def replay_screen(
    ctx: RunContext,
    items: list[UserItem],
    prompts: dict[str, str],
    recording: Path,
    out: Path,
) -> Screening:
    """Screen `prompts` on `items`' conversations recorded under `recording` (an episodes folder).

    Checkpointed under `out/<candidate hash>`, so a rerun asks nothing again.
    """
    folder = Path(out) / json_sha256(prompts)[:12]
    episodes = run_episodes(
        items,
        ctx.factory(prompts),
        ctx.clients.agent,
        folder,
        probe=StateProber(),
        periods=ctx.config.environment.periods,
        max_users_in_parallel=ctx.config.parallel_users,
        replay_from=Path(recording),
        progress=False,
    )
    records = [
        QuestionRecord.model_validate(q)
        for e in episodes
        for r in e.records
        for q in (r.probes or {}).get("questions", [])
    ]
    accuracy = state_accuracy(records) if records else None
    tokens = sum(
        row.get("total_tokens", 0) for e in episodes for r in e.records for row in r.usage.values()
    )
    requests = sum((e.usage or {}).get("total", {}).get("calls", 0) for e in episodes)
    return Screening(
        state_accuracy=accuracy.accuracy if accuracy and accuracy.pairs else None,
        pairs=accuracy.pairs if accuracy else 0,
        tokens=tokens,
        requests=requests,
    )
