"""The procedural catalogue: its data file, hash and validation; size, and renderings that
identify exactly one variable value.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

from memloop.core.errors import UserError
from memloop.environment import catalogue
from memloop.environment.catalogue import (
    CATALOGUE_SHA256,
    DOMAINS,
    VARIABLES,
    catalogue_sha256,
    load_catalogue,
    max_values_per_variable,
    variables_with_values,
)

CATALOGUE_FILE = Path(catalogue.__file__).with_name("catalogue.yaml")

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


# --- the data file -------------------------------------------------------------------------------

# Measured on the Python literal before the data moved to catalogue.yaml.
EXPECTED_DOMAINS = {
    "work": 5,
    "mobility and travel": 4,
    "housing": 5,
    "health and fitness": 5,
    "food and drink": 5,
    "money": 5,
    "family and social life": 5,
    "learning and growth": 4,
    "leisure": 5,
    "technology": 5,
}


def test_yaml_holds_the_same_catalogue_as_before() -> None:
    assert len(DOMAINS) == 10
    assert len(VARIABLES) == 48
    assert sum(len(var.values) for var in VARIABLES.values()) == 164
    assert sum(len(value.renderings) for var in VARIABLES.values() for value in var.values) == 328
    assert {domain: len(variables) for domain, variables in DOMAINS.items()} == EXPECTED_DOMAINS
    assert list(DOMAINS) == list(EXPECTED_DOMAINS)  # file order is kept
    assert sum(len(var.values) == 4 for var in VARIABLES.values()) == 20
    assert sum(len(var.values) == 3 for var in VARIABLES.values()) == 28
    first = DOMAINS["work"][0]
    assert (first.name, first.label, first.topic) == (
        "work_arrangement",
        "work arrangement",
        "where I do my work",
    )
    assert first.value_names == ["fully_remote", "hybrid", "office_based", "on_site_field"]
    assert isinstance(first.values, tuple) and isinstance(first.values[0].renderings, tuple)
    assert all(var.domain == domain for domain, group in DOMAINS.items() for var in group)


def test_sha256_is_the_hash_of_the_file_bytes() -> None:
    expected = hashlib.sha256(CATALOGUE_FILE.read_bytes()).hexdigest()
    assert CATALOGUE_SHA256 == expected == catalogue_sha256()
    packaged = resources.files("memloop.environment").joinpath("catalogue.yaml").read_bytes()
    assert hashlib.sha256(packaged).hexdigest() == expected
    assert re.fullmatch(r"[0-9a-f]{64}", CATALOGUE_SHA256)


def test_loading_the_file_by_path_gives_the_packaged_catalogue() -> None:
    loaded = load_catalogue(CATALOGUE_FILE)
    assert loaded.domains == DOMAINS
    assert loaded.variables == VARIABLES
    assert loaded.sha256 == CATALOGUE_SHA256
    assert loaded.source == str(CATALOGUE_FILE)


def test_an_edited_copy_has_another_hash(tmp_path: Path) -> None:
    text = CATALOGUE_FILE.read_text(encoding="utf-8")
    old = "I split my week between the office and working from home."
    assert text.count(old) == 1
    copy = tmp_path / "catalogue.yaml"
    copy.write_text(text.replace(old, "I split my week between the office and home."), "utf-8")
    edited = load_catalogue(copy)
    assert edited.sha256 == hashlib.sha256(copy.read_bytes()).hexdigest()
    assert edited.sha256 != CATALOGUE_SHA256
    hybrid = edited.variables["work_arrangement"].value("hybrid")
    assert hybrid.renderings[0] == "I split my week between the office and home."
    assert len(edited.variables) == len(VARIABLES)


def _data() -> dict[str, Any]:
    data = yaml.safe_load(CATALOGUE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _one_value(data: dict[str, Any]) -> None:
    del data["domains"][0]["variables"][1]["values"][1:]


def _empty_rendering(data: dict[str, Any]) -> None:
    data["domains"][0]["variables"][0]["values"][1]["renderings"][1] = "  "


def _duplicate_variable(data: dict[str, Any]) -> None:
    data["domains"][2]["variables"][0]["name"] = "work_schedule"


def _duplicate_value(data: dict[str, Any]) -> None:
    data["domains"][0]["variables"][0]["values"][2]["name"] = "hybrid"


def _duplicate_domain(data: dict[str, Any]) -> None:
    data["domains"][1]["domain"] = "work"


def _missing_advice(data: dict[str, Any]) -> None:
    del data["domains"][0]["variables"][0]["values"][0]["advice"]


def _unknown_key(data: dict[str, Any]) -> None:
    data["domains"][0]["variables"][0]["comment"] = "extra"


def _bad_value_name(data: dict[str, Any]) -> None:
    data["domains"][0]["variables"][0]["values"][0]["name"] = "Fully Remote"


def _advice_not_text(data: dict[str, Any]) -> None:
    data["domains"][0]["variables"][0]["values"][0]["advice"] = True


def _no_domains(data: dict[str, Any]) -> None:
    data["domains"] = []


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_one_value, "domain 'work', variable 'work_schedule': values: needs at least 2, got 1"),
        (
            _empty_rendering,
            "domain 'work', variable 'work_arrangement', value 'hybrid': renderings[1]: is empty",
        ),
        (
            _duplicate_variable,
            "domain 'housing', variable 'work_schedule': the name is already used in domain 'work'",
        ),
        (_duplicate_value, "domain 'work', variable 'work_arrangement': value 'hybrid' is given"),
        (_duplicate_domain, "domain 'work' is given twice"),
        (
            _missing_advice,
            "domain 'work', variable 'work_arrangement', values[0]: missing key 'advice'",
        ),
        (_unknown_key, "domain 'work', variables[0]: unknown key 'comment'"),
        (_bad_value_name, "values[0].name: 'Fully Remote' is not a snake_case name"),
        (
            _advice_not_text,
            "variable 'work_arrangement', value 'fully_remote': advice: expected text, got True",
        ),
        (_no_domains, "domains: needs at least 1, got 0"),
    ],
)
def test_a_malformed_copy_is_a_user_error_naming_file_and_entry(
    tmp_path: Path, edit: Any, message: str
) -> None:
    data = _data()
    edit(data)
    copy = tmp_path / "catalogue.yaml"
    copy.write_text(yaml.safe_dump(data, sort_keys=False, width=1000), encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_catalogue(copy)
    assert str(info.value).startswith(f"{copy}: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "domains:\n  - domain: work\n    domain: money\n",
            "not valid YAML (line 3, column 5: duplicate key 'domain')",
        ),
        ("domains: [\n", "not valid YAML"),
        ("- just a list\n", "the top level: expected a mapping with keys domains"),
        ("", "the top level: expected a mapping with keys domains"),
    ],
)
def test_broken_yaml_is_a_user_error(tmp_path: Path, text: str, message: str) -> None:
    copy = tmp_path / "broken.yaml"
    copy.write_text(text, encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_catalogue(copy)
    assert str(info.value).startswith(f"{copy}: ") and message in str(info.value)


def test_duplicate_key_is_named(tmp_path: Path) -> None:
    text = CATALOGUE_FILE.read_text(encoding="utf-8")
    line = "        label: work arrangement\n"
    assert text.count(line) == 1
    copy = tmp_path / "catalogue.yaml"
    copy.write_text(text.replace(line, line + line), encoding="utf-8")
    with pytest.raises(UserError, match="duplicate key 'label'"):
        load_catalogue(copy)


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read the catalogue"):
        load_catalogue(tmp_path / "nope.yaml")
