"""The `episode` search: a cycle = whole episodes under one prompt, then one evolution step.

Cycle k evaluates its prompts on whole episodes of every split (all users in one pass), builds one
budgeted feedback summary from the training users' episodes, and the evolver proposes cycle k+1's
prompts. No step follows the last cycle; a run extended with more cycles takes it then.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from memloop.feedback.objective import Mode
from memloop.feedback.report import collect
from memloop.feedback.summary import FeedbackSummary
from memloop.optimize.contract import EvolveInput, NoSettings, SearchContext, propose
from memloop.runs.cycles import CycleRecord


class EpisodeSearch:
    name = "episode"
    Settings = NoSettings
    needs_val = False
    evolves_itself = False

    def __init__(self, settings: NoSettings | None = None):
        self.settings = settings or NoSettings()

    @staticmethod
    def screen(ctx: SearchContext, k: int) -> Callable[[dict[str, str]], Any] | None:
        """A replay screen of candidate prompts on cycle k's training conversations."""
        if not ctx.users["train"]:
            return None
        from memloop.core.files import json_sha256

        recording = ctx.store.cycle_dir(k) / "episodes"
        out = ctx.store.cycle_dir(k) / "screen"

        def screen(prompts: dict[str, str], users: int | None = None) -> Any:
            # one folder per screened prompt; `users`: the first n training users only (a later
            # screen of the same prompt on all of them replays only the others)
            items = ctx.users["train"][:users] if users else ctx.users["train"]
            return ctx.replay_screen(items, prompts, recording, out / json_sha256(prompts)[:12])

        return screen

    def cycles(self, ctx: SearchContext) -> Iterator[CycleRecord]:
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
                summary = ctx.summary(
                    ctx.users["train"], questions, episodes=results["train"].episodes
                )
                store.save_summary(k, summary)
                record = CycleRecord.of(
                    k,
                    results,
                    seconds=round(time.perf_counter() - started, 1),
                    feedback=summary.report if Mode(ctx.mode).evolves else None,
                )
                store.save(record)
            history.append((dict(prompts), record.score("val", ctx.objective)))
            step = store.step(k)
            if step is None and k + 1 < n:
                step = propose(
                    evolver,
                    EvolveInput(
                        prompts=prompts,
                        summary=store.summary(k) or FeedbackSummary(mode=Mode(ctx.mode)),
                        cycle=k,
                        history=tuple(history),
                        screen=self.screen(ctx, k),
                        rejected=tuple(
                            r for j in range(k) for r in getattr(store.step(j), "rejected", [])
                        ),
                    ),
                )
                store.save_step(k, step)
                record.add_step(step)
                store.save(record)
            yield record
            if step is not None:
                prompts = step.prompts
