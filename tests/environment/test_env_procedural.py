"""Invariants of the procedural generator, its argument checks, and the CLI round trip."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memloop.core.errors import UserError
from memloop.core.files import json_sha256
from memloop.environment import catalogue
from memloop.environment.catalogue import (
    CATALOGUE_SHA256,
    VARIABLES,
    load_catalogue,
    variables_with_values,
)
from memloop.environment.data import UserItem
from memloop.environment.datafile import dump_items, load_items, parse_text
from memloop.environment.errors import ProceduralArgumentError
from memloop.environment.procedural import ProceduralSpec, add_months, generate_procedural
from memloop.environment.validation import check_items, parse_date, parse_session_time
from memloop.experiments.cli import main
from memloop.testing.paths import REPO

ROOT = REPO


@st.composite
def procedural_args(draw: st.DrawFn) -> dict[str, Any]:
    choices = draw(st.integers(2, 4))
    states = draw(st.integers(1 if choices >= 4 else 2, 3))  # choices ** states >= 4
    questions = draw(st.integers(1, 5))
    variables = min(questions * states, len(variables_with_values(choices)))
    return {
        "users": draw(st.integers(1, 2)),
        "periods": draw(st.integers(0, 5)),
        "questions": questions,
        "states_per_question": states,
        "choices_per_state": choices,
        "changes_per_period": draw(st.integers(1, min(variables, 4))),
        "seed": draw(st.integers(0, 2**40)),
    }


FAST = settings(max_examples=40, deadline=None)


@FAST
@given(procedural_args())
def test_output_is_valid_and_round_trips(args: dict[str, Any]) -> None:
    items = generate_procedural(**args)
    assert check_items(items) == []
    text = dump_items(items)
    parsed, problems = parse_text(text)
    assert problems == []
    assert dump_items(parsed) == text


@FAST
@given(procedural_args())
def test_same_arguments_give_identical_bytes(args: dict[str, Any]) -> None:
    assert dump_items(generate_procedural(**args)) == dump_items(generate_procedural(**args))


@FAST
@given(procedural_args())
def test_shape_matches_the_arguments(args: dict[str, Any]) -> None:
    for item in generate_procedural(**args):
        assert item.num_periods == args["periods"] + 1
        assert len(item.qas) == args["questions"]
        assert all(
            len(choices) == args["choices_per_state"] for choices in item.state_schema.values()
        )
        assert all(len(qa.required_info) == args["states_per_question"] for qa in item.qas)
        used = {var for qa in item.qas for var in qa.required_info}
        assert used == set(item.state_schema)
        totals = {
            var: sum(var in item.changed_variables(p) for p in range(1, item.num_periods))
            for var in item.state_schema
        }
        assert all(period.update_cnts == totals for period in item.periods)


@FAST
@given(procedural_args())
def test_exactly_k_changes_per_period(args: dict[str, Any]) -> None:
    for item in generate_procedural(**args):
        for p in range(1, item.num_periods):
            changed = item.changed_variables(p)
            assert len(changed) == args["changes_per_period"]
            assert set(item.periods[p].updates) == changed
            exposed = [var for values in item.exposed_values(p) for var in values]
            assert sorted(exposed) == sorted(changed)  # each change revealed once
        initial = [var for values in item.exposed_values(0) for var in values]
        assert sorted(initial) == sorted(item.state_schema)  # period 0 reveals every variable once


def _mentioned_values(query: str) -> dict[str, set[str]]:
    """Which values of which catalogue variables have a rendering inside `query`."""
    found: dict[str, set[str]] = {}
    for name, variable in VARIABLES.items():
        for value in variable.values:
            if any(text in query for text in value.renderings):
                found.setdefault(name, set()).add(value.name)
    return found


@FAST
@given(procedural_args())
def test_utterances_reveal_exactly_the_exposed_values(args: dict[str, Any]) -> None:
    for item in generate_procedural(**args):
        for period in item.periods:
            for session in period.sessions:
                mentioned = _mentioned_values(session.query)
                assert mentioned == {var: {value} for var, value in session.exposed_states.items()}


@FAST
@given(procedural_args())
def test_questions_have_distinct_answers_and_gold_every_period(args: dict[str, Any]) -> None:
    for item in generate_procedural(**args):
        experienced = {
            q: {item.required_state(q, p) for p in range(item.num_periods)}
            for q in range(len(item.qas))
        }
        for q, qa in enumerate(item.qas):
            answers = [choice.answer for choice in qa.answer_choices]
            variants = [tuple(choice.state) for choice in qa.answer_choices]
            assert len(answers) >= max(4, args["choices_per_state"]) or len(answers) == len(
                experienced[q]
            )
            assert len(answers) >= 4
            assert len(set(answers)) == len(answers)
            assert len(set(variants)) == len(variants)
            for choice in qa.answer_choices:
                kind = "experience" if tuple(choice.state) in experienced[q] else "random"
                assert choice.type == kind
            for p in range(item.num_periods):
                gold = item.gold_choice_index(q, p)
                assert tuple(qa.answer_choices[gold].state) == item.required_state(q, p)


@FAST
@given(procedural_args())
def test_dates_are_ordered(args: dict[str, Any]) -> None:
    for item in generate_procedural(**args):
        ends = [parse_date(period.period_end) for period in item.periods]
        assert ends == sorted(set(ends))
        times = [
            parse_session_time(s.session_time) for period in item.periods for s in period.sessions
        ]
        assert times == sorted(times) and len(set(times)) == len(times)


def test_choice_order_is_shuffled() -> None:
    items = generate_procedural(users=3, periods=6, questions=4, seed=1)
    golds = {item.gold_choice_index(q, 0) for item in items for q in range(len(item.qas))}
    assert len(golds) > 1
    first_kinds = {qa.answer_choices[0].type for item in items for qa in item.qas}
    assert first_kinds == {"experience", "random"}


def test_different_seeds_differ_and_users_are_stable_prefixes() -> None:
    assert dump_items(generate_procedural(seed=1)) != dump_items(generate_procedural(seed=2))
    three = generate_procedural(users=3, seed=5)
    five = generate_procedural(users=5, seed=5)
    assert [item.to_json() for item in three] == [item.to_json() for item in five[:3]]
    assert len({item.id for item in five}) == 5


def test_defaults() -> None:
    items = generate_procedural()
    assert len(items) == 3
    assert all(isinstance(item, UserItem) for item in items)
    assert items[0].num_periods == 5 and len(items[0].qas) == 4 and len(items[0].state_schema) == 8


def test_add_months_clamps_to_month_end() -> None:
    from datetime import date

    assert add_months(date(2021, 1, 31), 1) == date(2021, 2, 28)
    assert add_months(date(2020, 11, 30), 3) == date(2021, 2, 28)
    assert add_months(date(2020, 10, 1), 12) == date(2021, 10, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"users": 0}, "--users must be between 1"),
        ({"periods": -1}, "--periods must be between 0"),
        ({"questions": 0}, "--questions must be between 1"),
        (
            {"changes_per_period": 9},
            "--changes-per-period must be between 1 and the 8 state variables",
        ),
        ({"changes_per_period": 0}, "--changes-per-period must be between 1"),
        ({"states_per_question": 1, "choices_per_state": 2}, "allows only 2 distinct answers"),
        ({"states_per_question": 0}, "--states-per-question must be between 1"),
        ({"choices_per_state": 1}, "--choices-per-state must be between 2 and 4"),
        ({"choices_per_state": 5}, "--choices-per-state must be between 2 and 4"),
        (
            {"states_per_question": 21, "choices_per_state": 4},
            "--states-per-question must be between 1 and 20",
        ),
        ({"start_date": "2020-02-30"}, "--start-date must be a date"),
        ({"months_per_period": 0}, "--months-per-period must be between 1"),
    ],
)
def test_bad_arguments_are_user_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ProceduralArgumentError) as info:
        generate_procedural(**kwargs)
    assert isinstance(info.value, UserError)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_cli_procedural_then_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "env" / "data.json"
    argv = [
        "env",
        "procedural",
        "--users",
        "2",
        "--periods",
        "3",
        "--questions",
        "3",
        "--states-per-question",
        "2",
        "--choices-per-state",
        "3",
        "--changes-per-period",
        "2",
        "--seed",
        "7",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert (
        f"wrote 2 users (4 periods, 3 questions, 6 state variables each) to {out}"
        in capsys.readouterr().out
    )
    assert main(["env", "validate", str(out)]) == 0
    assert f"{out}: valid" in capsys.readouterr().out
    items = load_items(out)
    expected = generate_procedural(
        users=2,
        periods=3,
        questions=3,
        states_per_question=2,
        choices_per_state=3,
        changes_per_period=2,
        seed=7,
    )
    assert out.read_text(encoding="utf-8") == dump_items(expected)
    assert [item.to_json() for item in items] == [item.to_json() for item in expected]


def test_cli_bad_arguments_exit_2_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "data.json"
    assert main(["env", "procedural", "--users", "0", "--out", str(out)]) == 2
    assert main(["env", "procedural", "--changes-per-period", "50", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "memloop: error: --users must be between 1 and 10000; got 0"
    assert err.splitlines()[1].startswith(
        "memloop: error: --changes-per-period must be between 1 and the 8"
    )
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_bytes_identical_across_processes_with_different_hash_seeds(tmp_path: Path) -> None:
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"data-{hash_seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "memloop",
                "env",
                "procedural",
                "--seed",
                "3",
                "--out",
                str(out),
            ],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]
    assert json.loads(outputs[0])[0]["periods"][0]["period_end"] == "2020-10-01"


def test_description_carries_every_argument_and_the_catalogue_sha256() -> None:
    spec = ProceduralSpec(users=2, periods=2, questions=2, seed=0)
    description = spec.describe()
    catalogue_file = Path(catalogue.__file__).with_name("catalogue.yaml")
    assert description["catalogue_sha256"] == CATALOGUE_SHA256
    assert CATALOGUE_SHA256 == hashlib.sha256(catalogue_file.read_bytes()).hexdigest()
    assert {key: description[key] for key in dataclasses.asdict(spec)} == dataclasses.asdict(spec)
    assert set(description) == {f.name for f in dataclasses.fields(spec)} | {"catalogue_sha256"}
    assert json.loads(json.dumps(description)) == description
    assert description == ProceduralSpec(users=2, periods=2, questions=2, seed=0).describe()
    assert description != ProceduralSpec(users=2, periods=2, questions=2, seed=1).describe()


def test_an_edited_catalogue_changes_the_description_and_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = ProceduralSpec(users=2, periods=2, questions=2, seed=0)
    before = json_sha256(spec.describe())
    text = Path(catalogue.__file__).with_name("catalogue.yaml").read_text(encoding="utf-8")
    copy = tmp_path / "catalogue.yaml"
    copy.write_text(text.replace("I work nights now,", "I work nights these days,"), "utf-8")
    edited = load_catalogue(copy)
    assert edited.sha256 != CATALOGUE_SHA256
    monkeypatch.setattr(catalogue, "CATALOGUE_SHA256", edited.sha256)
    assert spec.describe()["catalogue_sha256"] == edited.sha256
    assert json_sha256(spec.describe()) != before
