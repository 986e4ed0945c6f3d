"""The generation run: per user, the steps in order.

Each step is loaded from raw/<user>/<step>.json when a previous run finished it, otherwise computed
and saved atomically. A user whose step fails after its refine budget is reported (step and reason),
never dropped silently; data.json is written only when every user passed, or with `allow_partial`
(then it holds the users that passed).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json
from memloop.environment.data import UserItem
from memloop.environment.datafile import save_items
from memloop.environment.llm_pipeline.asking import Asker, StepFailed, StepStats
from memloop.environment.llm_pipeline.assemble import (
    build_item,
    period_ends,
    session_times,
    session_window,
)
from memloop.environment.llm_pipeline.config import PipelineConfig
from memloop.environment.llm_pipeline.context import UserContext
from memloop.environment.llm_pipeline.personas import Persona, load_personas, select_personas
from memloop.environment.llm_pipeline.step_answers import answers_step, run_answers
from memloop.environment.llm_pipeline.step_profile import STEP as PROFILE_STEP
from memloop.environment.llm_pipeline.step_profile import run_profile
from memloop.environment.llm_pipeline.step_questions import (
    QUESTIONS_STEP,
    SCHEMA_STEP,
    run_questions,
    run_schema,
)
from memloop.environment.llm_pipeline.step_states import (
    INITIAL_STEP,
    events_step,
    run_events,
    run_initial,
    run_update,
    update_step,
)
from memloop.environment.llm_pipeline.step_utterances import (
    exposure_groups,
    initial_plan,
    run_sessions,
    sessions_step,
    update_plan,
)
from memloop.environment.llm_pipeline.store import RunStore
from memloop.environment.validation import check_item, check_items
from memloop.llm.client import ChatClient
from memloop.llm.usage import UsageRows, usage_delta

T = TypeVar("T")
ITEM_STEP = "item"


class GenerationIncomplete(UserError):
    """Some users failed a step after their refine budget (listed in report.json).

    The CLI exits 2.
    """


class _Cancelled(Exception):
    """Another user's thread hit a run-level error; stop at the next step boundary."""


@dataclass
class UserFailure:
    """A user that could not be generated: where it stopped and why."""

    user_id: str
    index: int
    name: str | None
    step: str
    reason: str
    failed_attempts: int = 0
    also_failed: list[dict[str, str]] = field(default_factory=list)
    """Other steps of this user that failed in the same parallel stage (step, reason)."""

    def line(self) -> str:
        who = f"user {self.index} {self.user_id}" + (f" ({self.name})" if self.name else "")
        more = (
            f" (and {len(self.also_failed)} more failed steps: "
            + ", ".join(f["step"] for f in self.also_failed)
            + ")"
            if self.also_failed
            else ""
        )
        return f"{who} failed at step {self.step}: {self.reason}{more}"


@dataclass
class PipelineResult:
    """What a run produced. `items` are the users that passed, in selection order."""

    items: list[UserItem]
    failures: list[UserFailure]
    requested: int
    out_dir: Path
    data_path: Path | None
    report_path: Path
    steps_run: int = 0
    steps_skipped: int = 0
    elapsed_s: float = 0.0
    usage: UsageRows = field(default_factory=dict)
    refinements: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.failures


def steps_per_user(config: PipelineConfig) -> int:
    """The number of steps of one user.

    Profile, questions, schema, initial state, (update, events) per period, sessions per period
    including period 0, answers per question, and the assembled item.
    """
    return 4 + 2 * config.periods + (config.periods + 1) + config.questions + 1


