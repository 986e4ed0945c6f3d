"""Steps `answers_qNN`: one personalised answer per state variant of a question.

The variants are every combination the user lives through, plus seeded random fillers up to
`min_state_variants`. Each answer gets a reflection check: a checker must pick the answer's own
variant, else the answer is refined.
"""

from __future__ import annotations

import itertools
import random
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

ANSWER_SCHEMA = strict_object({"answer": {"type": "string"}})
MAX_ANSWER_CHARS = 1200


def answers_step(question: int) -> str:
    return f"answers_q{question:02d}"


def plan_variants(
    required: list[str],
    schema: dict[str, list[str]],
    states: list[dict[str, str]],
    min_variants: int,
    fill_rng: random.Random,
    order_rng: random.Random,
) -> list[tuple[list[str], str]]:
    """The question's state variants in a seeded order.

    Returns [(values aligned with `required`, "experience" | "random")]. Experienced combinations
    come from the states in period order; fillers are drawn from the unused combinations in schema
    order, so nothing depends on set or hash order.
    """
    experienced: list[tuple[str, ...]] = []
    for state in states:
        combo = tuple(state[var] for var in required)
        if combo not in experienced:
            experienced.append(combo)
    product = list(itertools.product(*(schema[var] for var in required)))
    target = min(len(product), max(min_variants, len(experienced)))
    taken = set(experienced)
    unused = [combo for combo in product if combo not in taken]
    fillers = fill_rng.sample(unused, target - len(experienced))
    variants = [(list(c), "experience") for c in experienced] + [
        (list(c), "random") for c in fillers
    ]
    order_rng.shuffle(variants)
    return variants


def answers_schema(count: int) -> dict[str, Any]:
    return strict_object(
        {
            "answers": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": count,
                "maxItems": count,
            }
        }
    )


def validate_answers(parsed: Any, count: int) -> list[str]:
    answers = parsed.get("answers") if isinstance(parsed, dict) else None
    if not isinstance(answers, list) or len(answers) != count:
        raise Invalid(f"'answers' must hold exactly {count} answers, one per situation, in order")
    out: list[str] = []
    for n, answer in enumerate(answers, 1):
        text = text_of(answer, f"answer {n}", min_chars=20, max_chars=MAX_ANSWER_CHARS)
        if text in out:
            raise Invalid(
                f"answer {n} repeats answer {out.index(text) + 1}; "
                "each situation needs its own advice"
            )
        out.append(text)
    return out


def validate_answer(parsed: Any) -> str:
    return text_of(
        parsed.get("answer") if isinstance(parsed, dict) else None,
        "answer",
        min_chars=20,
        max_chars=MAX_ANSWER_CHARS,
    )


def choice_schema(count: int) -> dict[str, Any]:
    return strict_object({"situation": {"type": "integer", "enum": list(range(1, count + 1))}})


def validate_choice(parsed: Any, count: int) -> int:
    value = parsed.get("situation") if isinstance(parsed, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= count:
        raise Invalid(f"'situation' must be a number from 1 to {count}")
    return value - 1


def run_answers(
    ctx: UserContext,
    stats: StepStats,
    index: int,
    question: dict[str, Any],
    schema: dict[str, list[str]],
    states: list[dict[str, str]],
) -> dict[str, Any]:
    """{"choices": [{"state", "answer", "type", "checks"}]} in the final (seeded) choice order."""
    cfg = ctx.config
    step = answers_step(index)
    required: list[str] = question["required_info"]
    text: str = question["question"]
    planned = plan_variants(
        required,
        schema,
        states,
        cfg.min_state_variants,
        ctx.rng(f"fillers:q{index}"),
        ctx.rng(f"choice-order:q{index}"),
    )
    variants = [values for values, _ in planned]
    count = len(variants)
    answers = ctx.asker.ask(
        prompts.personalised_answers(ctx.name or "A user", text, required, variants),
        answers_schema(count),
        name="answers",
        budget=ctx.budget(step, stats, "answers"),
        temperature=cfg.temperature_low,
        validate=lambda p: validate_answers(p, count),
        max_tokens=100 + 160 * count,
    )
    choices = []
    for own, ((values, kind), answer) in enumerate(zip(planned, answers, strict=True)):
        budget = ctx.budget(
            step, stats, f"answer {own + 1} ({prompts.describe_variant(required, values)})"
        )
        checks = 0
        while True:
            checks += 1
            picked = ctx.asker.ask(
                prompts.reflection_check(text, answer, required, variants),
                choice_schema(count),
                name="reflection_check",
                budget=budget,
                temperature=cfg.temperature_check,
                component=CHECKER,
                validate=lambda p: validate_choice(p, count),
                max_tokens=40,
            )
            if picked == own:
                break
            budget.spend(
                f"reflection check failed: the checker matched the answer {answer[:160]!r} "
                f"to situation {picked + 1} "
                f"({prompts.describe_variant(required, variants[picked])})"
            )
            others = [v for i, v in enumerate(variants) if i != own]
            answer = ctx.asker.ask(
                prompts.refine_answer(text, answer, required, values, others, variants[picked]),
                ANSWER_SCHEMA,
                name="refine_answer",
                budget=budget,
                temperature=max(cfg.temperature_low, cfg.temperature_retry),
                validate=validate_answer,
                max_tokens=300,
            )
        choices.append({"state": list(values), "answer": answer, "type": kind, "checks": checks})
    return {"choices": choices}
