"""No echo (issue 42): no optimizer prompt carries an example of a fact kind or a value.

A small optimizer model copies what its prompt shows: the playbook's one learned rule in the
evidence run named exactly the two fact kinds of the reflector's example, kinds that environment
did not have. So no template an optimizer sends names a catalogue variable (its name, label or
topic) or value in any spelling (the leak matcher's), and none gives an example at all.
"""

from __future__ import annotations

import re

import pytest

from memloop.core.leaks import named
from memloop.environment.catalogue import load_catalogue
from memloop.optimize.evolvers import edits, playbook, reflective
from memloop.optimize.searches import gepa


def templates() -> dict[str, str]:
    """Every module-level text an optimizer sends: UPPER_CASE strings of its modules."""
    found = {}
    for op in edits.OPERATORS:  # the edit operators' sentences enter prompts as they are
        found[f"memloop.optimize.evolvers.edits.OPERATORS.{op.key}"] = op.sentence
    for module in (playbook, reflective, gepa, edits):
        for name, value in vars(module).items():
            if (
                re.fullmatch(r"[A-Z][A-Z0-9_]+", name)
                and isinstance(value, str)
                and len(value) > 60
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_the_templates_are_found():
    names = set(templates())
    assert {
        "memloop.optimize.evolvers.playbook.DELTA_SYSTEM",
        "memloop.optimize.evolvers.playbook.DELTA_USER",
        "memloop.optimize.evolvers.reflective.REFLECT_SYSTEM",
        "memloop.optimize.evolvers.reflective.RULES_SYSTEM",
        "memloop.optimize.evolvers.edits.SLOT_SYSTEM",
        "memloop.optimize.evolvers.edits.OPERATORS.own_words",
    } <= names


@pytest.mark.parametrize("name", sorted(templates()))
def test_no_template_names_a_fact_kind_or_value_or_gives_an_example(name):
    text = templates()[name]
    catalogue = load_catalogue()
    kinds = [
        spelling
        for var in catalogue.variables.values()
        for spelling in (var.name, var.label, var.topic, *(v.name for v in var.values))
    ]
    assert named(text, kinds) == [], name
    assert not re.search(r"\be\.g\.|for example|for instance|such as", text, re.I), name
    # the example that was echoed before (issue 42), in any spelling
    assert named(text, ["current city", "exercise", "travels"]) == [], name
