"""Optuna tuning of AWE's hyperparameters (update_freq, short_term_len, top_k).

The objective is the memory score on the tuning users (optionally a second objective: tokens per
user).

The Optuna storage is the source of truth (ask/tell): rerunning adds trials to the same study.
A trial killed mid-way is marked failed and its parameters asked again first, and its episodes
were checkpointed in a folder named by those parameters, so no finished model call is repeated.
The paper's default (2, 4, 30) is the first trial. Each trial is a nested MLflow run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memloop.core.files import json_sha256
from memloop.core.tables import format_table
from memloop.optimize import tracking
from memloop.optimize.config import TuneConfig
from memloop.optimize.evolution import load_environment, role_clients, split_users

PARAMS = ("update_freq", "short_term_len", "top_k")


@dataclass
class TuneOutcome:
    study_name: str
    storage: str
    trials: list[dict[str, Any]]
    best: list[dict[str, Any]]
    added: int
    requeued: int = 0  # interrupted trials of earlier runs put back in the queue


def _storage_path(storage: str) -> None:
    if storage.startswith("sqlite:///"):
        Path(storage[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)


def open_study(config: TuneConfig):
    import optuna

    _storage_path(config.storage)
    directions = ["maximize", "minimize"] if config.minimize_tokens else ["maximize"]
    sampler = optuna.samplers.TPESampler(seed=config.seed)
    study = optuna.create_study(
        study_name=config.study_name,
        storage=config.storage,
        load_if_exists=True,
        directions=directions,
        sampler=sampler,
    )
    return study


def requeue_interrupted(study) -> int:
    """Mark trials left RUNNING by a killed process as failed and ask their params again."""
    import optuna

    stale = [
        t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.RUNNING
    ]
    for t in stale:
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
        study.enqueue_trial(dict(t.params), skip_if_exists=False)
    return len(stale)


def _policy_factory(policy_config: Any) -> Callable[[str, Path, Any], Any]:
    """A policy factory for one trial's `policy_config` (bound now, not when it is called)."""
    from memloop.policies import build_policy

    return lambda uid, wd, c: build_policy(policy_config, c, wd)


