"""The playbook evolver: one delta per cycle to a list of one-sentence rules, merged
deterministically, with counts and a revert driven by the validation objective."""

from __future__ import annotations

import json

import pytest

from memloop.core.leaks import LeakCheck
from memloop.feedback.summary import FeedbackSummary
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.optimize.contract import EvolveInput
from memloop.optimize.evolver_check import check_evolver
from memloop.optimize.evolvers.playbook import (
    HEADER,
    PlaybookEvolver,
    render_playbook,
    rule_counts,
    split_playbook,
)
from memloop.testing import FakeOpenAIServer, scripted_screen

CORE = "Record what the user says about themselves."
SUMMARY = {"users": [{"states": {"home_city": "Lisbon"}}]}


def given(prompts, **kw):
    """The evolver's input: `prompts` and SUMMARY, whose user lives in Lisbon."""
    summary = FeedbackSummary.from_data(SUMMARY, private=["Lisbon"])
    return EvolveInput(prompts=prompts, summary=summary, **kw)


def test_a_playbook_round_trips_through_the_prompt_text():
    rules = [("r1", "Replace an old value when it changes."), ("r3", "Keep amounts exact.")]
    text = render_playbook(CORE, rules)
    assert text == f"{CORE}\n\n{HEADER}\n[r1] {rules[0][1]}\n[r3] {rules[1][1]}"
    assert split_playbook(text) == (CORE, rules)
    assert split_playbook(CORE) == (CORE, [])
    assert render_playbook(CORE, []) == CORE


@pytest.mark.parametrize(
    ("delta", "change", "problem"),
    [
        (
            {"op": "ADD", "id": "new", "rule": "Note how often the user exercises."},
            "added r3",
            None,
        ),
        (
            {"op": "ADD", "id": "new", "rule": "Replace the old value when it changes."},
            "",
            "repeats rule r1",
        ),
        (
            {"op": "ADD", "id": "new", "rule": "Remember that the user lives in Lisbon."},
            "",
            "names 1 private value of the users",
        ),
        ({"op": "ADD", "id": "new", "rule": "Too short."}, "", "2 words"),
        (
            {"op": "ADD", "id": "new", "rule": "Keep dates exact. Drop old ones."},
            "",
            "not one sentence",
        ),
        (
            {"op": "EDIT", "id": "r2", "rule": "Keep every amount exact with its unit."},
            "edited r2",
            None,
        ),
        (
            {"op": "EDIT", "id": "r9", "rule": "Keep every amount exact with its unit."},
            "",
            "EDIT of unknown rule 'r9'",
        ),
        ({"op": "REMOVE", "id": "[r1]", "rule": ""}, "removed r1", None),
        ({"op": "REMOVE", "id": "r7", "rule": ""}, "", "REMOVE of unknown rule 'r7'"),
    ],
)
def test_the_merge_is_deterministic_and_drops_bad_deltas(delta, change, problem):
    rules = [("r1", "Replace an old value when it changes."), ("r2", "Keep amounts exact.")]
    evolver = PlaybookEvolver(client=None)  # merge needs no model
    merged, what, why = evolver.merge(rules, delta, "r3", LeakCheck(frozenset({"lisbon"})), CORE)
    assert what.startswith(change) if change else what == ""
    if problem is None:
        assert why is None and merged != rules
    else:
        assert problem in why and merged == rules
    if delta["op"] == "ADD" and problem is None:
        assert merged == [*rules, ("r3", delta["rule"])]
    if delta["op"] == "REMOVE" and problem is None:
        assert merged == [rules[1]]


def test_at_most_max_rules():
    rules = [(f"r{i}", f"Keep fact kind number {i} current.") for i in range(1, 3)]
    evolver = PlaybookEvolver(client=None, max_rules=2)
    merged, _, why = evolver.merge(
        rules,
        {"op": "ADD", "id": "new", "rule": "Write the user's job title exactly."},
        "r3",
        LeakCheck(frozenset()),
        CORE,
    )
    assert merged == rules and "already 2 rules" in why


