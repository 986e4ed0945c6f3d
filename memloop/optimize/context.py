"""The run context of one evolution condition.

It holds the config, clients, users per split, run identity, evaluation, and the MLflow logging
of the cycles a search yields.

`RunContext.run(search.cycles(ctx))` opens (or resumes) the condition's MLflow run, logs every
`CycleRecord` the search yields (metrics `<split>_<metric>` at step = cycle, prompts and
summaries as artifacts, each cycle's prompt as a registry version), then makes the one selection
(`select_cycle`, on validation users) and points the registry alias `best` at it. Searches never
log and never select; this module imports no search.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, file_sha256, json_sha256, run_folder_lock
from memloop.environment.catalogue import catalogue_sha256
from memloop.environment.data import UserItem
from memloop.environment.datafile import load_items, local_path
from memloop.environment.simulator import SimulatorConfig
from memloop.feedback.evaluate import EvaluationResult, run_evaluation, run_evaluation_groups
from memloop.feedback.records import SCORER_VERSION, QuestionRecord
from memloop.feedback.summary import SummaryReport, episode_summary
from memloop.llm.client import ChatClient
from memloop.llm.roles import RoleClients
from memloop.optimize import tracking
from memloop.optimize.config import SPLITS, EnvSpec, EvolveConfig
from memloop.optimize.cycles import CYCLE_METRICS, CycleRecord, Selection, SplitResult, select_cycle
from memloop.optimize.evolver_registry import make_evolver
from memloop.optimize.evolvers import Evolver
from memloop.optimize.store import CycleStore

# ---------------------------------------------------------------- inputs


def load_environment(spec: EnvSpec) -> tuple[list[UserItem], dict[str, Any]]:
    """The items and a description for params and run keys.

    A data file is described by its path and sha256; a procedural environment by its arguments
    and the sha256 of the catalogue it draws from, so an edited catalogue is a new environment.
    """
    if spec.path:
        local = local_path(spec.path)  # an hf:// reference: its file in the Hugging Face cache
        return load_items(local), {"path": spec.path, "sha256": file_sha256(local)}
    from memloop.environment.procedural import ProceduralSpec, generate_procedural

    assert spec.procedural is not None  # EnvSpec requires exactly one of path / procedural
    args = spec.procedural.model_dump()
    return generate_procedural(**args), {"procedural": ProceduralSpec(**args).describe()}


def load_policy(path: str | Path) -> Any:
    """A policy YAML's config; a plug-in's class must have every method of the Policy contract.

    The full conformance suite is `memloop policy check`; this refuses, in one line and before
    anything runs, a class that cannot be one.
    """
    from memloop.environment.policy_check import missing_members
    from memloop.policies import PluginConfig, load_policy_config, registry

    config = load_policy_config(path)
    if isinstance(config, PluginConfig):
        cls = registry.plugin_class(config)
        missing = missing_members(cls)
        if missing:
            raise UserError(
                f"{path}: key 'type': {cls.__name__} does not meet the Policy contract: it has no "
                f"{', '.join(missing)} (memloop policy check {path} lists every promise)"
            )
    return config


def role_clients(endpoints: Any) -> RoleClients:
    return RoleClients.from_files(
        endpoints.agent, endpoints.user_sim, endpoints.checker, endpoints.optimizer
    )


def split_users(
    items: list[UserItem], spec: EnvSpec, source: str | None = None
) -> dict[str, list[UserItem]]:
    """{split: users}: the environment's users in order, train then val then test."""
    sizes = spec.sizes()
    need = sum(sizes.values())
    if len(items) < need:
        asked = " + ".join(f"{k}_users {v}" for k, v in sizes.items())
        raise UserError(
            f"{source or 'config'}: key 'environment': {asked} = {need} users, but the "
            f"environment has {len(items)}"
        )
    out, start = {}, 0
    for split in SPLITS:
        out[split] = items[start : start + sizes[split]]
        start += sizes[split]
    return out


def sim_config(config: Any) -> SimulatorConfig:
    """The user simulator's rounds of an evolve or tune config."""
    return SimulatorConfig(rounds_init=config.rounds.init, rounds_update=config.rounds.update)


def evaluation_options(config: Any, clients: RoleClients, progress: bool) -> dict[str, Any]:
    """run_evaluation's keyword arguments for an evolve or tune config."""
    return dict(
        agent_client=clients.agent,
        sim_client=clients.user_sim,
        checker_client=clients.checker,
        sim_config=sim_config(config),
        periods=config.environment.periods,
        max_users_in_parallel=config.parallel_users,
        progress=progress,
    )


# ---------------------------------------------------------------- outcome


@dataclass
class RunOutcome:
    mode: str
    evolver: str
    search: str
    run_id: str
    run_dir: Path
    cycles: list[CycleRecord] = field(default_factory=list)
    selection: Selection | None = None
    resumed: bool = False
    repeat: int = 0

    @property
    def headline(self) -> float | None:
        """The test memory score of the selected cycle's prompts."""
        if self.selection is None:
            return None
        return self.cycles[self.selection.cycle].score("test")


