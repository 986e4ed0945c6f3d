"""The factual-recall checker's calibration on known-truth claims (feedback.calibration): the
documents built from the state schema, the rates of scripted checkers on the fake server, and the
rule that a checker failing it leaves factual recall unreported in metrics.json."""

from __future__ import annotations

import json
import re

import pytest

from memloop.environment.procedural import generate_procedural
from memloop.feedback.calibration import (
    CALIBRATION_DOCUMENTS,
    MAX_FALSE_POSITIVE_RATE,
    calibration_documents,
    checker_calibration,
    recall_null_reason,
)
from memloop.feedback.evaluate import EvaluationSettings, run_evaluation, run_evaluation_groups
from memloop.feedback.probes import RECALL_PROMPT, RECALL_SYSTEM, revealed_states, words
from memloop.feedback.report import build_metrics, period_metrics
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.testing import (
    FakeOpenAIServer,
    ScriptedPolicy,
    is_recall_request,
    notes_checker,
    request_schema,
)


def items_4x4(users: int = 4):
    return generate_procedural(users=users, periods=1, questions=2, seed=0, choices_per_state=4)


def client(fake, tmp_path, name="c"):
    return ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / f"{name}.db")


def notes_facts(prompt: str) -> dict[str, str]:
    """{variable words: value words} a calibration document states (either rendering)."""
    notes = prompt.split("<notes>\n", 1)[1].split("\n</notes>", 1)[0]
    facts = {}
    for line in notes.splitlines()[1:]:
        external = re.fullmatch(r"- The user's (.+) is (.+)\.", line)
        awi = re.fullmatch(r"([a-z0-9_]+): (.+)", line)
        if external:
            facts[external.group(1)] = external.group(2)
        elif awi:
            facts[words(awi.group(1))] = awi.group(2)
    return facts


def claims_of(prompt: str) -> dict[str, tuple[str, str]]:
    """{claim number: (variable words, value words)}."""
    return {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r"^(\d+)\. The user's (.+) is: (.+)\.$", prompt, flags=re.M)
    }


def kind(facts: dict[str, str], variable: str, value: str) -> str:
    if variable not in facts:
        return "absent"
    return "present" if facts[variable] == value else "contradicting"


def checker(lie_on=frozenset(), style_of_lies=None):
    """A fake checker reading the document exactly; it answers wrong on the claim kinds in
    `lie_on` (only in documents of `style_of_lies` when given: 'awi' or 'external')."""

    def reply(body):
        schema = request_schema(body)
        if schema is None:
            return "Tell me more about that."
        if "answer" in schema["properties"]:
            return json.dumps({"answer": 1})
        prompt = body["messages"][-1]["content"]
        facts = notes_facts(prompt)
        style = "awi" if "Memory (label: value):" in prompt else "external"
        verdicts = {}
        for k, (variable, value) in claims_of(prompt).items():
            truth = kind(facts, variable, value)
            right = truth == "present"
            lie = truth in lie_on and style_of_lies in (None, style)
            verdicts[k] = "yes" if right != lie else "no"
        return json.dumps(verdicts)

    return reply


def yes_to_everything(body):
    schema = request_schema(body)
    if schema is None:
        return "Tell me more about that."
    if "answer" in schema["properties"]:
        return json.dumps({"answer": 1})
    return json.dumps({k: "yes" for k in schema["properties"]})


def test_documents_hold_known_truths_in_the_policies_renderings():
    items = items_4x4()
    docs = calibration_documents(items)
    assert docs == calibration_documents(list(reversed(items)))  # deterministic, order-free
    assert len(docs) == CALIBRATION_DOCUMENTS
    assert [d.user_id for d in docs] == sorted(it.id for it in items)
    assert [d.style for d in docs] == ["awi", "external", "awi", "external"]
    schema: dict = {}  # every user's variables together
    for it in sorted(items, key=lambda it: it.id):
        for v, values in it.state_schema.items():
            schema.setdefault(v, values)
    kinds = {"present": 0, "contradicting": 0, "absent": 0}
    for d in docs:
        assert {c.variable for c in d.claims} <= set(schema)
        assert len({c.variable for c in d.claims}) == len(d.claims)
        for c in d.claims:
            kinds[c.kind] += 1
            assert c.value in schema[c.variable]
            assert c.truth == (c.kind == "present")
            if c.kind == "absent":
                assert c.variable not in d.facts
            else:
                assert (d.facts[c.variable] == c.value) == (c.kind == "present")
        lines = d.text.splitlines()
        if d.style == "awi":
            assert lines[0] == "Memory (label: value):"
            assert lines[1:] == [f"{v}: {words(x)}" for v, x in sorted(d.facts.items())]
        else:
            assert lines[0] == f"Stored memories ({len(d.facts)}):"
            assert len(lines) == len(d.facts) + 1 and all(x.startswith("- ") for x in lines[1:])
    # 6 claims per document from the users' variables together: each kind twice per document
    assert kinds == {"present": 8, "contradicting": 8, "absent": 8}
    # one user: the documents cycle over it with other pairs
    one = calibration_documents(items_4x4(users=1))
    assert len(one) == CALIBRATION_DOCUMENTS
    assert len({tuple((c.variable, c.value, c.kind) for c in d.claims) for d in one}) == 4
    assert calibration_documents([]) == []


