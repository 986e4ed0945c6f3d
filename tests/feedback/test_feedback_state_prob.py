"""The letter read of the state queries (`probes.state_read: letters`): each option's probability
from one token's top log-probabilities, state_prob beside state accuracy, every variable probed,
and no state_prob, with the reason, where the endpoint or the policy gives no probabilities."""

from __future__ import annotations

import json
import math
import re

import pytest

from memloop.environment.procedural import generate_procedural
from memloop.feedback.probes import (
    LETTERS,
    ProbeSettings,
    StateProber,
    option_probabilities,
    read_variable,
)
from memloop.feedback.records import StateRead
from memloop.feedback.scoring import JSON_READ, state_accuracy
from memloop.policies.base import Answer
from memloop.testing import FakeOpenAIServer, ScriptedPolicy


def test_option_probabilities_renormalize_over_the_letters():
    top = [("B", math.log(0.6)), (" A", math.log(0.2)), ("The", math.log(0.1)), ("A", -5.0)]
    probs, mass, error = option_probabilities(top, 3)
    a = 0.2 + math.exp(-5.0)
    assert error is None
    assert probs == pytest.approx([a / (a + 0.6), 0.6 / (a + 0.6), 0.0])
    assert mass == pytest.approx((a + 0.6) / (a + 0.6 + 0.1))
    # a letter beyond the options is not an option
    assert option_probabilities([("D", -0.1), ("A", -2.0)], 3)[0] == pytest.approx([1.0, 0, 0])
    assert option_probabilities(None, 3) == (
        None,
        None,
        "the endpoint returned no log-probabilities",
    )
    assert option_probabilities([("The", -0.1)], 2) == (
        None,
        0.0,
        "no option letter among the top 1 tokens",
    )


class LetterPolicy(ScriptedPolicy):
    """Answers a letter read with given top log-probabilities per variable (by its words)."""

    def __init__(self, tops: dict[str, list[tuple[str, float]] | None]):
        super().__init__()
        self.tops = tops
        self.asked: list[dict] = []

    def answer(self, prompt, *, schema=None, memory_only=False, top_logprobs=None):
        self.asked.append({"prompt": prompt, "memory_only": memory_only, "k": top_logprobs})
        point = re.search(r"closest to my current (.+?) as things", prompt).group(1)
        top = self.tops.get(point)
        text = top[0][0] if top else "A"
        return Answer(text, [], None, None, top)


def test_a_read_gives_the_true_values_probability_and_the_most_probable_pick():
    (item,) = generate_procedural(users=1, periods=1, questions=1, choices_per_state=3, seed=4)
    variable = item.qas[0].required_info[0]
    choices = list(item.state_schema[variable])
    truth = item.state_at(0)[variable]
    t = choices.index(truth)
    other = (t + 1) % 3
    top = [(LETTERS[other], math.log(0.5)), (LETTERS[t], math.log(0.3)), ("I", math.log(0.2))]
    policy = LetterPolicy({variable.replace("_", " "): top})
    read = read_variable(item, 0, variable, policy)
    assert policy.asked[0]["memory_only"] and policy.asked[0]["k"] == 20
    for i, c in enumerate(choices):  # every option is shown with its letter
        assert f"{LETTERS[i]}. {c.replace('_', ' ')}" in policy.asked[0]["prompt"]
    assert read.prob_true == pytest.approx(0.3 / 0.8)
    assert read.picked == choices[other] and not read.right
    assert read.letter_mass == pytest.approx(0.8)
    assert read.true_value == truth and read.error is None


class OlderPolicy(ScriptedPolicy):
    """A policy written before the `top_logprobs` keyword."""

    def answer(self, prompt, *, schema=None, memory_only=False):
        return Answer("B, I think", [], None, None)


def test_a_policy_without_the_keyword_gives_a_pick_but_no_probability():
    (item,) = generate_procedural(users=1, periods=1, questions=1, seed=4)
    variable = item.qas[0].required_info[0]
    read = read_variable(item, 0, variable, OlderPolicy())
    assert read.prob_true is None and read.probs is None
    assert read.error == "policy scripted's answer takes no top_logprobs"
    assert read.picked == item.state_schema[variable][1]  # the letter its text starts with


def reads(values: list[tuple[bool, float | None]]) -> list[StateRead]:
    """Reads of a 4-value variable: (right?, P(true))."""
    out = []
    for i, (right, p) in enumerate(values):
        out.append(
            StateRead(
                user_id="u",
                period=i,
                variable="v",
                true_value="a",
                choices=["a", "b", "c", "d"],
                write_period=0,
                picked="a" if right else "b",
                prob_true=p,
                error=None if p is not None else "the endpoint returned no log-probabilities",
            )
        )
    return out


