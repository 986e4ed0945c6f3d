"""Issue 29: no user's private value enters a shared prompt, whatever the optimizer or the mode.

The optimizer role of a loopback fake model proposes text naming users' private values, each
re-spelled (a superseded value in CamelCase, a current one CamelCase and plural, a user's full
name, a hobby from the profile), through every shipped optimizer (the reflective and playbook
evolvers under the episode search, the reflective evolver under the period search, GEPA) and
every feedback mode that evolves. The registered prompt versions are then read back from MLflow
and checked for those values with a plain substring test, independent of the matcher under test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from memloop.environment.procedural import generate_procedural
from memloop.optimize.contract import NoSettings
from memloop.optimize.leaks import LeakCheck, named, words
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.evolvers import is_evolver_request
from memloop.testing.fake_server import request_schema
from memloop.testing.policies import DEFAULT_PROMPTS

MODES = ["complete", "diagnostic", "question_only"]
ENV = {"users": 3, "periods": 2, "questions": 1, "seed": 1}
SEED_PROMPT = DEFAULT_PROMPTS["writer"]


def camel(value: str) -> str:
    return "".join(w.capitalize() for w in re.split(r"[_\s]+", value))


def squash(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def planted() -> dict[str, str]:
    """{what: the user's own value} the fake optimizer names, taken from the environment."""
    items = generate_procedural(**ENV)
    superseded = next(
        (it.state_at(0)[v], it)
        for it in items
        for v in it.state_at(0)
        if it.state_at(0)[v] != it.state_at(1)[v]
    )
    current = next(
        it.state_at(1)[v] for it in items if it is not superseded[1] for v in it.state_at(1)
    )
    other = next(it for it in items if it is not superseded[1])
    hobby = other.user_profile.hobbies_and_interests.split(",")[-1].strip()
    return {
        "superseded": superseded[0],
        "current": current,
        "name": other.user_profile.name,
        "hobby": hobby,
    }


PLANTED = planted()
LEAK = (
    f"Always note that {PLANTED['name']} likes {camel(PLANTED['superseded'])}, "
    f"{camel(PLANTED['current'])}s and {PLANTED['hobby'].title()}."
)


def is_delta_request(body: dict[str, Any]) -> bool:
    """A playbook evolver's request for one delta."""
    schema = request_schema(body) or {}
    return set(schema.get("properties", {})) == {"op", "id", "rule"}


def leaking_reply(body: dict[str, Any]) -> str:
    """evolve_loop_reply, except that every optimizer request is answered with LEAK."""
    text = " ".join(str(m.get("content", "")) for m in body["messages"])
    if is_delta_request(body):
        return json.dumps({"op": "ADD", "id": "new", "rule": LEAK})
    if is_evolver_request(body):
        if "``` blocks" in text:  # GEPA's reflection
            return f"```\n{LEAK}\n```"
        if "NEW rules" in str(body["messages"][0].get("content", "")):
            return f"<rules>\n- {LEAK}\n- Record how often each stated fact changes.\n</rules>"
        return (
            "<changes>\n- more detail\n</changes>\n"
            f"<new_instructions>\n{LEAK} Record every fact the user states.\n</new_instructions>"
        )
    return evolve_loop_reply(body)


def test_the_planted_text_is_what_the_optimizers_propose():
    # the fake's proposals really are leaks, of each kind the issue lists
    assert PLANTED["superseded"] != PLANTED["current"]
    assert camel(PLANTED["superseded"]) in LEAK and PLANTED["superseded"] not in LEAK
    assert len(LEAK.split()) <= 30 and LEAK.endswith(".")  # a playbook rule's form


# ---------------------------------------------------------------- the matcher, by value


def test_values_are_matched_through_re_spellings():
    values = {"actively_moving", "paper_books", "nut_allergy", "Nikolai Ivanova", "Nikolai", "no"}
    cases = {
        "The user is ActivelyMoving.": ["actively_moving"],
        "prefers PAPER BOOKS": ["paper_books"],
        "likes paperbooks": ["paper_books"],
        "a paper book lover": ["paper_books"],
        "has nut-allergies": ["nut_allergy"],
        "Dear nikolai_ivanova,": ["Nikolai", "Nikolai Ivanova"],
        "say no to guesses": [],  # under 4 characters: too common to tell apart
        "Record the kind of books the user reads.": [],  # one word of a value is not the value
    }
    for text, expected in cases.items():
        assert named(text, values) == expected, text
    # a value the replaced text already held (the author's seed prompt) is not a leak
    assert named("Ask whether they are actively moving.", values, "actively moving?") == []
    assert words("HTTPServer nut_allergies boxes") == ["http", "server", "nut", "allergy", "box"]


def test_a_leak_check_counts_its_rejections():
    check = LeakCheck(frozenset({"shared_house"}))
    assert check.reject("Lives in a SharedHouse.") == 1
    assert check.reject("Lives somewhere.") == 0
    assert check.reject("shared houses and shared_house", "") == 1
    assert check.rejected == 2


def test_private_values_hold_every_period_the_name_and_profile_items():
    items = generate_procedural(**ENV)
    item = items[0]
    private = item.private_values()
    states = {str(v) for p in range(item.num_periods) for v in item.state_at(p).values()}
    assert states <= private and len(states) > len(item.state_at(0))  # superseded ones too
    name = item.user_profile.name
    assert {name, *name.split()} <= private
    hobbies = [h.strip() for h in item.user_profile.hobbies_and_interests.split(",")]
    assert set(hobbies) <= private and item.user_profile.occupation in private


# ---------------------------------------------------------------- every optimizer, every mode


def write_config(root: Path, search: str, evolver: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    policy = root / "awi.yaml"
    policy.write_text("type: awi\n")  # the scripted policy's prompt: SEED_PROMPT
    data: dict[str, Any] = {
        "experiment": f"leaks-{search}-{evolver}",
        "environment": {"procedural": ENV, "train_users": 1, "val_users": 1, "test_users": 1},
        "policy": str(policy),
        "feedback_modes": MODES,
        "evolvers": [evolver],
        "search": search,
        "cycles": 2,
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
    }
    if search == "gepa":  # GEPA's own reflection is its evolver
        del data["evolvers"]
        data["settings"] = {"gepa": {"minibatch_size": 1, "max_metric_calls": 6}}
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("search", "evolver"),
    [
        ("episode", "reflective"),
        ("episode", "playbook"),
        ("period", "reflective"),
        ("gepa", "gepa"),
    ],
)
def test_no_registered_prompt_names_a_private_value(tmp_path, capsys, search, evolver):
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.optimize.report import print_outcomes
    from memloop.runs import tracker

    config = load_config(write_config(tmp_path, search, evolver), EvolveConfig)
    with FakeOpenAIServer(reply=leaking_reply) as fake:
        outcomes = run_evolve(
            config,
            progress=False,
            clients=fake_roles(fake.base_url, tmp_path / "c.sqlite"),
            builder=scripted_builder(),
        )
        asked = [r for r in fake.requests if is_evolver_request(r) or is_delta_request(r)]
    assert sorted(o.mode for o in outcomes) == sorted(MODES)
    assert asked  # the optimizer was asked (and answered with LEAK)
    everyone = set().union(*(i.private_values() for i in generate_procedural(**ENV)))
    mlc = tracker.client(config.tracking_uri)
    for o in outcomes:
        refused = sum(c.leaks_rejected for c in o.cycles)
        assert refused >= 1, (o.mode, [c.leaks_rejected for c in o.cycles])
        name = mlc.get_run(o.run_id).data.tags["memloop.prompt_name"]
        versions = mlc.search_prompt_versions(name)
        assert versions  # the run registered its cycles' prompts
        # the registered prompts, and the evolver steps (logged to MLflow as evolve/)
        texts = [v.template for v in versions]
        texts += [p.read_text() for p in sorted(o.run_dir.glob("cycle_*/evolve.json"))]
        assert (len(texts) > len(versions)) == (search != "gepa")  # GEPA writes no steps
        for text in texts:
            for what, value in PLANTED.items():
                assert squash(value) not in squash(text), (o.mode, what, text)
        for v in versions:
            assert named(v.template, everyone, SEED_PROMPT) == [], (o.mode, v.template)
        history = mlc.get_metric_history(o.run_id, "optimizer/leaks_rejected")
        assert sum(m.value for m in history) == refused
    print_outcomes(config, outcomes)
    shown = capsys.readouterr().out
    assert "leaks refused" in shown
    total = sum(c.leaks_rejected for o in outcomes for c in o.cycles)
    assert f"leaks refused: {total} candidate prompts" in shown


class LeakingSearch:
    """A third-party search that bypasses contract.propose: its cycle 1 prompt is LEAK."""

    name = "leaky"
    Settings = NoSettings
    needs_val = False
    evolves_itself = True

    def __init__(self, settings=None):
        self.settings = settings or NoSettings()

    def cycles(self, ctx):
        from memloop.optimize.context import split_results
        from memloop.optimize.cycles import CycleRecord

        proposed = dict(ctx.initial_prompts)
        for k in range(ctx.config.cycles):
            prompts = ctx.store.prompts(k, proposed)
            results = ctx.evaluate_splits(prompts, ctx.store.cycle_dir(k))
            record = CycleRecord(cycle=k, splits=split_results(results))
            ctx.store.save(record)
            yield record
            proposed = {"writer": LEAK}


def test_a_search_that_bypasses_propose_is_stopped_before_registering(tmp_path):
    from memloop.core.errors import UserError
    from memloop.optimize import registry
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.runs import tracker

    registry.register("leaky", LeakingSearch)
    path = write_config(tmp_path, "leaky", "reflective")
    data = yaml.safe_load(path.read_text())
    data.update(feedback_modes=["complete"])
    del data["evolvers"]  # the search evolves the prompts itself
    path.write_text(yaml.safe_dump(data))
    config = load_config(path, EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        with pytest.raises(UserError, match="cycle 1's prompt for writer names a private value"):
            run_evolve(
                config,
                progress=False,
                clients=fake_roles(fake.base_url, tmp_path / "c.sqlite"),
                builder=scripted_builder(),
            )
    mlc = tracker.client(config.tracking_uri)
    (run,) = mlc.search_runs([mlc.get_experiment_by_name(config.experiment_name).experiment_id])
    versions = mlc.search_prompt_versions(run.data.tags["memloop.prompt_name"])
    assert [v.template for v in versions] == [SEED_PROMPT]  # cycle 0 only
    assert run.info.status == "KILLED"


def test_propose_refuses_leaking_candidates_before_the_screen_and_in_the_step():
    from memloop.feedback.summary import FeedbackSummary
    from memloop.optimize.contract import EvolveInput, EvolveStep, propose

    screened: list[dict[str, str]] = []

    def screen(prompts):
        from memloop.optimize.replay_score import Screening

        screened.append(prompts)
        return Screening(state_accuracy=0.5, pairs=2, tokens=10, requests=1)

    class Screens:
        name, Settings = "screens", NoSettings
        settings = NoSettings()

        def propose(self, inputs):
            self.results = [inputs.screen({"writer": t}) for t in (LEAK, "Keep facts current.")]
            return EvolveStep(prompts={"writer": LEAK}, tokens=3)

    summary = FeedbackSummary(mode="complete", private=sorted(PLANTED.values()))
    evolver = Screens()
    step = propose(evolver, EvolveInput({"writer": SEED_PROMPT}, summary, screen=screen))
    assert screened == [{"writer": "Keep facts current."}]  # the leak was never replayed
    assert [r.state_accuracy for r in evolver.results] == [None, 0.5]
    assert step.prompts == {"writer": SEED_PROMPT} and step.leaks_rejected == 2
    assert (
        step.errors["writer"]
        == "the proposal names 4 private values of the users; kept the old one"
    )
