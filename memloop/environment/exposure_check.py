"""Automatic meta-evaluation of state exposure (the paper's human check, by a checker LLM).

For every session, a checker that sees only the opening utterance predicts the values of the
session's exposed variables; agreement = share of exposed values it recovers.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from memloop.environment.data import UserItem
from memloop.environment.llm_pipeline import prompts
from memloop.environment.llm_pipeline.step_utterances import check_schema, mismatches
from memloop.llm.client import ChatClient


@dataclass
class SessionCheck:
    user_id: str
    period: int
    session: int
    intended: dict[str, str]
    predicted: dict[str, str | None]
    json_error: str | None = None

    @property
    def agreed(self) -> int:
        return len(self.intended) - len(mismatches(self.intended, self.predicted))


@dataclass
class ExposureReport:
    sessions: list[SessionCheck] = field(default_factory=list)

    def rate(self, user_id: str | None = None) -> float | None:
        rows = [s for s in self.sessions if user_id is None or s.user_id == user_id]
        total = sum(len(s.intended) for s in rows)
        return None if total == 0 else sum(s.agreed for s in rows) / total


def check_session(client: ChatClient, item: UserItem, period: int, index: int) -> SessionCheck:
    session = item.periods[period].sessions[index]
    intended = dict(session.exposed_states)
    options = {v: item.state_schema[v] for v in intended}
    result = client.chat_json(
        prompts.exposure_check(session.query, options), check_schema(options), component="checker"
    )
    parsed = result.parsed if result.ok else {}
    return SessionCheck(
        item.id, period, index, intended, {v: parsed.get(v) for v in intended}, result.json_error
    )


def check_exposure(
    items: list[UserItem], client: ChatClient, *, parallel: int = 4, progress: bool = True
) -> ExposureReport:
    from tqdm import tqdm

    jobs = [
        (item, p, s)
        for item in items
        for p in range(item.num_periods)
        for s in range(len(item.periods[p].sessions))
        if item.periods[p].sessions[s].exposed_states
    ]
    report = ExposureReport()
    with (
        ThreadPoolExecutor(max_workers=parallel) as pool,
        tqdm(total=len(jobs), desc="sessions", disable=not progress) as bar,
    ):
        for check in pool.map(lambda job: check_session(client, *job), jobs):
            report.sessions.append(check)
            bar.update(1)
    return report