def test_the_checker_is_asked_as_recall_asks(tmp_path):
    items = items_4x4()
    with FakeOpenAIServer(reply=yes_to_everything) as fake:
        checker_calibration(items, client(fake, tmp_path))
        bodies = list(fake.requests)
    docs = calibration_documents(items)
    assert len(bodies) == len(docs)
    seen = {b["messages"][-1]["content"] for b in bodies}
    expected = set()
    for d in docs:
        ordered = sorted(d.claims, key=lambda c: c.variable)  # Prober.recall's order
        claims = "\n".join(
            f"{i}. The user's {words(c.variable)} is: {words(c.value)}."
            for i, c in enumerate(ordered, start=1)
        )
        expected.add(RECALL_PROMPT.format(document=d.text, claims=claims))
    assert seen == expected
    assert all(b["messages"][0]["content"] == RECALL_SYSTEM for b in bodies)
    keys = [set(request_schema(b)["properties"]) for b in bodies]
    assert keys == [{str(i) for i in range(1, len(k) + 1)} for k in keys]


def scripted_evaluation(items, fake, tmp_path):
    """An evaluation of ScriptedPolicy on `items` against the fake endpoint, into tmp_path/out."""
    return run_evaluation(
        items,
        lambda uid, wd, c: ScriptedPolicy(),
        tmp_path / "out",
        clients=RoleClients.single(client(fake, tmp_path)),
        settings=EvaluationSettings(progress=False),
    )


def test_a_yes_saying_checker_nulls_recall_with_its_reason(tmp_path):
    items = generate_procedural(users=2, periods=1, questions=2, seed=11)
    n_negative = sum(not c.truth for d in calibration_documents(items) for c in d.claims)
    n_positive = sum(c.truth for d in calibration_documents(items) for c in d.claims)
    with FakeOpenAIServer(reply=yes_to_everything) as fake:
        result = scripted_evaluation(items, fake, tmp_path)
        assert result.new_requests == len(fake.requests)
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    cal = m["checker_calibration"]
    assert cal["false_positive_rate"] == 1.0 and cal["n_negative"] == n_negative
    assert cal["false_negative_rate"] == 0.0 and cal["n_positive"] == n_positive
    assert (cal["unparsed"], cal["passed"], cal["model"]) == (0, False, "m")
    assert cal["documents"] == CALIBRATION_DOCUMENTS and cal["tokens"] > 0
    assert m["factual_recall"] is None and m["factual_recall_per_period"] is None
    assert m["factual_recall_null_reason"] == (
        f"checker false-positive rate 1.00 > 0.10 on {n_negative} known-false claims"
    )
    assert all(p["factual_recall"] is None for p in m["per_period"])
    assert all(u["factual_recall"] is None for u in m["per_user"].values())
    # the recall itself was judged (all "yes"): only the report withholds it
    uncalibrated, _ = build_metrics([r for e in result.episodes for r in e.records])
    assert uncalibrated["factual_recall"] == 1.0
    assert uncalibrated["checker_calibration"] is None
    assert uncalibrated["factual_recall_null_reason"] is None
    keys = list(m)
    assert keys.index("checker_calibration") == keys.index("factual_recall_per_period") + 1