def test_counts_follow_the_objective_of_the_cycle_a_rule_was_new_in():
    p0 = {"w": CORE}
    p1 = {"w": render_playbook(CORE, [("r1", "a b c.")])}
    p2 = {"w": render_playbook(CORE, [("r1", "a b c."), ("r2", "d e f.")])}
    p3 = {"w": render_playbook(CORE, [("r1", "a b c."), ("r2", "d e f."), ("r3", "g h i.")])}
    history = [(p0, 0.5), (p1, 0.6), (p2, 0.55), (p3, None)]
    # r1 new in cycle 1 (0.5 -> 0.6: helpful); r2 new in cycle 2 (0.6 -> 0.55: harmful);
    # r3 new in cycle 3, whose objective is undefined: not counted
    assert rule_counts(history) == {"r1": [1, 0], "r2": [0, 1]}


def delta_reply(body):
    return json.dumps(
        {"op": "ADD", "id": "new", "rule": "Replace a stored value when the user says it changed."}
    )


def client_for(server, tmp_path):
    return ChatClient(Endpoint(model="m", base_url=server.base_url), cache=tmp_path / "c.sqlite")


def test_a_change_that_lowered_validation_is_reverted_before_the_next_delta(tmp_path):
    with FakeOpenAIServer(reply=delta_reply) as server:
        evolver = PlaybookEvolver(client_for(server, tmp_path), candidates=1)
        p0 = {"writer": CORE}
        step = evolver.propose(given(p0, cycle=0, history=[(p0, 0.5)]))
        assert step.prompts["writer"] == render_playbook(
            CORE, [("r1", "Replace a stored value when the user says it changed.")]
        )
        assert step.changes["writer"] == [
            "added r1: Replace a stored value when the user says it changed."
        ]
        assert step.tokens == 15  # the fake server's 10 + 5 per answer
        worse = {"writer": render_playbook(CORE, [("r1", "Keep dates exact in memory.")])}
        step = evolver.propose(given(worse, cycle=1, history=[(p0, 0.5), (worse, 0.4)]))
        # back to cycle 0's prompt, then the new rule gets an id never used before (r2)
        assert step.prompts["writer"] == render_playbook(
            CORE, [("r2", "Replace a stored value when the user says it changed.")]
        )
        assert step.changes["writer"][0] == "reverted cycle 1's change: validation 0.500 -> 0.400"
        assert "counts: " not in " ".join(step.changes["writer"])  # r1 is gone with the revert
        # the reflector sees each rule's counts
        step = evolver.propose(given(worse, cycle=1, history=[(p0, 0.4), (worse, 0.5)]))
        assert (
            "[r1] helpful 1 / harmful 0: Keep dates exact"
            in server.requests[-1]["messages"][-1]["content"]
        )
        assert step.changes["writer"][-1] == "counts: r1 helpful 1 / harmful 0"


