"""Steps `initial_state`, `update_KK` and `events_KK`: the user's states over time.

The user's starting values, then per period a validated set of changes (K-1..K+1 known variables,
each to a valid, different value) and the life events that explain them (every change covered
exactly once).
"""

from __future__ import annotations

from typing import Any

from memloop.environment.llm_pipeline import prompts
from memloop.environment.llm_pipeline.asking import Invalid, StepStats, strict_object, text_of
from memloop.environment.llm_pipeline.context import UserContext

INITIAL_STEP = "initial_state"
RECENT_SUMMARIES = 3
"""Prior periods shown to the update prompt (a fixed window, so prompts do not grow)."""


def update_step(period: int) -> str:
    return f"update_{period:02d}"


def events_step(period: int) -> str:
    return f"events_{period:02d}"


def initial_schema(schema: dict[str, list[str]]) -> dict[str, Any]:
    return strict_object(
        {var: {"type": "string", "enum": list(values)} for var, values in schema.items()}
    )


def validate_initial(parsed: Any, schema: dict[str, list[str]]) -> dict[str, str]:
    if not isinstance(parsed, dict):
        raise Invalid("the reply must map every variable to a value")
    state = {}
    for var, values in schema.items():
        value = parsed.get(var)
        if value not in values:
            raise Invalid(f"{var} must be one of {values}, got {value!r}")
        state[var] = value
    unknown = sorted(set(parsed) - set(schema))
    if unknown:
        raise Invalid(f"unknown variables {unknown}; use only {list(schema)}")
    return state


def run_initial(ctx: UserContext, stats: StepStats, schema: dict[str, list[str]]) -> dict[str, str]:
    cfg = ctx.config
    return ctx.asker.ask(
        prompts.initial_state(ctx.profile_text, cfg.start_date, schema),
        initial_schema(schema),
        name="initial_state",
        budget=ctx.budget(INITIAL_STEP, stats),
        temperature=cfg.temperature_low,
        validate=lambda p: validate_initial(p, schema),
        max_tokens=100 + 40 * len(schema),
    )


def change_range(target: int, available: int) -> tuple[int, int]:
    """How many variables a period may change: target-1..target+1, within 1..available."""
    high = max(1, min(target + 1, available))
    low = max(1, min(target - 1, high))
    return low, high


def eligible_variables(
    schema: dict[str, list[str]], counts: dict[str, int], cap: int, low: int
) -> list[str]:
    """Variables changed fewer than `cap` times.

    If fewer than `low` of them remain, all variables instead.
    """
    fresh = [var for var in schema if counts.get(var, 0) < cap]
    return fresh if len(fresh) >= low else list(schema)


def update_schema(
    schema: dict[str, list[str]], state: dict[str, str], eligible: list[str], low: int, high: int
) -> dict[str, Any]:
    """Changes as a list of {variable, new_value}.

    Each variable's new values exclude its current one, so a constrained decoder can only produce
    valid, different values.
    """
    options = [
        strict_object(
            {
                "variable": {"type": "string", "enum": [var]},
                "new_value": {
                    "type": "string",
                    "enum": [v for v in schema[var] if v != state[var]],
                },
            }
        )
        for var in eligible
    ]
    return strict_object(
        {
            "changes": {
                "type": "array",
                "items": {"anyOf": options},
                "minItems": low,
                "maxItems": high,
            },
            "summary": {"type": "string"},
        }
    )


def validate_update(
    parsed: Any, schema: dict[str, list[str]], state: dict[str, str], low: int, high: int
) -> dict[str, Any]:
    """{"summary", "changes": {var: new}} with low..high distinct known variables.

    Each is set to a valid value different from its current one.
    """
    changes = parsed.get("changes") if isinstance(parsed, dict) else None
    if not isinstance(changes, list):
        raise Invalid("'changes' must be a list of {variable, new_value}")
    out: dict[str, str] = {}
    for change in changes:
        var = change.get("variable") if isinstance(change, dict) else None
        new = change.get("new_value") if isinstance(change, dict) else None
        if var not in schema:
            raise Invalid(f"unknown variable {var!r}; use only {list(schema)}")
        if var in out:
            raise Invalid(f"{var} is changed twice; change each variable at most once")
        if new not in schema[var]:
            raise Invalid(f"{new!r} is not a value of {var} (values: {schema[var]})")
        if new == state[var]:
            raise Invalid(f"{var} is already {new!r}; a change needs a different value")
        out[var] = new
    if not low <= len(out) <= high:
        raise Invalid(f"{len(out)} variables changed; change between {low} and {high}")
    summary = text_of(parsed.get("summary"), "summary", min_chars=5, max_chars=1500)
    return {"summary": summary, "changes": out}


