"""Steps `questions` and `schema`: advice questions, then one state schema.

First advice questions with the facts each depends on, then those facts renamed and merged into one
state schema (variables shared by several questions get one unified list of values).
"""

from __future__ import annotations

from typing import Any

from memloop.environment.llm_pipeline import prompts
from memloop.environment.llm_pipeline.asking import (
    Invalid,
    StepFailed,
    StepStats,
    snake,
    strict_object,
    text_of,
)
from memloop.environment.llm_pipeline.context import UserContext

QUESTIONS_STEP = "questions"
SCHEMA_STEP = "schema"
MAX_NAME = 60
PROFILE_FACTS = frozenset(
    {
        "name",
        "age",
        "gender",
        "sex",
        "marital_status",
        "education",
        "education_level",
        "occupation",
        "job",
        "profession",
        "hobbies",
        "hobbies_and_interests",
        "skills",
        "skills_and_expertise",
    }
)
"""Info types the profile already states: a question depending on them tests no memory."""


def _string_array(count: int) -> dict[str, Any]:
    return {"type": "array", "items": {"type": "string"}, "minItems": count, "maxItems": count}


def questions_schema(count: int, per_question: int, choices: int) -> dict[str, Any]:
    info = strict_object({"info_type": {"type": "string"}, "info_choices": _string_array(choices)})
    question = strict_object(
        {
            "question": {"type": "string"},
            "required_info": {
                "type": "array",
                "items": info,
                "minItems": per_question,
                "maxItems": per_question,
            },
        }
    )
    return strict_object(
        {"questions": {"type": "array", "items": question, "minItems": count, "maxItems": count}}
    )


def clean_choices(values: Any, what: str, count: int) -> list[str]:
    """`count` distinct snake_case values, or Invalid."""
    if not isinstance(values, list) or len(values) != count:
        raise Invalid(f"{what} must list exactly {count} values")
    out = []
    for value in values:
        if not isinstance(value, str) or not snake(value, MAX_NAME):
            raise Invalid(f"{what} has an empty or non-text value")
        name = snake(value, MAX_NAME)
        if name in out:
            raise Invalid(f"{what} lists the value {name!r} twice; the values must be distinct")
        out.append(name)
    return out


def validate_questions(
    parsed: Any, count: int, per_question: int, choices: int
) -> list[dict[str, Any]]:
    """Questions with snake_case info types and values.

    Distinct questions, distinct info types within a question, distinct values within an info type.
    """
    items = parsed.get("questions") if isinstance(parsed, dict) else None
    if not isinstance(items, list) or len(items) != count:
        raise Invalid(f"'questions' must hold exactly {count} questions")
    out: list[dict[str, Any]] = []
    seen_text: set[str] = set()
    for q, item in enumerate(items, 1):
        text = text_of(item.get("question"), f"question {q}", min_chars=10, max_chars=500)
        if text.lower() in seen_text:
            raise Invalid(f"question {q} repeats an earlier question; every question must differ")
        seen_text.add(text.lower())
        infos = item.get("required_info")
        if not isinstance(infos, list) or len(infos) != per_question:
            raise Invalid(f"question {q} must have exactly {per_question} required_info entries")
        required: list[dict[str, Any]] = []
        for info in infos:
            raw = info.get("info_type") if isinstance(info, dict) else None
            name = snake(raw, MAX_NAME) if isinstance(raw, str) else ""
            if not name:
                raise Invalid(f"question {q} has an empty info_type")
            if name in PROFILE_FACTS:
                raise Invalid(
                    f"question {q} depends on {name!r}, which the person's sheet already "
                    "states; choose facts about their changing situation instead"
                )
            if any(r["info_type"] == name for r in required):
                raise Invalid(f"question {q} uses the info_type {name!r} twice")
            required.append(
                {
                    "info_type": name,
                    "info_choices": clean_choices(
                        info.get("info_choices"),
                        f"info_choices of {name!r} (question {q})",
                        choices,
                    ),
                }
            )
        out.append({"question": text, "required_info": required})
    return out


def run_questions(ctx: UserContext, stats: StepStats) -> list[dict[str, Any]]:
    cfg = ctx.config
    months = cfg.periods * cfg.months_per_period or cfg.months_per_period
    return ctx.asker.ask(
        prompts.questions(
            ctx.profile_text,
            cfg.start_date,
            months,
            cfg.questions,
            cfg.states_per_question,
            cfg.choices_per_state,
        ),
        questions_schema(cfg.questions, cfg.states_per_question, cfg.choices_per_state),
        name="questions",
        budget=ctx.budget(QUESTIONS_STEP, stats),
        temperature=cfg.temperature_high,
        validate=lambda p: validate_questions(
            p, cfg.questions, cfg.states_per_question, cfg.choices_per_state
        ),
        max_tokens=100
        + cfg.questions * (80 + cfg.states_per_question * (30 + 15 * cfg.choices_per_state)),
    )


def original_names(questions: list[dict[str, Any]]) -> list[str]:
    """Every info_type name, in order of first use."""
    names: list[str] = []
    for question in questions:
        for info in question["required_info"]:
            if info["info_type"] not in names:
                names.append(info["info_type"])
    return names


def _words(name: str) -> set[str]:
    return {word for word in name.split("_") if len(word) >= 3}