def test_sampled_candidates_are_screened_by_replay_and_the_gate_decides(tmp_path):

    rules = iter(
        ["Keep dates exact in memory.", "Note the user's job title.", "Keep dates exact in memory."]
    )

    def sampled(body):
        return json.dumps({"op": "ADD", "id": "new", "rule": next(rules)})

    screen_with = scripted_screen

    two = [{"u1": 0.5, "u2": 0.5}, {"u1": 0.5, "u2": 0.7}, {"u1": 0.625, "u2": 0.75}]
    with FakeOpenAIServer(reply=sampled) as server:
        evolver = PlaybookEvolver(client_for(server, tmp_path), candidates=3)
        screen, seen = screen_with(two)  # current, then the two distinct candidates
        step = evolver.propose(given({"writer": CORE}, cycle=0, screen=screen))
        # three sampled requests (distinct seeds), two distinct candidates after the merge
        assert [b["temperature"] for b in server.requests] == [0.8] * 3
        assert len({b["seed"] for b in server.requests}) == 3
    assert seen[0] == CORE and len(seen) == 3
    # two training users cannot show an improvement: the better candidate is an exploration step
    assert step.prompts["writer"] == render_playbook(CORE, [("r1", "Note the user's job title.")])
    assert step.changes["writer"][-1] == (
        "replay screen 0.600, 0.688 vs current 0.500: gate too few users; "
        "taken as an exploration step (not shown better)"
    )
    assert step.tokens == 3 * 15 + 3 * 100  # the reflector's and the screening's
    (decision,) = step.decisions
    assert decision["stage"] == "screen" and decision["verdict"] == "too few users"
    assert decision["users"] == ["u1", "u2"] and decision["n"] == 2
    assert decision["mean"] == pytest.approx((0.125 + 0.25) / 2)
    assert decision["comparisons"] == 2 and decision["min_users"] == 7

    # the same screen when only an improvement may pass: nothing is taken
    rules = iter(
        ["Keep dates exact in memory.", "Note the user's job title.", "Keep dates exact in memory."]
    )
    with FakeOpenAIServer(reply=sampled) as server:
        evolver = PlaybookEvolver(
            client_for(server, tmp_path / "strict"), candidates=3, screen_takes="improved"
        )
        screen, _ = screen_with(two)
        step = evolver.propose(given({"writer": CORE}, cycle=0, screen=screen))
    assert step.prompts == {"writer": CORE}
    assert "gate too few users; no candidate taken" in step.errors["writer"]

    # eight users all up for the second candidate: p = 2/256 <= 0.05/2, improved
    users = [f"u{i}" for i in range(8)]
    eight = [
        dict.fromkeys(users, 0.5),
        dict.fromkeys(users, 0.5),
        {u: 0.5 + 0.125 * (1 + i % 2) for i, u in enumerate(users)},
    ]
    rules = iter(
        ["Keep dates exact in memory.", "Note the user's job title.", "Keep dates exact in memory."]
    )
    with FakeOpenAIServer(reply=sampled) as server:
        evolver = PlaybookEvolver(
            client_for(server, tmp_path / "eight"), candidates=3, screen_takes="improved"
        )
        screen, _ = screen_with(eight)
        step = evolver.propose(given({"writer": CORE}, cycle=0, screen=screen))
    assert step.prompts["writer"] == render_playbook(CORE, [("r1", "Note the user's job title.")])
    assert step.changes["writer"][-1].endswith("gate improved; taken (improved)")
    assert step.decisions[0]["sign_flip_p"] == pytest.approx(2 / 256)

    rules = iter(
        ["Keep dates exact in memory.", "Note the user's job title.", "Note the user's job title."]
    )
    with FakeOpenAIServer(reply=sampled) as server:
        evolver = PlaybookEvolver(client_for(server, tmp_path / "other"), candidates=3)
        screen, seen = screen_with([{"u1": 0.7}, {"u1": 0.6}, {"u1": 0.7}])  # none beats it
        step = evolver.propose(given({"writer": CORE}, cycle=0, screen=screen))
    assert step.prompts == {"writer": CORE}
    assert (
        "replay screen 0.600, 0.700 vs current 0.700: gate too few users; no candidate taken"
        in step.errors["writer"]
    )


def test_an_unusable_reply_keeps_the_prompts(tmp_path):
    with FakeOpenAIServer(reply="not json") as server:
        step = PlaybookEvolver(client_for(server, tmp_path)).propose(
            given({"writer": CORE}, cycle=0)
        )
    assert step.prompts == {"writer": CORE} and "reflector reply unusable" in step.errors["writer"]


def test_the_playbook_evolver_passes_check_evolver(tmp_path):
    with FakeOpenAIServer(reply=delta_reply) as server:
        report = check_evolver(lambda: PlaybookEvolver(client_for(server, tmp_path)))
    assert report.ok


