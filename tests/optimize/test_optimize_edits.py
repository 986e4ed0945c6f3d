"""The edits evolver: edit operators chosen from named failures, a validator, a tabu memory,
nothing of the prompt fixed, the gate deciding on the replay screen."""

from __future__ import annotations

import json

import pytest

from memloop.feedback import write_failures as wf
from memloop.feedback.summary import FeedbackSummary
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.optimize.contract import EvolveInput, propose
from memloop.optimize.evolvers.edits import BY_KEY, EditsEvolver, validate
from memloop.testing import FakeOpenAIServer, scripted_screen

SEED = "You keep a short memory. Do not record details."
COUNTS = {wf.NEVER_WRITTEN: 3, wf.UPDATE_LOST: 1}


def given(prompts, counts=COUNTS, **kw):
    """An input whose feedback names `counts` failures; its user lives in Lisbon."""
    data = {"state_reads": {"wrong_by_failure": counts}, "users": [{"home_city": "Lisbon"}]}
    summary = FeedbackSummary.from_data(data, private=["Lisbon"])
    return EvolveInput(prompts=prompts, summary=summary, **kw)


screen_with = scripted_screen


def test_operators_are_ranked_by_the_failures_they_address_and_any_sentence_can_go():
    cands = EditsEvolver(client=None).candidates("writer", SEED, COUNTS)
    # own_words and a worked example (2 by default) answer 3 + 1, every_fact and removing the
    # restrictive s2 answer 3 (operators first), same_label_update 1; the rest none (operator
    # order, then the other removals)
    assert [c.edit for c in cands] == [
        "compound never written: add own_words + add every_fact + remove s2",
        "compound update lost: add own_words + add same_label_update",
        "add own_words",
        "add example",
        "add every_fact",
        "remove s2",
        "add same_label_update",
        "add one_per_fact",
        "add user_only",
        "add normalized",
        "remove s1",
    ]
    assert cands[2].addresses == {wf.NEVER_WRITTEN: 3, wf.UPDATE_LOST: 1}
    assert cands[2].text == SEED + "\n" + BY_KEY["own_words"].sentence
    removal = cands[5]
    assert removal.text == "You keep a short memory."
    assert removal.changes == ["removed s2: Do not record details."]


def test_switching_the_value_style_replaces_the_other_style_sentence():
    text = "Keep the user's facts.\n" + BY_KEY["own_words"].sentence
    cands = {c.edit: c for c in EditsEvolver(client=None).candidates("w", text, {wf.MISREAD: 2})}
    assert "add own_words" not in cands  # already there
    switch = cands["add normalized"]
    assert switch.text == "Keep the user's facts.\n" + BY_KEY["normalized"].sentence
    assert switch.changes[1] == f"removed s2 (switched value style): {BY_KEY['own_words'].sentence}"
    assert switch.addresses == {wf.MISREAD: 2}


REQUEST = (
    "the user said they walk the dog every single morning before going to work today "
    '{"question_answer_history": [], "user": "u1"}'
)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty"),
        (SEED, "no change"),
        ("Keep facts. " + "word " * 30 + "end.", "over-long (33 words, at most 20)"),
        ("Keep the facts the user states and", "truncated (no sentence ending)"),
        ('Write {"label": "x"} edits.', "JSON-shaped"),
        ('Use "label": "value" pairs.', "JSON-shaped"),
        (
            "Note that they walk the dog every single morning before going out.",
            "copies the request (8 words in a row of the feedback)",
        ),
        (
            "Pay special attention to: user_information_updates, question_answer_history.",
            "copies the request's field names (question_answer_history)",
        ),
        ("Keep the facts the user states about their life.", None),
    ],
)
def test_the_validator_refuses_what_a_small_model_gets_wrong(text, problem):
    assert validate(text, SEED, REQUEST, max_words=20) == problem


