"""The procedural catalogue: size, and renderings that identify exactly one variable value."""

from __future__ import annotations

import re

from memloop.environment.catalogue import (
    DOMAINS,
    VARIABLES,
    max_values_per_variable,
    variables_with_values,
)

RENDERINGS = [
    (var.name, value.name, text)
    for var in VARIABLES.values()
    for value in var.values
    for text in value.renderings
]


def test_catalogue_size() -> None:
    assert len(DOMAINS) >= 8
    assert len(VARIABLES) >= 40
    assert all(len(variables) >= 4 for variables in DOMAINS.values())
    assert all(len(var.values) >= 3 for var in VARIABLES.values())
    assert max_values_per_variable() == 4
    assert len(variables_with_values(4)) >= 12


def test_names_are_snake_case_and_unique_per_variable() -> None:
    for var in VARIABLES.values():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", var.name)
        assert len(set(var.value_names)) == len(var.value_names)
        assert all(re.fullmatch(r"[a-z0-9][a-z0-9_]*", name) for name in var.value_names)
        assert var.label and var.topic


def test_every_value_has_renderings_and_distinct_advice() -> None:
    advice = [value.advice for var in VARIABLES.values() for value in var.values]
    assert len(set(advice)) == len(advice)
    for var in VARIABLES.values():
        for value in var.values:
            assert len(value.renderings) >= 2
            assert all(text.endswith((".", "!")) for text in value.renderings)


def test_no_rendering_contains_another() -> None:
    texts = [text.lower() for _, _, text in RENDERINGS]
    assert len(set(texts)) == len(texts)
    for i, outer in enumerate(texts):
        for j, inner in enumerate(texts):
            assert i == j or inner not in outer, (RENDERINGS[i], RENDERINGS[j])