def run_tune(config: TuneConfig, *, progress: bool = True) -> TuneOutcome:
    import optuna

    from memloop.core.errors import UserError
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import run_evaluation
    from memloop.policies import AWEConfig, load_policy_config

    base = load_policy_config(config.policy)
    if not isinstance(base, AWEConfig):
        raise UserError(
            f"{config.source}: policy {config.policy} is not an AWE policy "
            "(type: awe); tuning covers AWE's update_freq, short_term_len and top_k"
        )
    items, env_desc = load_environment(config.environment)
    users, _ = split_users(items, config.environment)
    clients = role_clients(config.endpoints)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = open_study(config)
    requeued = requeue_interrupted(study)
    if not study.trials:
        study.enqueue_trial({k: config.default_trial[k] for k in PARAMS})

    mlc = tracking.client(config.tracking_uri)
    exp = tracking.experiment_id(mlc, config.experiment_name, config.tracking_uri)
    parent_key = json_sha256({"study": config.study_name, "storage": config.storage})
    parent_id, _ = tracking.open_run(
        mlc,
        exp,
        parent_key,
        f"tune-{config.study_name}",
        {
            "config": config.model_dump(mode="json", exclude={"source"}),
            "data": env_desc,
            "users": [u.id for u in users],
            "models": {r: e["model"] for r, e in clients.public().items()},
        },
        tags={"memloop.kind": "tune", "memloop.study": config.study_name},
    )
    sim = SimulatorConfig(rounds_init=config.rounds.init, rounds_update=config.rounds.update)

    added = 0
    for _ in range(config.trials):
        trial = study.ask()
        params = {
            "update_freq": trial.suggest_categorical("update_freq", config.update_freq),
            "short_term_len": trial.suggest_categorical("short_term_len", config.short_term_len),
            "top_k": trial.suggest_categorical("top_k", config.top_k),
        }
        policy_config = base.model_copy(update={**params, "name": None})
        out = (
            config.output_root / f"awe-{params['update_freq']}-{params['short_term_len']}-"
            f"{params['top_k']}"
        )
        key = json_sha256({"parent": parent_key, "params": params})
        run_id, _ = tracking.open_run(
            mlc,
            exp,
            key,
            f"trial-{trial.number}-{policy_config.display_name}",
            {"trial": trial.number, **params, "policy": policy_config.model_dump(mode="json")},
            tags={"memloop.kind": "tune-trial", "memloop.study": config.study_name},
            parent_run_id=parent_id,
        )
        started = time.perf_counter()
        try:
            result = run_evaluation(
                users,
                _policy_factory(policy_config),
                out,
                agent_client=clients.agent,
                sim_client=clients.user_sim,
                checker_client=clients.checker,
                sim_config=sim,
                periods=config.environment.periods,
                max_users_in_parallel=config.parallel_users,
                progress=progress,
            )
        except BaseException:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            tracking.finish_run(mlc, run_id, "FAILED")
            raise
        m = result.metrics
        tokens = sum(m["usage"].values()) / max(1, m["users"])
        score = m["memory_score"] if m["memory_score"] is not None else 0.0
        trial.set_user_attr("overall", m["overall"])
        trial.set_user_attr("factual_recall", m["factual_recall"])
        trial.set_user_attr("tokens_per_user", tokens)
        trial.set_user_attr("run_id", run_id)
        values = [score, tokens] if config.minimize_tokens else score
        study.tell(trial, values)
        tracking.log_metrics(
            mlc,
            run_id,
            {
                "memory_score": m["memory_score"],
                "overall": m["overall"],
                "factual_recall": m["factual_recall"],
                "tokens_per_user": tokens,
                **{k: v for k, v in m["diagnosis"].items()},
                **{f"tokens_{c}": float(v) for c, v in m["usage"].items()},
                "seconds": time.perf_counter() - started,
            },
            step=0,
        )
        tracking.finish_run(mlc, run_id)
        tracking.log_metrics(mlc, parent_id, {"memory_score": score}, step=trial.number)
        added += 1
    tracking.finish_run(mlc, parent_id)
    return summarize_study(study, config, added, requeued)


def summarize_study(study, config: TuneConfig, added: int, requeued: int = 0) -> TuneOutcome:
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    rows = [
        {
            "number": t.number,
            **t.params,
            "memory_score": t.values[0],
            "tokens_per_user": t.user_attrs.get("tokens_per_user"),
            "overall": t.user_attrs.get("overall"),
            "factual_recall": t.user_attrs.get("factual_recall"),
        }
        for t in done
    ]
    best_numbers = {t.number for t in study.best_trials} if done else set()
    best = sorted(
        (r for r in rows if r["number"] in best_numbers), key=lambda r: -r["memory_score"]
    )
    return TuneOutcome(config.study_name, config.storage, rows, best, added, requeued)


def format_outcome(outcome: TuneOutcome) -> str:
    best = {r["number"] for r in outcome.best}
    rows = [
        [
            f"{r['number']}{'*' if r['number'] in best else ''}",
            r["update_freq"],
            r["short_term_len"],
            r["top_k"],
            r["memory_score"],
            r["overall"],
            r["factual_recall"],
            None if r["tokens_per_user"] is None else round(r["tokens_per_user"]),
        ]
        for r in outcome.trials
    ]
    lines = [
        f"study {outcome.study_name} ({outcome.storage}): {len(outcome.trials)} finished "
        f"trials, {outcome.added} added now"
        + (f", {outcome.requeued} interrupted trials re-queued" if outcome.requeued else ""),
        format_table(
            [
                "trial",
                "update_freq",
                "short_term_len",
                "top_k",
                "mem_score",
                "overall",
                "recall",
                "tokens/user",
            ],
            rows,
            align="r" * 8,
        ),
    ]
    lines.append(
        "* best trial(s)" + (" (Pareto front: memory score vs tokens)" if len(best) > 1 else "")
    )
    return "\n".join(lines)
