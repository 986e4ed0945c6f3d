"""Endpoint: where and how to reach a chat model. Holds the *name* of the key variable, never a key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from llm.errors import MissingApiKey, UserError

LOCAL = "local"


class Endpoint(BaseModel):
    """An OpenAI-compatible chat endpoint, or `base_url: local` for the embedded model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("local-1.5b", description="model name sent to the API; for base_url local: "
                       "local-1.5b (default, Qwen2.5-Coder-1.5B) or local-0.5b")
    base_url: str = Field(LOCAL, description="e.g. https://api.openai.com/v1, or `local`")
    api_key_env: str | None = Field(None, description="name of the environment variable "
                                    "holding the key (never the key itself)")
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(512, gt=0)
    timeout_s: float = Field(120.0, gt=0)
    max_concurrency: int = Field(4, ge=1, le=256, description="requests in flight at once; "
                                 "for the embedded model also its number of parallel slots")
    max_retries: int = Field(4, ge=0, le=20)
    context_window: int | None = Field(None, gt=0, description="tokens per request; "
                                       "defaults to 8192 for the embedded model")

    @field_validator("api_key_env")
    @classmethod
    def _looks_like_a_name(cls, value: str | None) -> str | None:
        if value is not None and not value.replace("_", "").isalnum():
            # A key pasted here by mistake must not be echoed back in the error.
            raise ValueError("must be the NAME of an environment variable (letters, digits, _), "
                             "not a key")
        return value

    @property
    def is_local(self) -> bool:
        return self.base_url == LOCAL

    @property
    def effective_context_window(self) -> int | None:
        if self.context_window is not None:
            return self.context_window
        return 8192 if self.is_local else None

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

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Endpoint":
        path = Path(path)
        data = load_yaml_mapping(path)
        if "endpoint" in data and isinstance(data["endpoint"], dict) and len(data) == 1:
            data = data["endpoint"]
        return parse_model(cls, data, str(path))


def load_endpoint(path: str | Path | None) -> Endpoint:
    """The endpoint of a YAML file, or the embedded model's default endpoint for None."""
    return Endpoint.from_yaml(path) if path else Endpoint()


class _DatesAsText(yaml.SafeLoader):
    """SafeLoader that leaves timestamps as strings."""


_DatesAsText.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:timestamp"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    except ValueError:  # an impossible unquoted date (2020-13-01): read dates as text, so the
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_DatesAsText)  # key is named
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of keys to values at the top level")
    return data


def parse_model(cls: type[BaseModel], data: Any, where: str) -> Any:
    """Validate `data` into `cls`, turning the first pydantic error into one line naming the key."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(cls.model_fields)
            raise UserError(f"{where}: unknown key '{key}' (allowed: {allowed})") from None
        raise UserError(f"{where}: key '{key}': {err['msg']}") from None