def validate_mapping(parsed: Any, questions: list[dict[str, Any]]) -> dict[str, str]:
    """{original info_type: variable}: every original mapped to a snake_case name.

    The name keeps a word of the fact's name or values (so it still says what it is about), and no
    two facts of one question share a variable.
    """
    table = parsed.get("variables") if isinstance(parsed, dict) else None
    if not isinstance(table, dict):
        raise Invalid("'variables' must map every fact name to a variable name")
    mapping: dict[str, str] = {}
    for original in original_names(questions):
        value = table.get(original)
        name = snake(value, MAX_NAME) if isinstance(value, str) else ""
        if not name:
            raise Invalid(f"the fact {original!r} has no variable name")
        vocabulary = _words(original)
        for question in questions:
            for info in question["required_info"]:
                if info["info_type"] == original:
                    vocabulary.update(*(_words(v) for v in info["info_choices"]))
        if vocabulary and not _words(name) & vocabulary:
            raise Invalid(
                f"the variable name {name!r} for the fact {original!r} does not say what the "
                "fact is about; keep a word of the fact's name in it"
            )
        mapping[original] = name
    for q, question in enumerate(questions, 1):
        targets: dict[str, str] = {}
        for info in question["required_info"]:
            var = mapping[info["info_type"]]
            if var in targets:
                raise Invalid(
                    f"the facts {targets[var]!r} and {info['info_type']!r} of request {q} both map "
                    f"to {var!r}; facts of one request need different variables"
                )
            targets[var] = info["info_type"]
    return mapping


def merge_uses(
    questions: list[dict[str, Any]], mapping: dict[str, str]
) -> tuple[dict[str, list[str]], dict[str, list[dict[str, Any]]]]:
    """(settled variables with their values, conflicting variables with every use).

    A variable is settled when all its uses propose the same values.
    """
    uses: dict[str, list[dict[str, Any]]] = {}
    for question in questions:
        for info in question["required_info"]:
            uses.setdefault(mapping[info["info_type"]], []).append(
                {
                    "request": question["question"],
                    "fact": info["info_type"],
                    "values": info["info_choices"],
                }
            )
    settled, conflicts = {}, {}
    for var, var_uses in uses.items():
        if all(use["values"] == var_uses[0]["values"] for use in var_uses):
            settled[var] = list(var_uses[0]["values"])
        else:
            conflicts[var] = var_uses
    return settled, conflicts


def validate_unified(parsed: Any, variables: list[str], choices: int) -> dict[str, list[str]]:
    if not isinstance(parsed, dict):
        raise Invalid("the reply must map each variable to its values")
    return {
        var: clean_choices(parsed.get(var), f"the values of {var!r}", choices) for var in variables
    }


def run_schema(
    ctx: UserContext, stats: StepStats, questions: list[dict[str, Any]]
) -> dict[str, Any]:
    """The facts renamed and merged into one state schema.

    Returns {"schema": {var: values}, "questions": [{"question", "required_info": [var, ...]}],
    "mapping": {original: var}}; variables in order of first use.
    """
    cfg = ctx.config
    names = original_names(questions)
    overview = [
        {"request": q["question"], "facts": [i["info_type"] for i in q["required_info"]]}
        for q in questions
    ]
    mapping_schema = strict_object(
        {"variables": strict_object({name: {"type": "string"} for name in names})}
    )
    fallbacks: list[str] = []
    # Merging is a tidy-up, not a quality check: when the model cannot do it within the budget,
    # each fact keeps its own name (always a valid schema) and the fallback is recorded.
    try:
        mapping = ctx.asker.ask(
            prompts.merge_names(overview),
            mapping_schema,
            name="schema_merge",
            budget=ctx.budget(SCHEMA_STEP, stats, "merge"),
            temperature=cfg.temperature_low,
            validate=lambda p: validate_mapping(p, questions),
            max_tokens=100 + 40 * len(names),
        )
    except StepFailed as exc:
        mapping = {name: name for name in names}
        fallbacks.append(f"merge skipped, facts keep their names: {exc.reason}")
    settled, conflicts = merge_uses(questions, mapping)
    unified: dict[str, list[str]] = {}
    if conflicts:
        months = cfg.periods * cfg.months_per_period or cfg.months_per_period
        unify_schema = strict_object(
            {var: _string_array(cfg.choices_per_state) for var in conflicts}
        )
        try:
            unified = ctx.asker.ask(
                prompts.unify_choices(conflicts, months, cfg.choices_per_state),
                unify_schema,
                name="schema_unify",
                budget=ctx.budget(SCHEMA_STEP, stats, "unify"),
                temperature=cfg.temperature_low,
                validate=lambda p: validate_unified(p, list(conflicts), cfg.choices_per_state),
                max_tokens=100 + len(conflicts) * (30 + 20 * cfg.choices_per_state),
            )
        except StepFailed as exc:
            unified = {var: list(uses[0]["values"]) for var, uses in conflicts.items()}
            fallbacks.append(
                f"values not unified, each variable keeps its first question's values: {exc.reason}"
            )
    schema: dict[str, list[str]] = {}
    for name in names:
        var = mapping[name]
        if var not in schema:
            schema[var] = unified.get(var) or settled[var]
    refined = [
        {
            "question": q["question"],
            "required_info": [mapping[i["info_type"]] for i in q["required_info"]],
        }
        for q in questions
    ]
    return {"schema": schema, "questions": refined, "mapping": mapping, "fallbacks": fallbacks}
