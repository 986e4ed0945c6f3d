"""Step `profile`: the published user_profile of a persona.

Personas with a name and short notes are converted directly; otherwise the LLM extracts the name and
condenses the notes.
"""

from __future__ import annotations

from typing import Any

from memloop.environment.llm_pipeline import prompts
from memloop.environment.llm_pipeline.asking import (
    Asker,
    Budget,
    Invalid,
    StepStats,
    strict_object,
    text_of,
)
from memloop.environment.llm_pipeline.config import PipelineConfig
from memloop.environment.llm_pipeline.personas import Persona

STEP = "profile"

PROFILE_SCHEMA = strict_object({"name": {"type": "string"}, "summary": {"type": "string"}})


def validate_profile(parsed: Any) -> tuple[str, str]:
    """(name, summary) if the name looks like a person's name and the summary is usable."""
    name = text_of(parsed.get("name"), "name", min_chars=2, max_chars=80)
    if not any(ch.isalpha() for ch in name) or len(name.split()) > 6:
        raise Invalid(f"name {name!r} does not look like a person's name (one to six words)")
    summary = text_of(parsed.get("summary"), "summary", min_chars=20, max_chars=2000)
    return name, summary


def run_profile(
    persona: Persona, asker: Asker, config: PipelineConfig, stats: StepStats
) -> dict[str, Any]:
    """The profile as published JSON."""
    if not persona.needs_llm_profile():
        return persona.profile().model_dump(mode="json", exclude_none=True)
    budget = Budget(step=STEP, limit=config.refine_budget, stats=stats)
    basic = {k: v for k, v in persona.basic_fields().items() if k != "uuid"}
    notes = persona.free_text() or "(none)"
    name, summary = asker.ask(
        prompts.profile(basic, notes[:6000]),
        PROFILE_SCHEMA,
        name="profile",
        budget=budget,
        temperature=config.temperature_low,
        validate=validate_profile,
        max_tokens=500,
    )
    return persona.profile(name=name, summary=summary).model_dump(mode="json", exclude_none=True)