def test_state_prob_is_the_mean_p_of_the_truth_over_reads_that_have_one():
    s = state_accuracy([], reads([(True, 0.9), (False, 0.2), (True, 0.6)]))
    assert (s.pairs, s.prob_pairs) == (3, 3)
    assert s.accuracy == pytest.approx(2 / 3)
    assert s.prob == pytest.approx((0.9 + 0.2 + 0.6) / 3)
    assert s.chance == pytest.approx(0.25)
    assert s.score == pytest.approx((2 / 3 - 0.25) / 0.75)
    none = state_accuracy([], reads([(True, None), (False, None)]))
    assert none.prob is None and none.prob_pairs == 0
    assert none.prob_null_reason == "the endpoint returned no log-probabilities"
    assert state_accuracy([]).prob_null_reason == JSON_READ


def test_all_variables_are_read_once_per_period_and_fill_the_questions():
    (item,) = generate_procedural(users=1, periods=1, questions=2, seed=3)
    # a user holding more variables than its questions need (procedural users hold exactly
    # those; AMemGym's hold more)
    item = item.model_copy(update={"qas": item.qas[:1]})
    assert len(item.state_schema) > len({v for qa in item.qas for v in qa.required_info})
    tops = {v.replace("_", " "): [("A", -0.1), ("B", -2.5)] for v in item.state_schema}
    prober = StateProber(ProbeSettings(state_read="letters", state_probes="all"))
    policy = LetterPolicy(tops)
    out = prober(item, 0, policy, None)  # type: ignore[arg-type]
    assert sorted(r["variable"] for r in out["state_reads"]) == sorted(item.state_schema)
    assert len(policy.asked) == len(item.state_schema)  # one call per variable
    p_a = 1 / (1 + math.exp(-2.4))
    for q in out["questions"]:
        for v in q["required_info"]:
            read = next(r for r in out["state_reads"] if r["variable"] == v)
            assert q["state_answers"][v] == read["picked"] == item.state_schema[v][0]
            truth = item.state_at(0)[v]
            expected = p_a if truth == item.state_schema[v][0] else 1 - p_a
            if len(item.state_schema[v]) > 2 and truth != item.state_schema[v][1]:
                expected = 0.0
            assert q["state_probs"][v] == pytest.approx(expected)
    questions_only = StateProber(ProbeSettings(state_read="letters"))
    policy = LetterPolicy(tops)
    out = questions_only(item, 0, policy, None)  # type: ignore[arg-type]
    needed = {v for qa in item.qas for v in qa.required_info}
    assert {r["variable"] for r in out["state_reads"]} == needed
    assert len(policy.asked) == len(needed)


def test_all_needs_the_letter_read():
    with pytest.raises(ValueError, match="needs state_read: letters"):
        ProbeSettings(state_probes="all")
    assert ProbeSettings().spec() is None
    assert ProbeSettings(state_read="letters").spec() == {
        "state_read": "letters",
        "state_probes": "questions",
    }


def awi_reply(body):
    """The fake model for AWI: no memory edits, option 2 for questions, yes for recall."""
    from memloop.testing import request_schema

    schema = request_schema(body)
    if schema is None:
        return "B"  # a letter read (or a chat reply)
    props = schema["properties"]
    if "answer" in props:
        return json.dumps({"answer": 2})
    if "edits" in props:
        return json.dumps({"edits": []})
    return json.dumps({k: "yes" if k.isdigit() else None for k in props})


def letter_logprobs(body, text):
    """The first letter option at P 0.6, B at 0.3, a non-letter at 0.1."""
    return [("A", math.log(0.6)), ("B", math.log(0.3)), ("Sure", math.log(0.1))]