def test_the_screen_and_gate_decide_and_every_refused_edit_is_tabu_later(tmp_path):
    # single edits only here (compound edits: their own test below)
    evolver = EditsEvolver(client=None, candidates=3, max_examples=0, compound=False)
    # current 0.5; the options: own_words 0.6, every_fact 0.7, remove s2 0.4 (two users)
    screen, seen = screen_with(
        [
            {"u1": 0.5, "u2": 0.5},
            {"u1": 0.6, "u2": 0.6},
            {"u1": 0.7, "u2": 0.7},
            {"u1": 0.4, "u2": 0.4},
        ]
    )
    step = propose(evolver, given({"writer": SEED}, cycle=0, screen=screen))
    assert len(seen) == 4
    assert step.prompts["writer"] == SEED + "\n" + BY_KEY["every_fact"].sentence
    changes = step.changes["writer"]
    assert changes[0] == "named failures: never written 3, update lost 1"
    assert "chose add every_fact (addresses never written 3)" in changes
    assert changes[-1].endswith("taken as an exploration step (not shown better)")
    assert step.decisions[0]["verdict"] == "too few users"
    assert [(r["edit"], r["stage"]) for r in step.rejected] == [
        ("add own_words", "screen"),
        ("remove s2", "screen"),
    ]
    assert step.rejected[0]["reason"] == "scored 0.600 on replay, the current prompt 0.500"

    # the same prompt again with the tabu: the two refused edits are not proposed twice
    screen, seen = screen_with([{"u1": 0.5, "u2": 0.5}])
    again = propose(
        evolver, given({"writer": SEED}, cycle=1, screen=screen, rejected=tuple(step.rejected))
    )
    assert "2 edits skipped: refused in an earlier step (tabu)" in again.changes["writer"]
    screened = seen[1:]
    assert SEED + "\n" + BY_KEY["own_words"].sentence not in screened
    assert "You keep a short memory." not in screened
    assert screened[0] == SEED + "\n" + BY_KEY["every_fact"].sentence


def test_nothing_taken_says_why(tmp_path):
    evolver = EditsEvolver(client=None, candidates=2, screen_takes="improved", max_examples=0)
    screen, _ = screen_with([{"u1": 0.5}, {"u1": 0.9}, {"u1": 0.1}])
    step = propose(evolver, given({"writer": SEED}, cycle=0, screen=screen))
    assert step.prompts == {"writer": SEED}
    assert "gate too few users; no candidate taken; kept" in step.errors["writer"]
    assert {r["stage"] for r in step.rejected} == {"gate"}


def test_the_slot_is_validated_and_leak_checked(tmp_path):
    def reply(body):
        return json.dumps({"kinds": "home in Lisbon, commute length"})

    with FakeOpenAIServer(reply=reply) as server:
        client = ChatClient(Endpoint(model="m", base_url=server.base_url), cache=tmp_path / "c")
        evolver = EditsEvolver(client, slot=True, candidates=16, max_examples=0, compound=False)
        step = propose(evolver, given({"writer": SEED}, cycle=0))
        sent = [r["messages"][-1]["content"] for r in server.requests]
    assert len(sent) == 1 and "never written" in sent[0]
    (leaked,) = [r for r in step.rejected if r["edit"] == "slot"]
    assert leaked["stage"] == "leak check"
    assert "Lisbon" not in json.dumps(step.model_dump())
    # without a screen the best-ranked edit is taken
    assert step.prompts["writer"] == SEED + "\n" + BY_KEY["own_words"].sentence


def test_a_sentence_capping_the_labels_is_a_restriction_tried_first_when_facts_go_unwritten():
    """The evidence run's seed: its "one label" sentence is what keeps facts unwritten."""
    seed = (
        "You keep a short memory for an assistant. Write one label, topic, whose value names "
        "what the latest conversation was about in two or three words."
    )
    cands = EditsEvolver(client=None).candidates("writer", seed, {wf.NEVER_WRITTEN: 5})
    edits = [c.edit for c in cands]
    assert edits.index("remove s2") < edits.index("add same_label_update")
    assert edits.index("remove s2") < edits.index("remove s1")
    assert cands[edits.index("remove s2")].addresses == {wf.NEVER_WRITTEN: 5}