def test_a_checker_reading_the_notes_keeps_recall(tmp_path):
    items = generate_procedural(users=2, periods=1, questions=2, seed=11)

    def reply(body):
        if is_recall_request(body):
            return notes_checker(body)
        return yes_to_everything(body)

    class InitialStatePolicy(ScriptedPolicy):
        """Memory: the user's initial state (AWI's rendering), stale where a value changed."""

        def __init__(self, uid):
            super().__init__()
            self.state = next(it for it in items if it.id == uid).state_at(0)

        def memory_view(self):
            lines = [f"{v}: {words(x)}" for v, x in sorted(self.state.items())]
            return "\n".join(["Memory (label: value):", *lines])

    with FakeOpenAIServer(reply=reply) as fake:
        cache = client(fake, tmp_path)
        factory = lambda uid, wd, c: InitialStatePolicy(uid)  # noqa: E731
        result = run_evaluation(
            items,
            factory,
            tmp_path / "out",
            clients=RoleClients.single(cache),
            settings=EvaluationSettings(progress=False),
        )
        sent = len(fake.requests)
        again = run_evaluation(
            items,
            factory,
            tmp_path / "out",
            clients=RoleClients.single(cache),
            settings=EvaluationSettings(progress=False),
        )
        assert len(fake.requests) == sent and again.new_requests == 0  # calibration cached too
    m = result.metrics
    assert again.metrics == m
    cal = m["checker_calibration"]
    assert (cal["false_positive_rate"], cal["false_negative_rate"], cal["passed"]) == (0, 0, True)
    assert m["factual_recall_null_reason"] is None
    # recall as judged: the latest revealed values found in the memory at the user's last period
    hits = n = 0
    for item, episode in zip(items, result.episodes, strict=True):
        last = episode.records[-1]
        memory = last.probes["memory_view"].lower()
        for value, _ in revealed_states(item, last.period).values():
            n += 1
            hits += bool(re.search(rf"\b{re.escape(words(value).lower())}\b", memory))
    assert m["factual_recall"] == pytest.approx(hits / n)
    assert 0 < hits < n


@pytest.mark.parametrize(
    ("lie_on", "style"),
    [
        ({"contradicting"}, None),
        ({"absent"}, "awi"),
        ({"present", "contradicting"}, "external"),
        ({"present"}, None),
    ],
)
def test_a_checker_wrong_on_some_claims_has_exact_rates(tmp_path, lie_on, style):
    items = items_4x4()
    docs = calibration_documents(items)
    wrong = {"present": 0, "contradicting": 0, "absent": 0}
    total = {"present": 0, "contradicting": 0, "absent": 0}
    for d in docs:
        for c in d.claims:
            total[c.kind] += 1
            wrong[c.kind] += c.kind in lie_on and style in (None, d.style)
    with FakeOpenAIServer(reply=checker(frozenset(lie_on), style)) as fake:
        cal = checker_calibration(items, client(fake, tmp_path))
    assert cal is not None
    n_negative = total["contradicting"] + total["absent"]
    fp = (wrong["contradicting"] + wrong["absent"]) / n_negative
    assert cal["n_negative"] == n_negative == 16 and cal["n_positive"] == total["present"] == 8
    assert cal["false_positive_rate"] == pytest.approx(fp)
    assert cal["false_negative_rate"] == pytest.approx(wrong["present"] / total["present"])
    assert 0 < cal["false_positive_rate"] + cal["false_negative_rate"]
    for k in total:
        assert cal["by_kind"][k]["n"] == total[k]
        yes = wrong[k] if k != "present" else total[k] - wrong[k]
        assert cal["by_kind"][k]["yes_rate"] == pytest.approx(yes / total[k])
    assert cal["passed"] == (fp <= MAX_FALSE_POSITIVE_RATE)
    assert (recall_null_reason(cal) is None) == cal["passed"]


def test_the_threshold_and_unparsed_answers():
    assert recall_null_reason(None) is None
    at = {"false_positive_rate": 0.10, "n_negative": 10, "max_false_positive_rate": 0.10}
    assert recall_null_reason(at) is None  # at the limit: reported
    above = {**at, "false_positive_rate": 0.42, "n_negative": 24}
    assert recall_null_reason(above) == (
        "checker false-positive rate 0.42 > 0.10 on 24 known-false claims"
    )
    none = {"false_positive_rate": None, "n_negative": 0, "unparsed": 16}
    assert recall_null_reason(none) == (
        "checker calibration: no answer on a known-false claim parsed (16 unparsed)"
    )


def test_an_unparsable_checker_and_no_checker(tmp_path):
    items = items_4x4()
    with FakeOpenAIServer(reply="not json") as fake:
        cal = checker_calibration(items, client(fake, tmp_path))
    assert cal is not None
    n = sum(len(d.claims) for d in calibration_documents(items))
    assert (cal["unparsed"], cal["n_negative"], cal["n_positive"]) == (n, 0, 0)
    assert cal["false_positive_rate"] is None and cal["passed"] is False
    assert recall_null_reason(cal) == (
        f"checker calibration: no answer on a known-false claim parsed ({n} unparsed)"
    )
    assert checker_calibration(items, None) is None


