"""The `period` cadence (the paper's Algorithm 1 as published): prompts evolve every period.

The prompts evolve after each period inside the episode, from that period's feedback, and apply
from the next period on while the memory written so far is kept. Training users advance in
lockstep and share one prompt, so cycle k = period k (with one user this is exactly Algorithm 1).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memloop.core.files import atomic_write_json, atomic_write_text, safe_name
from memloop.environment.episode import EpisodeRunner
from memloop.environment.simulator import SimulatorConfig, UserSimulator
from memloop.feedback.probes import Prober
from memloop.feedback.report import build_metrics, collect
from memloop.feedback.summary import summarize
from memloop.llm.usage import UsageTracker
from memloop.optimize.evolution import (
    Evolution,
    _evolver_tokens,
    metric_row,
    select_questions,
)
from memloop.optimize.evolvers import EvolveStep, make_evolver


def run_period_cadence(evo: Evolution, mlc, run_id: str) -> list[dict[str, Any]]:
    config = evo.config
    items = evo.train
    n_periods = min(
        min(config.environment.periods or it.num_periods, it.num_periods) for it in items
    )
    evolver = make_evolver(
        evo.evolver_name if evo.mode != "none" else "none", evo.clients.optimizer.fork()
    )
    sim_config = SimulatorConfig(rounds_init=config.rounds.init, rounds_update=config.rounds.update)
    prober = Prober(ub_client=evo.clients.agent, checker_client=evo.clients.checker)
    runners: list[EpisodeRunner] = []
    for item in items:
        usage = UsageTracker()
        user_dir = evo.run_dir / "episodes" / safe_name(item.id)
        agent = evo.clients.agent.fork(usage)
        policy = evo.factory(evo.initial_prompts)(item.id, user_dir / "workdir", agent)
        runners.append(
            EpisodeRunner(
                item,
                policy,
                user_dir,
                simulator=UserSimulator(evo.clients.user_sim.fork(usage), sim_config),
                probe=prober.for_user(usage),
                usage=usage,
                periods=n_periods,
            )
        )
    all_records: dict[str, list] = {it.id: [] for it in items}
    prompts = evo.initial_prompts
    cycles = []
    try:
        for p in range(n_periods):
            cdir = evo.run_dir / f"cycle_{p:02d}"
            prompts = evo._cycle_prompts(cdir, prompts)
            started = time.perf_counter()
            with ThreadPoolExecutor(max_workers=config.parallel_users) as pool:
                # bind the period and its prompts (B023); pool.map finishes within the period anyway
                records = list(
                    pool.map(lambda r, p=p, prompts=prompts: r.advance(p, prompts), runners)
                )
            for item, rec in zip(items, records, strict=True):
                all_records[item.id].append(rec)
            done = cdir / "done.json"
            if done.is_file():
                row = json.loads(done.read_text())
            else:
                metrics, _ = build_metrics(records)
                questions, _ = collect(records)
                chosen = select_questions(questions, evo.mode, config.summary_max_questions)
                summary = (
                    {
                        "users": [
                            {
                                "user": it.id,
                                **summarize(
                                    [q for q in chosen if q.user_id == it.id],
                                    evo.mode,
                                    {v: it.state_at(p)[v] for e in it.exposed_values(p) for v in e},
                                    all_records=collect(all_records[it.id])[0],
                                ),
                            }
                            for it in items
                            if any(q.user_id == it.id for q in chosen)
                        ]
                    }
                    if evo.mode != "none"
                    else {}
                )
                atomic_write_json(cdir / "summary.json", summary)
                row = {
                    "cycle": p,
                    **metric_row(metrics),
                    "per_user": metrics["per_user"],
                    "tokens": dict(metrics["usage"]),
                    "seconds": round(time.perf_counter() - started, 1),
                }
                if p + 1 < n_periods:
                    before = _evolver_tokens(evolver)
                    step = evolver.propose(prompts, summary, cycle=p)
                    atomic_write_text(cdir / "evolve.json", step.model_dump_json(indent=1))
                    row["tokens"]["optimizer"] = _evolver_tokens(evolver) - before
                atomic_write_json(done, row)
            evo.log_cycle(mlc, run_id, p, row, prompts, cdir)
            cycles.append(row)
            if (cdir / "evolve.json").is_file():
                prompts = EvolveStep.model_validate_json((cdir / "evolve.json").read_text()).prompts
    finally:
        for r in runners:
            r.policy.close()
    return cycles
