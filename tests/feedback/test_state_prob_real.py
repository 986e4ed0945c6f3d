"""The letter read on the embedded 0.5B model: the probability the code computes is the one the
server's own log-probabilities give, and a memory holding the value gives it a higher probability
than an empty memory does, on the same query."""

from __future__ import annotations

import math

import pytest

from memloop.environment.procedural import generate_procedural
from memloop.feedback.probes import LETTERS, read_variable, words
from memloop.policies import AWIConfig, build_policy

pytestmark = pytest.mark.real_model


def user():
    (item,) = generate_procedural(users=1, periods=1, questions=1, choices_per_state=4, seed=5)
    return item, "main_hobby"


def awi(local_client, tmp_path, facts: dict[str, str]):
    policy = build_policy(AWIConfig(), local_client, tmp_path / "work")
    for label, value in facts.items():
        policy.facts[label] = {"value": value}
    return policy


def test_the_probability_is_the_servers_own(local_client, tmp_path, monkeypatch):
    from memloop.llm import client as client_module
    from memloop.llm.client import ChatClient

    completions = []  # every chat completion the server sent, as its JSON
    real = client_module._completion

    def keep(resp):
        completion = real(resp)
        completions.append(completion)
        return completion

    monkeypatch.setattr(client_module, "_completion", keep)
    item, variable = user()
    truth = item.state_at(0)[variable]
    uncached = ChatClient(local_client.endpoint, cache=None)  # a request the server answers
    policy = awi(uncached, tmp_path, {"favourite pastime": words(truth)})
    read = read_variable(item, 0, variable, policy)
    assert read.error is None and read.probs is not None
    (completion,) = completions

    # by hand, from the server's own answer
    choices = item.state_schema[variable]
    top = completion["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    assert len(top) == 20
    mass = {letter: 0.0 for letter in LETTERS[: len(choices)]}
    for alt in top:
        if alt["token"].strip() in mass:
            mass[alt["token"].strip()] += math.exp(alt["logprob"])
    expected = mass[LETTERS[choices.index(truth)]] / sum(mass.values())
    assert read.prob_true == pytest.approx(expected, rel=1e-12)
    assert read.probs == pytest.approx(
        [mass[letter] / sum(mass.values()) for letter in LETTERS[: len(choices)]], rel=1e-12
    )


def test_a_memory_holding_the_value_gives_it_a_higher_probability(local_client, tmp_path):
    item, variable = user()
    truth = item.state_at(0)[variable]
    holding = awi(local_client, tmp_path / "a", {"favourite pastime": words(truth)})
    empty = awi(local_client, tmp_path / "b", {})
    with_value = read_variable(item, 0, variable, holding)
    without = read_variable(item, 0, variable, empty)
    assert with_value.prob_true is not None and without.prob_true is not None
    assert with_value.prob_true > without.prob_true
    assert with_value.picked == truth
