"""The data.json models: exact round trip of the published format and the lookups later code
uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.core.errors import UserError
from memloop.environment.data import UserItem
from memloop.environment.datafile import dump_items, load_items, save_items
from memloop.environment.errors import EnvDataError, EnvFileError
from memloop.testing.paths import TEST_DATA

SAMPLE = TEST_DATA / "published_sample.json"


@pytest.fixture
def item() -> UserItem:
    return load_items(SAMPLE)[0]


def test_published_sample_round_trips_to_equal_json(tmp_path: Path) -> None:
    items = load_items(SAMPLE)
    out = tmp_path / "copy.json"
    save_items(items, out)
    assert json.loads(out.read_text(encoding="utf-8")) == json.loads(
        SAMPLE.read_text(encoding="utf-8")
    )


def test_round_trip_keeps_key_order_and_unknown_fields() -> None:
    original = json.loads(SAMPLE.read_text(encoding="utf-8"))
    dumped = json.loads(dump_items(load_items(SAMPLE)))
    assert list(dumped[0]) == list(original[0])
    assert list(dumped[0]["periods"][1]) == list(original[0]["periods"][1])
    assert dumped[0]["qas"][1]["note"] == original[0]["qas"][1]["note"]


def test_absent_optional_fields_stay_absent() -> None:
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    for period in data[0]["periods"]:
        del period["update_cnts"]
        for session in period["sessions"]:
            del session["messages"]
    item = UserItem.model_validate(data[0])
    assert item.to_json() == data[0]
    assert item.periods[0].sessions[0].messages == []


def test_state_and_changes(item: UserItem) -> None:
    assert item.num_periods == 2
    assert item.state_at(0) == {"commute_mode": "car", "household_pets": "none"}
    assert item.state_at(1) == {"commute_mode": "bike", "household_pets": "one_dog"}
    assert item.changed_variables(0) == {"commute_mode", "household_pets"}
    assert item.changed_variables(1) == {"commute_mode", "household_pets"}
    assert item.last_set_period("commute_mode", 1) == 1
    assert item.last_set_period("commute_mode", 0) == 0
    state = item.state_at(0)
    state["commute_mode"] = "train"
    assert item.state_at(0)["commute_mode"] == "car"  # a copy


def test_gold_choice_index(item: UserItem) -> None:
    assert item.gold_choice_index(0, 0) == 2  # ["car", "none"]
    assert item.gold_choice_index(0, 1) == 0  # ["bike", "one_dog"]
    assert item.gold_choice_index(1, 0) == 0
    assert item.gold_choice_index(1, 1) == 1
    assert item.required_state(0, 1) == ("bike", "one_dog")


def test_gold_choice_index_accepts_dict_states(item: UserItem) -> None:
    qa = item.qas[0]
    for choice in qa.answer_choices:
        choice.state = dict(zip(qa.required_info, choice.state, strict=True))
    assert item.gold_choice_index(0, 1) == 0


def test_gold_missing_raises_user_error(item: UserItem) -> None:
    del item.qas[0].answer_choices[0]
    with pytest.raises(EnvDataError, match="no choice"):
        item.gold_choice_index(0, 1)


def test_exposed_values(item: UserItem) -> None:
    assert item.exposed_values(0) == [{"commute_mode": "car"}, {"household_pets": "none"}]
    assert item.exposed_values(1) == [{"commute_mode": "bike", "household_pets": "one_dog"}]


def test_profile_text(item: UserItem) -> None:
    assert item.user_profile.text().startswith("name: Marta Okafor\nage: 41")
    item.user_profile.formatted_str = None
    assert item.user_profile.text().splitlines()[1] == "age: 41"


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    items = load_items(SAMPLE)
    out = tmp_path / "sub" / "data.json"
    save_items(items, out)
    save_items(items, out)  # overwrite in place
    assert sorted(p.name for p in out.parent.iterdir()) == ["data.json"]


def test_save_to_a_directory_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(EnvFileError, match="is a directory"):
        save_items(load_items(SAMPLE), tmp_path)


def test_load_items_raises_one_line_user_error(tmp_path: Path) -> None:
    data = json.loads(SAMPLE.read_text(encoding="utf-8"))
    data[0]["periods"][1]["state"]["commute_mode"] = "walk"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(UserError) as info:
        load_items(bad)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(
        f"{bad}: [0].periods[1].state.commute_mode: 'walk' is not a choice of commute_mode"
    )
    assert "memloop env validate" in message
    assert isinstance(info.value, EnvFileError) and len(info.value.violations) > 1


def test_load_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(EnvFileError, match="no such file"):
        load_items(tmp_path / "absent.json")


def test_a_data_file_that_is_a_pipe_is_refused_without_waiting(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "data.json")  # reading it would wait for a writer forever
    with pytest.raises(EnvFileError, match="is not a regular file"):
        load_items(tmp_path / "data.json")