class _Progress:
    """Step counter shared by the user threads, shown as a tqdm bar when asked."""

    def __init__(self, total: int, users: int, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            unit="step",
            desc="generate",
            file=sys.stderr,
            disable=not enabled,
            dynamic_ncols=True,
        )
        self.lock = threading.Lock()
        self.run = self.skipped = self.done_users = self.failed_users = 0
        self.users = users

    def step(self, skipped: bool) -> None:
        with self.lock:
            if skipped:
                self.skipped += 1
            else:
                self.run += 1
            self.bar.update(1)

    def user_finished(self, failed: bool, leftover_steps: int) -> None:
        with self.lock:
            self.failed_users += failed
            self.done_users += 1
            self.bar.update(leftover_steps)
            self.bar.set_postfix_str(
                f"users {self.done_users}/{self.users}, failed {self.failed_users}"
            )

    def close(self) -> None:
        self.bar.close()


class _UserRun:
    """The steps of one user, each resumed from its file when present."""

    def __init__(self, run: _Run, index: int, persona: Persona) -> None:
        self.run = run
        self.index = index
        self.persona = persona
        self.user_id = persona.id
        self.name: str | None = persona.row.get("name")
        self.steps_done = 0
        self.failed_attempts: dict[str, int] = {}
        self.notes: list[str] = []
        self._lock = threading.Lock()  # parallel steps of this user count concurrently

    def step(self, name: str, compute: Callable[[StepStats], T]) -> T:
        store = self.run.store
        record = store.load_step(self.user_id, name)
        if record is not None:
            self._count(name, record.get("failed_attempts", 0), skipped=True)
            return record["result"]
        if self.run.cancel.is_set():
            raise _Cancelled()
        stats = StepStats()
        try:
            result = compute(stats)
        except StepFailed as exc:
            exc.failed_attempts = stats.failed_attempts
            raise
        store.save_step(self.user_id, name, {"step": name, "result": result, **stats.record()})
        self._count(name, stats.failed_attempts, skipped=False)
        return result

    def _count(self, name: str, failed_attempts: int, skipped: bool) -> None:
        with self._lock:
            self.steps_done += 1
            if failed_attempts:
                self.failed_attempts[name] = failed_attempts
        self.run.progress.step(skipped)

    def parallel(self, jobs: list[tuple[str, Callable[[StepStats], Any]]]) -> list[Any]:
        """Independent steps at once (the endpoint's concurrency bound still applies).

        All are finished (and saved) before the first failure, in job order, is raised.
        """
        workers = max(1, min(len(jobs), self.run.workers))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="memloop-step") as pool:
            futures: list[Future] = [pool.submit(self.step, name, fn) for name, fn in jobs]
            errors = [f.exception() for f in futures]
        for error in errors:  # run-level errors first: they are not this user's fault
            if error is not None and not isinstance(error, StepFailed):
                raise error
        failed = [error for error in errors if isinstance(error, StepFailed)]
        if failed:
            first = failed[0]
            first.also_failed = [{"step": e.step, "reason": e.reason} for e in failed[1:]]
            raise first
        return [f.result() for f in futures]

    def generate(self) -> UserItem:
        cfg = self.run.config
        asker = self.run.asker
        profile = self.step(PROFILE_STEP, lambda s: run_profile(self.persona, asker, cfg, s))
        self.name = profile.get("name") or self.name
        ctx = UserContext(
            asker=asker,
            config=cfg,
            user_id=self.user_id,
            profile_text=profile.get("formatted_str") or "",
            name=self.name or "",
        )
        raw_questions = self.step(QUESTIONS_STEP, lambda s: run_questions(ctx, s))
        merged = self.step(SCHEMA_STEP, lambda s: run_schema(ctx, s, raw_questions))
        self.notes.extend(merged.get("fallbacks", []))
        schema: dict[str, list[str]] = merged["schema"]
        questions: list[dict[str, Any]] = merged["questions"]
        ends = period_ends(cfg.start_date, cfg.periods, cfg.months_per_period)

        states = [self.step(INITIAL_STEP, lambda s: run_initial(ctx, s, schema))]
        counts = dict.fromkeys(schema, 0)
        updates: list[dict[str, Any]] = []
        events: list[list[dict[str, Any]]] = []
        for k in range(1, cfg.periods + 1):
            window = (ends[k - 1].isoformat(), ends[k].isoformat())
            before = states[-1]
            summaries = [u["summary"] for u in updates]
            update = self.step(
                update_step(k),
                partial(
                    run_update,
                    ctx,
                    period=k,
                    window=window,
                    schema=schema,
                    state=before,
                    counts=dict(counts),
                    summaries=summaries,
                ),
            )
            events.append(
                self.step(
                    events_step(k),
                    partial(
                        run_events,
                        ctx,
                        period=k,
                        window=window,
                        schema=schema,
                        before=before,
                        update=update,
                    ),
                )
            )
            updates.append(update)
            states.append({**before, **update["changes"]})
            for var in update["changes"]:
                counts[var] += 1

        groups = exposure_groups(
            questions, schema, cfg.max_states_per_utterance, ctx.rng("exposure-groups")
        )
        plans = [initial_plan(groups, states[0])] + [
            update_plan(events[k - 1], states[k - 1], states[k]) for k in range(1, cfg.periods + 1)
        ]
        jobs: list[tuple[str, Callable[[StepStats], Any]]] = []
        for k, plan in enumerate(plans):
            jobs.append(
                (
                    sessions_step(k),
                    partial(
                        run_sessions,
                        ctx,
                        period=k,
                        plan=plan,
                        schema=schema,
                        date=ends[k].isoformat(),
                    ),
                )
            )
        for q, question in enumerate(questions):
            jobs.append(
                (
                    answers_step(q),
                    partial(
                        run_answers, ctx, index=q, question=question, schema=schema, states=states
                    ),
                )
            )
        results = self.parallel(jobs)
        sessions, answers = results[: len(plans)], results[len(plans) :]

        stamps = [
            session_times(ctx.rng(f"session-times:{k}"), *session_window(k, ends), len(sessions[k]))
            for k in range(len(sessions))
        ]

        def assemble(stats: StepStats) -> dict[str, Any]:
            item = build_item(
                self.user_id,
                cfg.start_date,
                profile,
                schema,
                states,
                updates,
                sessions,
                stamps,
                questions,
                answers,
                ends,
            )
            problems = check_item(item, 0)
            if problems:
                raise StepFailed(
                    ITEM_STEP, f"the assembled item breaks the data format: {problems[0]}"
                )
            return item.to_json()

        return UserItem.model_validate(self.step(ITEM_STEP, assemble))


