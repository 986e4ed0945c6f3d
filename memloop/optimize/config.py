"""Experiment YAML files for `memloop evolve` and `memloop tune`.

Pydantic models that reject unknown keys and wrong types with one line naming the file and key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memloop.core.config import load_yaml_model
from memloop.core.errors import UserError
from memloop.feedback.summary import FeedbackMode

EvolverName = Literal["none", "reflective", "gepa"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProceduralEnv(_Strict):
    """A procedural environment built on the fly (free, instant, reproducible)."""

    users: int = Field(4, ge=1)
    periods: int = Field(3, ge=1, description="update periods (the item has periods + 1)")
    questions: int = Field(3, ge=1)
    states_per_question: int = Field(2, ge=1)
    choices_per_state: int = Field(2, ge=2)
    changes_per_period: int = Field(2, ge=1)
    seed: int = 0


class EnvSpec(_Strict):
    path: str | None = Field(None, description="a data.json file")
    procedural: ProceduralEnv | None = None
    train_users: int = Field(2, ge=1, description="users the evolver learns from")
    heldout_users: int = Field(0, ge=0, description="users that only evaluate a cycle's prompts")
    periods: int | None = Field(None, ge=1, description="evaluate only the first P periods")

    @model_validator(mode="after")
    def _one_source(self) -> EnvSpec:
        if (self.path is None) == (self.procedural is None):
            raise ValueError("give exactly one of path or procedural")
        return self


class Endpoints(_Strict):
    """Endpoint YAML files per role; null = the embedded model."""

    agent: str | None = None
    user_sim: str | None = None
    checker: str | None = None
    optimizer: str | None = None


class Rounds(_Strict):
    init: int = Field(1, ge=1)
    update: int = Field(2, ge=1)


class GepaSettings(_Strict):
    minibatch_size: int = Field(2, ge=1, description="training users per reflective step")
    max_metric_calls: int | None = Field(
        None,
        ge=1,
        description="episode evaluations budget; default: enough for the configured cycles",
    )


class EvolveConfig(_Strict):
    experiment: str | None = Field(None, description="MLflow experiment (default: file name)")
    environment: EnvSpec
    policy: str = Field(description="policy YAML, e.g. ../policies/awi.yaml")
    feedback_modes: list[FeedbackMode] = Field(["complete"], min_length=1)
    evolvers: list[EvolverName] = Field(["reflective"], min_length=1)
    cadence: Literal["episode", "period"] = "episode"
    cycles: int = Field(3, ge=1, description="evolution cycles (episode cadence)")
    rounds: Rounds = Field(default_factory=Rounds)
    endpoints: Endpoints = Field(default_factory=Endpoints)
    summary_max_questions: int = Field(
        12, ge=1, description="questions per feedback summary (wrong answers first)"
    )
    gepa: GepaSettings = Field(default_factory=GepaSettings)
    parallel_users: int = Field(2, ge=1)
    seed: int = 0
    tracking_uri: str = "sqlite:///mlruns/mlflow.db"
    out_dir: str | None = Field(None, description="run folders (default: runs/evolve/<experiment>)")
    source: str | None = Field(None, exclude=True)

    def conditions(self) -> list[tuple[str, str]]:
        """(feedback mode, evolver) runs; `none` feedback or evolver means no evolution."""
        seen, out = set(), []
        for mode in self.feedback_modes:
            for evolver in self.evolvers:
                key = ("none", "none") if "none" in (mode, evolver) else (mode, evolver)
                if key not in seen:
                    seen.add(key)
                    out.append(key)
        return out

    @property
    def experiment_name(self) -> str:
        return self.experiment or (Path(self.source).stem if self.source else "memloop")

    @property
    def output_root(self) -> Path:
        return Path(self.out_dir or f"runs/evolve/{self.experiment_name}")


class TuneConfig(_Strict):
    experiment: str | None = None
    study: str | None = Field(None, description="Optuna study name (default: file name)")
    environment: EnvSpec
    policy: str = Field(description="an AWE policy YAML, e.g. ../policies/awe.yaml")
    trials: int = Field(6, ge=1, description="trials to add per invocation")
    update_freq: list[int] = Field([1, 2, 4], min_length=1)
    short_term_len: list[int] = Field([0, 2, 4, 8], min_length=1)
    top_k: list[int] = Field([5, 10, 30], min_length=1)
    default_trial: dict[str, int] = Field(
        default_factory=lambda: {"update_freq": 2, "short_term_len": 4, "top_k": 30}
    )
    minimize_tokens: bool = Field(False, description="second objective: tokens per user")
    rounds: Rounds = Field(default_factory=Rounds)
    endpoints: Endpoints = Field(default_factory=Endpoints)
    parallel_users: int = Field(2, ge=1)
    seed: int = 0
    tracking_uri: str = "sqlite:///mlruns/mlflow.db"
    storage: str = "sqlite:///mlruns/optuna.db"
    out_dir: str | None = None
    source: str | None = Field(None, exclude=True)

    @property
    def experiment_name(self) -> str:
        return self.experiment or (Path(self.source).stem if self.source else "memloop-tune")

    @property
    def study_name(self) -> str:
        return self.study or self.experiment_name

    @property
    def output_root(self) -> Path:
        return Path(self.out_dir or f"runs/tune/{self.study_name}")


def load_config(path: str | Path, cls: type[_Strict]) -> Any:
    """Read an experiment YAML; the files it names follow the one rule (relative to its folder)."""
    path = Path(path)
    config = load_yaml_model(cls, path, path_keys=_PATH_KEYS)
    config.source = str(path)
    named = [("policy", config.policy), ("environment.path", config.environment.path)]
    named += [(f"endpoints.{role}", ref) for role, ref in config.endpoints.model_dump().items()]
    for key, ref in named:
        if ref and not Path(ref).is_file():
            raise UserError(
                f"{path}: key '{key}': no such file {ref} (paths inside a YAML file "
                "are relative to that file's folder)"
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