def test_evolve_with_the_playbook_selects_on_the_objective(tmp_path):
    import yaml

    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.testing import evolve_loop_reply, fake_roles, scripted_builder

    (tmp_path / "awi.yaml").write_text("type: awi\n")
    (tmp_path / "exp.yaml").write_text(
        yaml.safe_dump(
            {
                "experiment": "pb",
                "environment": {
                    "procedural": {"users": 4, "periods": 1, "questions": 2, "seed": 1},
                    "train_users": 2,
                    "val_users": 1,
                    "test_users": 1,
                },
                "policy": "awi.yaml",
                "evolvers": ["playbook"],
                "objective": "state_accuracy",
                "cycles": 2,
                "tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db",
                "out_dir": str(tmp_path / "runs"),
            }
        )
    )
    config = load_config(tmp_path / "exp.yaml", EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        roles = fake_roles(server.base_url, tmp_path / "c.sqlite")
        (outcome,) = run_evolve(config, progress=False, clients=roles, builder=scripted_builder())
    prompts = [
        json.loads((outcome.run_dir / f"cycle_{k:02d}" / "prompts.json").read_text())
        for k in range(2)
    ]
    # the scripted policy's state answers do not depend on its prompt: every candidate screens
    # the same as the current prompt on replay, so none is taken
    assert prompts[0] == prompts[1]
    step = json.loads((outcome.run_dir / "cycle_00" / "evolve.json").read_text())
    assert "gate too few users; no candidate taken" in step["errors"]["writer"]
    screened = list((outcome.run_dir / "cycle_00" / "screen").iterdir())
    assert len(screened) == 2  # the current prompt and the one distinct candidate
    values = [c.score("val", "state_accuracy") for c in outcome.cycles]
    # the same prompts in both cycles: the seed stands for the run, no gate asked
    assert values[0] == values[1] and outcome.selection.cycle == 0
    assert outcome.selection.rule == "the seed (no cycle beat it on val_state_accuracy)"
    assert outcome.selection.val_objective == values[0] and outcome.selection.verdict is None


def test_replay_screening_asks_only_the_state_queries_and_scores_like_the_evaluation(tmp_path):
    from memloop.environment.procedural import generate_procedural
    from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
    from memloop.optimize.replay_score import replay_screen
    from memloop.testing import ScriptedPolicy, evolve_loop_reply

    items = generate_procedural(users=2, periods=1, questions=3, seed=2)
    asked: list[str] = []

    class Counting(ScriptedPolicy):
        def answer(self, prompt, *, schema=None, memory_only=False):
            asked.append(prompt)
            return super().answer(prompt, schema=schema, memory_only=memory_only)

    def factory(uid, workdir, client):
        return Counting()

    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        client = client_for(server, tmp_path)
        result = run_evaluation(
            items,
            factory,
            tmp_path / "onpolicy",
            clients=RoleClients.single(client),
            settings=EvaluationSettings(progress=False),
        )
        evaluated = len(asked)
        asked.clear()
        sent = len(server.requests)
        screening = replay_screen(
            items, factory, client, tmp_path / "onpolicy" / "episodes", tmp_path / "screen"
        )
        assert len(server.requests) == sent  # the scripted policy needs no model to screen
    periods = sum(len(i.periods) for i in items)
    assert len(asked) == periods * 3  # one state query per question, nothing else
    assert evaluated == periods * 3 * 2  # the evaluation: a choice and a state query per question
    pairs = sum(len(qa.required_info) for i in items for qa in i.qas) * len(items[0].periods)
    assert screening.pairs == pairs
    # the same answers as the evaluation's state queries (the scripted policy's are fixed)
    assert screening.state_accuracy == pytest.approx(result.metrics["state_accuracy"])


SEEDED = "You keep a short memory. Do not record details.\nWrite one label."


@pytest.mark.parametrize(
    ("delta", "core", "change"),
    [
        (
            {"op": "REMOVE", "id": "s2", "rule": ""},
            "You keep a short memory.\nWrite one label.",
            "removed s2: Do not record details.",
        ),
        (
            {"op": "EDIT", "id": "[s2]", "rule": "Record every fact the user states."},
            "You keep a short memory. Record every fact the user states.\nWrite one label.",
            "rewrote s2: Do not record details. -> Record every fact the user states.",
        ),
    ],
)
def test_nothing_is_fixed_a_starting_sentence_can_be_removed_or_rewritten(
    tmp_path, delta, core, change
):
    with FakeOpenAIServer(reply=lambda body: json.dumps(delta)) as server:
        evolver = PlaybookEvolver(client_for(server, tmp_path), candidates=1)
        step = evolver.propose(given({"writer": SEEDED}, cycle=0))
        sent = server.requests[0]["messages"][-1]["content"]
    assert step.prompts["writer"] == core
    assert change in step.changes["writer"]
    # the request shows every sentence as an editable unit, none of them fixed
    assert (
        "[s1] You keep a short memory.\n[s2] Do not record details.\n[s3] Write one label." in sent
    )
    assert "fixed" not in sent.lower()


def test_a_core_edit_is_checked_like_a_rule(tmp_path):
    evolver = PlaybookEvolver(client=None)
    leaks = LeakCheck(frozenset({"lisbon"}))
    _, _, why = evolver.edit_core(
        SEEDED, {"op": "EDIT", "id": "s1", "rule": "Remember the flat in Lisbon."}, leaks, []
    )
    assert why is not None and why.startswith("EDIT dropped:")
    _, _, why = evolver.edit_core(SEEDED, {"op": "REMOVE", "id": "s9", "rule": ""}, leaks, [])
    assert why == "REMOVE of unknown sentence 's9'"
    only = "Write one label."
    _, _, why = evolver.edit_core(only, {"op": "REMOVE", "id": "s1", "rule": ""}, leaks, [])
    assert why == "REMOVE of s1 would leave no instruction"
