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

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json, json_sha256, safe_name
from memloop.core.leaks import LeakCheck, Redactor
from memloop.environment.data import UserItem
from memloop.environment.simulator import SimulatorConfig
from memloop.feedback.evaluate import (
    EvaluationResult,
    EvaluationSettings,
    run_evaluation,
    run_evaluation_groups,
)
from memloop.feedback.objective import Mode, Objective
from memloop.feedback.records import QuestionRecord
from memloop.feedback.summary import FeedbackSummary, episode_summary
from memloop.llm.client import ChatClient
from memloop.llm.roles import RoleClients
from memloop.optimize import confirm, registry
from memloop.optimize.config import SPLITS, EnvSpec, EvolveConfig
from memloop.optimize.contract import Evolver, Search, settings_record
from memloop.optimize.replay_score import Screening
from memloop.runs import tracker
from memloop.runs.cycles import (
    CONFIRM_SPLIT,
    Confirmation,
    CycleRecord,
    Selection,
    select_cycle,
)
from memloop.runs.folder import open_run_folder
from memloop.runs.inputs import load_environment, load_policy, roles
from memloop.runs.recorder import EvolveRecord, recording
from memloop.runs.spec import RunSpec
from memloop.runs.store import CycleStore

# ---------------------------------------------------------------- inputs


def role_clients(endpoints: Any) -> RoleClients:
    return roles(endpoints.agent, endpoints.user_sim, endpoints.checker, endpoints.optimizer)


def split_users(
    items: list[UserItem], spec: EnvSpec, source: str | None = None
) -> dict[str, list[UserItem]]:
    """{split: users}: the environment's users in order, train then val then test.

    One-line UserError when the environment has fewer users, or fewer periods than
    `environment.periods` asks for.
    """
    sizes = spec.sizes()
    need = sum(sizes.values())
    if len(items) < need:
        asked = " + ".join(f"{k}_users {v}" for k, v in sizes.items())
        raise UserError(
            f"{source or 'config'}: key 'environment': {asked} = {need} users, but the "
            f"environment has {len(items)}"
        )
    have = min((item.num_periods for item in items), default=0)
    if spec.periods is not None and spec.periods > have:
        raise UserError(
            f"{source or 'config'}: key 'environment.periods': {spec.periods}, but the "
            f"environment's users have {have} periods (drop the key to run them all)"
        )
    out, start = {}, 0
    for split, size in sizes.items():  # SPLITS, then the confirmation users when there are any
        out[split] = items[start : start + size]
        start += size
    return out


def sim_config(config: Any) -> SimulatorConfig:
    """The user simulator's rounds of an evolve or tune config."""
    return SimulatorConfig(rounds_init=config.rounds.init, rounds_update=config.rounds.update)


def resolve_reads(config: Any, clients: RoleClients) -> tuple[Any, Objective, str | None]:
    """An evolve or tune config with its state read resolved, its objective, the JSON read's why.

    An unset `probes.state_read` is the letter read where the agent's endpoint returns
    log-probabilities (feedback/probes.py `probes_for`); an unset objective follows the read
    (state_prob with letters: `Objective.default_for`). The note is None unless the JSON read was
    chosen by default.
    """
    from memloop.feedback.probes import probes_for

    agent = clients.agent.endpoint
    probes, note = probes_for(config.probes, agent.returns_logprobs)
    if probes is not config.probes:
        config = config.model_copy(update={"probes": probes})
    letters = config.probes.state_read == "letters"
    objective = Objective.of(config.objective, agent.is_local, letters)
    # either way the run would rank every cycle on n/a: refused before its first request
    json_chosen = not letters and "state_read" in config.probes.model_fields_set
    if objective is Objective.STATE_PROB and json_chosen:
        raise UserError(
            "objective state_prob is the letter read's number, and the run's state reads are "
            "the JSON read: set probes: {state_read: letters}, or choose another objective "
            "(--objective state_accuracy or memory_score)"
        )
    if objective is Objective.STATE_PROB and not agent.returns_logprobs:
        raise UserError(
            "objective state_prob reads the agent's log-probabilities (probes: {state_read: "
            "letters}), and the agent's endpoint does not declare `logprobs: true`: if the "
            "server returns them, set it in the endpoint file (or give --logprobs with --model); "
            "else choose another objective (--objective state_accuracy or memory_score)"
        )
    return config, objective, note


