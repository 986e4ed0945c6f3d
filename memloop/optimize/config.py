"""Experiment YAML files for `memloop evolve` and `memloop tune`.

Pydantic models that reject unknown keys and wrong types with one line naming the file and key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from memloop.core.config import load_yaml_model
from memloop.core.credentials import store_url_problem
from memloop.core.errors import UserError
from memloop.core.files import safe_name, sqlite_file
from memloop.core.settings import DEFAULT_TRACKING_URI
from memloop.feedback.objective import DEFAULT_MODE, Mode, Objective
from memloop.feedback.probes import ProbeSettings

SPLITS = ("train", "val", "test")

DEFAULT_STORAGE = "sqlite:///mlruns/optuna.db"
"""Optuna's store when the tracking URI is not a sqlite file (relative to the working folder)."""


def no_stored_credentials(url: str) -> str:
    """`url` (a tracking URI or a storage URL), refused when it holds a credential."""
    problem = store_url_problem(url)
    if problem is not None:
        raise ValueError(problem)
    return url


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProceduralEnv(_Strict):
    """A procedural environment built on the fly (free, instant, reproducible)."""

    users: StrictInt = Field(4, ge=1, le=100_000)
    periods: StrictInt = Field(
        3, ge=1, le=1000, description="update periods (the item has periods + 1)"
    )
    questions: StrictInt = Field(3, ge=1, le=1000)
    states_per_question: StrictInt = Field(2, ge=1)
    choices_per_state: StrictInt = Field(2, ge=2)
    changes_per_period: StrictInt = Field(2, ge=1)
    seed: StrictInt = 0


class EnvSpec(_Strict):
    """Where the users come from and how they are split.

    The environment's users are taken in order: the first `train_users` are training users, the
    next `val_users` validation users, the next `test_users` test users; the rest are unused.
    - train: their episodes make the feedback the prompts evolve from;
    - val: every selection (the `best` prompt, GEPA's Pareto front, tuning's objective);
    - test: only evaluated, never selected on: the headline numbers.
    """

    path: str | None = Field(None, description="a data.json file, or hf://OWNER/NAME")
    procedural: ProceduralEnv | None = None
    train_users: StrictInt = Field(2, ge=0, description="users the evolver learns from")
    val_users: StrictInt = Field(1, ge=0, description="users every selection is made on")
    test_users: StrictInt = Field(
        1, ge=0, description="users that are only evaluated (the headline)"
    )
    confirm_users: StrictInt = Field(
        0,
        ge=0,
        description="fresh users after the test users that the loop never reads: the run's one "
        "pre-declared candidate is compared with the seed on them, once, and that decision is "
        "the run's verdict and its `best` (optimize/confirm.py)",
    )
    periods: StrictInt | None = Field(None, ge=1, description="evaluate only the first P periods")

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "heldout_users" in data:
            raise ValueError(
                "heldout_users was split in two: val_users (selection) and test_users "
                "(only evaluated, the headline)"
            )
        return data

    @model_validator(mode="after")
    def _one_source(self) -> EnvSpec:
        if (self.path is None) == (self.procedural is None):
            raise ValueError("give exactly one of path or procedural")
        return self

    def sizes(self) -> dict[str, int]:
        """{split: number of users} in SPLITS order, then `confirm` when there are any."""
        out = {"train": self.train_users, "val": self.val_users, "test": self.test_users}
        if self.confirm_users:
            out["confirm"] = self.confirm_users
        return out


class Endpoints(_Strict):
    """Endpoint YAML files per role; null = the embedded model."""

    agent: str | None = None
    user_sim: str | None = None
    checker: str | None = None
    optimizer: str | None = None


class Rounds(_Strict):
    init: StrictInt = Field(1, ge=1)
    update: StrictInt = Field(2, ge=1)


