"""`memloop env validate`: one message with a JSON path per violation, exit code 2, no traceback."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memloop.environment.datafile import parse_data, parse_text
from memloop.experiments.cli import main
from memloop.testing.paths import TEST_DATA

SAMPLE = TEST_DATA / "published_sample.json"
BASE = json.loads(SAMPLE.read_text(encoding="utf-8"))


def _mutated(change: Callable[[list[Any]], Any]) -> list[Any]:
    data = copy.deepcopy(BASE)
    change(data)
    return data


def _set(*path_and_value: Any) -> Callable[[list[Any]], None]:
    *path, last, value = path_and_value

    def change(data: list[Any]) -> None:
        node = data
        for step in path:
            node = node[step]
        node[last] = value

    return change


def _delete(*path: Any) -> Callable[[list[Any]], None]:
    def change(data: list[Any]) -> None:
        node = data
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]

    return change


# (name, change to the published sample, a message that must be among the violations)
CASES = [
    (
        "bad value",
        _set(0, "periods", 1, "state", "commute_mode", "walk"),
        "[0].periods[1].state.commute_mode: 'walk' is not a choice of commute_mode",
    ),
    (
        "unknown variable",
        _set(0, "periods", 0, "state", "mood", "calm"),
        "[0].periods[0].state.mood: unknown variable 'mood' (not in state_schema)",
    ),
    (
        "unknown required variable",
        _set(0, "qas", 1, "required_info", 0, "mood"),
        "[0].qas[1].required_info[0]: unknown variable 'mood' (not in state_schema)",
    ),
    (
        "gold missing among choices",
        _delete(0, "qas", 0, "answer_choices", 0),
        "[0].qas[0].answer_choices: no choice matches the gold state ['bike', 'one_dog'] "
        "of period 1",
    ),
    (
        "gold matched twice",
        _set(0, "qas", 1, "answer_choices", 2, "state", ["none"]),
        "[0].qas[1].answer_choices[2].state: same state variant ['none'] as answer_choices[0]",
    ),
    (
        "choice value not a choice",
        _set(0, "qas", 0, "answer_choices", 1, "state", ["bus", "two_cats"]),
        "[0].qas[0].answer_choices[1].state[0]: 'bus' is not a choice of commute_mode",
    ),
    (
        "exposed mismatch",
        _set(0, "periods", 1, "sessions", 0, "exposed_states", "commute_mode", "train"),
        "[0].periods[1].sessions[0].exposed_states.commute_mode: 'train' does not match "
        "the period's state value 'bike'",
    ),
    (
        "period dates out of order",
        _set(0, "periods", 1, "period_end", "2021-01-15"),
        "[0].periods[1].period_end: 2021-01-15 is not after the previous period's end 2021-03-01",
    ),
    (
        "session dates out of order",
        _set(0, "periods", 0, "sessions", 1, "session_time", "2021-02-27 10:00:00"),
        "[0].periods[0].sessions[1].session_time: 2021-02-27 10:00:00 is earlier than "
        "the preceding session",
    ),
    (
        "not a date",
        _set(0, "start_time", "March 2021"),
        "[0].start_time: 'March 2021' is not a date (YYYY-MM-DD)",
    ),
    (
        "update without change",
        _set(0, "periods", 1, "updates", "commute_mode", {"old": "bike", "new": "bike"}),
        "[0].periods[1].updates.commute_mode.old: 'bike' differs from the previous period's "
        "value 'car'",
    ),
    (
        "change without update",
        _delete(0, "periods", 1, "updates", "household_pets"),
        "[0].periods[1].updates: 'household_pets' changed from 'none' to 'one_dog' but has "
        "no update entry",
    ),
    (
        "state misses a variable",
        _delete(0, "periods", 1, "state", "household_pets"),
        "[0].periods[1].state: missing variable(s) 'household_pets'",
    ),
    (
        "missing field",
        _delete(0, "qas", 0, "required_info"),
        "[0].qas[0].required_info: missing required field",
    ),
    (
        "missing nested field",
        _delete(0, "periods", 1, "sessions", 0, "query"),
        "[0].periods[1].sessions[0].query: missing required field",
    ),
    (
        "wrong type int",
        _set(0, "user_profile", "age", "41"),
        "[0].user_profile.age: expected an integer, got string '41'",
    ),
    (
        "wrong type list",
        _set(0, "qas", 0, "required_info", "commute_mode"),
        "[0].qas[0].required_info: expected a list, got string 'commute_mode'",
    ),
    (
        "wrong type value",
        _set(0, "periods", 0, "state", "commute_mode", 3),
        "[0].periods[0].state.commute_mode: expected a string, got integer 3",
    ),
    (
        "wrong type choice state",
        _set(0, "qas", 0, "answer_choices", 0, "state", ["bike", 3]),
        "[0].qas[0].answer_choices[0].state: entry 1 must be a string value",
    ),
    (
        "item not an object",
        lambda data: data.append("user"),
        "[1]: expected an object, got string 'user'",
    ),
    (
        "duplicate id",
        lambda data: data.append(copy.deepcopy(data[0])),
        "[1].id: duplicate id '5b0f3c1e-7d2a-4c55-9e0b-2f6a1d8c4e71' (also [0])",
    ),
]


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_published_sample_is_valid() -> None:
    items, problems = parse_data(copy.deepcopy(BASE))
    assert problems == []
    assert len(items) == 1


@pytest.mark.parametrize(("name", "change", "expected"), CASES, ids=[case[0] for case in CASES])
def test_violation_message(name: str, change: Callable, expected: str) -> None:
    _, problems = parse_data(_mutated(change))
    assert any(problem.startswith(expected) for problem in problems), problems


@pytest.mark.parametrize(("name", "change", "expected"), CASES, ids=[case[0] for case in CASES])
def test_cli_prints_violation_and_exits_2(
    name: str, change: Callable, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path / "data.json", _mutated(change))
    before = sorted(tmp_path.iterdir())
    assert main(["env", "validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert any(line.startswith(expected) for line in out.splitlines()), out
    assert "Traceback" not in out + err
    assert err.startswith(f"memloop: error: {path}: ") and err.count("\n") == 1
    assert sorted(tmp_path.iterdir()) == before  # nothing written


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "(file): the file is empty"),
        ("  \n\t", "(file): the file is empty"),
        ('[{"id": "x",', "(file): malformed JSON at line 1, column 13"),
        ("{}", "(top level): expected a list of user items, got an object"),
        (
            '{"periods": []}',
            "(top level): expected a list of user items, got an object; "
            "wrap the single item in [ ]",
        ),
        ("[]", "(top level): the list holds no user items"),
        ("42", "(top level): expected a list of user items, got integer 42"),
    ],
)
def test_file_level_problems(
    content: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "data.json"
    path.write_text(content, encoding="utf-8")
    assert main(["env", "validate", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[0].startswith(expected)
    assert "Traceback" not in out + err


def test_not_utf8_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "data.json"
    path.write_bytes(b"\xff\xfe[]")
    assert main(["env", "validate", str(path)]) == 2
    assert capsys.readouterr().out.startswith("(file): not UTF-8 text")
    assert main(["env", "validate", str(tmp_path / "absent.json")]) == 2
    assert capsys.readouterr().err == f"memloop: error: {tmp_path / 'absent.json'}: no such file\n"
    assert main(["env", "validate", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_valid_file_prints_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env", "validate", str(SAMPLE)]) == 0
    out = capsys.readouterr().out
    assert f"{SAMPLE}: valid" in out
    assert "users: 1" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("choices per question"))
    assert row.split()[3:] == ["3", "3.50", "4", "7"]  # min, mean, max, total: 2 questions (3, 4)
    assert main(["env", "validate", str(SAMPLE), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["users"] == 1
    assert summary["choices_per_question"] == {"min": 3, "mean": 3.5, "max": 4, "total": 7}
    assert summary["changes_per_period"]["max"] == 2


def _json_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none()
        | st.booleans()
        | st.integers(-5, 5)
        | st.text(max_size=5)
        | st.sampled_from(["car", "bike", "none", "one_dog", "2021-03-01", "2021-02-28 19:42:10"])
    )
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
        ),
        max_leaves=8,
    )


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            out += _paths(child, prefix + (key,))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            out += _paths(child, prefix + (index,))
    return out


ALL_PATHS = _paths(BASE)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ALL_PATHS[1:]), _json_values(), st.booleans())
def test_any_corruption_gives_messages_not_exceptions(
    path: tuple, value: Any, delete: bool
) -> None:
    data = copy.deepcopy(BASE)
    node = data
    for step in path[:-1]:
        node = node[step]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    items, problems = parse_data(data)
    assert all(isinstance(problem, str) and "\n" not in problem for problem in problems)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_any_text_gives_messages_not_exceptions(text: str) -> None:
    items, problems = parse_text(text)
    assert all(isinstance(problem, str) and "\n" not in problem for problem in problems)
