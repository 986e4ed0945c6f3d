"""Steps `sessions_KK`: the opening message of every session of a period.

Each message reveals a small set of state values. A checker that sees only the message must infer
every intended value; otherwise the message is refined and checked again, within the refine budget.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from functools import partial
from typing import Any

from memloop.environment.llm_pipeline import prompts
from memloop.environment.llm_pipeline.asking import (
    CHECKER,
    Invalid,
    StepStats,
    strict_object,
    text_of,
)
from memloop.environment.llm_pipeline.context import UserContext

MESSAGE_SCHEMA = strict_object({"message": {"type": "string"}})
MAX_MESSAGE_CHARS = 800
MESSAGE_TOKENS = 320


def sessions_step(period: int) -> str:
    return f"sessions_{period:02d}"


def exposure_groups(
    questions: list[dict[str, Any]], schema: dict[str, list[str]], max_per: int, rng: random.Random
) -> list[list[str]]:
    """Period 0: variables grouped by the question that needs them (at most `max_per` per group).

    Every variable is in exactly one group; the group order is a seeded shuffle.
    """
    groups: list[list[str]] = []
    assigned: set[str] = set()
    sources = [q["required_info"] for q in questions] + [list(schema)]
    for variables in sources:
        pending = [var for var in variables if var in schema and var not in assigned]
        for start in range(0, len(pending), max_per):
            groups.append(pending[start : start + max_per])
        assigned.update(pending)
    rng.shuffle(groups)
    return groups


def initial_plan(groups: list[list[str]], state: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {"exposed": {var: state[var] for var in group}, "event": None, "previous": {}}
        for group in groups
    ]


def update_plan(
    events: list[dict[str, Any]], before: dict[str, str], after: dict[str, str]
) -> list[dict[str, Any]]:
    """One session per life event, revealing the new values of the event's variables."""
    return [
        {
            "exposed": {var: after[var] for var in event["variables"]},
            "event": event["event"],
            "previous": {var: before[var] for var in event["variables"]},
        }
        for event in events
    ]


_NOT_A_USER = re.compile(
    r"\b(I'?m sorry, but I can|I can'?t assist|as an AI|I am an AI|I'?m an AI|"
    r"computer program|language model)\b",
    re.I,
)


def validate_message(parsed: Any) -> str:
    """A user's opening message of sensible length that is not a refusal or an assistant's voice."""
    text = text_of(
        parsed.get("message") if isinstance(parsed, dict) else None,
        "message",
        min_chars=15,
        max_chars=MAX_MESSAGE_CHARS,
    )
    if _NOT_A_USER.search(text):
        raise Invalid(
            "the message must be written by the person, as a request to the assistant, "
            "not a refusal or an assistant's words"
        )
    return text


def check_schema(options: dict[str, list[str]]) -> dict[str, Any]:
    return strict_object(
        {var: {"type": "string", "enum": list(values)} for var, values in options.items()}
    )


def validate_prediction(parsed: Any, options: dict[str, list[str]]) -> dict[str, str]:
    if not isinstance(parsed, dict):
        raise Invalid("the reply must map each item to one of its values")
    out = {}
    for var, values in options.items():
        if parsed.get(var) not in values:
            raise Invalid(f"{var} must be one of {values}")
        out[var] = parsed[var]
    return out


def mismatches(
    intended: dict[str, str], predicted: Mapping[str, str | None]
) -> dict[str, str | None]:
    """{var: predicted} where the checker's reading differs from the intended value."""
    return {
        var: predicted.get(var) for var, value in intended.items() if predicted.get(var) != value
    }


def run_sessions(
    ctx: UserContext,
    stats: StepStats,
    period: int,
    plan: list[dict[str, Any]],
    schema: dict[str, list[str]],
    date: str,
) -> list[dict[str, Any]]:
    """[{"event", "exposed_states", "query", "checks"}] in plan order."""
    cfg = ctx.config
    step = sessions_step(period)
    out = []
    for n, entry in enumerate(plan, 1):
        budget = ctx.budget(step, stats, unit=f"session {n}")
        exposed: dict[str, str] = entry["exposed"]
        reveal = {
            var: {"value": value, "not_to_be_confused_with": [v for v in schema[var] if v != value]}
            for var, value in exposed.items()
        }
        for var, old in entry["previous"].items():
            reveal[var]["previous_value"] = old
        hidden = [var for var in schema if var not in exposed]
        options = {var: schema[var] for var in exposed}
        message = ctx.asker.ask(
            prompts.opening_message(ctx.profile_text, date, reveal, hidden, entry["event"]),
            MESSAGE_SCHEMA,
            name="opening_message",
            budget=budget,
            temperature=cfg.temperature_low,
            validate=validate_message,
            max_tokens=MESSAGE_TOKENS,
        )
        checks = 0
        while True:
            checks += 1
            predicted = ctx.asker.ask(
                prompts.exposure_check(message, options),
                check_schema(options),
                name="exposure_check",
                budget=budget,
                temperature=cfg.temperature_check,
                component=CHECKER,
                validate=partial(validate_prediction, options=options),
                max_tokens=60 + 30 * len(options),
            )
            wrong = mismatches(exposed, predicted)
            if not wrong:
                break
            budget.spend(
                "exposure check failed: from "
                + repr(message[:200])
                + " the checker read "
                + ", ".join(
                    f"{var}={got!r} (intended {exposed[var]!r})" for var, got in wrong.items()
                )
            )
            message = ctx.asker.ask(
                prompts.refine_message(message, reveal, predicted, hidden),
                MESSAGE_SCHEMA,
                name="refine_message",
                budget=budget,
                temperature=max(cfg.temperature_low, cfg.temperature_retry),
                validate=validate_message,
                max_tokens=MESSAGE_TOKENS,
            )
        out.append(
            {
                "event": entry["event"],
                "exposed_states": dict(exposed),
                "query": message,
                "checks": checks,
            }
        )
    return out
