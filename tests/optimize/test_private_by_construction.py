"""The optimizer never sees a private value (issue 57, point 1): by construction, not by a check.

Every private value the environment knows reaches an optimizer model only as its typed
placeholder (`UserItem.placeholders`, `core/leaks.Redactor`), in every feedback mode and for every
optimizer that calls a model (reflective, playbook, the edits evolver's slot, GEPA's reflection).
The writer of the fake endpoint plants re-spellings of every user's values in memory (camelCase,
capitals and hyphens, a zero-width space, Cyrillic look-alike letters, plurals), so the feedback
(retrieved memories, memory views, the state reads) carries them; the optimizer has an endpoint of
its own, whose every request is read: none holds a planted spelling or any value as the leak
check folds it, and the placeholders are there instead. The policy under evaluation still sees
what was written (its own requests hold the planted spellings)."""

from __future__ import annotations

import json
import re

import pytest

from memloop.core.leaks import MIN_CHARS, LeakCheck, Redactor, tokens
from memloop.environment.procedural import generate_procedural
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, request_schema
from memloop.testing.commands import write_small_evolve

USERS = (1, 1, 1)
ENV = {"users": sum(USERS), "periods": 1, "questions": 2, "seed": 1}
MODES = ["question_only", "complete", "diagnostic"]


def respellings(value: str) -> list[str]:
    """Spellings of `value` the folding is documented to undo."""
    words = tokens(value, numbers=False)
    camel = words[0] + "".join(w.title() for w in words[1:])
    plural = " ".join(words) + ("" if words[-1].endswith("s") else "s")
    cyrillic = " ".join(words).replace("a", "\u0430").replace("o", "\u043e")
    zero_width = " ".join(words)
    zero_width = zero_width[:2] + "\u200b" + zero_width[2:]
    return [camel, "-".join(words).upper(), zero_width, cyrillic, plural]


def planted() -> dict[str, list[str]]:
    """{value: its planted spellings} for every checked private value of the run's users."""
    items = generate_procedural(**ENV)
    values = {v for item in items for v in item.private_values()}
    return {v: respellings(v) for v in values if len("".join(tokens(v))) >= MIN_CHARS}


PLANTED = planted()


def planting_reply(body):
    """The loop's fake replies, except that every memory write stores every planted spelling."""
    if "edits" not in (request_schema(body) or {}).get("properties", {}):
        return evolve_loop_reply(body)
    spelled = [s for spellings in PLANTED.values() for s in spellings]
    return json.dumps(
        {"edits": [{"label": f"fact_{i}", "value": s} for i, s in enumerate(spelled)]}
    )


def run(tmp_path, name: str, **settings):
    """An evolve run of `settings` with the optimizer on its own fake endpoint.

    Returns the optimizer's requests (their JSON) and the other roles' requests.
    """
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve

    with (
        FakeOpenAIServer(reply=planting_reply) as agent,
        FakeOpenAIServer(reply=planting_reply) as optimizer,
    ):
        files = {}
        for role, fake in (("agent", agent), ("optimizer", optimizer)):
            path = tmp_path / f"{role}.yaml"
            path.write_text(f"model: fake\nbase_url: {fake.base_url}\nmax_retries: 0\n")
            files[role] = str(path)
        path = write_small_evolve(
            tmp_path,
            name,
            USERS,
            periods=ENV["periods"],
            questions=ENV["questions"],
            cycles=2,
            feedback_modes=MODES,
            endpoints={
                "agent": files["agent"],
                "user_sim": files["agent"],
                "checker": files["agent"],
                "optimizer": files["optimizer"],
            },
            **settings,
        )
        outcomes = run_evolve(load_config(path, EvolveConfig), progress=False)
        sent = [json.dumps(r["messages"], ensure_ascii=False) for r in optimizer.requests]
        others = [json.dumps(r["messages"], ensure_ascii=False) for r in agent.requests]
    return outcomes, sent, others


def assert_private(sent: list[str], others: list[str]) -> None:
    check = LeakCheck(frozenset(PLANTED))
    assert sent, "the optimizer was asked nothing: the test would show nothing"
    for text in sent:
        decoded = json.loads(text)  # the request's own characters, not JSON escapes
        body = " ".join(str(m.get("content", "")) for m in decoded)
        assert check.names(body) == []
        folded = body.casefold()
        for spellings in PLANTED.values():
            for spelling in spellings:  # as a whole word ("chen" is in "kitchen")
                pattern = rf"(?<!\w){re.escape(spelling.casefold())}(?!\w)"
                assert not re.search(pattern, folded), spelling
    # the placeholders stand where the values were: the feedback still has its structure
    assert any(re.search(r"\[\w+ #\d+\]", t) for t in sent)
    # the policy under evaluation saw what was written, re-spellings and all
    assert any("\u200b" in t or "\\u200b" in t for t in others)


@pytest.mark.parametrize(
    "optimizer",
    [
        {"evolvers": ["reflective", "playbook"]},
        {"evolvers": ["edits"], "settings": {"edits": {"slot": True, "max_examples": 0}}},
        {"search": "gepa", "evolvers": None, "gepa": {"minibatch_size": 1, "max_metric_calls": 6}},
    ],
    ids=["reflective-playbook", "edits-slot", "gepa"],
)
def test_no_optimizer_request_holds_a_private_value_in_any_spelling(tmp_path, optimizer):
    outcomes, sent, others = run(tmp_path, "private", **optimizer)
    assert {o.mode for o in outcomes} == set(MODES)
    assert_private(sent, others)
    # and no registered prompt does either (the backstop's side: the proposals)
    check = LeakCheck(frozenset(PLANTED))
    for outcome in outcomes:
        for cycle in outcome.run_dir.glob("cycle_*/prompts.json"):
            assert check.names(cycle.read_text()) == []


def test_the_redactor_replaces_each_spelling_with_its_kind():
    redact = Redactor({"shared_house": "[home_type #2]", "Rosa Fontaine": "[name]"})
    text = "ROSA-FONTAINE moved to a sharedHouse; sha\u200bred houses (big) are cheap."
    assert redact(text) == "[name] moved to a [home_type #2]; [home_type #2] (big) are cheap."
    # words between a value's words are part of its span; other text is kept as written
    assert redact("a shared (big) house, Rosa!") == "a [home_type #2], Rosa!"
    assert redact.data({"k": ["a shared house", 3]}) == {"k": ["a [home_type #2]", 3]}
