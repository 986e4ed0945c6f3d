"""The `episode` search: a cycle = whole episodes under one prompt, then one evolution step.

Cycle k evaluates its prompts on whole episodes of every split (all users in one pass), builds one
budgeted feedback summary from the training users' episodes, and the evolver proposes cycle k+1's
prompts. No step follows the last cycle; a run extended with more cycles takes it then.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from memloop.feedback.objective import Mode
from memloop.feedback.report import collect
from memloop.optimize.cycles import CycleRecord

if TYPE_CHECKING:
    from memloop.optimize.config import EvolveConfig
    from memloop.optimize.context import RunContext


class EpisodeSearch:
    name = "episode"
    needs_val = False
    evolves_itself = False

    def spec(self, config: EvolveConfig) -> dict[str, Any]:
        return {"name": self.name}

    @staticmethod
    def extras(ctx: RunContext, evolver: Any, history: list, k: int) -> dict[str, Any]:
        """What an evolver asks for beyond (prompts, summary).

        The history of (prompts, validation objective), and a replay screen of candidate prompts
        on cycle k's training conversations.
        """
        extra: dict[str, Any] = {}
        if getattr(evolver, "wants_history", False):
            extra["history"] = list(history)
        if getattr(evolver, "wants_screen", False) and ctx.train:
            from memloop.core.files import json_sha256
            from memloop.optimize.replay_score import replay_screen

            recording = ctx.store.cycle_dir(k) / "episodes"
            out = ctx.store.cycle_dir(k) / "screen"

            def screen(prompts: dict[str, str]) -> Any:
                return replay_screen(
                    ctx.train,
                    ctx.factory(prompts),
                    ctx.clients.agent,
                    recording,
                    out / json_sha256(prompts)[:12],  # one folder per screened prompt
                    periods=ctx.config.environment.periods,
                    parallel_users=ctx.config.parallel_users,
                )

            extra["screen"] = screen
        return extra

    def cycles(self, ctx: RunContext) -> Iterator[CycleRecord]:
        from memloop.optimize.context import split_results, usage_tokens

        store = ctx.store
        evolver = ctx.make_evolver()
        prompts = ctx.initial_prompts
        n = ctx.config.cycles
        history: list[tuple[dict[str, str], float | None]] = []  # (prompts, val objective)
        for k in range(n):
            prompts = store.prompts(k, prompts)
            record = store.record(k)
            if record is None:
                started = time.perf_counter()
                results = ctx.evaluate_splits(prompts, store.cycle_dir(k))
                questions, _ = collect(r for e in results["train"].episodes for r in e.records)
                summary, report = ctx.summary(ctx.train, questions)
                store.save_summary(k, summary)
                record = CycleRecord(
                    cycle=k,
                    splits=split_results(results),
                    tokens=usage_tokens(results.values()),
                    seconds=round(time.perf_counter() - started, 1),
                    feedback=report if Mode(ctx.mode).evolves else None,
                )
                store.save(record)
            history.append((dict(prompts), record.score("val", ctx.objective)))
            step = store.step(k)
            if step is None and k + 1 < n:
                step = evolver.propose(
                    prompts,
                    store.summary(k) or {},
                    cycle=k,
                    **self.extras(ctx, evolver, history, k),
                )
                store.save_step(k, step)
                record.tokens["optimizer"] = step.tokens
                store.save(record)
            yield record
            if step is not None:
                prompts = step.prompts
