"""Asking the model for schema-constrained JSON, validating it, re-asking with the problem stated.

All within a refine budget. Every failure (junk JSON, invalid content, failed check) spends the
budget; when it runs out the step fails with its reason, and the user is reported.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from memloop.llm.client import ChatClient

T = TypeVar("T")

GENERATOR = "generator"
"""Usage tag of the calls that write content."""
CHECKER = "checker"
"""Usage tag of the calls that verify content (exposure and reflection checks)."""

_SNAKE = re.compile(r"[^a-z0-9]+")


class Invalid(ValueError):
    """A model output that cannot be used; the message says why, in words the model can act on."""


class StepFailed(Exception):
    """A step of one user could not be completed within its refine budget."""

    def __init__(self, step: str, reason: str, failed_attempts: int = 0) -> None:
        super().__init__(f"{step}: {reason}")
        self.step = step
        self.reason = reason
        self.failed_attempts = failed_attempts
        self.also_failed: list[dict[str, str]] = []


@dataclass
class StepStats:
    """Counts of one step, saved with its result: model calls made and failed attempts."""

    calls: int = 0
    failed_attempts: int = 0
    problems: list[str] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "failed_attempts": self.failed_attempts,
            "problems": self.problems[-5:],
        }


@dataclass
class Budget:
    """The failures one unit of work (a period update, an utterance, an answer...) may spend."""

    step: str
    limit: int
    stats: StepStats
    unit: str = ""
    failures: int = 0
    calls: int = 0

    def spend(self, reason: str) -> None:
        """Count a failure; raise StepFailed when it exceeds the limit."""
        self.failures += 1
        self.stats.failed_attempts += 1
        where = f"{self.unit}: " if self.unit else ""
        self.stats.problems.append(f"{where}{reason}"[:500])
        if self.failures > self.limit:
            raise StepFailed(
                self.step,
                f"{where}{reason} (still failing after {self.failures} failed attempts; "
                f"refine_budget is {self.limit})",
                self.stats.failed_attempts,
            )

    def next_sample(self) -> int:
        """A new draw index for each call of this unit (the response cache is keyed on it)."""
        self.calls += 1
        self.stats.calls += 1
        return self.calls - 1


@dataclass
class Asker:
    """The client plus the per-call settings every step shares."""

    client: ChatClient
    max_tokens: int
    retry_temperature: float = 0.8

    def ask(
        self,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        *,
        name: str,
        budget: Budget,
        temperature: float,
        validate: Callable[[Any], T],
        component: str = GENERATOR,
        max_tokens: int | None = None,
    ) -> T:
        """Ask until `validate(parsed)` accepts the reply.

        After a failure the model sees (the start of) its own reply and the problem, and answers
        again: a new sample, drawn at no less than `retry_temperature` so that a near-deterministic
        model does not repeat itself. `max_tokens` caps this call below the run's limit (a runaway
        reply then fails fast).
        """
        limit = min(self.max_tokens, max_tokens) if max_tokens else self.max_tokens
        history = list(messages)
        heat = temperature
        while True:
            result = self.client.chat_json(
                history,
                schema,
                component=component,
                schema_name=name,
                sample=budget.next_sample(),
                temperature=heat,
                max_tokens=limit,
            )
            if result.finish_reason == "length" and not result.ok:
                problem = f"the reply was cut off at {limit} tokens; keep it much shorter"
            elif not result.ok:
                problem = f"the reply is not the requested JSON ({result.json_error})"
            else:
                try:
                    return validate(result.parsed)
                except Invalid as exc:
                    problem = str(exc)
            budget.spend(f"{name}: {problem}")
            heat = max(temperature, self.retry_temperature)
            history = list(messages) + [
                {"role": "assistant", "content": result.text[:1500]},
                {
                    "role": "user",
                    "content": f"That reply cannot be used: {problem}. "
                    "Answer again with corrected JSON only.",
                },
            ]


def snake(text: str, limit: int = 60) -> str:
    """A lower-case snake_case identifier made from `text` (may be empty)."""
    return _SNAKE.sub("_", text.strip().lower()).strip("_")[:limit].strip("_")


def strict_object(properties: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema object with exactly these properties, all required (strict-mode friendly)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def text_of(value: Any, what: str, *, min_chars: int = 1, max_chars: int = 2000) -> str:
    """A stripped string of acceptable length, or Invalid naming `what`."""
    if not isinstance(value, str):
        raise Invalid(f"{what} must be a string")
    text = " ".join(value.split())
    if len(text) < min_chars:
        raise Invalid(f"{what} is empty or too short (at least {min_chars} characters)")
    if len(text) > max_chars:
        raise Invalid(f"{what} is too long ({len(text)} characters; at most {max_chars})")
    return text
