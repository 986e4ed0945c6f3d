"""Evolution cycles, logged to MLflow with step = cycle.

Episodes -> probes -> feedback summary (in the configured mode) -> evolver -> new prompts via
`with_prompts`.

Cadences:
- `episode`: a cycle evaluates the current prompts on the training users (whole episodes), builds
  one feedback summary from them, evaluates the same prompts on held-out users (so a gain is shown
  to generalise) and then evolves.
- `period` (the paper's Algorithm 1 as published): inside the episode, after each period's probes,
  the period's feedback evolves the prompts used from the next period on; memory is kept. Users
  advance in lockstep and share one prompt, so a cycle is a period (one user = Algorithm 1).

A run folder holds every cycle's prompts, summary and evaluation checkpoints, so a killed run,
started again, continues at the last finished cycle, repeats no finished model call and logs to
the same MLflow run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memloop.core.files import atomic_write_json, atomic_write_text, file_sha256, json_sha256
from memloop.environment.data import UserItem
from memloop.environment.datafile import load_items
from memloop.environment.simulator import SimulatorConfig
from memloop.feedback.evaluate import run_evaluation
from memloop.feedback.records import QuestionRecord
from memloop.feedback.report import collect
from memloop.feedback.summary import summarize
from memloop.llm.client import ChatClient
from memloop.llm.roles import RoleClients
from memloop.optimize import tracking
from memloop.optimize.config import EnvSpec, EvolveConfig
from memloop.optimize.evolvers import EvolveStep, make_evolver

CYCLE_METRICS = ("memory_score", "overall", "factual_recall", "write", "read", "utilization")


# ---------------------------------------------------------------- inputs


def load_environment(spec: EnvSpec) -> tuple[list[UserItem], dict[str, Any]]:
    """The items and a description for params and run keys.

    A data file is described by its path and sha256; a procedural environment by its arguments
    and the sha256 of the catalogue it draws from, so an edited catalogue is a new environment.
    """
    if spec.path:
        return load_items(spec.path), {"path": spec.path, "sha256": file_sha256(spec.path)}
    from memloop.environment.procedural import ProceduralSpec, generate_procedural

    assert spec.procedural is not None  # EnvSpec requires exactly one of path / procedural
    args = spec.procedural.model_dump()
    return generate_procedural(**args), {"procedural": ProceduralSpec(**args).describe()}


def role_clients(endpoints: Any) -> RoleClients:
    return RoleClients.from_files(
        endpoints.agent, endpoints.user_sim, endpoints.checker, endpoints.optimizer
    )


def split_users(items: list[UserItem], spec: EnvSpec) -> tuple[list[UserItem], list[UserItem]]:
    from memloop.core.errors import UserError

    need = spec.train_users + spec.heldout_users
    if len(items) < need:
        raise UserError(
            f"the environment has {len(items)} users; train_users + heldout_users = {need}"
        )
    return items[: spec.train_users], items[spec.train_users : need]


# ---------------------------------------------------------------- summaries and metrics


def latest_updates(item: UserItem, periods: int) -> dict[str, str]:
    """{variable: its value at the end} for every variable revealed in the first `periods`."""
    revealed = {v for p in range(periods) for exposed in item.exposed_values(p) for v in exposed}
    state = item.state_at(periods - 1)
    return {v: state[v] for v in sorted(revealed)}


def select_questions(records: list[QuestionRecord], mode: str, cap: int) -> list[QuestionRecord]:
    """At most `cap` records, the most useful first.

    Wrong answers first when the mode reveals correctness anyway, otherwise the latest periods
    first (so the selection leaks nothing).
    """
    if mode in ("complete", "diagnostic"):
        key = lambda r: (r.correct, -r.period, r.user_id, r.question_index)  # noqa: E731
    else:
        key = lambda r: (-r.period, r.user_id, r.question_index)  # noqa: E731
    return sorted(records, key=key)[:cap]


def episode_summary(
    items: list[UserItem], records: list[QuestionRecord], mode: str, cap: int, periods: int | None
) -> dict[str, Any]:
    if mode == "none":
        return {}
    users = []
    chosen = select_questions(records, mode, cap)
    for item in items:
        mine = [r for r in chosen if r.user_id == item.id]
        if not mine:
            continue
        n = min(periods or item.num_periods, item.num_periods)
        users.append(
            {"user": item.id, **summarize(mine, mode, latest_updates(item, n), all_records=records)}
        )
    return {"users": users}


def metric_row(metrics: dict[str, Any], prefix: str = "") -> dict[str, float | None]:
    """The CYCLE_METRICS of a metrics.json dict, each name with ``prefix``."""
    flat = {**metrics, **metrics["diagnosis"]}
    return {f"{prefix}{name}": flat[name] for name in CYCLE_METRICS}


# ---------------------------------------------------------------- the loop


@dataclass
class RunOutcome:
    mode: str
    evolver: str
    run_id: str
    run_dir: Path
    cycles: list[dict[str, Any]] = field(default_factory=list)
    resumed: bool = False


class Evolution:
    """One condition (policy, feedback mode, evolver) of an evolve config."""

    def __init__(
        self,
        config: EvolveConfig,
        mode: str,
        evolver: str,
        *,
        clients: RoleClients | None = None,
        progress: bool = True,
        builder: Any = None,
    ):
        from memloop.policies import build_policy, load_policy_config

        self.config = config
        self.mode = mode
        self.evolver_name = evolver
        self.progress = progress
        self.clients = clients or role_clients(config.endpoints)
        self.policy_config = load_policy_config(config.policy)
        self._build_policy = builder or build_policy
        items, self.env_desc = load_environment(config.environment)
        self.train, self.heldout = split_users(items, config.environment)
        probe = self._build_policy(self.policy_config, self.clients.agent, None)
        try:
            self.initial_prompts = probe.prompts()
        finally:
            probe.close()
        self.key = json_sha256(
            {
                "experiment": config.experiment_name,
                "env": self.env_desc,
                "train": [i.id for i in self.train],
                "heldout": [i.id for i in self.heldout],
                "policy": self.policy_config.model_dump(mode="json"),
                "mode": mode,
                "evolver": evolver,
                "cadence": config.cadence,
                "rounds": config.rounds.model_dump(),
                "periods": config.environment.periods,
                "endpoints": self.clients.public(),
                "summary_max_questions": config.summary_max_questions,
                "seed": config.seed,
                "gepa": config.gepa.model_dump() if evolver == "gepa" else None,
            }
        )
        self.name = f"{self.policy_config.display_name}-{mode}-{evolver}"
        self.run_dir = config.output_root / f"{self.name}-{self.key[:8]}"
        self.prompt_registry_name = tracking.prompt_name(config.experiment_name, self.name)

    # -- shared pieces ---------------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        from memloop.optimize.spec import git_revision, versions

        return {
            "config": self.config.model_dump(mode="json", exclude={"source"}),
            "condition": {
                "feedback_mode": self.mode,
                "evolver": self.evolver_name,
                "policy": self.policy_config.display_name,
            },
            "policy_config": self.policy_config.model_dump(mode="json"),
            "data": self.env_desc,
            "models": {r: e["model"] for r, e in self.clients.public().items()},
            "seed": self.config.seed,
            "git_revision": git_revision(),
            "versions": versions(),
        }

    def factory(self, prompts: dict[str, str]):
        def make(user_id: str, workdir: Path, client: ChatClient):
            return self._build_policy(self.policy_config, client, workdir, prompts=prompts)

        return make

    def _eval_options(self) -> dict[str, Any]:
        return dict(
            agent_client=self.clients.agent,
            sim_client=self.clients.user_sim,
            checker_client=self.clients.checker,
            sim_config=SimulatorConfig(
                rounds_init=self.config.rounds.init, rounds_update=self.config.rounds.update
            ),
            periods=self.config.environment.periods,
            max_users_in_parallel=self.config.parallel_users,
            progress=self.progress,
        )

    def evaluate(self, items: list[UserItem], prompts: dict[str, str], out: Path):
        return run_evaluation(items, self.factory(prompts), out, **self._eval_options())

    def evaluate_groups(
        self, groups: dict[str, list[UserItem]], prompts: dict[str, str], out: Path
    ):
        """Training and held-out users in one pass (their users run concurrently)."""
        from memloop.feedback.evaluate import run_evaluation_groups

        return run_evaluation_groups(groups, self.factory(prompts), out, **self._eval_options())

    # -- episode cadence -------------------------------------------------------------------

    def run(self, search: Search) -> RunOutcome:
        """Open (or resume) the MLflow run and let ``search`` produce the cycles."""
        mlc = tracking.client(self.config.tracking_uri)
        exp = tracking.experiment_id(mlc, self.config.experiment_name, self.config.tracking_uri)
        run_id, resumed = tracking.open_run(
            mlc,
            exp,
            self.key,
            self.name,
            self.params(),
            tags={
                "memloop.feedback_mode": self.mode,
                "memloop.evolver": self.evolver_name,
                "memloop.policy": self.policy_config.display_name,
                "memloop.cadence": self.config.cadence,
                "memloop.prompt_name": self.prompt_registry_name,
            },
        )
        outcome = RunOutcome(self.mode, self.evolver_name, run_id, self.run_dir, resumed=resumed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            self.run_dir / "run.json", {"run_id": run_id, "key": self.key, "name": self.name}
        )
        try:
            cycles = search(self, mlc, run_id)
        except BaseException:
            tracking.finish_run(mlc, run_id, "KILLED")
            raise
        outcome.cycles = cycles
        self.mark_best(mlc, cycles)
        tracking.finish_run(mlc, run_id)
        return outcome

    def _episode_cycles(self, mlc, run_id: str) -> list[dict[str, Any]]:
        evolver = make_evolver(
            self.evolver_name if self.mode != "none" else "none", self.clients.optimizer.fork()
        )
        prompts = self.initial_prompts
        cycles = []
        for k in range(self.config.cycles):
            cdir = self.run_dir / f"cycle_{k:02d}"
            prompts = self._cycle_prompts(cdir, prompts)
            done = cdir / "done.json"
            if done.is_file():
                row = json.loads(done.read_text())
            else:
                started = time.perf_counter()
                results = self.evaluate_groups(
                    {"train": self.train, "heldout": self.heldout}, prompts, cdir
                )
                train, held = results["train"], results.get("heldout")
                records, _ = collect(r for e in train.episodes for r in e.records)
                summary = episode_summary(
                    self.train,
                    records,
                    self.mode,
                    self.config.summary_max_questions,
                    self.config.environment.periods,
                )
                atomic_write_json(cdir / "summary.json", summary)
                main = held.metrics if held else train.metrics
                row = {
                    "cycle": k,
                    **metric_row(main),
                    **metric_row(train.metrics, "train_"),
                    "per_user": main["per_user"],
                    "tokens": _tokens(train.metrics, held.metrics if held else None),
                    "seconds": round(time.perf_counter() - started, 1),
                }
                atomic_write_json(done, row)
            evolve_file = cdir / "evolve.json"
            # no wasted evolution after the last cycle; a run extended with more cycles evolves
            # its formerly last cycle's prompt here
            if k + 1 < self.config.cycles and not evolve_file.is_file():
                summary = json.loads((cdir / "summary.json").read_text())
                before = _evolver_tokens(evolver)
                step = evolver.propose(prompts, summary, cycle=k)
                atomic_write_text(evolve_file, step.model_dump_json(indent=1))
                row["tokens"]["optimizer"] = _evolver_tokens(evolver) - before
                atomic_write_json(done, row)
            self.log_cycle(mlc, run_id, k, row, prompts, cdir)
            cycles.append(row)
            if evolve_file.is_file():
                prompts = EvolveStep.model_validate_json(evolve_file.read_text()).prompts
        return cycles

    def _cycle_prompts(self, cdir: Path, proposed: dict[str, str]) -> dict[str, str]:
        path = cdir / "prompts.json"
        if path.is_file():
            return json.loads(path.read_text())
        cdir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, proposed)
        return proposed

    # -- logging ---------------------------------------------------------------------------

    def log_cycle(
        self, mlc, run_id: str, k: int, row: dict[str, Any], prompts: dict[str, str], cdir: Path
    ) -> None:
        metrics = {
            key: row.get(key)
            for key in row
            if key not in ("cycle", "tokens", "seconds", "prompt_version")
            and not isinstance(row[key], dict)
        }
        metrics.update({f"tokens_{c}": float(v) for c, v in row.get("tokens", {}).items()})
        tracking.log_metrics(mlc, run_id, metrics, step=k)
        tracking.log_text(
            mlc,
            run_id,
            json.dumps(prompts, indent=1, ensure_ascii=False),
            f"prompts/cycle_{k:02d}.json",
        )
        tracking.log_text(
            mlc,
            run_id,
            json.dumps(row.get("per_user", {}), indent=1),
            f"per_user/cycle_{k:02d}.json",
        )
        for name in ("summary.json", "evolve.json"):
            if (cdir / name).is_file():
                tracking.log_text(
                    mlc,
                    run_id,
                    (cdir / name).read_text(),
                    f"{name.split('.')[0]}/cycle_{k:02d}.json",
                )
        if prompts:
            row["prompt_version"] = tracking.register_prompt(
                mlc,
                self.prompt_registry_name,
                prompts,
                cycle=k,
                run_id=run_id,
                score=row.get("memory_score"),
            )

    def mark_best(self, mlc, cycles: list[dict[str, Any]]) -> None:
        scored = [
            c for c in cycles if c.get("prompt_version") and c.get("memory_score") is not None
        ]
        if scored:
            best = max(scored, key=lambda c: (c["memory_score"], -c["cycle"]))
            tracking.set_best(mlc, self.prompt_registry_name, best["prompt_version"])


def _tokens(*metrics: dict[str, Any] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in metrics:
        for k, v in (m or {}).get("usage", {}).items():
            out[k] = out.get(k, 0) + v
    return out


def _evolver_tokens(evolver: Any) -> int:
    client = getattr(evolver, "client", None)
    if client is None:
        return 0
    used = client.usage.component("optimizer")
    return used.total_tokens


# (evolution, MLflow client, run id) -> the cycle rows; chosen per condition in optimize/evolve.py
Search = Callable[[Evolution, Any, str], list[dict[str, Any]]]


def run_episode_cadence(evo: Evolution, mlc: Any, run_id: str) -> list[dict[str, Any]]:
    """Episode cadence: each cycle runs whole episodes, then evolves once."""
    return evo._episode_cycles(mlc, run_id)
