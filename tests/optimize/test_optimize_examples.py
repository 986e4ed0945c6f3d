"""Worked examples for the writer: leak-free by construction, exact edits, an evolvable block."""

from __future__ import annotations

import pytest

from memloop.core.leaks import LeakCheck, named
from memloop.environment import catalogue
from memloop.environment import procedural as gen
from memloop.feedback import write_failures as wf
from memloop.optimize.evolvers.edits import BY_KEY, EditsEvolver, validate_edit
from memloop.optimize.evolvers.examples import (
    DEMO_KINDS,
    HEADER,
    MAX_EXAMPLES,
    split_examples,
    with_examples,
    write_examples,
)

SEEDS = range(40)


def every_example_text() -> str:
    texts = [
        with_examples("x.", MAX_EXAMPLES, s, style=st)
        for s in SEEDS
        for st in ("own_words", "normalized")
    ]
    texts += [f"{v.said} {v.short} {v.advice}" for k in DEMO_KINDS for v in k.values]
    return "\n".join(texts)


def test_no_example_names_any_value_the_procedural_environment_can_give_a_user():
    """Stronger than any one run's users: every value of every variable, every profile entry."""
    values = {v for var in catalogue.load_catalogue().variables.values() for v in var.value_names}
    values |= {var.label for var in catalogue.load_catalogue().variables.values()}
    for pool in (gen._LAST_NAMES, gen._MARITAL, gen._EDUCATION, gen._OCCUPATIONS):
        values |= set(pool)
    for pool2 in (gen._INTERESTS, gen._SKILLS, gen._TOWNS):
        values |= set(pool2)
    values |= {first for first, _ in gen._FIRST_NAMES}
    assert len(values) > 300
    assert named(every_example_text(), values) == []


def test_a_run_users_private_values_never_appear_in_an_example():
    """On the evidence benchmark's 30 users: the run's own leak check passes every example."""
    users = gen.generate_procedural(
        users=30, periods=1, questions=2, states_per_question=2, choices_per_state=4, seed=42
    )
    check = LeakCheck(frozenset(set().union(*(u.private_values() for u in users))))
    assert len(check.private) > 100
    for seed in SEEDS:
        for n in range(1, MAX_EXAMPLES + 1):
            assert check.names(with_examples("Keep the user's facts.", n, seed)) == []


def test_the_edits_are_exact_and_show_each_named_failure_avoided():
    a, update, two, nothing = write_examples(4, seed=3)
    # a new fact next to the assistant's advice: the user's sentence is stored, not the advice
    (role, said), (_, advice) = a.excerpt
    assert role == "user" and a.memory == () and a.edits[0][1] == said
    assert advice not in a.render(1).split("| Edits:")[1]
    # an update under the label that holds the old value, with the new value in full
    ((label, old),) = update.memory
    ((new_label, new),) = update.edits
    assert new_label == label and new != old and update.excerpt[0][1].endswith(new)
    # two facts in one excerpt, under two labels
    assert len({k for k, _ in two.edits}) == 2
    assert " ".join(v for _, v in two.edits) == two.excerpt[0][1]
    # no fact about the user: no edit
    assert nothing.edits == () and nothing.render(4).endswith("| Edits: none")
    assert write_examples(2, seed=3) == [a, update]  # fewer examples: a prefix, same draw


def test_the_normalized_style_stores_the_short_phrase():
    own = write_examples(1, seed=5)[0]
    short = write_examples(1, seed=5, style="normalized")[0]
    kind = next(k for k in DEMO_KINDS if k.label == own.edits[0][0])
    value = next(v for v in kind.values if v.said == own.edits[0][1])
    assert short.edits == ((kind.label, value.short),)


def test_the_block_round_trips_and_follows_the_value_style():
    base = "Keep the user's facts."
    text = with_examples(base, 2, seed=1)
    assert text.startswith(base + "\n\n" + HEADER + "\n1. ")
    assert split_examples(text) == (base, 2)
    assert split_examples(base) == (base, 0)
    assert with_examples(text, 0) == base
    assert with_examples(text, 3, seed=1).startswith(text)  # one more, the first two kept
    normalized = base + " " + BY_KEY["normalized"].sentence
    short = write_examples(2, seed=1, style="normalized")
    assert with_examples(normalized, 2, seed=1).endswith(short[1].render(2))
    with pytest.raises(ValueError, match="at most 4"):
        write_examples(5)
    with pytest.raises(ValueError, match="style"):
        write_examples(1, style="verbose")


COUNTS = {wf.NEVER_WRITTEN: 3, wf.ASSISTANT_WORDS: 2}


def test_the_edits_evolver_adds_examples_one_at_a_time_and_can_drop_them():
    base = "You keep a short memory. Note what the user says."
    off = EditsEvolver(None, max_examples=0).candidates("w", base, COUNTS)
    assert "add example" not in {c.edit for c in off}
    evolver = EditsEvolver(None, max_examples=2, examples_seed=7)
    cands = {c.edit: c for c in evolver.candidates("w", base, COUNTS)}
    one = cands["add example"]
    assert one.text == with_examples(base, 1, seed=7)
    assert one.addresses == COUNTS  # the examples show the way out of both failures
    assert "drop examples" not in cands
    cands = {c.edit: c for c in evolver.candidates("w", one.text, COUNTS)}
    assert cands["add example"].text == with_examples(base, 2, seed=7)
    assert cands["drop examples"].text == base
    # an operator edits the instructions and keeps the block, switched to the value style asked
    normalized = cands["add normalized"].text
    assert split_examples(normalized) == (base + "\n" + BY_KEY["normalized"].sentence, 1)
    assert normalized == with_examples(split_examples(normalized)[0], 1, seed=7)
    short = write_examples(1, seed=7, style="normalized")[0].render(1)
    assert normalized.endswith(short) and not one.text.endswith(short)
    full = evolver.candidates("w", with_examples(base, 2, seed=7), COUNTS)
    assert "add example" not in {c.edit for c in full}  # max_examples reached


def test_the_validator_checks_the_instructions_not_memlooops_examples():
    base = "You keep a short memory."
    long_block = with_examples(base, 4, seed=0)
    assert len(long_block.split()) > 60
    assert validate_edit(long_block, base, "", max_words=60) is None
    assert validate_edit(base, long_block, "", max_words=60) is None
    assert validate_edit(long_block, long_block, "", max_words=60) == "no change"
    worse = with_examples(base + ' Write {"a": 1}.', 4, seed=0)
    assert validate_edit(worse, long_block, "", max_words=60) == "JSON-shaped"