# ---------------------------------------------------------------- the context


class RunContext:
    """One condition (policy, feedback mode, evolver, search) of an evolve config."""

    def __init__(
        self,
        config: EvolveConfig,
        mode: str,
        evolver: str,
        search: str,
        search_spec: dict[str, Any],
        *,
        clients: RoleClients | None = None,
        progress: bool = True,
        builder: Any = None,
        environment: tuple[list[UserItem], dict[str, Any]] | None = None,
        repeat: int = 0,
    ):
        from memloop.policies import build_policy, policy_prompts

        self.config = config
        self.mode = mode
        self.evolver_name = evolver
        self.search_name = search
        self.search_spec = search_spec
        self.repeat = repeat  # which draw of the condition (clients come drawn already)
        self.progress = progress
        self.policy_config = load_policy(config.policy)
        self._build_policy = builder or build_policy
        # (items, description) as load_environment gives them, when the caller has them already
        items, self.env_desc = environment or load_environment(config.environment)
        self.users = split_users(items, config.environment, config.source)
        self.clients = clients or role_clients(config.endpoints)
        self.initial_prompts = policy_prompts(
            self.policy_config, self.clients.agent, self._build_policy
        )
        self.objective = config.objective or (
            "state_accuracy" if self.clients.agent.endpoint.is_local else "memory_score"
        )
        self.key = json_sha256(self.identity())
        self.name = f"{self.policy_config.display_name}-{mode}-{evolver}"
        if search != "episode":
            self.name += f"-{search}"
        if repeat:
            self.name += f"-r{repeat}"
        self.run_dir = config.output_root / f"{self.name}-{self.key[:8]}"
        self.store = CycleStore(self.run_dir)
        self.prompt_registry_name = tracking.prompt_name(config.experiment_name, self.name)

    @property
    def train(self) -> list[UserItem]:
        return self.users["train"]

    # -- identity --------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """Everything that defines this condition's numbers; its hash is the run key."""
        config = self.config
        return {
            "experiment": config.experiment_name,
            "env": self.env_desc,
            "users": {split: [i.id for i in items] for split, items in self.users.items()},
            "policy": self.policy_config.model_dump(mode="json"),
            # the prompts a run starts from: edited default prompts are a new run
            "initial_prompts_sha256": json_sha256(self.initial_prompts),
            "mode": self.mode,
            "evolver": self.evolver_name,
            "search": self.search_spec,
            "rounds": config.rounds.model_dump(),
            "periods": config.environment.periods,
            "endpoints": self.clients.public(),
            "summary": {
                "max_questions": config.summary_max_questions,
                "max_chars": config.summary_max_chars,
            },
            "seed": config.seed,
            "scorer_version": SCORER_VERSION,
            "catalogue_sha256": catalogue_sha256(),
            # repeat 0 keeps the key of a run without repeats: adding repeats later reuses it
            **({"repeat": self.repeat} if self.repeat else {}),
            # the memory score was the only objective once: those runs keep their keys
            **({"objective": self.objective} if self.objective != "memory_score" else {}),
        }

    def params(self) -> dict[str, Any]:
        from memloop.optimize.spec import git_revision, versions

        sizes = {f"{s}_users": len(items) for s, items in self.users.items()}
        return {
            "config": self.config.model_dump(mode="json", exclude={"source"}),
            "condition": {
                "feedback_mode": self.mode,
                "evolver": self.evolver_name,
                "search": self.search_name,
                "policy": self.policy_config.display_name,
                "repeat": self.repeat,
                "objective": self.objective,
            },
            "search_spec": self.search_spec,
            "policy_config": self.policy_config.model_dump(mode="json"),
            "data": self.env_desc,
            "splits": sizes,
            "models": {r: e["model"] for r, e in self.clients.public().items()},
            "seed": self.config.seed,
            "scorer_version": SCORER_VERSION,
            "catalogue_sha256": catalogue_sha256(),
            "git_revision": git_revision(),
            "versions": versions(),
        }

    # -- evaluation ------------------------------------------------------------------------

    def factory(self, prompts: dict[str, str]):
        def make(user_id: str, workdir: Path, client: ChatClient):
            return self._build_policy(self.policy_config, client, workdir, prompts=prompts)

        return make

    def sim_config(self) -> SimulatorConfig:
        return sim_config(self.config)

    def _eval_options(self) -> dict[str, Any]:
        return evaluation_options(self.config, self.clients, self.progress)

    def evaluate(
        self, items: list[UserItem], prompts: dict[str, str], out: Path
    ) -> EvaluationResult:
        """Whole episodes of `items` under `prompts`, checkpointed under `out`."""
        return run_evaluation(items, self.factory(prompts), out, **self._eval_options())

    def evaluate_splits(
        self, prompts: dict[str, str], out: Path, splits: Iterable[str] = SPLITS
    ) -> dict[str, EvaluationResult]:
        """Whole episodes of every non-empty split in `splits`, all users in one pass."""
        groups = {s: self.users[s] for s in splits if self.users[s]}
        return run_evaluation_groups(groups, self.factory(prompts), out, **self._eval_options())

    def make_evolver(self) -> Evolver:
        name = self.evolver_name if self.mode != "none" else "none"
        return make_evolver(name, self.clients.optimizer.fork())

    def summary(
        self, items: list[UserItem], records: list[QuestionRecord], *, max_chars: int | None = None
    ) -> tuple[dict[str, Any], SummaryReport]:
        """The budgeted feedback summary of `items`' whole episodes in this condition's mode."""
        return episode_summary(
            items,
            records,
            self.mode,
            max_questions=self.config.summary_max_questions,
            max_chars=max_chars or self.config.summary_max_chars,
            periods=self.config.environment.periods,
        )

    # -- the run ---------------------------------------------------------------------------

    def run(self, cycles: Iterable[CycleRecord]) -> RunOutcome:
        """Open (or resume) the MLflow run, log every cycle of `cycles`, then select.

        `cycles` is a search's (lazy) `cycles(self)`: it starts once the run is open. The run
        folder is this process's meanwhile: a second live `evolve` of the same condition is
        refused in one line (core.files.run_folder_lock).
        """
        with run_folder_lock(self.run_dir, "memloop evolve"):
            return self._run(cycles)

    def _run(self, cycles: Iterable[CycleRecord]) -> RunOutcome:
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
                "memloop.search": self.search_name,
                "memloop.policy": self.policy_config.display_name,
                "memloop.prompt_name": self.prompt_registry_name,
                "memloop.repeat": str(self.repeat),
                "memloop.objective": self.objective,
            },
        )
        outcome = RunOutcome(
            self.mode,
            self.evolver_name,
            self.search_name,
            run_id,
            self.run_dir,
            resumed=resumed,
            repeat=self.repeat,
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            self.run_dir / "run.json", {"run_id": run_id, "key": self.key, "name": self.name}
        )
        versions: dict[int, int | None] = {}
        try:
            for record in cycles:
                versions[record.cycle] = self.log_cycle(mlc, run_id, record)
                outcome.cycles.append(record)
        except BaseException:
            tracking.finish_run(mlc, run_id, "KILLED")
            raise
        outcome.selection = select_cycle(outcome.cycles, self.objective)
        self.log_selection(mlc, run_id, outcome, versions)
        tracking.finish_run(mlc, run_id)
        return outcome

    def log_cycle(self, mlc: Any, run_id: str, record: CycleRecord) -> int | None:
        """Metrics, artifacts and the registry version of one cycle.

        Returns the version, or None when the search recorded no prompts for the cycle.
        """
        k = record.cycle
        tracking.log_metrics(mlc, run_id, record.metrics(), step=k)
        for folder, text in self.store.artifacts(k).items():
            tracking.log_text(mlc, run_id, text, f"{folder}/cycle_{k:02d}.json")
        prompts = self.store.saved_prompts(k)
        if prompts is None:
            return None
        return tracking.register_prompt(
            mlc,
            self.prompt_registry_name,
            prompts,
            cycle=k,
            run_id=run_id,
            score=record.score("val", self.objective),
            objective=self.objective,
        )

    def log_selection(
        self, mlc: Any, run_id: str, outcome: RunOutcome, versions: dict[int, int | None]
    ) -> None:
        """The selected cycle: alias `best`, and `selected_cycle` / `headline_*` metrics."""
        chosen = outcome.selection
        if chosen is None:
            return
        version = versions.get(chosen.cycle)
        if self.initial_prompts and version is not None:
            tracking.set_best(mlc, self.prompt_registry_name, version)
        record = outcome.cycles[chosen.cycle]
        step = len(outcome.cycles) - 1
        metrics: dict[str, float | None] = {"selected_cycle": float(chosen.cycle)}
        if "test" in record.splits:
            metrics.update(
                {f"headline_test_{m}": record.score("test", m) for m in (*CYCLE_METRICS, "users")}
            )
        tracking.log_metrics(mlc, run_id, metrics, step=step)
        mlc.set_tag(run_id, "memloop.selection", f"cycle {chosen.cycle}: {chosen.rule}")


def split_results(results: dict[str, EvaluationResult]) -> dict[str, SplitResult]:
    return {s: SplitResult.from_metrics(r.metrics) for s, r in results.items()}


def usage_tokens(results: Iterable[EvaluationResult]) -> dict[str, int]:
    """Tokens per component summed over evaluations."""
    out: dict[str, int] = {}
    for result in results:
        for k, v in result.metrics.get("usage", {}).items():
            out[k] = out.get(k, 0) + v
    return out
