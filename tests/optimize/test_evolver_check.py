"""check_evolver: every shipped evolver and test double passes it; broken evolvers are caught."""

from __future__ import annotations

import random

import pytest
from pydantic import BaseModel

from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.optimize.contract import EvolveStep
from memloop.optimize.evolver_check import (
    DEFAULT_PROMPTS,
    EVOLVER_MEMBERS,
    EvolverCheckError,
    check_evolver,
)
from memloop.optimize.evolvers import NoEvolver, ReflectiveEvolver
from memloop.testing import FakeOpenAIServer, ScriptedEvolver


def rewrite_reply(body):
    text = body["messages"][-1]["content"]
    step = text.split("Step: ", 1)[1].split("\n", 1)[0]
    return (
        "<changes>\n- track changes of schedule\n</changes>\n<new_instructions>\n"
        f"For the {step} step: record each stated fact about the user's current situation, "
        "and replace a stored fact when the user says it changed.\n</new_instructions>"
    )


class MutatesSummary(ScriptedEvolver):
    def propose(self, inputs):
        inputs.summary.users.clear()
        return super().propose(inputs)


class DropsAPrompt(ScriptedEvolver):
    def propose(self, inputs):
        step = super().propose(inputs)
        return EvolveStep(prompts=dict(list(step.prompts.items())[:1]))


class EmptiesAPrompt(ScriptedEvolver):
    def propose(self, inputs):
        return EvolveStep(
            prompts={k: "" if k == "update" else v for k, v in inputs.prompts.items()}
        )


class Random(ScriptedEvolver):
    def propose(self, inputs):
        n = random.random()
        return EvolveStep(prompts={k: f"{v} {n}" for k, v in inputs.prompts.items()})


class NeedsASetting(ScriptedEvolver):
    class Settings(BaseModel):
        rate: float  # required: a YAML without settings could not build it

    def __init__(self, client=None, settings=None):
        super().__init__(client)
        self.settings = settings or self.Settings(rate=0.5)


def test_members_come_from_the_contract():
    assert EVOLVER_MEMBERS == ("name", "Settings", "propose")


@pytest.mark.parametrize("factory", [NoEvolver, ScriptedEvolver], ids=["none", "scripted"])
def test_model_free_evolvers_pass(factory):
    report = check_evolver(factory)
    assert report.ok and len(report.checks) == 8


def test_reflective_evolver_passes_under_a_shared_cache(tmp_path):
    with FakeOpenAIServer(reply=rewrite_reply) as fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "c.db")
        report = check_evolver(lambda: ReflectiveEvolver(client))
        assert report.ok, report.problems
        # one rewrite per prompt; the second evolver was answered from the cache
        assert len(fake.requests) == len(DEFAULT_PROMPTS)


@pytest.mark.parametrize(
    "cls, problem",
    [
        (MutatesSummary, "propose() mutated the prompts or the summary it was given"),
        (DropsAPrompt, "prompt names in ['update', 'writer'], out ['writer']"),
        (EmptiesAPrompt, "empty prompts: ['update']"),
        (Random, "a second evolver from the same factory proposed different prompts"),
        (
            NeedsASetting,
            "Settings is <class 'test_evolver_check.NeedsASetting.Settings'>, settings Settings",
        ),
    ],
)
def test_broken_evolvers_are_caught(cls, problem):
    report = check_evolver(cls, raise_on_problem=False)
    assert report.problems == [problem]
    with pytest.raises(EvolverCheckError, match="breaks the Evolver contract"):
        check_evolver(cls)


@pytest.mark.real_model
def test_reflective_evolver_on_the_embedded_model(local_client):
    # One prompt keeps the model work to one rewrite (plus at most one rules request).
    report = check_evolver(
        lambda: ReflectiveEvolver(local_client, max_tokens=160),
        prompts={"writer": DEFAULT_PROMPTS["writer"]},
    )
    assert report.ok, report.problems
