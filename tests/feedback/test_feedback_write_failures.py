"""Named write failures (feedback/write_failures.py): each name computed on hand-made records."""

from __future__ import annotations

import json

import pytest

from memloop.environment.episode import PeriodRecord, SessionLog
from memloop.feedback import write_failures as wf
from memloop.feedback.summary import budgeted_summary

GYM_OLD = "I go to the gym on Monday mornings before work."
GYM_NEW = "These days I swim laps at the pool on Friday evenings."
PET = "We adopted a beagle puppy named after a river last spring."
DIET = "I stopped eating meat and cheese entirely this year."
REPLY = "Consider stretching routines and hydration strategies beforehand."


def session(i, exposed, user, assistant=REPLY):
    return SessionLog(
        session_index=i,
        session_time="t",
        exposed_states=exposed,
        messages=[{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
    )


def record(period, sessions, memory, reads):
    """One period: its sessions, the memory view at probe time and letter reads {var: (b, t)}."""
    return PeriodRecord(
        user_id="u",
        period=period,
        mode="off_policy",
        sessions=sessions,
        probes={
            "memory_view": "Memory (label: value):\n" + "\n".join(memory) if memory else "",
            "state_reads": [
                {
                    "user_id": "u",
                    "period": period,
                    "variable": v,
                    "true_value": t,
                    "choices": [t, "other_value"],
                    "write_period": 0,
                    "picked": b,
                }
                for v, (b, t) in reads.items()
            ],
        },
    )


P0 = [
    session(0, {"exercise_habit": "gym_mornings"}, GYM_OLD),
    session(1, {"pet_owner": "dog"}, PET),
]


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        # the user's words are in memory, the reader picked wrong
        (["exercise: swim laps at the pool on Friday evenings"], wf.MISREAD),
        # the assistant's reply was stored
        (["exercise: stretching routines and hydration strategies"], wf.ASSISTANT_WORDS),
        # the old value's words are still there, the new one never replaced them
        (
            ["exercise: gym on Monday mornings before work", "pet: beagle puppy river"],
            wf.UPDATE_LOST,
        ),
        # nothing about it; fewer entries than facts, one holds a later fact's words
        (["notes: stopped eating meat and cheese"], wf.COLLISION),
        # nothing about it, and no collision: as many entries as facts
        (["pet: adopted a beagle puppy", "food: stopped eating meat", "x: y z"], wf.NEVER_WRITTEN),
        # a topic label that only names the kind holds no fact
        (["topic: exercise habit"], wf.NEVER_WRITTEN),
    ],
)
def test_each_wrong_pair_gets_its_failure_name(memory, expected):
    p1 = [
        session(0, {"exercise_habit": "pool_evenings"}, GYM_NEW),
        session(1, {"diet": "vegetarian"}, DIET),
    ]
    records = [
        record(0, P0, [], {}),
        record(1, p1, memory, {"exercise_habit": ("gym_mornings", "pool_evenings")}),
    ]
    (pair,) = [p for p in wf.state_pairs(records) if p.period == 1]
    assert (pair.variable, pair.believed, pair.true) == (
        "exercise_habit",
        "gym_mornings",
        "pool_evenings",
    )
    assert pair.failure == expected


def test_a_right_pair_has_no_failure_and_an_unrevealed_value_is_not_a_write_failure():
    records = [
        record(
            0,
            P0,
            ["gym: Monday mornings before work"],
            {"exercise_habit": ("gym_mornings", "gym_mornings"), "diet": ("vegan", "keto")},
        )
    ]
    pairs = {p.variable: p for p in wf.state_pairs(records)}
    assert pairs["exercise_habit"].failure is None
    assert pairs["diet"].failure == wf.NOT_REVEALED


def test_the_block_groups_pairs_by_kind_and_failure_with_counts():
    pairs = [
        wf.StatePair("u", 0, "pet_owner", "cat", "dog", wf.NEVER_WRITTEN),
        wf.StatePair("u", 1, "pet_owner", None, "dog", wf.NEVER_WRITTEN),
        wf.StatePair("u", 0, "exercise_habit", "a", "a", None),
        wf.StatePair("v", 1, "exercise_habit", "a", "b", wf.UPDATE_LOST),
    ]
    block = wf.failure_block(pairs)
    assert block["state_pairs"] == 4 and block["right"] == 1
    assert block["wrong_by_failure"] == {wf.NEVER_WRITTEN: 2, wf.UPDATE_LOST: 1}
    assert list(block["by_kind"]) == ["pet owner", "exercise habit"]  # most wrong first
    assert block["by_kind"]["pet owner"] == {
        "right": 0,
        "wrong": 2,
        "failures": {wf.NEVER_WRITTEN: 2},
        "believed_vs_true": [["cat", "dog"], [None, "dog"]],
    }
    assert block["by_kind"]["exercise habit"]["right"] == 1
    assert wf.failure_counts(pairs) == {wf.NEVER_WRITTEN: 2, wf.UPDATE_LOST: 1}


@pytest.mark.parametrize(
    ("mode", "shown"),
    [("complete", True), ("diagnostic", True), ("question_only", False), ("none", False)],
)
def test_the_summary_shows_the_block_in_every_mode_that_shows_answers(mode, shown):
    block = wf.failure_block([wf.StatePair("u", 0, "pet_owner", "cat", "dog", wf.MISREAD)])
    summary = budgeted_summary([], mode, {}, max_questions=10, max_chars=10_000, failures=block)
    assert ("state_reads" in summary.header) is shown
    if shown:
        assert summary.data()["state_reads"]["wrong_by_failure"] == {wf.MISREAD: 1}
        assert "dog" in summary.private  # the leak check still guards the values it shows


def test_the_block_shrinks_to_its_budget_counts_last():
    pairs = [
        wf.StatePair("u", p, f"kind_{i}", "a" * 40, "b" * 40, wf.NEVER_WRITTEN)
        for i in range(6)
        for p in range(2)
    ]
    block = wf.failure_block(pairs)
    size = len(json.dumps(block, indent=1))
    assert wf.fit_block(block, size) == block
    lean = wf.fit_block(block, size - 1)
    assert lean is not None and "believed_vs_true" not in lean["by_kind"]["kind 0"]
    assert lean["by_kind"]["kind 0"]["failures"] == {wf.NEVER_WRITTEN: 2}
    counts = wf.fit_block(block, 200)
    assert counts == {"state_pairs": 12, "right": 0, "wrong_by_failure": {wf.NEVER_WRITTEN: 12}}
    assert wf.fit_block(block, 20) is None
    # a summary's smaller budget keeps the block within half of it, and whole questions
    summary = budgeted_summary(
        [], "complete", {}, max_questions=5, max_chars=size * 4, failures=block
    )
    assert summary.data()["state_reads"] == block
    assert summary.fit(400).data()["state_reads"] == counts
