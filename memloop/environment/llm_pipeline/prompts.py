"""Prompt texts of the generation pipeline, one builder per call.

Data goes in as compact JSON blocks after a label line, so prompts stay short enough for small local
models.
"""

from __future__ import annotations

import json
from typing import Any

Messages = list[dict[str, str]]

_WRITER = (
    "You write material for a simulation of people talking to an AI assistant over many "
    "months. Reply with JSON only, in the requested form."
)
_READER = (
    "You read texts carefully and infer facts about the people involved. "
    "Reply with JSON only, in the requested form."
)


def block(value: Any) -> str:
    """A data block: JSON with one level of indentation, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=False, indent=1)


def _chat(system: str, user: str) -> Messages:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def describe_variant(variables: list[str], values: list[str] | tuple[str, ...]) -> str:
    return "; ".join(f"{var} = {value}" for var, value in zip(variables, values, strict=True))


def profile(basic: dict[str, Any], notes: str) -> Messages:
    return _chat(
        _WRITER,
        (
            "Structured facts about a person:\n" + block(basic) + "\n\n"
            "Free-text notes about the same person:\n" + notes + "\n\n"
            "Give the person's full name as the notes state it (if they give none, choose a "
            "plausible one that fits the facts), and a neutral summary of at most 150 words of "
            "what the notes add beyond the structured facts. Keep only lasting traits and "
            "background, no passing events."
        ),
    )


def questions(
    profile_text: str, start_date: str, months: int, count: int, per_question: int, choices: int
) -> Messages:
    return _chat(
        _WRITER,
        (
            f"Person, as of {start_date}:\n{profile_text}\n\n"
            f"Write {count} different requests for advice that this person could send to an "
            f"assistant at any time during the next {months} months. Each request:\n"
            "- is written in the first person, the way this person would type it;\n"
            "- makes sense whenever it is asked, so it names no one-off event or date;\n"
            f"- has a best answer that depends on exactly {per_question} facts about the person's "
            "current situation which the sheet above does not settle and which plausibly change a "
            "few times over those months (neither daily nor never).\n"
            f"List those facts in required_info. info_type: a short snake_case name (for example "
            f"weekly_exercise_hours). info_choices: {choices} short snake_case values that exclude "
            "each other, would each call for different advice, and could be told apart from "
            "everyday conversation.\n"
            "Spread the requests over different parts of life (work, money, health, family, home, "
            "leisure) and give different facts different names."
        ),
    )


def merge_names(uses: list[dict[str, Any]]) -> Messages:
    return _chat(
        _WRITER,
        (
            "Each advice request below depends on some facts about one person:\n"
            + block(uses)
            + "\n\n"
            "The facts will become the state variables of that person. For every fact name, give "
            "the variable it is stored in:\n"
            "- a snake_case name that is clear without reading the request (add the missing "
            "context, e.g. budget -> monthly_grocery_budget);\n"
            "- facts that describe the same aspect of the person's life get the same variable "
            "name, so it is tracked once;\n"
            "- two facts of the same request never share a variable."
        ),
    )


def unify_choices(groups: dict[str, list[dict[str, Any]]], months: int, choices: int) -> Messages:
    return _chat(
        _WRITER,
        (
            "Each state variable below was made from facts of several advice requests, which "
            "proposed different values:\n" + block(groups) + "\n\n"
            f"For each variable write {choices} snake_case values that exclude each other, cover "
            f"what the person may go through in the next {months} months, allow gradual moves from "
            "one to another, and would each call for different advice in every request listed."
        ),
    )


def initial_state(profile_text: str, start_date: str, schema: dict[str, list[str]]) -> Messages:
    return _chat(
        _WRITER,
        (
            f"Person, as of {start_date}:\n{profile_text}\n\n"
            "State variables and their possible values:\n" + block(schema) + "\n\n"
            f"Choose each variable's value on {start_date}. Follow the sheet where it decides; "
            "otherwise prefer a value that is not at either end of the range, so it can later move "
            "in both directions."
        ),
    )


def state_update(
    profile_text: str,
    start_date: str,
    schema: dict[str, list[str]],
    state: dict[str, str],
    counts: dict[str, int],
    recent: list[str],
    period: int,
    periods: int,
    window: tuple[str, str],
    low: int,
    high: int,
    target: int,
    cap: int,
) -> Messages:
    history = "\n".join(f"- {line}" for line in recent) if recent else "- (none yet)"
    return _chat(
        _WRITER,
        (
            f"Person, as of {start_date}:\n{profile_text}\n\n"
            "State variables and their possible values:\n" + block(schema) + "\n\n"
            "Values now:\n" + block(state) + "\n\n"
            "How often each variable has changed so far:\n" + block(counts) + "\n\n"
            f"Recent periods:\n{history}\n\n"
            f"Now comes period {period} of {periods}, from {window[0]} to {window[1]} "
            f"({periods - period} more follow). Decide which variables change in it: between {low} "
            f"and {high} of them, ideally {target}. Changes should be believable and gradual for "
            "this person; variables that depend on each other move together; prefer variables that "
            f"have changed fewer than {cap} times, and leave room for later periods. A new value "
            "always differs from the current one. Add a one- or two-sentence summary of the period."
        ),
    )


def life_events(
    profile_text: str,
    window: tuple[str, str],
    summary: str,
    changes: dict[str, dict[str, Any]],
    unchanged: dict[str, str],
) -> Messages:
    return _chat(
        _WRITER,
        (
            f"Person:\n{profile_text}\n\n"
            f"Period {window[0]} to {window[1]}. Summary: {summary}\n\n"
            "These facts changed during the period (old -> new, with the possible values):\n"
            + block(changes)
            + "\n\n"
            "These facts did not change; no event may suggest otherwise:\n"
            + block(unchanged)
            + "\n\n"
            "Describe the concrete life events behind the changes, one event per group of related "
            "changes, as a numbered list ('events'). Then, in 'event_of', give for every changed "
            "variable the number of the event that explains it. Make each event specific (what "
            "happened, where, with whom) so that the new value follows from it and could not be "
            "mistaken for another possible value, without quoting variable names or values."
        ),
    )


def opening_message(
    profile_text: str,
    date: str,
    reveal: dict[str, dict[str, Any]],
    hidden: list[str],
    event: str | None,
) -> Messages:
    context = f"Something that happened to them recently: {event}\n\n" if event else ""
    return _chat(
        _WRITER,
        (
            f"Person:\n{profile_text}\n\nDate: {date}\n\n{context}"
            "Write the first message this person sends to an AI assistant in a new chat. It asks "
            "for help with something real in their life (a question or a task, not a status "
            "report), and while doing so lets a careful reader infer these facts (the value, and "
            "the values it must not be confused with):\n" + block(reveal) + "\n\n"
            "Convey each value through concrete details rather than by naming it; being "
            "unambiguous matters more than being subtle. Say nothing that bears on: "
            + (", ".join(hidden) if hidden else "(nothing else)")
            + ". "
            "One to three sentences, first person."
        ),
    )


def exposure_check(message: str, options: dict[str, list[str]]) -> Messages:
    return _chat(
        _READER,
        (
            f'A user sent this message to an assistant:\n"{message}"\n\n'
            "Judging only from the message, pick for each item the value that describes the user:\n"
            + block(options)
        ),
    )


def refine_message(
    message: str, reveal: dict[str, dict[str, Any]], read_as: dict[str, str], hidden: list[str]
) -> Messages:
    return _chat(
        _WRITER,
        (
            f'This message to an assistant:\n"{message}"\n\n'
            "should let a reader infer these facts about its author:\n" + block(reveal) + "\n\n"
            "but a reader concluded:\n" + block(read_as) + "\n\n"
            "Rewrite the message so that every intended value is clearly told apart from the other "
            "possible values, while it stays a natural first-person request for help of one to "
            "three sentences. Say nothing that bears on: "
            + (", ".join(hidden) if hidden else "(nothing else)")
            + "."
        ),
    )


def personalised_answers(
    asker: str, question: str, required: list[str], variants: list[list[str]]
) -> Messages:
    lines = "\n".join(f"{i}. {describe_variant(required, v)}" for i, v in enumerate(variants, 1))
    return _chat(
        _WRITER,
        (
            f'{asker} asks an assistant: "{question}"\n\n'
            f"The best advice depends on: {', '.join(required)}. Write one answer for each of "
            f"these situations, in this order:\n{lines}\n\n"
            "Each answer: two or three sentences of practical advice that fits its own situation "
            "and clearly differs from the answers for the other situations. Do not quote variable "
            "names or values; let the situation show through what you recommend."
        ),
    )


def reflection_check(
    question: str, answer: str, required: list[str], variants: list[list[str]]
) -> Messages:
    lines = "\n".join(f"{i}. {describe_variant(required, v)}" for i, v in enumerate(variants, 1))
    return _chat(
        _READER,
        (
            f'Question from a user: "{question}"\n\nAn advisor\'s answer: "{answer}"\n\n'
            f"The advisor wrote it for one of these situations of the user:\n{lines}\n\n"
            "Which situation does the answer fit best? Give its number."
        ),
    )


def refine_answer(
    question: str,
    answer: str,
    required: list[str],
    target: list[str],
    others: list[list[str]],
    chosen: list[str],
) -> Messages:
    rest = "\n".join(f"- {describe_variant(required, v)}" for v in others)
    return _chat(
        _WRITER,
        (
            f'Question from a user: "{question}"\n\n'
            "Answer written for the situation: "
            f'{describe_variant(required, target)}\n"{answer}"\n\n'
            f"A reader thought it was written for: {describe_variant(required, chosen)}\n\n"
            f"Other situations it must not fit:\n{rest}\n\n"
            "Rewrite the answer in two or three sentences of practical advice so that it clearly "
            "fits the target situation and none of the others. Do not quote variable names or "
            "values."
        ),
    )