def test_a_compound_edit_adds_the_sentences_that_address_one_failure_together():
    """Facts never written: every operator that answers it (one value style) and the removal
    of the restrictive sentence, at most three parts, in one candidate; named in full."""
    seed = (
        "You keep a short memory for an assistant. Write one label, topic, whose value names "
        "what the latest conversation was about in two or three words."
    )
    evolver = EditsEvolver(client=None)
    cands = evolver.candidates("writer", seed, {wf.NEVER_WRITTEN: 5, wf.ASSISTANT_WORDS: 2})
    compound = {c.edit: c for c in cands if c.edit.startswith("compound")}
    never = compound["compound never written: add own_words + add every_fact + remove s2"]
    assert never.text == "\n".join(
        [
            "You keep a short memory for an assistant.",
            BY_KEY["own_words"].sentence,
            BY_KEY["every_fact"].sentence,
        ]
    )
    assert never.addresses == {wf.NEVER_WRITTEN: 5, wf.ASSISTANT_WORDS: 2}
    words = compound["compound assistant's words stored: add own_words + add user_only"]
    assert words.text == seed + "\n" + BY_KEY["own_words"].sentence + "\n" + (
        BY_KEY["user_only"].sentence
    )
    assert never.shown(1000) == (
        "compound never written: add own_words + add every_fact + remove s2 "
        f"[added (own_words): {BY_KEY['own_words'].sentence} | added (every_fact): "
        f"{BY_KEY['every_fact'].sentence} | removed s2: {seed.split('. ', 1)[1]}]"
    )
    assert len(never.shown()) == 160 and never.shown().endswith("...")
    # a failure only one operator answers makes no compound; compound: false makes none
    assert not [c for c in evolver.candidates("w", seed, {wf.COLLISION: 4}) if "compound" in c.edit]
    off = EditsEvolver(client=None, compound=False)
    assert not [c for c in off.candidates("w", seed, {wf.NEVER_WRITTEN: 5}) if "compound" in c.edit]


def test_a_step_screens_five_candidates_and_names_what_each_would_write():
    """The default: 5 candidates, the compound edits among them; the step's lines name each
    candidate's sentences, not only its id; a chosen compound lists every sentence it added."""
    evolver = EditsEvolver(client=None, max_examples=0)
    # current 0.5; the compound for unwritten facts 0.9, the others 0.6
    screen, seen = screen_with([{"u1": 0.5}, {"u1": 0.9}] + [{"u1": 0.6}] * 4)
    step = propose(evolver, given({"writer": SEED}, cycle=0, screen=screen))
    assert len(seen) == 6  # the current prompt and 5 candidates
    changes = step.changes["writer"]
    (tried,) = [c for c in changes if c.startswith("candidates: ")]
    assert tried.count("(addresses") == 5
    assert f"add own_words [added (own_words): {BY_KEY['own_words'].sentence[:40]}" in tried
    chose = "chose compound never written: add own_words + add every_fact + remove s2"
    assert any(c.startswith(chose) for c in changes)
    assert f"added (every_fact): {BY_KEY['every_fact'].sentence}" in changes
    assert "removed s2: Do not record details." in changes
    assert step.prompts["writer"] == "\n".join(
        ["You keep a short memory.", BY_KEY["own_words"].sentence, BY_KEY["every_fact"].sentence]
    )


