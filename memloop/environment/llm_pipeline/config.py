"""The knobs of the LLM generation pipeline (paper §3.1), loaded from YAML.

Paths are resolved against the file's folder. The `base` and `extra` configurations live in
experiments/env/*.yaml.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memloop.core.config import load_yaml_model, parse_model
from memloop.core.errors import UserError
from memloop.core.files import json_sha256
from memloop.llm.endpoint import Endpoint

BUILTIN_PERSONAS = Path(__file__).resolve().parents[1] / "personas" / "personas.jsonl"
"""The small persona file shipped with the repository (used when `personas` is not set)."""

# Knobs that change what is generated: an output folder holds one value of each, so a resumed
# run never mixes users made under different settings. `users`, `refine_budget`, `rounds_*`
# and the endpoint's transport settings may change between runs.
_FINGERPRINT_KEYS = (
    "questions",
    "periods",
    "months_per_period",
    "states_per_question",
    "choices_per_state",
    "changes_per_period",
    "max_changes_per_state",
    "min_state_variants",
    "max_states_per_utterance",
    "start_date",
    "seed",
    "temperature_high",
    "temperature_low",
    "temperature_check",
    "temperature_retry",
    "max_tokens",
    "exclude_ids",
)


class PipelineConfig(BaseModel):
    """One generation run's settings. Counts follow the paper's names (see base.yaml)."""

    model_config = ConfigDict(extra="forbid")

    users: int = Field(20, ge=1, le=100_000, description="simulated users to generate")
    questions: int = Field(10, ge=1, le=50, description="advice questions per user")
    periods: int = Field(10, ge=0, le=200, description="update periods after the initial state")
    months_per_period: int = Field(3, ge=1, le=24)
    states_per_question: int = Field(2, ge=1, le=5, description="required_info per question")
    choices_per_state: int = Field(3, ge=2, le=8, description="values per state variable")
    changes_per_period: int = Field(
        4, ge=1, le=20, description="target changes per period (K-1..K+1 accepted)"
    )
    max_changes_per_state: int = Field(
        3,
        ge=1,
        le=100,
        description="a variable changed this often is left alone "
        "while enough others can still change",
    )
    min_state_variants: int = Field(
        4, ge=2, le=20, description="minimum answer choices per question"
    )
    max_states_per_utterance: int = Field(
        2, ge=1, le=5, description="variables one initial opening message reveals"
    )
    rounds_init: int = Field(1, ge=1, le=50, description="simulator rounds per period-0 session")
    rounds_update: int = Field(2, ge=1, le=50, description="simulator rounds per later session")
    refine_budget: int = Field(
        5,
        ge=0,
        le=50,
        description="failed attempts (junk JSON, invalid content or a failed "
        "check) tolerated per unit of work before the user fails",
    )
    start_date: str = "2020-10-01"
    seed: int = 42
    personas: str | None = Field(
        None,
        description="JSONL or parquet persona file; default: the "
        "built-in environment/personas/personas.jsonl",
    )
    exclude_ids: list[str] = Field(default_factory=list, description="persona ids to skip")
    endpoint: str | dict[str, Any] | None = Field(
        None,
        description="an endpoint YAML file (relative to this file) or an inline mapping; "
        "default: the embedded local model",
    )
    temperature_high: float = Field(1.0, ge=0.0, le=2.0, description="questions and state updates")
    temperature_low: float = Field(0.2, ge=0.0, le=2.0, description="every other generation call")
    temperature_check: float = Field(0.0, ge=0.0, le=2.0, description="the checker calls")
    temperature_retry: float = Field(
        0.8,
        ge=0.0,
        le=2.0,
        description="at least this for re-asks and refinements, so a "
        "retry is a new draw, not a repeat",
    )
    max_tokens: int = Field(
        4096,
        ge=64,
        le=65_536,
        description="completion limit per call (each "
        "call also has its own cap, scaled to what it asks for)",
    )

    @field_validator("start_date")
    @classmethod
    def _is_date(cls, value: str) -> str:
        try:
            day = datetime.strptime(value, "%Y-%m-%d").date()
        except ValueError:
            raise ValueError(f"must be a date YYYY-MM-DD, got {value!r}") from None
        if not 1900 <= day.year <= 9000:
            raise ValueError("must be between the years 1900 and 9000")
        return value

    @model_validator(mode="after")
    def _variants_possible(self) -> PipelineConfig:
        if self.choices_per_state**self.states_per_question < 2:
            raise ValueError("choices_per_state ** states_per_question must allow 2 answer choices")
        return self

    def endpoint_config(self) -> Endpoint:
        """The generation endpoint: the file or mapping named by `endpoint`, else the default."""
        if self.endpoint is None:
            return Endpoint()
        if isinstance(self.endpoint, dict):
            return parse_model(Endpoint, self.endpoint, "endpoint")
        return Endpoint.from_yaml(self.endpoint)

    def persona_path(self) -> Path:
        return Path(self.personas) if self.personas else BUILTIN_PERSONAS

    def fingerprint(self, model_identity: str) -> dict[str, Any]:
        """What an output folder must agree on to be resumed (plus the model and persona source)."""
        data = {key: getattr(self, key) for key in _FINGERPRINT_KEYS}
        data["model"] = model_identity
        data["personas"] = str(self.persona_path().resolve())
        return data

    def fingerprint_hash(self, model_identity: str) -> str:
        return json_sha256(self.fingerprint(model_identity))[:16]


def load_config(path: str | Path, **overrides: Any) -> PipelineConfig:
    """Read a pipeline YAML file.

    `personas` / `endpoint` paths follow the one rule (relative to the file's folder). `overrides`
    (None values ignored) replace keys, e.g. users=1 from the command line; override paths are taken
    as given (relative to the working directory).
    """
    config = load_yaml_model(
        PipelineConfig, path, path_keys=("personas", "endpoint"), overrides=overrides
    )
    if config.personas is not None and not Path(config.personas).is_file():
        raise UserError(f"{path}: key 'personas': no such file {config.personas}")
    return config
