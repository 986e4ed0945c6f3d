"""`memloop evolve`: every condition of an experiment, each run by the search it calls for.

The searches: episode cadence (a cycle = whole episodes, then one evolution step), period cadence
(the paper's Algorithm 1: the prompt evolves inside the episode after every period) and GEPA.
The cycle machinery they share lives in optimize/evolution.py, which imports none of them.
"""

from __future__ import annotations

from typing import Any

from memloop.llm.roles import RoleClients
from memloop.optimize.config import EvolveConfig
from memloop.optimize.evolution import (
    Evolution,
    RunOutcome,
    Search,
    role_clients,
    run_episode_cadence,
)
from memloop.optimize.gepa_search import run_gepa
from memloop.optimize.period_cadence import run_period_cadence


def choose_search(config: EvolveConfig, evolver: str) -> Search:
    """GEPA is its own search; otherwise the config's cadence decides."""
    if evolver == "gepa":
        return run_gepa
    return run_period_cadence if config.cadence == "period" else run_episode_cadence


def run_evolve(
    config: EvolveConfig,
    *,
    progress: bool = True,
    clients: RoleClients | None = None,
    builder: Any = None,
) -> list[RunOutcome]:
    """Every condition of `config` in turn; `builder` replaces policies.build_policy (tests)."""
    clients = clients or role_clients(config.endpoints)
    outcomes = []
    for mode, evolver in config.conditions():
        print(f"== {config.experiment_name}: feedback={mode} evolver={evolver}", flush=True)
        outcomes.append(
            Evolution(
                config, mode, evolver, clients=clients, progress=progress, builder=builder
            ).run(choose_search(config, evolver))
        )
    return outcomes