class EvolveConfig(_Strict):
    experiment: str | None = Field(None, description="MLflow experiment (default: file name)")
    environment: EnvSpec
    policy: str = Field(description="policy YAML, e.g. ../policies/awi.yaml")
    feedback_modes: list[Mode] = Field([DEFAULT_MODE], min_length=1)
    evolvers: list[str] = Field(
        ["reflective"],
        min_length=1,
        description="how the next prompts are proposed: none, reflective, playbook, a "
        "registered name, 'package.module:Class' or 'file.py:Class' (optimize/registry.py)",
    )
    search: str = Field(
        "episode",
        description="how cycles are made: episode, period, gepa, a registered name, "
        "'package.module:Class' or 'file.py:Class'",
    )
    settings: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="each optimizer's settings by name, e.g. {playbook: {candidates: 2}, gepa: "
        "{minibatch_size: 1}}; checked against its Settings model and recorded in the run "
        "identity",
    )
    cycles: StrictInt = Field(
        3,
        ge=1,
        le=1000,
        description="evolution cycles; with search: gepa, the evaluation budget instead: "
        "val + (cycles - 1) x (2 x minibatch_size + val) episode evaluations, one cycle per GEPA "
        "iteration, and an iteration whose candidate loses on its minibatch costs only "
        "2 x minibatch_size, so a GEPA run usually has more cycles than this (fix the budget "
        "with settings.gepa.max_metric_calls)",
    )
    objective: Objective | None = Field(
        None,
        description="what the prompt is selected on (validation users), GEPA scores candidates "
        "by and an evolver reverts on; default: state_accuracy when the agent is the embedded "
        "model (its multiple-choice step is too weak for the memory score to carry a signal), "
        "memory_score otherwise (feedback.objective.Objective.default_for)",
    )
    rounds: Rounds = Field(default_factory=Rounds)
    probes: ProbeSettings = Field(
        default_factory=ProbeSettings,
        description="how the state queries read memory (feedback/probes.py ProbeSettings)",
    )
    confirm_looks: Literal[1, 2] = Field(
        2,
        description="looks at the confirmation users: 2 stops at half of them when the effect "
        "is large (an exact two-look rule with alpha spending, core/stats.TwoLooks; used when "
        "half the users can reach its first level, 9 or more), 1 decides once on all of them",
    )
    null_control: bool = Field(
        False,
        description="with confirmation users: also score the seed again as if it were a "
        "candidate (a draw of its own when an endpoint samples, else the seed reworded) by the "
        "same rule; its verdict is printed beside the run's: the run's own noise floor",
    )
    endpoints: Endpoints = Field(default_factory=Endpoints)
    summary_max_questions: StrictInt = Field(
        12, ge=1, description="questions per feedback summary (wrong answers first)"
    )
    summary_max_chars: StrictInt = Field(
        12000,
        ge=200,
        description="feedback summary size budget (JSON characters), filled with whole users "
        "and questions; what does not fit is left out and recorded",
    )
    repeats: StrictInt = Field(
        1,
        ge=1,
        le=100,
        description="runs per condition, each with its own draws of the simulated user and the "
        "agent (needs temperature > 0 on their endpoints); compare shows the spread across them",
    )
    parallel_users: StrictInt = Field(2, ge=1, le=1024)
    seed: StrictInt = 0
    tracking_uri: str = DEFAULT_TRACKING_URI
    out_dir: str | None = Field(None, description="run folders (default: runs/evolve/<experiment>)")
    source: str | None = Field(None, exclude=True)

    @field_validator("tracking_uri")
    @classmethod
    def _no_credentials(cls, value: str) -> str:
        return no_stored_credentials(value)

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if "cadence" in data:
                raise ValueError(
                    f"cadence was renamed search (search: {data['cadence']}); a search is "
                    "episode, period, gepa or a registered name"
                )
            if "gepa" in (data.get("evolvers") or []):
                raise ValueError(
                    "GEPA is a search, not an evolver: write search: gepa (and drop evolvers)"
                )
            if "gepa" in data:  # the key GEPA's settings had before `settings:`
                data = dict(data)
                gepa = data.pop("gepa")
                settings = dict(data.get("settings") or {})
                if "gepa" in settings:
                    raise ValueError("give GEPA's settings once: settings.gepa or gepa, not both")
                settings["gepa"] = gepa
                data["settings"] = settings
        return data

    @model_validator(mode="after")
    def _needs_training(self) -> EvolveConfig:
        if not self.environment.train_users:
            raise ValueError(
                "environment.train_users: evolution needs at least one training user "
                "(their episodes make the feedback)"
            )
        if self.null_control and not self.environment.confirm_users:
            raise ValueError(
                "null_control: the null control is scored on the confirmation users; set "
                "environment.confirm_users (or give --confirm-users N)"
            )
        return self

    def conditions(self, evolves_itself: bool = False) -> list[tuple[str, str]]:
        """(feedback mode, evolver) runs; `none` feedback or evolver means no evolution.

        A search that `evolves_itself` (GEPA) has no evolver: its conditions are (mode, search).
        """
        evolvers = [self.search] if evolves_itself else self.evolvers
        seen, out = set(), []
        for mode in self.feedback_modes:
            for evolver in evolvers:
                evolves = Mode(mode).evolves and evolver != "none"
                key = (mode, evolver) if evolves else ("none", "none")
                if key not in seen:
                    seen.add(key)
                    out.append(key)
        return out

    @property
    def experiment_name(self) -> str:
        return self.experiment or (Path(self.source).stem if self.source else "memloop")

    @property
    def output_root(self) -> Path:
        # a name is never a path: `experiment: ../../x` stays a folder inside runs/evolve/
        return Path(self.out_dir or f"runs/evolve/{safe_name(self.experiment_name)}")