def evaluation_settings(
    config: Any, progress: bool, run_users: list[UserItem]
) -> EvaluationSettings:
    """How an evolve or tune config's evaluations run.

    `run_users`: every user of the run; the checker is calibrated on all of them, the same for
    every evaluation of the run.
    """
    return EvaluationSettings(
        sim_config=sim_config(config),
        periods=config.environment.periods,
        max_users_in_parallel=config.parallel_users,
        progress=progress,
        plot=False,  # inner evaluations: their numbers go to MLflow and compare's figures
        probes=config.probes,
        calibration_users=tuple(run_users),
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
    confirmation: Confirmation | None = None  # the decision on the confirmation users

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
        search: Search,
        *,
        clients: RoleClients | None = None,
        progress: bool = True,
        builder: Any = None,
        environment: tuple[list[UserItem], dict[str, Any]] | None = None,
        repeat: int = 0,
    ):
        from memloop.policies import build_policy, policy_prompts

        self.config = config
        self.mode = Mode(mode)
        self.evolver_name = evolver
        self.search = search
        self.search_name = search.name
        self.repeat = repeat  # which draw of the condition (clients come drawn already)
        self.progress = progress
        # (items, description) as load_environment gives them, when the caller has them already
        items, self.env_desc = environment or load_environment(config.environment)
        self.users = split_users(items, config.environment, config.source)
        self.run_users = [i for split in self.users.values() for i in split]
        self.policy_config = load_policy(config.policy, config.tracking_uri, self.run_users)
        self._build_policy = builder or build_policy
        self.clients = clients or role_clients(config.endpoints)
        self.initial_prompts = policy_prompts(
            self.policy_config, self.clients.agent, self._build_policy
        )
        config, self.objective, self.read_note = resolve_reads(config, self.clients)
        self.config = config
        self.spec = RunSpec(
            kind="evolve",
            experiment=config.experiment_name,
            environment=self.env_desc,
            users={split: [i.id for i in items] for split, items in self.users.items()},
            policy=self.policy_config.model_dump(mode="json"),
            # the prompts a run starts from: edited default prompts are a new run
            prompts_sha256=json_sha256(self.initial_prompts),
            endpoints=self.clients.identity(),
            evaluation={
                "rounds": config.rounds.model_dump(),
                "periods": config.environment.periods,
                "summary": {
                    "max_questions": config.summary_max_questions,
                    "max_chars": config.summary_max_chars,
                },
                # only when set: the keys of runs with the default (JSON) read stay
                **({"probes": config.probes.spec()} if config.probes.spec() else {}),
            },
            mode=mode,
            objective=self.objective,
            optimizer={
                "evolver": settings_record(evolver, self.evolver_settings()),
                "search": settings_record(search.name, search.settings),
                # only with confirmation users: the keys of runs without them stay
                **(
                    {
                        "confirmation": {
                            "looks": config.confirm_looks,
                            "rule": confirm.candidate_rule(self),
                        }
                    }
                    if self.users.get(CONFIRM_SPLIT)
                    else {}
                ),
            },
            seed=config.seed,
            repeat=repeat,
        )
        self.check_setting_edits()
        self.key = self.spec.key()
        self.name = f"{self.policy_config.display_name}-{mode}-{evolver}"
        if search.name != "episode":
            self.name += f"-{search.name}"
        if repeat:
            self.name += f"-r{repeat}"
        # a policy's name is never a path: the folder stays inside output_root
        self.run_dir = config.output_root / f"{safe_name(self.name)}-{self.key[:8]}"
        self.store = CycleStore(self.run_dir)
        self.prompt_registry_name = tracker.prompt_name(config.experiment_name, self.name)

    def check_setting_edits(self) -> None:
        """Every value of the evolver's `setting_edits` is one the policy takes (one line)."""
        from memloop.policies.config import apply_params

        edits = getattr(self.evolver_settings(), "setting_edits", None) or {}
        for key, values in edits.items():
            for value in values:
                where = (
                    f"{self.config.source or 'config'}: key 'settings.{self.evolver_name}."
                    f"setting_edits.{key}' value {value!r}"
                )
                apply_params(self.policy_config, {key: value}, where)

    @property
    def train(self) -> list[UserItem]:
        return self.users["train"]

    @property
    def policy_name(self) -> str:
        return self.policy_config.display_name

    @functools.cached_property
    def private(self) -> frozenset[str]:
        """Every user's private values (all splits): no prompt of this run may name one."""
        return frozenset(
            v for items in self.users.values() for i in items for v in i.private_values()
        )

    @functools.cached_property
    def redactor(self) -> Redactor:
        """Every user's private values (all splits) as typed placeholders.

        The optimizer's feedback shows those, never a value (feedback/summary.py).
        """
        from memloop.feedback.summary import placeholders_of

        return placeholders_of(i for items in self.users.values() for i in items)

    @functools.cached_property
    def _leaks(self) -> LeakCheck:
        return LeakCheck(self.private)  # its values indexed once for the whole run

    def check_no_leak(self, record: CycleRecord) -> None:
        """Stop a run whose search yields a cycle whose prompts name a private value.

        The built-in searches propose through `contract.propose`, which rejects such a candidate
        first; this is the last gate before anything is logged or registered, for any search.
        """
        prompts = self.store.saved_prompts(record.cycle) or {}
        leaking = sorted(
            n for n, t in prompts.items() if self._leaks.names(t, self.initial_prompts.get(n, ""))
        )
        if leaking:
            raise UserError(
                f"search {self.search_name}: cycle {record.cycle}'s prompt for "
                f"{', '.join(leaking)} names a private value of the users; nothing of it was "
                "logged or registered (propose through memloop.optimize.contract.propose, which "
                "rejects such candidates)"
            )

    # -- evaluation ------------------------------------------------------------------------

    def factory(self, prompts: dict[str, str]):
        def make(user_id: str, workdir: Path, client: ChatClient):
            return self._build_policy(self.policy_config, client, workdir, prompts=prompts)

        return make

    def sim_config(self) -> SimulatorConfig:
        return sim_config(self.config)

    def _eval_options(self) -> dict[str, Any]:
        """run_evaluation's keywords for this run: its clients and evaluation settings."""
        return {
            "clients": self.clients,
            "settings": evaluation_settings(self.config, self.progress, self.run_users),
        }

    def evaluate(
        self, items: list[UserItem], prompts: dict[str, str], out: Path
    ) -> EvaluationResult:
        """Whole episodes of `items` under `prompts`, checkpointed under `out`."""
        ids = {item.id for item in items}
        split = next((s for s in SPLITS if ids <= {i.id for i in self.users[s]}), None)
        return run_evaluation(
            items,
            self.factory(prompts),
            out,
            **self._eval_options(),
            label=f"{self.condition_label} candidate",
            group=split,
        )

    def replay_screen(
        self, items: list[UserItem], prompts: dict[str, str], recording: Path, out: Path
    ) -> Screening:
        """State queries of `prompts` on `items`' recorded conversations (no new conversation)."""
        from memloop.optimize.replay_score import replay_screen

        return replay_screen(
            items,
            self.factory(prompts),
            self.clients.agent,
            recording,
            out,
            periods=self.config.environment.periods,
            parallel_users=self.config.parallel_users,
            probes=self.config.probes,
        )

    def evaluate_splits(
        self, prompts: dict[str, str], out: Path, splits: Iterable[str] = SPLITS
    ) -> dict[str, EvaluationResult]:
        """Whole episodes of every non-empty split in `splits`, all users in one pass."""
        groups = {s: self.users[s] for s in splits if self.users[s]}
        return run_evaluation_groups(
            groups,
            self.factory(prompts),
            out,
            **self._eval_options(),
            label=f"{self.condition_label} cycle {self._cycle_of(out)}",
        )

    @property
    def condition_label(self) -> str:
        """The condition in progress bars: `complete/playbook` (`... r1` for repeat 1)."""
        return f"{self.mode}/{self.evolver_name}" + (f" r{self.repeat}" if self.repeat else "")

    def _cycle_of(self, out: Path) -> int:
        """The cycle an evaluation in `out` belongs to.

        Its `cycle_NN` folder's, else the first cycle without a finished record (searches
        evaluate cycle k before yielding it).
        """
        name = Path(out).name
        if name.startswith("cycle_") and name[6:].isdigit():
            return int(name[6:])
        k = 0
        while self.store.record_file(k).is_file():
            k += 1
        return k

    def _base_dir(self) -> Path | None:
        return Path(self.config.source).parent if self.config.source else None

    def evolver_settings(self) -> Any:
        """The settings of this condition's evolver (GEPA's conditions: its search's own)."""
        if self.search.evolves_itself and self.evolver_name == self.search.name:
            return self.search.settings
        cls = registry.optimizer_class(self.evolver_name, "evolver", "evolvers", self._base_dir())
        return registry.settings(
            cls, self.config.settings.get(self.evolver_name), f"settings.{self.evolver_name}"
        )

    def make_evolver(self) -> Evolver:
        """This condition's evolver on the optimizer role (`none` when the mode shows nothing)."""
        name = self.evolver_name if Mode(self.mode).evolves else "none"
        return registry.build_evolver(
            name, self.clients.optimizer.fork(), self.config.settings.get(name), self._base_dir()
        )

    def summary(
        self,
        items: list[UserItem],
        records: list[QuestionRecord],
        *,
        max_chars: int | None = None,
        episodes: Iterable[Any] = (),
    ) -> FeedbackSummary:
        """The budgeted feedback summary of `items`' whole episodes in this condition's mode.

        With `episodes` (their EpisodeResults) it shows the named write failures of their state
        reads (feedback/write_failures.py).
        """
        from memloop.feedback.write_failures import episode_pairs, failure_block

        pairs = episode_pairs(items, episodes)
        return episode_summary(
            items,
            records,
            self.mode,
            max_questions=self.config.summary_max_questions,
            max_chars=max_chars or self.config.summary_max_chars,
            periods=self.config.environment.periods,
            private=self.private,
            failures=failure_block(pairs) if pairs else None,
            redactor=self.redactor,
        )

    # -- the run ---------------------------------------------------------------------------

    def run(self, cycles: Iterable[CycleRecord]) -> RunOutcome:
        """Open (or resume) the MLflow run, log every cycle of `cycles`, then select.

        `cycles` is a search's (lazy) `cycles(self)`: it starts once the run is open. The run
        folder is this process's meanwhile: a second live `evolve` of the same condition is
        refused in one line (core.files.run_folder_lock).
        """
        with open_run_folder(self.run_dir, self.spec, "memloop evolve", option="run folder"):
            return self._run(cycles)

    def _run(self, cycles: Iterable[CycleRecord]) -> RunOutcome:
        record = self.record()
        with recording(
            self.config.tracking_uri,
            self.config.experiment_name,
            self.spec,
            self.name,
            tags={
                "memloop.evolver": self.evolver_name,
                "memloop.search": self.search_name,
                "memloop.policy": self.policy_config.display_name,
                "memloop.prompt_name": self.prompt_registry_name,
            },
        ) as rec:
            outcome = RunOutcome(
                self.mode,
                self.evolver_name,
                self.search_name,
                rec.run_id,
                self.run_dir,
                resumed=rec.resumed,
                repeat=self.repeat,
            )
            atomic_write_json(
                self.run_dir / "run.json",
                {"run_id": rec.run_id, "key": self.key, "name": self.name},
            )
            versions: dict[int, int | None] = {}
            for cycle in cycles:
                self.check_no_leak(cycle)
                versions[cycle.cycle] = record.log_cycle(rec, cycle)
                outcome.cycles.append(cycle)
            outcome.confirmation = confirm.confirm(self, outcome.cycles)
            outcome.selection = select_cycle(outcome.cycles, self.objective, outcome.confirmation)
            record.close(rec, outcome.cycles, outcome.confirmation, outcome.selection, versions)
        return outcome

    def record(self) -> EvolveRecord:
        """How this condition's run is recorded in MLflow (runs/recorder.py)."""
        return EvolveRecord(
            name=self.name,
            mode=self.mode,
            evolver=self.evolver_name,
            search=self.search_name,
            policy=self.policy_config.display_name,
            objective=self.objective,
            users={s: [i.id for i in items] for s, items in self.users.items()},
            store=self.store,
            prompt_name=self.prompt_registry_name,
            seeded=bool(self.initial_prompts),
            run_dir=self.run_dir,
        )
