"""Run an evaluation: on-policy episodes with the probes after every period, then scores.

After the episodes come the checker's calibration (feedback.calibration: on known-truth claims
built from the evaluated users, or from the run's users when the settings name them, so every
evaluation of a run asks the same requests; a checker failing it nulls factual recall), the
scores, diagnosis, factual recall and the output files. The policy is passed in as a factory, so
this module never depends on a policy implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from memloop.environment.data import UserItem
from memloop.environment.episode import (
    EpisodeResult,
    PolicyFactory,
    requests_sent,
    run_episodes,
)
from memloop.environment.simulator import SimulatorConfig
from memloop.feedback.calibration import checker_calibration
from memloop.feedback.health import Health, health_of
from memloop.feedback.probes import Prober, ProbeSettings
from memloop.feedback.report import write_outputs
from memloop.llm.client import ChatClient
from memloop.llm.roles import RoleClients
from memloop.llm.usage import UsageTracker


@dataclass
class EvaluationResult:
    metrics: dict[str, Any]
    episodes: list[EpisodeResult]
    calibration_requests: int = 0  # requests the checker calibration sent (counted once)
    episodes_dir: Path | None = None  # where their period folders are (turns.json)

    @cached_property
    def health(self) -> Health:
        """The users' memory-health series and alarms (feedback/health.py)."""
        return health_of(self.episodes, self.episodes_dir)

    @property
    def new_requests(self) -> int:
        """Model requests this run sent (0 when everything was resumed or cached)."""
        return requests_sent(self.episodes) + self.calibration_requests


def calibrate(
    items: list[UserItem], checker: ChatClient | None
) -> tuple[dict[str, Any] | None, int]:
    """(the checker's `checker_calibration` on these users' state schemas, requests it sent)."""
    usage = UsageTracker()
    calibration = checker_calibration(items, checker, usage=usage)
    return calibration, int(usage.summary()["total"]["calls"])


@dataclass(frozen=True)
class EvaluationSettings:
    """How an evaluation runs, whoever it evaluates: the same for every evaluation of a run.

    - `sim_config`: the user simulator's rounds (None: its defaults);
    - `periods`: the periods of each user's episode (None: all of them);
    - `max_users_in_parallel`: users whose episodes run at the same time;
    - `progress`: progress bars on the terminal;
    - `plot`: per_period.png beside metrics.json (report.write_outputs);
    - `probes`: how the probes read the answers (None: the default JSON read);
    - `calibration_users`: the users whose state schemas the checker's calibration documents are
      built from (None: the evaluated users). An evolve or tune run names all its users: every
      evaluation of the run (each split, cycle, screen and trial) then asks the checker the same
      four requests, answered by the response cache after the first, and its factual recall is
      gated by one calibration.
    """

    sim_config: SimulatorConfig | None = None
    periods: int | None = None
    max_users_in_parallel: int = 2
    progress: bool = True
    plot: bool = True
    probes: ProbeSettings | None = None
    calibration_users: tuple[UserItem, ...] | None = None


def run_evaluation(
    items: list[UserItem],
    policy_factory: PolicyFactory,
    out_dir: Path,
    *,
    clients: RoleClients,
    settings: EvaluationSettings | None = None,
    replay_from: Path | None = None,
    extra: dict[str, Any] | None = None,
    label: str | None = None,
    group: str | None = None,
) -> EvaluationResult:
    """Episodes under `out_dir/episodes`; metrics.json, records.jsonl, per_period.png in `out_dir`.

    A rerun resumes finished periods from their checkpoints (no model calls). `replay_from`: the
    recorded conversations to replay instead of simulating; `extra`: more keys for metrics.json;
    `label` and `group` (the users' split) name the progress bars.
    """
    out_dir = Path(out_dir)
    s = settings or EvaluationSettings()
    groups = {item.id: group for item in items} if group else None
    episodes, calibration, sent = _run(
        items, policy_factory, out_dir, clients, s, label, groups, replay_from
    )
    period_records = [r for e in episodes for r in e.records]
    metrics = write_outputs(out_dir, period_records, extra, calibration, plot=s.plot)
    return EvaluationResult(metrics, episodes, sent, out_dir / "episodes")


def run_evaluation_groups(
    groups: dict[str, list[UserItem]],
    policy_factory: PolicyFactory,
    out_dir: Path,
    *,
    clients: RoleClients,
    settings: EvaluationSettings | None = None,
    label: str | None = None,
) -> dict[str, EvaluationResult]:
    """Several groups of users (e.g. training and held-out users) under one policy in one pass.

    Users of different groups therefore run concurrently: episodes under `out_dir/episodes`,
    each non-empty group's metrics.json / records.jsonl / per_period.png in `out_dir/<group>`.
    The progress bars are named by `label` and show each group's users.
    """
    out_dir = Path(out_dir)
    everyone = [item for items in groups.values() for item in items]
    if len({item.id for item in everyone}) != len(everyone):
        raise ValueError("a user appears in more than one group (or twice in one)")
    s = settings or EvaluationSettings()
    by_group = {item.id: name for name, items in groups.items() for item in items}
    # one calibration for every group (on all their users), its requests counted in the first
    episodes, calibration, sent = _run(
        everyone, policy_factory, out_dir, clients, s, label, by_group
    )
    by_user = {e.user_id: e for e in episodes}
    results: dict[str, EvaluationResult] = {}
    for name, items in groups.items():
        if items:
            mine = [by_user[item.id] for item in items]
            records = [r for e in mine for r in e.records]
            metrics = write_outputs(out_dir / name, records, calibration=calibration, plot=s.plot)
            results[name] = EvaluationResult(
                metrics, mine, 0 if results else sent, out_dir / "episodes"
            )
    return results


def _run(
    items: list[UserItem],
    policy_factory: PolicyFactory,
    out_dir: Path,
    clients: RoleClients,
    s: EvaluationSettings,
    label: str | None,
    groups: dict[str, str] | None,
    replay_from: Path | None = None,
) -> tuple[list[EpisodeResult], dict[str, Any] | None, int]:
    """Run `items`' episodes under out_dir/episodes and calibrate the checker.

    The calibration is built from all of `items` (from the settings' `calibration_users` when it
    names them). Returns (episodes, the calibration, the requests the calibration sent).
    """
    prober = Prober(clients.agent, clients.checker, s.probes or ProbeSettings())
    episodes = run_episodes(
        items,
        policy_factory,
        clients.agent,
        out_dir / "episodes",
        sim_client=clients.user_sim,
        sim_config=s.sim_config,
        probe=prober,
        periods=s.periods,
        max_users_in_parallel=s.max_users_in_parallel,
        replay_from=replay_from,
        progress=s.progress,
        label=label,
        groups=groups,
    )
    calibration, sent = calibrate(list(s.calibration_users or items), prober.checker_client)
    return episodes, calibration, sent