Choice = StrictBool | StrictInt | StrictFloat | StrictStr


class Range(_Strict):
    """A numeric range of a search space: ints when `low` and `high` are ints, else floats."""

    low: StrictInt | StrictFloat
    high: StrictInt | StrictFloat
    step: StrictInt | StrictFloat | None = Field(
        None, gt=0, description="spacing of the values (ints: default 1; floats: continuous)"
    )
    log: StrictBool = Field(False, description="sample on a log scale (low > 0, no step)")

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.high < self.low:
            raise ValueError(f"high {self.high} is below low {self.low}")
        if self.log and (self.low <= 0 or self.step is not None):
            raise ValueError("log: needs low > 0 and no step")
        if self.is_int and self.step is not None and not isinstance(self.step, int):
            raise ValueError("step: an int range takes an int step")
        return self

    @property
    def is_int(self) -> bool:
        return isinstance(self.low, int) and isinstance(self.high, int)

    @property
    def finite(self) -> bool:
        """A countable set of values (what the grid sampler can enumerate)."""
        return self.is_int or self.step is not None


# the paper's grid: AWE-(freq, ns, topk) with freq {2,4,8}, ns {0,4,8}, topk {10,30,50}
PAPER_GRID: dict[str, list[Choice]] = {
    "update_freq": [2, 4, 8],
    "short_term_len": [0, 4, 8],
    "top_k": [10, 30, 50],
}


class TuneConfig(_Strict):
    experiment: str | None = None
    study: str | None = Field(None, description="Optuna study name (default: file name)")
    environment: EnvSpec
    policy: str = Field(description="the policy YAML whose options are tuned (any type)")
    trials: StrictInt = Field(6, ge=1, le=100_000, description="trials to add per invocation")
    search_space: dict[str, list[Choice] | Range] | None = Field(
        None,
        description="option -> a list of choices, or {low, high, step, log}; an option is a key "
        "of the policy YAML (a plug-in's too), `a.b` for a key inside a mapping; "
        "default: the paper's AWE grid over update_freq, short_term_len and top_k",
    )
    default_trial: dict[str, Choice] | None = Field(
        None,
        description="the first trial's setting; default: the policy YAML's own values, when "
        "every one of them is in the search space",
    )
    sampler: Literal["grid", "tpe"] = Field(
        "grid",
        description="grid: each setting once, in random order (stops when all are done); "
        "tpe: Optuna's TPE, reseeded per run so a rerun continues the search",
    )
    objective: Objective | None = Field(
        None,
        description="what trials are ranked on, on the validation users; default as for "
        "evolve: state_accuracy with the embedded agent (measures memory without the "
        "multiple-choice step; always defined), memory_score otherwise",
    )
    minimize_tokens: bool = Field(False, description="second objective: tokens per user")
    confirm_looks: Literal[1, 2] = Field(
        2,
        description="looks at the confirmation users when the best trial is compared with the "
        "policy's defaults (as evolve's confirm_looks)",
    )
    heartbeat_s: StrictInt = Field(
        60, ge=1, description="trial heartbeat; a trial silent for 2x this is taken as dead"
    )
    rounds: Rounds = Field(default_factory=Rounds)
    probes: ProbeSettings = Field(
        default_factory=ProbeSettings,
        description="how the state queries read memory (feedback/probes.py ProbeSettings)",
    )
    endpoints: Endpoints = Field(default_factory=Endpoints)
    parallel_users: StrictInt = Field(2, ge=1, le=1024)
    seed: StrictInt = 0
    tracking_uri: str = DEFAULT_TRACKING_URI
    storage: str = Field(
        "",
        description="Optuna's study store; default: optuna.db beside a sqlite tracking_uri's "
        "store (sqlite:///mlruns/optuna.db beside the default one), else "
        "sqlite:///mlruns/optuna.db",
    )
    out_dir: str | None = None
    source: str | None = Field(None, exclude=True)

    @field_validator("tracking_uri", "storage")
    @classmethod
    def _no_credentials(cls, value: str) -> str:
        return no_stored_credentials(value)

    @model_validator(mode="after")
    def _storage_beside_the_tracking_store(self) -> TuneConfig:
        if not self.storage:
            self.storage = default_storage(self.tracking_uri)
        return self

    @property
    def experiment_name(self) -> str:
        return self.experiment or (Path(self.source).stem if self.source else "memloop-tune")

    @field_validator("search_space", mode="before")
    @classmethod
    def _ranges(cls, value: Any) -> Any:
        """A mapping is a Range, with its own message (not "Input should be a valid list")."""
        if not isinstance(value, dict):
            return value
        out = {}
        for key, spec in value.items():
            if isinstance(spec, dict):
                try:
                    spec = Range.model_validate(spec)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    where = ".".join(str(p) for p in err["loc"])
                    message = str(err["msg"]).removeprefix("Value error, ")
                    raise ValueError(f"{key}{'.' + where if where else ''}: {message}") from None
            out[key] = spec
        return out

    @model_validator(mode="after")
    def _tuning_splits(self) -> TuneConfig:
        env = self.environment
        if "train_users" not in env.model_fields_set:
            env.train_users = 0  # the EnvSpec default is for evolution
        if env.train_users:
            raise ValueError(
                "environment.train_users: tuning trains nothing; its objective is on val_users "
                "and the best trial is re-evaluated on test_users (set train_users: 0)"
            )
        if not env.val_users:
            raise ValueError("environment.val_users: tuning needs validation users (its objective)")
        space = self.space
        if not space:
            raise ValueError("search_space: no option to search (omit it for the paper's grid)")
        for key, choices in space.items():
            if isinstance(choices, list) and not choices:
                raise ValueError(f"search_space.{key}: no choice")
            if self.sampler == "grid" and isinstance(choices, Range) and not choices.finite:
                raise ValueError(
                    f"search_space.{key}: the grid sampler needs choices, an int range or a "
                    "step; give one, or use sampler: tpe"
                )
        if self.default_trial is not None and set(self.default_trial) != set(space):
            raise ValueError(f"default_trial: give a value for each of {', '.join(space)}")
        return self

    @property
    def space(self) -> dict[str, list[Choice] | Range]:
        """The search space in force (the paper's AWE grid when none is given)."""
        return dict(PAPER_GRID if self.search_space is None else self.search_space)

    @property
    def study_name(self) -> str:
        return self.study or self.experiment_name

    @property
    def output_root(self) -> Path:
        return Path(self.out_dir or f"runs/tune/{safe_name(self.study_name)}")