def test_groups_share_one_calibration(tmp_path):
    items = generate_procedural(users=3, periods=1, questions=2, seed=4)
    groups = {"train": items[:2], "test": items[2:], "none": []}
    docs = {d.text for d in calibration_documents(items)}
    with FakeOpenAIServer(reply=yes_to_everything) as fake:
        results = run_evaluation_groups(
            groups,
            lambda uid, wd, c: ScriptedPolicy(),
            tmp_path / "out",
            clients=RoleClients.single(client(fake, tmp_path)),
            settings=EvaluationSettings(progress=False),
        )
        asked = [
            b
            for b in fake.requests
            if is_recall_request(b)
            and b["messages"][-1]["content"].split("<notes>\n")[1].split("\n</notes>")[0] in docs
        ]
        assert sum(r.new_requests for r in results.values()) == len(fake.requests)
    assert len(asked) == len(docs) == CALIBRATION_DOCUMENTS  # once, for both groups
    assert set(results) == {"train", "test"}
    train, test = (results[g].metrics for g in ("train", "test"))
    assert train["checker_calibration"] == test["checker_calibration"] is not None
    assert train["factual_recall"] is None and test["factual_recall"] is None
    assert results["train"].calibration_requests == CALIBRATION_DOCUMENTS
    assert results["test"].calibration_requests == 0


def test_evaluations_naming_the_runs_users_ask_one_calibration(tmp_path):
    """Evolve and tune name all their users (`calibration_users`): evaluations of different
    users (a split, a screen, a trial) send the same calibration requests, answered by the
    response cache after the first, and are gated by the same calibration."""
    items = generate_procedural(users=4, periods=1, questions=2, seed=4)
    own = [{d.text for d in calibration_documents(part)} for part in (items[:2], items[2:])]
    assert own[0] != own[1]  # calibrated on their own users, they would ask different requests
    docs = {d.text for d in calibration_documents(items)}
    settings = EvaluationSettings(progress=False, calibration_users=tuple(items))
    with FakeOpenAIServer(reply=yes_to_everything) as fake:
        c = client(fake, tmp_path)
        first, second = (
            run_evaluation(
                part,
                lambda uid, wd, c: ScriptedPolicy(),
                tmp_path / name,
                clients=RoleClients.single(c),
                settings=settings,
            )
            for name, part in (("a", items[:2]), ("b", items[2:]))
        )
        asked = [
            b["messages"][-1]["content"].split("<notes>\n")[1].split("\n</notes>")[0]
            for b in fake.requests
            if is_recall_request(b) and "<notes>\n" in b["messages"][-1]["content"]
        ]
    assert sorted(d for d in asked if d in docs) == sorted(docs)  # each document asked once
    assert (first.calibration_requests, second.calibration_requests) == (CALIBRATION_DOCUMENTS, 0)
    assert first.metrics["checker_calibration"] == second.metrics["checker_calibration"]


def test_period_metrics_follow_the_calibration(tmp_path):
    items = generate_procedural(users=1, periods=1, questions=2, seed=2)
    with FakeOpenAIServer(reply=yes_to_everything) as fake:
        result = scripted_evaluation(items, fake, tmp_path)
    history = [r for e in result.episodes for r in e.records]
    cal = result.metrics["checker_calibration"]
    kept = period_metrics(history, 1)
    assert kept["factual_recall"] == 1.0 and kept["checker_calibration"] is None
    nulled = period_metrics(history, 1, cal)
    assert nulled["factual_recall"] is None and nulled["factual_recall_per_period"] is None
    assert all(u["factual_recall"] is None for u in nulled["per_user"].values())
    assert nulled["factual_recall_null_reason"] == result.metrics["factual_recall_null_reason"]


@pytest.mark.real_model
def test_calibration_on_the_embedded_model(local_client):
    """Two checker requests on the embedded 0.5B model: rates in [0, 1] over the built pairs."""
    items = items_4x4(users=2)
    docs = calibration_documents(items, documents=2)
    cal = checker_calibration(items, local_client, documents=2)
    assert cal is not None and cal["documents"] == 2
    negative = sum(not c.truth for d in docs for c in d.claims)
    positive = sum(c.truth for d in docs for c in d.claims)
    assert cal["n_negative"] + cal["n_positive"] + cal["unparsed"] == negative + positive
    if cal["unparsed"] == 0:
        assert (cal["n_negative"], cal["n_positive"]) == (negative, positive)
    for rate in (cal["false_positive_rate"], cal["false_negative_rate"]):
        assert rate is None or 0.0 <= rate <= 1.0
    assert cal["passed"] == (
        cal["false_positive_rate"] is not None
        and cal["false_positive_rate"] <= MAX_FALSE_POSITIVE_RATE
    )