@pytest.mark.parametrize("served", [True, False], ids=["logprobs", "no-logprobs"])
def test_an_evaluation_reports_state_prob_or_says_why_not(tmp_path, served):
    from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint
    from memloop.llm.roles import RoleClients
    from memloop.policies import AWIConfig, build_policy

    items = generate_procedural(users=2, periods=1, questions=2, seed=11)
    fake = FakeOpenAIServer(reply=awi_reply, logprobs=letter_logprobs if served else None)
    with fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "c.db")
        result = run_evaluation(
            items,
            lambda uid, wd, c: build_policy(AWIConfig(), c, wd),
            tmp_path / "out",
            clients=RoleClients.single(client),
            settings=EvaluationSettings(progress=False, probes=ProbeSettings(state_read="letters")),
        )
        letter_requests = [b for b in fake.requests if b.get("logprobs")]
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert m == json.loads(json.dumps(result.metrics))
    # one read per (user, period, variable the questions need), one token each
    needed = sum(
        len({v for qa in it.qas for v in qa.required_info}) * it.num_periods for it in items
    )
    assert m["state_pairs"] == needed
    # identical reads (the same memory in two periods) are answered from the response cache
    assert 0 < len(letter_requests) <= needed
    assert all(b["max_tokens"] == 1 and b["top_logprobs"] == 20 for b in letter_requests)
    reads = [
        r
        for it in items
        for p in range(it.num_periods)
        for r in json.loads(
            (tmp_path / "out" / "episodes" / it.id / f"period_{p:02d}" / "record.json").read_text()
        )["probes"]["state_reads"]
    ]
    assert len(reads) == needed
    picked_a = [r["picked"] == r["choices"][0] for r in reads]
    if served:
        # by hand: A holds 0.6 / 0.9 of the letters' mass, B 0.3 / 0.9, any other option 0
        expected = [
            2 / 3
            if r["true_value"] == r["choices"][0]
            else (1 / 3 if r["true_value"] == r["choices"][1] else 0.0)
            for r in reads
        ]
        assert m["state_prob"] == pytest.approx(sum(expected) / len(expected))
        assert m["state_prob_pairs"] == needed and m["state_prob_null_reason"] is None
        assert all(picked_a)
        assert m["state_accuracy"] == pytest.approx(
            sum(r["true_value"] == r["choices"][0] for r in reads) / len(reads)
        )
        for uid, row in m["per_user"].items():
            mine = [e for e, r in zip(expected, reads, strict=True) if r["user_id"] == uid]
            assert row["state_prob"] == pytest.approx(sum(mine) / len(mine))
    else:
        # no probabilities: no state_prob, the reason, and still a pick (the text's letter B)
        assert m["state_prob"] is None and m["state_prob_pairs"] == 0
        assert m["state_prob_null_reason"] == "the endpoint returned no log-probabilities"
        assert all(r["picked"] == r["choices"][1] for r in reads)
        assert all(row["state_prob"] is None for row in m["per_user"].values())


def test_the_letter_read_is_the_default_where_the_endpoint_returns_log_probabilities():
    from memloop.feedback.objective import Objective
    from memloop.feedback.probes import probes_for
    from memloop.llm.endpoint import Endpoint

    hosted = Endpoint(model="m", base_url="http://127.0.0.1:1/v1")
    assert Endpoint(model="local-0.5b", base_url="local").returns_logprobs
    assert not hosted.returns_logprobs
    assert hosted.model_copy(update={"logprobs": True}).returns_logprobs
    assert not Endpoint(model="local-0.5b", base_url="local", logprobs=False).returns_logprobs
    # not part of a run's identity: declaring it does not change a response
    assert "logprobs" not in hosted.model_copy(update={"logprobs": True}).result_settings()

    unset = ProbeSettings()
    letters, note = probes_for(unset, True)
    assert (letters.state_read, note) == ("letters", None)
    kept, note = probes_for(unset, False)
    assert kept.state_read == "json"
    assert note is not None and "does not declare `logprobs: true`" in note
    chosen = ProbeSettings(state_read="json")  # a read the run sets is kept, and said nothing of
    assert probes_for(chosen, True) == (chosen, None)

    assert Objective.of(None, agent_is_local=True, letters=True) is Objective.STATE_PROB
    assert Objective.of(None, agent_is_local=False, letters=True) is Objective.STATE_PROB
    assert Objective.of(None, agent_is_local=True) is Objective.STATE_ACCURACY
    assert Objective.of(None, agent_is_local=False) is Objective.MEMORY_SCORE
    assert Objective.of("memory_score", agent_is_local=True, letters=True) is (
        Objective.MEMORY_SCORE
    )


