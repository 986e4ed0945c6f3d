"""The episode runner: drives a policy through every period of a user item.

Runs on-policy (with the user simulator) or off-policy (replaying a recorded conversation), with
per-period checkpoints so a killed run resumes at its last finished period.

Layout of a run folder, per user:
    <out>/<user_id>/period_00/record.json   conversation, probe results, usage (written last)
    <out>/<user_id>/period_00/turns.json    per turn: the messages the writer took, memory lines
                                            added and removed, the model calls it made (agent,
                                            writer, user simulator); the probes' calls (read by
                                            runs/traces.py)
    <out>/<user_id>/period_00/policy/       the policy's state at the end of the period
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, safe_name
from memloop.core.tables import printable
from memloop.environment.data import UserItem
from memloop.environment.policy import Policy
from memloop.environment.policy_guard import guarded
from memloop.environment.simulator import UserSimulator, opening_message
from memloop.llm.calls import recorded_calls
from memloop.llm.client import ChatClient
from memloop.llm.usage import UsageRows, UsageTracker, usage_delta

RECORD_VERSION = 1
TURNS_FILE = "turns.json"  # per period: what each turn handed to memory (TurnLog)


class SessionLog(BaseModel):
    session_index: int
    session_time: str
    exposed_states: dict[str, str]
    messages: list[dict[str, str]]
    leaked_variables: list[str] = Field(default_factory=list)


class TurnLog:
    """What memory did at each turn of a period, seen through the Policy contract alone.

    After every turn: how many messages the policy handed to its memory (`unwritten_messages()`
    fell by them), how many it still holds unwritten, and the lines of `memory_view()` added and
    removed. Any policy, a plug-in's
    included, is logged the same way; the file is what a trace shows (runs/traces.py). A policy
    with a `stats()` method (counters: writes, write errors) has them saved with the period
    (feedback/health.py reads the write errors).
    """

    def __init__(self, policy: Policy):
        self.policy = policy
        self.memory = policy.memory_view()
        self.unwritten = policy.unwritten_messages()
        self.start = self.memory
        self.sessions: list[list[dict[str, Any]]] = []

    def session(self) -> None:
        self.sessions.append([])

    def turn(self, user: str, assistant: str, calls: list[dict[str, Any]] | None = None) -> None:
        """Log the turn just taken; `calls`: the model calls it made (llm/calls.py)."""
        memory, unwritten = self.policy.memory_view(), self.policy.unwritten_messages()
        added, removed = line_changes(self.memory, memory)
        entry: dict[str, Any] = {
            "user": user,
            "assistant": assistant,
            "written": max(0, self.unwritten + 2 - unwritten),
            "unwritten": unwritten,
        }
        if added or removed:
            entry.update(added=added, removed=removed)
        if calls:
            entry["calls"] = calls
        self.memory, self.unwritten = memory, unwritten
        self.sessions[-1].append(entry)

    def dump(self, probe_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"memory_before": self.start, "sessions": self.sessions}
        stats = getattr(self.policy, "stats", None)  # optional: the writer's counters
        if callable(stats):
            out["stats"] = stats()
        if probe_calls:
            out["probe_calls"] = probe_calls
        return out


def line_changes(before: str, after: str) -> tuple[list[str], list[str]]:
    """(lines added, lines removed) from `before` to `after`, in their order.

    Each line counts as often as it occurs: "a", "b" before and "b", "c", "c" after give
    (["c", "c"], ["a"]).
    """
    old, new = before.splitlines(), after.splitlines()
    return _beyond(new, Counter(new) - Counter(old)), _beyond(old, Counter(old) - Counter(new))


def _beyond(lines: list[str], extra: Counter[str]) -> list[str]:
    out = []
    for line in lines:
        if extra[line] > 0:
            extra[line] -= 1
            out.append(line)
    return out


class PeriodRecord(BaseModel):
    """Everything that happened to one user in one period; the unit of checkpointing."""

    version: int = RECORD_VERSION
    user_id: str
    period: int
    mode: str  # "on_policy" | "off_policy"
    sessions: list[SessionLog]
    probes: dict[str, Any] = Field(default_factory=dict)  # filled by the probe hook
    usage: UsageRows = Field(default_factory=dict)  # this period only
    seconds: float = 0.0


# (item, period, policy, record) -> probe results stored in record.probes
ProbeHook = Callable[[UserItem, int, Policy, PeriodRecord], dict[str, Any]]
# (user_id, workdir, client) -> a fresh policy for that user
PolicyFactory = Callable[[str, Path, ChatClient], Policy]


@dataclass
class EpisodeResult:
    user_id: str
    records: list[PeriodRecord]
    resumed_from: int  # periods found finished on disk (0 = fresh start)
    usage: UsageRows | None = None  # this run's calls (not the resumed ones)


def requests_sent(episodes: list[EpisodeResult]) -> int:
    """Model requests these episodes sent in this run (0 when resumed or served from the cache)."""
    return sum(int((e.usage or {}).get("total", {}).get("calls", 0)) for e in episodes)


def period_dir(user_dir: Path, period: int) -> Path:
    return user_dir / f"period_{period:02d}"


def _periods_of(item: UserItem, periods: int | None) -> int:
    return min(periods or item.num_periods, item.num_periods)


def load_record(path: Path) -> PeriodRecord:
    return PeriodRecord.model_validate_json(path.read_text(encoding="utf-8"))


def _redo(folder: Path) -> str:
    """What to do about a damaged checkpoint in the period folder `folder`."""
    return (
        f"delete {folder.name} and the later period folders beside it to redo from there, or "
        "start over (memloop eval --force)"
    )


def _reason(exc: Exception) -> str:
    if isinstance(exc, ValidationError) and exc.errors():
        return exc.errors()[0]["msg"]
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def read_checkpoint(path: Path) -> PeriodRecord:
    """The period record at `path`; a damaged one is one line naming it and what to delete."""
    try:
        return load_record(path)
    except (OSError, ValueError) as exc:  # ValidationError and UnicodeDecodeError included
        raise UserError(
            f"{path}: damaged checkpoint ({_reason(exc)}); {_redo(path.parent)}"
        ) from None


def restore_policy(policy: Policy, directory: Path) -> None:
    """Load the policy state saved in `directory` (a period folder's `policy/`) into `policy`.

    A damaged state is one line naming it and what to delete.
    """
    try:
        policy.load(directory)
    except UserError as exc:  # names its file already
        raise UserError(f"{exc}; {_redo(directory.parent)}") from None
    except (OSError, ValueError) as exc:
        raise UserError(
            f"{directory}: damaged policy checkpoint ({_reason(exc)}); {_redo(directory.parent)}"
        ) from None


def finished_records(user_dir: Path, limit: int) -> list[PeriodRecord]:
    """The contiguous run of finished periods from period 0 (record.json is written last)."""
    records = []
    for p in range(limit):
        path = period_dir(user_dir, p) / "record.json"
        if not path.is_file():
            break
        records.append(read_checkpoint(path))
    return records


class EpisodeRunner:
    """Runs one user's episode.

    `simulator` is needed on-policy; `replay` (period -> sessions of recorded messages) selects
    off-policy mode.
    """

    def __init__(
        self,
        item: UserItem,
        policy: Policy,
        user_dir: Path,
        *,
        simulator: UserSimulator | None = None,
        probe: ProbeHook | None = None,
        usage: UsageTracker | None = None,
        periods: int | None = None,
        replay: dict[int, list[list[dict[str, str]]]] | None = None,
        on_period: Callable[[int], None] | None = None,
    ):
        if simulator is None and replay is None:
            raise ValueError("on-policy episodes need a simulator; off-policy ones a replay")
        self.item = item
        self.policy = guarded(policy, item.id)  # each return checked: a plug-in's bug is named
        self.user_dir = Path(user_dir)
        self.simulator = simulator
        self.probe = probe
        self.usage = usage
        self.replay = replay
        self.n_periods = _periods_of(item, periods)
        self.on_period = on_period
        self._restore_from: Path | None = None  # policy state to load before the next run period

    def advance(self, p: int, prompts: dict[str, str] | None = None) -> PeriodRecord:
        """Run period `p` alone (lockstep use; periods must be advanced in order).

        A finished period is read from disk, otherwise the policy state of period p-1 is restored if
        needed, switched to `prompts` keeping its memory, and period p is run.
        """
        path = period_dir(self.user_dir, p) / "record.json"
        if path.is_file():
            self._restore_from = period_dir(self.user_dir, p) / "policy"
            return read_checkpoint(path)
        if self._restore_from is not None:
            self.policy.period = p - 1  # the period whose saved state is loaded
            restore_policy(self.policy, self._restore_from)
            self._restore_from = None
        self.policy.period = p
        if prompts is not None and prompts != self.policy.prompts():
            old, self.policy = self.policy, self.policy.with_prompts(prompts, keep_memory=True)
            old.close()
        record = self._run_period(p)
        if self.on_period:
            self.on_period(p)
        return record

    def run(self) -> EpisodeResult:
        records = finished_records(self.user_dir, self.n_periods)
        resumed = len(records)
        if resumed:
            self.policy.period = resumed - 1  # the period whose saved state is loaded
            restore_policy(self.policy, period_dir(self.user_dir, resumed - 1) / "policy")
        for p in range(resumed, self.n_periods):
            records.append(self._run_period(p))
            if self.on_period:
                self.on_period(p)
        return EpisodeResult(self.item.id, records, resumed)

    def _run_period(self, p: int) -> PeriodRecord:
        self.policy.period = p
        started = time.perf_counter()
        before = self.usage.summary() if self.usage else {}
        turns = TurnLog(self.policy)
        if self.replay is not None:
            sessions = self._replay_period(p, turns)
            mode = "off_policy"
        else:
            sessions = self._interact_period(p, turns)
            mode = "on_policy"
        record = PeriodRecord(user_id=self.item.id, period=p, mode=mode, sessions=sessions)
        out = period_dir(self.user_dir, p)
        self.policy.save(out / "policy")
        with recorded_calls() as probe_calls:
            if self.probe is not None:
                record.probes = self.probe(self.item, p, self.policy, record)
        atomic_write_json(out / TURNS_FILE, turns.dump(probe_calls))
        if self.usage:
            record.usage = usage_delta(before, self.usage.summary())
            record.usage.pop("total", None)
        record.seconds = round(time.perf_counter() - started, 3)
        atomic_write_json(out / "record.json", record.model_dump(mode="json"))
        return record

    def _interact_period(self, p: int, turns: TurnLog) -> list[SessionLog]:
        assert self.simulator is not None
        logs = []
        period = self.item.periods[p]
        for s, session in enumerate(period.sessions):
            turns.session()
            messages: list[dict[str, str]] = []
            leaked: list[str] = []
            user_msg = opening_message(session)
            for r in range(self.simulator.rounds(p)):
                with recorded_calls() as calls:
                    reply = self.policy.respond(user_msg)
                turns.turn(user_msg, reply, calls)
                messages.append({"role": "user", "content": user_msg})
                messages.append({"role": "assistant", "content": reply})
                if r < self.simulator.rounds(p) - 1:
                    with recorded_calls() as calls:  # the user simulator's next message
                        follow = self.simulator.follow_up(self.item, p, session, messages)
                    if calls:
                        turns.sessions[-1][-1].setdefault("calls", []).extend(calls)
                    leaked.extend(v for v in follow.leaked_variables if v not in leaked)
                    user_msg = follow.text
            logs.append(
                SessionLog(
                    session_index=s,
                    session_time=session.session_time,
                    exposed_states=dict(session.exposed_states),
                    messages=messages,
                    leaked_variables=leaked,
                )
            )
        return logs

    def _replay_period(self, p: int, turns: TurnLog) -> list[SessionLog]:
        assert self.replay is not None
        period = self.item.periods[p]
        recorded = self.replay.get(p)
        if recorded is None:
            raise ValueError(f"the recording has no period {p} for user {self.item.id}")
        logs = []
        for s, messages in enumerate(recorded):
            roles = [m["role"] for m in messages]
            if roles != ["user", "assistant"] * (len(messages) // 2) or len(messages) % 2:
                raise ValueError(
                    f"recorded session {s} of period {p} (user {self.item.id}) "
                    "must alternate user/assistant messages"
                )
            turns.session()
            for i in range(0, len(messages), 2):
                with recorded_calls() as calls:
                    self.policy.ingest(messages[i]["content"], messages[i + 1]["content"])
                turns.turn(messages[i]["content"], messages[i + 1]["content"], calls)
            session = period.sessions[s] if s < len(period.sessions) else None
            logs.append(
                SessionLog(
                    session_index=s,
                    session_time=session.session_time if session else "",
                    exposed_states=dict(session.exposed_states) if session else {},
                    messages=[dict(m) for m in messages],
                )
            )
        return logs


def load_replay(run_dir: Path, user_id: str) -> dict[int, list[list[dict[str, str]]]]:
    """The recorded conversation of `user_id` in an earlier run folder, for off-policy replay."""
    user_dir = Path(run_dir) / safe_name(user_id)
    replay = {}
    for path in sorted(user_dir.glob("period_*/record.json")):
        record = load_record(path)
        replay[record.period] = [log.messages for log in record.sessions]
    if not replay:
        raise UserError(f"{user_dir}: no recorded periods to replay (run an on-policy eval first)")
    return replay


class EpisodeProgress:
    """run_episodes' bars: users done per group (a split), periods done with the model calls.

    Each bar is named `label · <group> users` / `label · periods` (e.g. "complete/playbook
    cycle 2 · val users"). The periods bar's postfix `calls=N` (`cached=M`: answers from the
    response cache) is refreshed by a timer twice a second, from the users' usage trackers,
    never from a model call: counting costs the calls nothing. Disabled, it draws nothing and
    starts no thread.

    When stderr is not a terminal (a log file, a pipe), there are no bars: each finished user is
    one plain line with the users and periods done, the time elapsed and the time left (from the
    periods run in this process; periods resumed from checkpoints took no time and are left out
    of the rate).
    """

    TICK_S = 0.5

    def __init__(
        self,
        items: list[UserItem],
        total_periods: int,
        *,
        enabled: bool,
        label: str | None = None,
        groups: dict[str, str] | None = None,
    ) -> None:
        import threading

        from tqdm import tqdm

        self.enabled = enabled
        self.plain = enabled and not on_terminal()  # lines, not bars
        drawn = enabled and not self.plain
        self.groups = groups or {}
        prefix = f"{printable(label)} · " if label else ""  # a policy's or condition's name
        names = list(dict.fromkeys(self.groups.get(it.id, "") for it in items)) or [""]
        # a disabled tqdm keeps no description: the plain lines read these
        self._desc = {
            name: f"{prefix}{printable(name)} users" if name else f"{prefix}users" for name in names
        }
        self._totals = {
            name: sum(1 for it in items if self.groups.get(it.id, "") == name) for name in names
        }
        self.user_bars = {
            name: tqdm(
                total=self._totals[name],
                desc=self._desc[name],
                unit="user",
                disable=not drawn,
                position=i,
            )
            for i, name in enumerate(names)
        }
        self.periods = tqdm(
            total=total_periods,
            desc=f"{prefix}periods",
            unit="period",
            disable=not drawn,
            position=len(names),
        )
        self._began = time.monotonic()
        self._total_periods = total_periods
        self._counts = {name: 0 for name in names}  # users done per group
        self._periods = [0, 0]  # periods done, of which resumed from checkpoints
        self._lock = threading.Lock()
        self._running: list[UsageTracker] = []
        self._done = [0, 0]  # calls sent, answers from the cache, of the users finished
        self._shown = ""
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if drawn:
            self._timer = threading.Thread(target=self._tick, daemon=True)
            self._timer.start()

    def started(self, usage: UsageTracker) -> None:
        with self._lock:
            self._running.append(usage)

    def stopped(self, usage: UsageTracker) -> None:
        """A user's episode ended (finished or not): its calls are final."""
        total = usage.summary()["total"]
        with self._lock:
            self._running.remove(usage)
            self._done[0] += int(total["calls"])
            self._done[1] += int(total["cached_calls"])

    def user_done(self, user_id: str) -> None:
        name = self.groups.get(user_id, "")
        self.user_bars[name].update(1)
        if self.plain:
            with self._lock:
                self._counts[name] += 1
                line = self._line(name)
            print(f"{line} · {self._calls()}", file=sys.stderr, flush=True)

    def period_done(self, n: int = 1, *, resumed: bool = False) -> None:
        """`n` periods finished; `resumed`: read back from checkpoints, run earlier."""
        self.periods.update(n)
        with self._lock:
            self._periods[0] += n
            self._periods[1] += n if resumed else 0

    def _line(self, name: str) -> str:
        """A finished user's plain line: users and periods done, time elapsed and left."""
        done, resumed = self._periods
        elapsed = time.monotonic() - self._began
        total, ran = self._total_periods, done - resumed
        left = ""
        if ran and done < total:  # the rate of the periods run here, over the ones to come
            left = f", ~{_duration(elapsed / ran * (total - done))} left"
        return (
            f"{self._desc[name]}: {self._counts[name]}/{self._totals[name]} done · "
            f"periods {done}/{total} · {_duration(elapsed)} elapsed{left}"
        )

    def _calls(self) -> str:
        """`calls=N cached=M`: the model calls so far, of the users done and under way."""
        with self._lock:
            running = list(self._running)
            sent, cached = self._done
        for usage in running:  # the users under way: at most the parallel users
            total = usage.summary()["total"]
            sent, cached = sent + int(total["calls"]), cached + int(total["cached_calls"])
        return f"calls={sent}" + (f" cached={cached}" if cached else "")

    def _show(self) -> None:
        text = self._calls()
        if text != self._shown:
            self._shown = text
            self.periods.set_postfix_str(text, refresh=True)

    def _tick(self) -> None:
        while not self._stop.wait(self.TICK_S):
            self._show()

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()
            self._show()  # the final count
        self.periods.close()
        for bar in self.user_bars.values():
            bar.close()


def resumed_line(episodes: list[EpisodeResult]) -> str | None:
    """What a rerun found done, as a line (None when every user started afresh)."""
    found = [e.resumed_from for e in episodes if e.resumed_from]
    if not found:
        return None
    return (
        f"resumed from checkpoints: {sum(found)} period(s) of {len(found)} of "
        f"{len(episodes)} user(s) were done before this run, and were not run again"
    )


def on_terminal() -> bool:
    """Whether stderr, where progress goes, is a terminal (bars) or a file or pipe (lines)."""
    return sys.stderr.isatty()


def _duration(seconds: float) -> str:
    """`42 s`, `3 min 05 s`, `1 h 02 min`."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def run_episodes(
    items: list[UserItem],
    policy_factory: PolicyFactory,
    agent_client: ChatClient,
    out_dir: Path,
    *,
    sim_client: ChatClient | None = None,
    sim_config: Any = None,
    probe: ProbeHook | None = None,
    periods: int | None = None,
    max_users_in_parallel: int = 2,
    replay_from: Path | None = None,
    progress: bool = True,
    label: str | None = None,
    groups: dict[str, str] | None = None,
) -> list[EpisodeResult]:
    """Run every user's episode, users concurrently up to a bound.

    Progress bars (`EpisodeProgress`, named by `label` and each user's group in `groups`, e.g.
    its split) show users and periods done and the model calls. Each user gets its own policy
    and token counters; the endpoints, cache and concurrency bounds are shared.
    """
    out_dir = Path(out_dir)
    # every checkpoint is read before any user starts: a damaged one stops the run before work
    already = {
        it.id: len(finished_records(out_dir / safe_name(it.id), _periods_of(it, periods)))
        for it in items
    }
    total_periods = sum(_periods_of(it, periods) for it in items)
    bars = EpisodeProgress(items, total_periods, enabled=progress, label=label, groups=groups)

    def one(item: UserItem) -> EpisodeResult:
        user_dir = out_dir / safe_name(item.id)
        usage = UsageTracker()
        bars.started(usage)
        agent = agent_client.fork(usage)
        try:
            policy = policy_factory(item.id, user_dir / "workdir", agent)
            try:
                simulator = None
                replay = None
                if replay_from is not None:
                    replay = load_replay(replay_from, item.id)
                else:
                    simulator = UserSimulator((sim_client or agent_client).fork(usage), sim_config)
                # a probe that makes model calls counts them in this user's tracker
                user_probe = (
                    probe.for_user(usage)
                    if probe is not None and hasattr(probe, "for_user")
                    else probe
                )
                runner = EpisodeRunner(
                    item,
                    policy,
                    user_dir,
                    simulator=simulator,
                    probe=user_probe,
                    usage=usage,
                    periods=periods,
                    replay=replay,
                    on_period=lambda _p: bars.period_done(),
                )
                bars.period_done(already[item.id], resumed=True)
                result = runner.run()
                result.usage = usage.summary()
            finally:
                guarded(policy, item.id).close()  # a plug-in's failing close is one line too
        finally:
            bars.stopped(usage)
        bars.user_done(item.id)
        return result

    try:
        with ThreadPoolExecutor(max_workers=max(1, max_users_in_parallel)) as pool:
            return list(pool.map(one, items))
    finally:
        bars.close()
