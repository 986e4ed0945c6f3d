"""The `period` search (the paper's Algorithm 1 as published): prompts evolve every period.

Training users advance through their episodes in lockstep and share one prompt; after each period
that period's feedback evolves the prompt used from the next period on, and the memory written so
far is kept. Cycle p = period p:
- `train_*`: period p's probes of the training users (the online numbers), diagnosed against each
  user's whole history, so a fact written right and later misread stays a read failure;
- `val_*` / `test_*`: period p's prompt run on whole episodes of the val / test users (a prompt
  is only comparable across conditions on fresh users).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memloop.core.files import safe_name
from memloop.environment.episode import EpisodeRunner, PeriodRecord
from memloop.environment.simulator import UserSimulator
from memloop.feedback.calibration import checker_calibration
from memloop.feedback.objective import Mode
from memloop.feedback.probes import Prober
from memloop.feedback.report import collect, period_metrics
from memloop.feedback.summary import budgeted_summary
from memloop.feedback.write_failures import failure_block, state_pairs
from memloop.llm.usage import UsageTracker
from memloop.optimize.contract import EvolveInput, NoSettings, SearchContext, propose
from memloop.runs.cycles import CycleRecord


class PeriodSearch:
    name = "period"
    Settings = NoSettings
    needs_val = False
    evolves_itself = False

    def __init__(self, settings: NoSettings | None = None):
        self.settings = settings or NoSettings()

    def cycles(self, ctx: SearchContext) -> Iterator[CycleRecord]:
        config, store, items = ctx.config, ctx.store, ctx.users["train"]
        n_periods = min(
            min(config.environment.periods or it.num_periods, it.num_periods) for it in items
        )
        evolver = ctx.make_evolver()
        prober = Prober(ctx.clients.agent, ctx.clients.checker, config.probes)
        runners: list[EpisodeRunner] = []
        for item in items:
            usage = UsageTracker()
            user_dir = ctx.store.run_dir / "episodes" / safe_name(item.id)
            agent = ctx.clients.agent.fork(usage)
            policy = ctx.factory(ctx.initial_prompts)(item.id, user_dir / "workdir", agent)
            runners.append(
                EpisodeRunner(
                    item,
                    policy,
                    user_dir,
                    simulator=UserSimulator(ctx.clients.user_sim.fork(usage), ctx.sim_config()),
                    probe=prober.for_user(usage),
                    usage=usage,
                    periods=n_periods,
                )
            )
        # the training users' recall is gated like every evaluation's (val/test run through it):
        # one calibration, on all the run's users
        self._calibration = checker_calibration(ctx.run_users, ctx.clients.checker)
        history: list[PeriodRecord] = []
        prompts = ctx.initial_prompts
        try:
            for p in range(n_periods):
                prompts = store.prompts(p, prompts)
                with ThreadPoolExecutor(max_workers=config.parallel_users) as pool:
                    # bind the period and its prompts (B023); the pool finishes within the period
                    history += pool.map(
                        lambda r, p=p, prompts=prompts: r.advance(p, prompts), runners
                    )
                record = store.record(p)
                if record is None:
                    record = self._cycle(ctx, p, prompts, history, evolver, last=p + 1 == n_periods)
                yield record
                step = store.step(p)
                if step is not None:
                    prompts = step.prompts
        finally:
            for r in runners:
                r.policy.close()

    def _cycle(
        self,
        ctx: SearchContext,
        p: int,
        prompts: dict[str, str],
        history: list[PeriodRecord],
        evolver: Any,
        *,
        last: bool,
    ) -> CycleRecord:
        started = time.perf_counter()
        train = period_metrics(history, p, self._calibration)
        questions, _ = collect(history)
        updates = {
            it.id: {v: it.state_at(p)[v] for e in it.exposed_values(p) for v in e}
            for it in ctx.users["train"]
        }
        by_user: dict[str, list[PeriodRecord]] = {}
        for r in history:
            by_user.setdefault(r.user_id, []).append(r)
        pairs = [x for rs in by_user.values() for x in state_pairs(rs) if x.period == p]
        summary = budgeted_summary(
            [q for q in questions if q.period == p],
            ctx.mode,
            updates,
            max_questions=ctx.config.summary_max_questions,
            max_chars=ctx.config.summary_max_chars,
            history=questions,
            private=ctx.private,
            failures=failure_block(pairs) if pairs else None,
            redactor=ctx.redactor,
        )
        ctx.store.save_summary(p, summary)
        held = ctx.evaluate_splits(prompts, ctx.store.cycle_dir(p), splits=("val", "test"))
        record = CycleRecord.of(
            p, held, train=train, feedback=summary.report if Mode(ctx.mode).evolves else None
        )
        if not last:
            # no history (the period's prompt has no validation score yet) and no replay screen
            step = propose(evolver, EvolveInput(prompts=prompts, summary=summary, cycle=p))
            ctx.store.save_step(p, step)
            record.add_step(step)
        record.seconds = round(time.perf_counter() - started, 1)
        ctx.store.save(record)
        return record
