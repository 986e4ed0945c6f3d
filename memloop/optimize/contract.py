"""The optimizer contract: what every evolver and every search receives, declares and returns.

Two kinds of optimizer, one shape (in the spirit of DSPy's single `compile`):
- an **Evolver** proposes the next prompts of one step: `propose(EvolveInput) -> EvolveStep`;
- a **Search** turns a run into cycles: `cycles(ctx) -> Iterator[CycleRecord]`, asking an
  evolver for each proposal (GEPA's Pareto search asks its own, `gepa`, through the same input).

Each declares its settings as a pydantic model (`Settings`), read from the experiment YAML's
`settings: {<name>: {...}}` and recorded in the run's RunSpec, and is built the same way:
`Evolver(client, settings)`, `Search(settings)`. Every one is found by name in one registry
(optimize/registry.py). Every proposal goes through `propose` below, the one place a proposal
is made and checked, against the leak check (core/leaks.py) included.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from memloop.core.leaks import LeakCheck, Redactor, described
from memloop.feedback.summary import FeedbackSummary
from memloop.runs.cycles import CycleRecord, EvolveStep

if TYPE_CHECKING:
    from memloop.environment.data import UserItem
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import EvaluationResult
    from memloop.feedback.objective import Mode, Objective
    from memloop.feedback.records import QuestionRecord
    from memloop.llm.roles import RoleClients
    from memloop.optimize.config import EvolveConfig
    from memloop.optimize.replay_score import Screening
    from memloop.runs.store import CycleStore


class NoSettings(BaseModel):
    """The settings of an optimizer that has none."""

    model_config = ConfigDict(extra="forbid")


EVOLVER_MEMBERS = ("name", "Settings", "propose")  # on the class; its instances add `settings`
SEARCH_MEMBERS = ("name", "Settings", "needs_val", "evolves_itself", "cycles")

History = Sequence[tuple[dict[str, str], float | None]]


@dataclass(frozen=True)
class EvolveInput:
    """Everything an evolver may use for one proposal.

    - `prompts`: {predictor: instructions} now;
    - `summary`: the feedback (within its budget; `summary.fit(n)` for a smaller one);
    - `cycle`: the cycle (or period, or GEPA iteration) the proposal follows;
    - `history`: [(prompts, validation objective)] of the finished cycles, oldest first
      (empty where a search has none: the period search, GEPA);
    - `screen`: scores candidate prompts by replaying the training users' recorded
      conversations (optimize/replay_score.py), or None where a search cannot;
    - `rejected`: the edits earlier steps refused (their `EvolveStep.rejected`), oldest first:
      the tabu memory an evolver may read so that it never proposes one twice;
    - `leaks`: the leak check of this proposal, on the summary's private values (made here;
      an evolver may use it to drop a leaking rule early: `inputs.leaks.reject(text, old)`).
    """

    prompts: dict[str, str]
    summary: FeedbackSummary
    cycle: int = 0
    history: History = field(default_factory=tuple)
    screen: Callable[[dict[str, str]], Any] | None = None
    rejected: tuple[dict[str, Any], ...] = ()
    leaks: LeakCheck = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "leaks", LeakCheck(frozenset(self.summary.private)))


@runtime_checkable
class Evolver(Protocol):
    """Built as `Cls(client, settings)`; `client` is the optimizer role's model."""

    name: str
    # and a class attribute `Settings`: the settings model (checked by the registry)

    @property
    def settings(self) -> BaseModel:
        """This evolver's settings (a `Settings`)."""
        ...

    def propose(self, inputs: EvolveInput) -> EvolveStep: ...


class SearchContext(Protocol):
    """What a search may read and call of its run; optimize/context.py's RunContext meets it.

    Reading: the experiment's `config`, the role `clients`, the run's `store` (its folder is
    `store.run_dir`), the `users` of each split (`run_users`: all of them, in split order), the
    `initial_prompts`, the feedback `mode`, the selection `objective`, the users' `private`
    values (and the `redactor` that shows them to an optimizer as typed placeholders) and the
    `policy_name`. Calling: a policy `factory` for prompts, the simulator's `sim_config`,
    whole-episode evaluations (`evaluate`, `evaluate_splits`), a replay of recorded conversations
    (`replay_screen`), the feedback `summary` and the condition's evolver (`make_evolver`).
    """

    config: EvolveConfig
    clients: RoleClients
    store: CycleStore
    users: dict[str, list[UserItem]]
    run_users: list[UserItem]
    initial_prompts: dict[str, str]
    mode: Mode
    objective: Objective

    @property
    def private(self) -> frozenset[str]: ...

    @property
    def redactor(self) -> Redactor: ...

    @property
    def policy_name(self) -> str: ...

    def factory(self, prompts: dict[str, str]) -> Callable[..., Any]: ...

    def sim_config(self) -> SimulatorConfig: ...

    def evaluate(
        self, items: list[UserItem], prompts: dict[str, str], out: Path
    ) -> EvaluationResult: ...

    def evaluate_splits(
        self, prompts: dict[str, str], out: Path, splits: Iterable[str] = ...
    ) -> dict[str, EvaluationResult]: ...

    def replay_screen(
        self, items: list[UserItem], prompts: dict[str, str], recording: Path, out: Path
    ) -> Screening: ...

    def summary(
        self,
        items: list[UserItem],
        records: list[QuestionRecord],
        *,
        max_chars: int | None = None,
        episodes: Iterable[Any] = (),
    ) -> FeedbackSummary: ...

    def make_evolver(self) -> Evolver: ...