def run_update(
    ctx: UserContext,
    stats: StepStats,
    period: int,
    window: tuple[str, str],
    schema: dict[str, list[str]],
    state: dict[str, str],
    counts: dict[str, int],
    summaries: list[str],
) -> dict[str, Any]:
    cfg = ctx.config
    low, high = change_range(cfg.changes_per_period, len(schema))
    eligible = eligible_variables(schema, counts, cfg.max_changes_per_state, low)
    asked_high = min(high, len(eligible))  # len(eligible) >= low by construction
    target = min(max(cfg.changes_per_period, low), asked_high)
    messages = prompts.state_update(
        ctx.profile_text,
        cfg.start_date,
        schema,
        state,
        counts,
        summaries[-RECENT_SUMMARIES:],
        period,
        cfg.periods,
        window,
        low,
        asked_high,
        target,
        cfg.max_changes_per_state,
    )
    # The constrained form offers only eligible variables; validation accepts any known one, as
    # the cap is a preference and an endpoint may not enforce the form.
    return ctx.asker.ask(
        messages,
        update_schema(schema, state, eligible, low, asked_high),
        name="state_update",
        budget=ctx.budget(update_step(period), stats),
        temperature=cfg.temperature_high,
        validate=lambda p: validate_update(p, schema, state, low, high),
        max_tokens=250 + 50 * asked_high,
    )


def events_schema(changed: list[str]) -> dict[str, Any]:
    """Events as texts, then each changed variable's event number.

    Every variable belongs to exactly one event by construction.
    """
    numbers = list(range(1, len(changed) + 1))
    return strict_object(
        {
            "events": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "maxItems": len(changed),
            },
            "event_of": strict_object(
                {var: {"type": "integer", "enum": numbers} for var in changed}
            ),
        }
    )


def validate_events(parsed: Any, changed: list[str]) -> list[dict[str, Any]]:
    """[{"variables", "event"}]: every changed variable assigned to an existing event.

    Events that explain no variable are dropped (they would expose nothing).
    """
    texts = parsed.get("events") if isinstance(parsed, dict) else None
    owner = parsed.get("event_of") if isinstance(parsed, dict) else None
    if not isinstance(texts, list) or not texts or not isinstance(owner, dict):
        raise Invalid(
            "the reply needs 'events' (a non-empty list) and 'event_of' (variable -> event number)"
        )
    unknown = sorted(set(owner) - set(changed))
    if unknown:
        raise Invalid(f"'event_of' names {unknown}, which did not change; name only {changed}")
    missing = [var for var in changed if var not in owner]
    if missing:
        raise Invalid(f"no event explains {missing}; every changed variable needs an event")
    out = []
    for n, text in enumerate(texts, 1):
        variables = [var for var in changed if owner[var] == n]
        if variables:
            out.append(
                {
                    "variables": variables,
                    "event": text_of(text, f"event {n}", min_chars=10, max_chars=1500),
                }
            )
    for var in changed:
        number = owner[var]
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= len(texts):
            raise Invalid(f"{var} points to event {number!r}, but there are {len(texts)} events")
    return out


def run_events(
    ctx: UserContext,
    stats: StepStats,
    period: int,
    window: tuple[str, str],
    schema: dict[str, list[str]],
    before: dict[str, str],
    update: dict[str, Any],
) -> list[dict[str, Any]]:
    cfg = ctx.config
    changed = list(update["changes"])
    changes = {
        var: {"old": before[var], "new": new, "possible_values": schema[var]}
        for var, new in update["changes"].items()
    }
    unchanged = {var: value for var, value in before.items() if var not in update["changes"]}
    return ctx.asker.ask(
        prompts.life_events(ctx.profile_text, window, update["summary"], changes, unchanged),
        events_schema(changed),
        name="events",
        budget=ctx.budget(events_step(period), stats),
        temperature=cfg.temperature_low,
        validate=lambda p: validate_events(p, changed),
        max_tokens=100 + 150 * len(changed),
    )