def test_successive_halving_screens_all_on_half_the_users_and_the_best_on_all():
    """5 candidates, a budget of 3, 8 users: all five on the first 4 users, the 3 with the largest
    mean gain there on all 8; the gate's level is still divided by the 5 proposed."""
    evolver = EditsEvolver(client=None, max_examples=0, screen_budget=3)
    users = [f"u{i}" for i in range(1, 9)]

    def every(value: float) -> dict[str, float]:
        return dict.fromkeys(users, value)

    # current 0.5; on the half: 0.55, 0.9, 0.6, 0.4, 0.7 -> candidates 1, 4, 2 go on
    # (ranked by gain, kept in their order); on all users: 0.8, 0.6, 0.65
    halves = [every(v) for v in (0.55, 0.9, 0.6, 0.4, 0.7)]
    screen, seen = screen_with([every(0.5), *halves, every(0.8), every(0.6), every(0.65)])
    step = propose(evolver, given({"writer": SEED}, cycle=0, screen=screen))
    assert len(seen) == 1 + 5 + 3
    candidates = seen[1:6]
    assert seen[6:] == [candidates[1], candidates[2], candidates[4]]
    assert step.prompts["writer"] == candidates[1]
    (decision,) = step.decisions
    assert decision["verdict"] == "improved"  # 8 of 8 users up: p = 2/256 < 0.05/5
    assert decision["level"] == pytest.approx(0.05 / 5)
    assert len(decision["users"]) == 8
    stages = {r["edit"]: (r["stage"], r["reason"]) for r in step.rejected}
    halved = [r for r in step.rejected if "successive halving" in r["reason"]]
    assert len(halved) == 2
    assert sorted(r["reason"] for r in halved) == [
        "scored 0.400 on replay, the current prompt 0.500 on half the users (successive halving)",
        "scored 0.550 on replay, the current prompt 0.500 on half the users (successive halving)",
    ]
    assert [s for s, _ in stages.values()].count("screen") == 4
    note = step.changes["writer"][-1]
    assert note.startswith("first rung on 4 users: 3 of 5 candidates go on; replay screen ")
    assert "0.550*, 0.800, 0.600, 0.400*, 0.650 (*: half the users)" in note
    assert note.endswith("gate improved; taken (improved)")


def test_no_halving_with_fewer_than_four_users_or_within_the_budget():
    evolver = EditsEvolver(client=None, max_examples=0, screen_budget=3)
    screen, seen = screen_with([{"u1": 0.5, "u2": 0.5, "u3": 0.5}])
    propose(evolver, given({"writer": SEED}, cycle=0, screen=screen))
    assert len(seen) == 6  # 3 users: every candidate on every user
    evolver = EditsEvolver(client=None, max_examples=0, screen_budget=5)
    screen, seen = screen_with([dict.fromkeys("abcdefgh", 0.5)])
    propose(evolver, given({"writer": SEED}, cycle=0, screen=screen))
    assert len(seen) == 6


def test_an_evolve_run_halves_on_the_real_replay(tmp_path):
    """AWI on the fake endpoint, 4 training users, 5 candidates and a budget of 2: every
    candidate's replay folder holds the first 2 users, and only the 2 that went on (and the
    current prompt) hold all 4; the step's rejections say which were halved."""
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.testing import evolve_loop_reply, fake_roles
    from memloop.testing.commands import write_small_evolve

    path = write_small_evolve(
        tmp_path,
        "halving",
        (4, 0, 1),
        periods=1,
        cycles=2,
        evolvers=["edits"],
        settings={"edits": {"max_examples": 0, "screen_budget": 2}},
    )
    config = load_config(path, EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        (outcome,) = run_evolve(
            config, progress=False, clients=fake_roles(fake.base_url, tmp_path / "c.sqlite")
        )
    screen = outcome.run_dir / "cycle_00" / "screen"
    users = sorted(len([u for u in p.iterdir() if u.is_dir()]) for p in screen.iterdir())
    assert users == [2, 2, 2, 4, 4, 4]  # 3 halved; the current prompt and 2 went on
    step = json.loads((outcome.run_dir / "cycle_00" / "evolve.json").read_text())
    halved = [r for r in step["rejected"] if "successive halving" in r["reason"]]
    assert len(halved) == 3
    assert step["changes"]["writer"][-1].startswith("first rung on 2 users: 2 of 5 candidates")


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"edits": {"max_examples": "2"}}, "max_examples"),
        ({"edits": {"candidates": "5"}}, "candidates"),
        ({"reflective": {"max_tokens": "800"}}, "max_tokens"),
    ],
)
def test_a_number_given_as_text_in_optimizer_settings_is_refused(tmp_path, settings, key):
    """`max_examples: '2'` was taken as 2 (issue 57): optimizer settings are strict."""
    from memloop.core.errors import UserError
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import conditions
    from memloop.testing.commands import write_small_evolve

    evolver = next(iter(settings))
    path = write_small_evolve(tmp_path, "s", (1, 1, 1), evolvers=[evolver], settings=settings)
    with pytest.raises(UserError, match=key):
        conditions(load_config(path, EvolveConfig))