def default_storage(tracking_uri: str) -> str:
    """Tune's Optuna store when its YAML names none.

    optuna.db beside a sqlite tracking store, else DEFAULT_STORAGE; `memloop ui --study` looks
    for a study there too.
    """
    db = sqlite_file(tracking_uri, create_folder=False)
    if db is None or db.name == ":memory:":
        return DEFAULT_STORAGE
    return f"sqlite:///{db.parent / 'optuna.db'}"


def load_config(
    path: str | Path, cls: type[_Strict], overrides: dict[str, Any] | None = None
) -> Any:
    """Read an experiment YAML; the files it names follow the one rule (relative to its folder).

    `overrides`: command-line values in place of the YAML's (dotted keys for nested ones), None
    left out. With `environment.confirm_users` set so, a procedural environment too small for
    every split grows to fit (its users are generated; the confirmation users come last).
    """
    path = Path(path)
    config: Any = load_yaml_model(cls, path, path_keys=_PATH_KEYS, overrides=overrides)
    config.source = str(path)
    env = config.environment
    if (overrides or {}).get("environment.confirm_users") is not None and env.procedural:
        need = sum(env.sizes().values())
        if env.procedural.users < need:
            print(
                f"environment.procedural.users: {env.procedural.users} -> {need} (train, "
                "validation, test and confirmation users; the generated users come in that order)"
            )
            env.procedural.users = need
    named = [("policy", config.policy), ("environment.path", config.environment.path)]
    named += [(f"endpoints.{role}", ref) for role, ref in config.endpoints.model_dump().items()]
    for key, ref in named:
        if ref and "://" not in ref and not Path(ref).is_file():
            raise UserError(
                f"{path}: key '{key}': no such file {ref} (paths inside a YAML file "
                "are relative to that file's folder, else one memloop ships in "
                "memloop/experiments/ or its folders)"
            )
    return config


_PATH_KEYS = (
    "policy",
    "environment.path",
    "endpoints.agent",
    "endpoints.user_sim",
    "endpoints.checker",
    "endpoints.optimizer",
)