def one_cycle_evolve(tmp_path, fake, declared: bool, **settings):
    """A one-cycle evolve YAML on `fake` for every role; its endpoint file declares
    `logprobs: true` when `declared`."""
    from memloop.testing.commands import write_small_evolve

    endpoint = tmp_path / "fake.yaml"
    endpoint.write_text(
        f"model: fake\nbase_url: {fake.base_url}\nmax_retries: 0\n"
        + ("logprobs: true\n" if declared else "")
    )
    roles = ("agent", "user_sim", "checker", "optimizer")
    return write_small_evolve(
        tmp_path,
        "reads",
        (1, 1, 1),
        periods=1,
        cycles=1,
        evolvers=["none"],
        feedback_modes=["none"],
        endpoints={role: str(endpoint) for role in roles},
        **settings,
    )


@pytest.mark.parametrize("declared", [True, False], ids=["logprobs-true", "undeclared"])
def test_an_evolve_run_reads_letters_and_ranks_on_state_prob_where_the_endpoint_declares_them(
    tmp_path, capsys, declared
):
    """A hosted endpoint file with `logprobs: true`: the run's spec holds the letter read, its
    objective is state_prob and its cycles have one; undeclared: the JSON read, state accuracy's
    fallback (memory_score for a hosted agent) and the printed reason."""
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve

    with FakeOpenAIServer(reply=awi_reply, logprobs=letter_logprobs) as fake:
        path = one_cycle_evolve(tmp_path, fake, declared)
        (outcome,) = run_evolve(load_config(path, EvolveConfig), progress=False)
    spec = json.loads((outcome.run_dir / "spec.json").read_text())["spec"]
    out = capsys.readouterr().out
    (cycle,) = outcome.cycles
    if declared:
        assert spec["objective"] == "state_prob"
        letters = {"state_read": "letters", "state_probes": "questions"}
        assert spec["evaluation"]["probes"] == letters
        # letter_logprobs gives A 0.6 and B 0.3: renormalized A 2/3, B 1/3, C and D 0; the
        # user's 4 reads (2 questions x 2 variables) average to a multiple of 1/12
        prob = cycle.splits["val"].state_prob
        assert prob is not None and 0 < prob < 1
        assert prob * 12 == pytest.approx(round(prob * 12))
        assert "state reads use the JSON read" not in out
    else:
        assert spec["objective"] == "memory_score"
        assert "probes" not in spec["evaluation"]
        assert cycle.splits["val"].state_prob is None
        assert "state reads use the JSON read (0/1 scores, no state_prob)" in out


def test_gepa_scores_a_user_on_state_prob_from_the_letter_reads():
    """GEPA's per-user number under the state_prob objective: the mean P(true value) of the
    user's reads (a run on the embedded model ranks on it by default)."""
    from memloop.optimize.searches.gepa import user_score

    def read(variable: str, prob: float) -> StateRead:
        return StateRead(
            user_id="u",
            period=0,
            variable=variable,
            true_value="a",
            choices=["a", "b"],
            write_period=0,
            picked="a" if prob >= 0.5 else "b",
            probs=[prob, 1 - prob],
            prob_true=prob,
        )

    from memloop.feedback.records import QuestionRecord

    asked = QuestionRecord(
        user_id="u",
        period=0,
        question_index=0,
        question="q?",
        choices=["yes", "no"],
        required_info=["x", "y"],
        gold_index=0,
        true_values={"x": "a", "y": "a"},
        write_periods={"x": 0, "y": 0},
        chosen_index=0,
        ub_chosen_index=0,
    )
    reads = [read("x", 0.9), read("y", 0.3)]
    assert user_score([asked], "state_prob", reads) == pytest.approx(0.6)
    # no reads (the JSON read): undefined, 0 for every candidate alike
    assert user_score([asked], "state_prob") == 0.0


@pytest.mark.parametrize(
    ("probes", "declared", "why"),
    [
        ({"state_read": "letters"}, False, "does not declare `logprobs: true`"),
        ({}, False, "does not declare `logprobs: true`"),  # the JSON read by default: n/a too
        ({"state_read": "json"}, True, "the run's state reads are the JSON read"),
    ],
    ids=["letters-undeclared", "default-undeclared", "json-read"],
)
def test_an_objective_state_prob_that_would_be_n_a_is_refused_before_the_first_request(
    tmp_path, capsys, probes, declared, why
):
    """Issue 57: the run ranked every cycle on n/a and said so only at the end."""
    from memloop.experiments.cli import main

    with FakeOpenAIServer(reply=awi_reply, logprobs=letter_logprobs) as fake:
        settings = {"objective": "state_prob", **({"probes": probes} if probes else {})}
        path = one_cycle_evolve(tmp_path, fake, declared, **settings)
        assert main(["evolve", str(path), "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "objective state_prob" in lines[0] and why in lines[0]
    assert fake.requests == []