class _Run:
    def __init__(
        self,
        config: PipelineConfig,
        store: RunStore,
        asker: Asker,
        progress: _Progress,
        workers: int,
    ) -> None:
        self.config = config
        self.store = store
        self.asker = asker
        self.progress = progress
        self.workers = workers
        self.cancel = threading.Event()


def run_pipeline(
    config: PipelineConfig,
    out_dir: str | Path,
    client: ChatClient,
    *,
    allow_partial: bool = False,
    progress: bool = False,
    personas: list[Persona] | None = None,
) -> PipelineResult:
    """Generate `config.users` users into `out_dir`, resuming finished steps found there.

    Writes report.json always and data.json when every user passed (or, with `allow_partial`, when
    at least one did). Step failures are returned in `PipelineResult.failures`, not raised;
    run-level problems (endpoint down, bad persona file, a different config in `out_dir`) raise
    UserError.
    """
    started = time.perf_counter()
    store = RunStore(out_dir)
    identity = client.cache_identity[1]  # the model (its file hash when embedded), not the URL
    store.check_config(config.fingerprint(identity), config.model_dump(mode="json"))
    pool = personas if personas is not None else load_personas(config.persona_path())
    selected = select_personas(
        pool, config.users, config.seed, config.exclude_ids, source=str(config.persona_path())
    )
    # Start the embedded model (if any) in the calling thread: llm/embedded_server ties the
    # server's life to the thread that spawned it (PR_SET_PDEATHSIG), and our worker threads end
    # with the run.
    client.resolved_base_url()
    usage_before = client.usage.summary()
    tracker = _Progress(config.users * steps_per_user(config), config.users, progress)
    workers = max(1, client.endpoint.max_concurrency)
    run = _Run(
        config, store, Asker(client, config.max_tokens, config.temperature_retry), tracker, workers
    )
    users = [_UserRun(run, i, persona) for i, persona in enumerate(selected)]
    outcomes: dict[int, UserItem | UserFailure] = {}
    fatal: BaseException | None = None

    def one(user: _UserRun) -> None:
        try:
            outcomes[user.index] = user.generate()
            failed = False
        except StepFailed as exc:
            outcomes[user.index] = UserFailure(
                user.user_id,
                user.index,
                user.name,
                exc.step,
                exc.reason,
                exc.failed_attempts,
                list(getattr(exc, "also_failed", [])),
            )
            failed = True
        except BaseException:
            run.cancel.set()
            raise
        tracker.user_finished(failed, steps_per_user(config) - user.steps_done)

    try:
        with ThreadPoolExecutor(
            max_workers=max(1, min(len(users), workers)), thread_name_prefix="memloop-user"
        ) as executor:
            futures = [executor.submit(one, user) for user in users]
            try:
                for future in futures:
                    error = future.exception()
                    if error is not None and not isinstance(error, _Cancelled) and fatal is None:
                        fatal = error
            except BaseException:  # Ctrl-C while waiting: let running steps stop at a boundary
                run.cancel.set()
                raise
    except BaseException as exc:
        fatal = fatal or exc
    finally:
        tracker.close()

    items = [o for i, o in sorted(outcomes.items()) if isinstance(o, UserItem)]
    failures = [o for i, o in sorted(outcomes.items()) if isinstance(o, UserFailure)]
    result = PipelineResult(
        items=items,
        failures=failures,
        requested=config.users,
        out_dir=store.root,
        data_path=None,
        report_path=store.report_path,
        steps_run=tracker.run,
        steps_skipped=tracker.skipped,
        usage=usage_delta(usage_before, client.usage.summary()),
        refinements={u.user_id: dict(u.failed_attempts) for u in users if u.failed_attempts},
        notes={u.user_id: list(u.notes) for u in users if u.notes},
    )
    if fatal is not None:
        result.elapsed_s = time.perf_counter() - started
        _write_report(
            result, status="interrupted", error=f"{type(fatal).__name__}: {fatal}", selected=users
        )
        raise fatal

    status = (
        "complete" if not failures else ("partial" if allow_partial and items else "incomplete")
    )
    if status in ("complete", "partial"):
        problems = check_items(items)
        if problems:  # ids are unique by selection; anything here is a pipeline bug
            raise RuntimeError(f"generated users break the data format: {problems[0]}")
        save_items(items, store.data_path)
        result.data_path = store.data_path
    elif store.data_path.exists():
        store.data_path.unlink()  # never leave an older data.json looking like this run's output
    result.elapsed_s = time.perf_counter() - started
    _write_report(result, status=status, error=None, selected=users)
    return result


def _write_report(
    result: PipelineResult, *, status: str, error: str | None, selected: list[_UserRun]
) -> None:
    passed = {item.id for item in result.items}
    failed = {f.user_id for f in result.failures}
    report = {
        "status": status,
        "error": error,
        "requested_users": result.requested,
        "succeeded": [
            {"index": u.index, "user_id": u.user_id, "name": u.name}
            for u in selected
            if u.user_id in passed
        ],
        "failed": [asdict(f) for f in result.failures],
        "not_finished": [
            {"index": u.index, "user_id": u.user_id}
            for u in selected
            if u.user_id not in passed and u.user_id not in failed
        ],
        "data_file": result.data_path.name if result.data_path else None,
        "failed_attempts_by_step": result.refinements,
        "notes": result.notes,
        "steps_run": result.steps_run,
        "steps_resumed": result.steps_skipped,
        "elapsed_s": round(result.elapsed_s, 2),
        "usage": result.usage,
    }
    atomic_write_json(result.report_path, report, indent=2)
