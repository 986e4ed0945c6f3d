"""Endpoint: where and how to reach a chat model.

Holds the *name* of the key variable, never a key.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from memloop.core.config import KeyProblem, load_yaml_mapping, parse_model
from memloop.core.credentials import (
    KEY_HINT,
    secret_path,
    url_problem,
)
from memloop.core.errors import UserError
from memloop.llm.errors import MissingApiKey

LOCAL = "local"
MILLION = 1_000_000
RESULT_SETTINGS = ("model", "base_url", "temperature", "max_tokens", "context_window")
MAX_TIMEOUT_S = 86_400  # a day per request
MAX_PRICE = 10_000  # US dollars per million tokens

# The request fields memloop sets itself (client.ChatClient.chat and _send): extra_body is merged
# into the request last, so one of these there would silently replace memloop's value.
OWN_REQUEST_FIELDS = {
    "model": "use the endpoint's `model:` field",
    "temperature": "use the endpoint's `temperature:` field",
    "max_tokens": "use the endpoint's `max_tokens:` field",
    "messages": "set by memloop per request (the conversation)",
    "response_format": "set by memloop per request (the JSON schema of a structured answer)",
    "seed": "set by memloop per request (each sampled draw's own seed)",
    "stop": "set by memloop per request",
    "stream": "set by memloop per request (memloop reads whole answers)",
    "n": "set by memloop per request (one answer per request)",
    "logprobs": "set by memloop per request (the letter read asks for log-probabilities)",
    "top_logprobs": "set by memloop per request (the letter read asks for 20 alternatives)",
    # servers' own structured-output fields: each would replace memloop's JSON-schema constraint
    "grammar": "replaces memloop's JSON-schema constraint (response_format)",
    "json_schema": "replaces memloop's JSON-schema constraint (response_format)",
    "guided_json": "replaces memloop's JSON-schema constraint (response_format)",
    "guided_grammar": "replaces memloop's JSON-schema constraint (response_format)",
    "guided_regex": "replaces memloop's JSON-schema constraint (response_format)",
    "guided_choice": "replaces memloop's JSON-schema constraint (response_format)",
    "structured_outputs": "replaces memloop's JSON-schema constraint (response_format)",
}


def _real_number(value: Any) -> Any:
    """A finite real number, as given; booleans, text and inf/nan refused (the bounds follow)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, not a boolean ({str(value).lower()})")
    if isinstance(value, str):
        raise ValueError(
            f"expected a number, not text ({value!r}); write a plain number such as 30 or 0.5"
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value}")
    return value