@runtime_checkable
class Search(Protocol):
    """Built as `Cls(settings)`; never logs, never selects (RunContext.run does both)."""

    name: str
    # and a class attribute `Settings`: the settings model (checked by the registry)

    @property
    def settings(self) -> BaseModel:
        """This search's settings (a `Settings`)."""
        ...

    needs_val: bool  # refuses to start without validation users
    evolves_itself: bool  # True: proposes with its own evolver (conditions are (mode, name))

    def cycles(self, ctx: SearchContext) -> Iterator[CycleRecord]:
        """Yield cycle 0, 1, ... in order, each saved in `ctx.store` before it is yielded.

        optimize/searches/base.py gives the whole call order.
        """
        ...


def builds_from_defaults(model: type[BaseModel]) -> bool:
    """Whether `model()` builds: a YAML without `settings:` for the optimizer must work."""
    try:
        model()
    except Exception:  # a required setting, or a model that is not one
        return False
    return True


def check_declaration(report: Any, optimizer: Any, members: tuple[str, ...], contract: str) -> bool:
    """The checks every optimizer's suite starts with, into `report` (a core.checks.CheckReport).

    Every member of the `contract`, a non-empty name, and settings that are a pydantic `Settings`
    model building from defaults. False when members are missing (nothing else can be checked).
    """
    expect = report.expect
    missing = [m for m in (*members, "settings") if not hasattr(optimizer, m)]
    if not expect(
        not missing,
        f"has every member of the {contract} contract",
        f"missing: {', '.join(missing)}",
    ):
        return False
    expect(
        isinstance(optimizer.name, str) and bool(optimizer.name),
        "name is a non-empty str",
        f"name is {optimizer.name!r}",
    )
    declared = optimizer.Settings
    expect(
        isinstance(declared, type)
        and issubclass(declared, BaseModel)
        and isinstance(optimizer.settings, declared)
        and builds_from_defaults(declared),
        "settings are a pydantic Settings model that builds from defaults",
        f"Settings is {declared!r}, settings {type(optimizer.settings).__name__}",
    )
    return True


def settings_record(name: str, settings: BaseModel) -> dict[str, Any]:
    """An optimizer's name and settings as the RunSpec records them."""
    return {"name": name, **settings.model_dump(mode="json")}


def propose(evolver: Evolver, inputs: EvolveInput) -> EvolveStep:
    """The one way a proposal is made: the evolver's step, checked against its input.

    A step holds the input's predictors, each non-empty text naming no private value of the users
    (core/leaks.py); what an evolver leaves out, empties or leaks keeps its old text, recorded
    as an error, and every leak is counted in `leaks_rejected` (with those the evolver's own use
    of `inputs.leaks` dropped). A prompt that names a private value is not screened either: the
    screen reports it undefined.
    """
    check = inputs.leaks
    if inputs.screen is not None:
        inputs = replace(inputs, screen=_guarded(inputs.screen, inputs.prompts, check))
        object.__setattr__(inputs, "leaks", check)  # one count for the screen and the step
    step = evolver.propose(inputs)
    if not isinstance(step, EvolveStep):
        raise TypeError(
            f"evolver {evolver.name}: propose returned {type(step).__name__}, not an EvolveStep"
        )
    prompts, errors = dict(inputs.prompts), dict(step.errors)
    for name, text in step.prompts.items():
        if name not in prompts:
            errors[name] = "not a predictor of this policy; dropped"
        elif not isinstance(text, str) or not text.strip():
            errors[name] = "empty proposal; kept the old one"
        elif hits := check.reject(text, prompts[name]):
            errors[name] = f"the proposal {described(hits)}; kept the old one"
        else:
            prompts[name] = text
    return step.model_copy(
        update={"prompts": prompts, "errors": errors, "leaks_rejected": check.rejected}
    )


def _guarded(
    screen: Callable[[dict[str, str]], Any], current: dict[str, str], check: LeakCheck
) -> Callable[[dict[str, str]], Any]:
    """`screen`, except that a candidate naming a private value is refused, not replayed."""
    from memloop.optimize.replay_score import Screening

    def guarded(candidate: dict[str, str], **options: Any) -> Any:
        if any(check.reject(t, current.get(n, "")) for n, t in candidate.items()):
            return Screening(state_accuracy=None, pairs=0, tokens=0, requests=0)
        return screen(candidate, **options)

    return guarded
