"""docs/data.md's promises: the sample file loads, the JSON Schema agrees with the loader, and every
relative link in README.md, docs/*.md and benchmarks/README.md points to a file that exists."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from pydantic import TypeAdapter

from memloop.environment.data import UserItem
from memloop.environment.datafile import load_items, parse_data
from memloop.environment.errors import EnvFileError
from memloop.testing.paths import REPO

ROOT = REPO
DOCS = ROOT / "docs"
SAMPLE = DOCS / "sample-data.json"
SCHEMA = DOCS / "data.schema.json"


def _schema() -> dict[str, Any]:
    return json.loads(SCHEMA.read_text(encoding="utf-8"))


def _sample() -> list[dict[str, Any]]:
    return json.loads(SAMPLE.read_text(encoding="utf-8"))


def _schema_errors(data: Any) -> list[str]:
    validator = Draft202012Validator(_schema())
    return [error.message for error in validator.iter_errors(data)]


# --- (1) the sample is valid against the schema --------------------------------------------------


def test_schema_is_a_valid_json_schema() -> None:
    Draft202012Validator.check_schema(_schema())


def test_sample_is_valid_against_the_schema() -> None:
    assert _schema_errors(_sample()) == []


# --- (2) memloop's own loader reads the sample, with these values ---------------------------------


def test_loader_reads_the_sample_values() -> None:
    items = load_items(SAMPLE)
    assert [item.id for item in items] == ["ana", "ben"]
    ana, ben = items
    assert ana.num_periods == 2
    assert ben.num_periods == 2
    assert ana.state_schema["commute_mode"] == ["car", "bike", "train"]
    assert ana.state_at(0) == {"commute_mode": "car", "diet": "omnivore"}
    assert ana.state_at(1) == {"commute_mode": "bike", "diet": "omnivore"}
    assert ana.changed_variables(1) == {"commute_mode"}
    assert ana.periods[1].updates["commute_mode"].old == "car"
    assert ana.periods[0].updates["commute_mode"].old is None
    assert ana.exposed_values(1) == [{"commute_mode": "bike"}]
    # the gold answer follows the state: the car answer after period 0, the bike one after 1
    assert ana.gold_choice_index(0, 0) == 0
    assert ana.gold_choice_index(0, 1) == 1
    # the object form of an answer choice's state works as the list form does
    assert ana.gold_choice_index(1, 1) == 0
    assert len(ben.qas[0].answer_choices) == 4
    assert ben.gold_choice_index(0, 0) == 0
    assert ben.gold_choice_index(0, 1) == 3
    # the profile text: formatted_str when given, else `key: value` lines from the fields
    assert ben.user_profile.text() == "name: Ben Okoro\nage: 51\noccupation: accountant"
    assert ana.user_profile.text().splitlines()[:2] == ["name: Ana Lima", "age: 34"]
    # optional fields left out of the file stay unset: the item is written back as it was read
    assert ana.periods[0].sessions[0].messages == []
    assert ana.to_json() == _sample()[0]


# --- (3) both reject a file without a required field ----------------------------------------------


def test_a_missing_required_field_is_rejected_by_schema_and_loader(tmp_path: Path) -> None:
    data = _sample()
    del data[0]["periods"][1]["state"]
    assert any("'state' is a required property" in m for m in _schema_errors(data))
    broken = tmp_path / "data.json"
    broken.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(EnvFileError) as caught:
        load_items(broken)
    assert caught.value.violations == ["[0].periods[1].state: missing required field"]


Mutation = Callable[[Any], Any]


def _drop(*path: str | int) -> Mutation:
    def change(data: Any) -> Any:
        node = data
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]
        return data

    return change


def _set(value: Any, *path: str | int) -> Mutation:
    def change(data: Any) -> Any:
        node = data
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value
        return data

    return change


REJECTED: dict[str, Mutation] = {
    "no user items": lambda data: [],
    "one object, not a list": lambda data: data[0],
    "no id": _drop(0, "id"),
    "no start_time": _drop(1, "start_time"),
    "no user_profile": _drop(0, "user_profile"),
    "no state_schema": _drop(0, "state_schema"),
    "no qas": _drop(1, "qas"),
    "no period_end": _drop(0, "periods", 0, "period_end"),
    "no sessions": _drop(0, "periods", 0, "sessions"),
    "no updates": _drop(1, "periods", 1, "updates"),
    "no query": _drop(0, "periods", 0, "sessions", 0, "query"),
    "no exposed_states": _drop(0, "periods", 0, "sessions", 0, "exposed_states"),
    "no session_time": _drop(0, "periods", 0, "sessions", 0, "session_time"),
    "no update old": _drop(0, "periods", 0, "updates", "diet", "old"),
    "no answer": _drop(0, "qas", 0, "answer_choices", 0, "answer"),
    "no required_info": _drop(1, "qas", 0, "required_info"),
    "age as text": _set("34", 0, "user_profile", "age"),
    "a state value not a string": _set(2, 0, "periods", 0, "state", "diet"),
    "no periods": _set([], 0, "periods"),
    "empty required_info": _set([], 0, "qas", 0, "required_info"),
    "repeated required_info": _set(["diet", "diet"], 0, "qas", 1, "required_info"),
    "no answer choices": _set([], 0, "qas", 0, "answer_choices"),
    "a variable without values": _set([], 0, "state_schema", "diet"),
    "a value listed twice": _set(["car", "car", "bike"], 0, "state_schema", "commute_mode"),
}

ACCEPTED: dict[str, Mutation] = {
    "an unknown field": _set("kept", 0, "note"),
    "an empty profile": _set({}, 0, "user_profile"),
    "null profile fields": _set(None, 0, "user_profile", "age"),
    "no period_start": _drop(0, "periods", 1, "period_start"),
    "no period_summary": _drop(0, "periods", 1, "period_summary"),
    "no update_cnts": _drop(0, "periods", 1, "update_cnts"),
    "null update_cnts": _set(None, 0, "periods", 1, "update_cnts"),
    "no event": _drop(0, "periods", 1, "sessions", 0, "event"),
    "no messages": _drop(0, "periods", 1, "sessions", 0, "messages"),
    "no answer type": _drop(0, "qas", 0, "answer_choices", 0, "type"),
    "no sessions in a period": _set([], 1, "periods", 1, "sessions"),
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_schema_and_loader_both_reject(name: str) -> None:
    data = REJECTED[name](copy.deepcopy(_sample()))
    assert _schema_errors(data), f"the schema accepts a file with {name}"
    _, problems = parse_data(data)
    assert problems, f"the loader accepts a file with {name}"


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_schema_and_loader_both_accept(name: str) -> None:
    data = ACCEPTED[name](copy.deepcopy(_sample()))
    assert _schema_errors(data) == []
    items, problems = parse_data(data)
    assert problems == []
    assert len(items) == 2


# --- the hand-written schema stays in step with the pydantic models -------------------------------


def _kinds(node: dict[str, Any]) -> frozenset[Any]:
    """What JSON a schema node allows, as a comparable value (minItems and the like aside).

    A reference is compared by the name of the model it points to."""
    if "$ref" in node:
        return frozenset({("model", node["$ref"].rsplit("/", 1)[-1])})
    if "anyOf" in node:
        return frozenset().union(*(_kinds(part) for part in node["anyOf"]))
    types = node.get("type")
    if types is None:
        return frozenset({"any"})
    out: set[Any] = set()
    for kind in [types] if isinstance(types, str) else types:
        if kind == "array":
            out.add(("array", _kinds(node.get("items", {}))))
        elif kind == "object" and isinstance(node.get("additionalProperties"), dict):
            out.add(("object", _kinds(node["additionalProperties"])))
        else:
            out.add(kind)
    return frozenset(out)


def test_schema_matches_the_pydantic_models() -> None:
    generated = TypeAdapter(list[UserItem]).json_schema()
    mine = _schema()
    assert _kinds(mine) == _kinds(generated)
    assert sorted(mine["$defs"]) == sorted(generated["$defs"])
    for name, model in generated["$defs"].items():
        written = mine["$defs"][name]
        assert sorted(written["properties"]) == sorted(model["properties"]), name
        assert sorted(written.get("required", [])) == sorted(model.get("required", [])), name
        assert written["additionalProperties"] is True, name  # the models keep unknown keys
        for field, spec in model["properties"].items():
            assert _kinds(written["properties"][field]) == _kinds(spec), f"{name}.{field}"


# --- every relative link in the Markdown pages points to a file that exists -----------------------

PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "benchmarks" / "README.md"]
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _links(page: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", page.read_text(encoding="utf-8")))


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lowercased, punctuation dropped, spaces -> '-'."""
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_the_pages_exist() -> None:
    names = {page.relative_to(ROOT).as_posix() for page in PAGES}
    for name in (
        "docs/endpoints.md",
        "docs/memory-system.md",
        "docs/data.md",
        "docs/experiments.md",
        "docs/architecture.md",
    ):
        assert name in names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_point_to_existing_files(page: Path) -> None:
    broken = []
    for link in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link) or link.startswith("#"):
            continue  # http(s), mailto: not checked here; an anchor in the same page
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve()
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading with this anchor in {target}")
    assert broken == []


def test_readme_is_a_landing_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200