class Price(BaseModel):
    """US dollars per million tokens, as a provider's price list gives them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(
        ge=0.0, le=MAX_PRICE, description=f"per million prompt tokens, 0 to {MAX_PRICE}"
    )
    output: float = Field(
        ge=0.0, le=MAX_PRICE, description=f"per million completion tokens, 0 to {MAX_PRICE}"
    )

    @field_validator("input", "output", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        return _real_number(value)

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input + completion_tokens * self.output) / MILLION


class Endpoint(BaseModel):
    """An OpenAI-compatible chat endpoint, or `base_url: local` for the embedded model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        "local-1.5b",
        description="model name sent to the API; for base_url local: "
        "local-1.5b (default, Qwen2.5-Coder-1.5B) or local-0.5b",
    )
    base_url: str = Field(
        LOCAL,
        description="e.g. https://api.openai.com/v1, or `local`; no user name or password before "
        "'@' and no secret-looking query parameter (the key goes in api_key_env's variable)",
    )
    api_key_env: str | None = Field(
        None, description="name of the environment variable holding the key (never the key itself)"
    )
    temperature: float | None = Field(
        0.0,
        ge=0.0,
        le=2.0,
        description="a number 0-2; null: not sent (the server's default; reasoning models)",
    )
    max_tokens: StrictInt | None = Field(512, gt=0, description="null: not sent (no cap)")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="fields sent with every request, e.g. {reasoning_effort: low} or a "
        "provider's options; part of the cache key and the run's identity, so no secret-looking "
        "key (api_key, token, ...) at any depth and none of memloop's own request fields "
        f"({', '.join(OWN_REQUEST_FIELDS)})",
    )
    timeout_s: float = Field(
        120.0,
        gt=0,
        le=MAX_TIMEOUT_S,
        description=f"seconds per request, > 0 and <= {MAX_TIMEOUT_S}",
    )
    max_concurrency: StrictInt = Field(
        4,
        ge=1,
        le=256,
        description="requests in flight at once; "
        "for the embedded model also its number of parallel slots",
    )
    max_retries: StrictInt = Field(4, ge=0, le=20)
    context_window: StrictInt | None = Field(
        None, gt=0, description="tokens per request; defaults to 8192 for the embedded model"
    )

    logprobs: bool | None = Field(
        None,
        strict=True,
        description="whether the server returns log-probabilities (`logprobs`, `top_logprobs`); "
        "null: yes for the embedded model, assumed no elsewhere. Where yes, state reads default "
        "to the letter read and runs to the state_prob objective (feedback/probes.py "
        "probes_for); not part of the run's identity",
    )
    price_per_mtok: Price | None = Field(
        None,
        description=f"{{input: USD, output: USD}} per million tokens, each 0 to {MAX_PRICE}: runs "
        "then report a cost in money; not part of the run's identity (a price does not change a "
        "response)",
    )

    @field_validator("timeout_s", "temperature", mode="before")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        return _real_number(value)

    @field_validator("base_url")
    @classmethod
    def _has_a_scheme(cls, value: str) -> str:
        # credentials first: the messages below echo the URL, these never do
        problem = url_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}: remove it and {KEY_HINT}")
        if value != LOCAL and not value.lower().startswith(("http://", "https://")):
            raise ValueError(
                f"{value!r} has no scheme: add http:// or https:// (e.g. http://{value}), "
                f"or write {LOCAL!r} for the embedded model"
            )
        return value

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_a_name(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("_", "").isalnum():
            # A key pasted here by mistake must not be echoed back in the error.
            raise ValueError(
                "must be the NAME of an environment variable (letters, digits, _), not a key"
            )
        return value

    @field_validator("extra_body")
    @classmethod
    def _no_secrets_nor_own_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if key in OWN_REQUEST_FIELDS:
                raise KeyProblem(
                    key, f"overrides memloop's own request field: {OWN_REQUEST_FIELDS[key]}"
                )
        path = secret_path(value)
        if path is not None:
            raise KeyProblem(
                path,
                "looks like a secret, and extra_body is stored with the run (spec.json, MLflow): "
                f"remove it and {KEY_HINT}",
            )
        return value

    def __hash__(self) -> int:  # frozen, but extra_body is a dict: hash the whole settings
        return hash(self.model_dump_json())

    @property
    def is_local(self) -> bool:
        return self.base_url == LOCAL

    @property
    def returns_logprobs(self) -> bool:
        """Whether this endpoint gives each token's log-probability (declared, or the embedded)."""
        return self.is_local if self.logprobs is None else self.logprobs

    @property
    def effective_context_window(self) -> int | None:
        if self.context_window is not None:
            return self.context_window
        return 8192 if self.is_local else None

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """The price of one answer's tokens; None when the endpoint has no price."""
        if self.price_per_mtok is None:
            return None
        return self.price_per_mtok.cost_usd(prompt_tokens, completion_tokens)

    def api_key(self) -> str:
        """The key read from the environment now; a placeholder when none is needed."""
        if self.api_key_env is None:
            return "not-needed"
        value = os.environ.get(self.api_key_env)
        if not value:
            raise MissingApiKey(
                f"environment variable {self.api_key_env} is not set; the endpoint for model "
                f"{self.model!r} at {self.base_url} reads its API key from it (export it first)"
            )
        return value

    def public_dict(self) -> dict[str, Any]:
        """Every field, safe to log (holds no secret by construction)."""
        return self.model_dump()

    def result_settings(self) -> dict[str, Any]:
        """The settings that can change a response: a run's identity holds these only.

        Concurrency, timeouts, retries and the key's variable change how a response is fetched,
        not what it says, so changing them resumes a run rather than starting another.
        """
        settings = self.model_dump(include=set(RESULT_SETTINGS))
        if self.extra_body:  # absent when empty: runs made before the field keep their keys
            settings["extra_body"] = self.extra_body
        return settings

    @classmethod
    def from_yaml(cls, path: str | Path) -> Endpoint:
        path = Path(path)
        data = load_yaml_mapping(path)
        if "endpoint" in data and isinstance(data["endpoint"], dict) and len(data) == 1:
            data = data["endpoint"]
        if not data:
            # an empty file would silently become the embedded model: say so instead
            raise UserError(
                f"{path}: empty endpoint file; give at least base_url and model (or base_url: "
                f"{LOCAL} for the embedded model)"
            )
        return cls.from_mapping(data, str(path))

    @classmethod
    def from_mapping(cls, data: Any, where: str) -> Endpoint:
        """The endpoint an endpoint YAML holding `data` gives (`where` names it in errors).

        The one validation of an endpoint file's fields, also for endpoints made in memory (the
        command line's `--model NAME --base-url URL`): the same fields give the same endpoint.
        """
        return parse_model(cls, data, where)


# an endpoint YAML file, an endpoint made in memory, or None for the embedded model
EndpointRef = str | Path | Endpoint | None


def load_endpoint(ref: EndpointRef) -> Endpoint:
    """The endpoint of a YAML file (or one made already), or the embedded model's for None."""
    if isinstance(ref, Endpoint):
        return ref
    return Endpoint.from_yaml(ref) if ref else Endpoint()
