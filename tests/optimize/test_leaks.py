"""Issue 29: no user's private value enters a shared prompt, whatever the optimizer or the mode.

The optimizer role of a loopback fake model proposes text naming users' private values, each
re-spelled (a superseded value in CamelCase, a current one CamelCase and plural, a user's full
name, a hobby from the profile), through every shipped optimizer (the reflective, playbook and
edits evolvers under the episode search, the reflective evolver under the period search, GEPA) and
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

from memloop.core.leaks import LeakCheck, ValueIndex, named, words
from memloop.environment.procedural import generate_procedural
from memloop.optimize.contract import NoSettings
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.evolvers import is_evolver_request
from memloop.testing.fake_server import request_schema
from memloop.testing.paths import TEST_DATA
from memloop.testing.policies import DEFAULT_PROMPTS

MODES = ["complete", "diagnostic", "question_only"]
ENV = {"users": 3, "periods": 2, "questions": 1, "seed": 37}
SEED_PROMPT = DEFAULT_PROMPTS["writer"]


def squash(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


# The users of ENV (seed 37) and, per re-spelling the issue lists, the value planted in the fake
# optimizer's proposals and how it is written there.
PLANTED = {
    "plural of a value ending in -se": ("shared_house", "shared houses"),
    "a number as a digit": ("one_cup", "1 cup"),
    "diacritics": ("evening_classes", "\u00e9vening cl\u00e4sses"),
    "full-width letters": (
        "documentaries",
        "\uff44\uff4f\uff43\uff55\uff4d\uff45\uff4e\uff54\uff41\uff52\uff49\uff45\uff53",
    ),
    "a word between": ("rotating_shifts", "rotating (big) shifts"),
    "homoglyphs (Cyrillic a, o) in a name": (
        "Nikolai Okonkwo",
        "Nikol\u0430i \u041ek\u043enkw\u043e",
    ),
    "a place in complementary_info": ("Cork", "Cork"),
}
LEAK = (
    "Note that users live in {}, drink {}, take {}, watch {}, like {}, and {} grew up in {}."
).format(*(spelling for _, spelling in PLANTED.values()))
VALUES = sorted(value for value, _ in PLANTED.values())
DATA = TEST_DATA


def is_delta_request(body: dict[str, Any]) -> bool:
    """A playbook evolver's request for one delta."""
    schema = request_schema(body) or {}
    return set(schema.get("properties", {})) == {"op", "id", "rule"}


def is_slot_request(body: dict[str, Any]) -> bool:
    """The edits evolver's request to fill its one slot (kinds of information)."""
    schema = request_schema(body) or {}
    return set(schema.get("properties", {})) == {"kinds"}


def leaking_reply(body: dict[str, Any]) -> str:
    """evolve_loop_reply, except that every optimizer request is answered with LEAK."""
    text = " ".join(str(m.get("content", "")) for m in body["messages"])
    if is_slot_request(body):
        return json.dumps({"kinds": ", ".join(spelling for _, spelling in PLANTED.values())})
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
    # the fake's proposals really are leaks, of each kind the issue lists, of these users' values
    private = set().union(*(i.private_values() for i in generate_procedural(**ENV)))
    assert set(VALUES) <= private
    superseded = {v for i in generate_procedural(**ENV) for v in i.state_at(0).values()}
    assert {"one_cup", "rotating_shifts"} <= superseded - {
        v for i in generate_procedural(**ENV) for v in i.state_at(1).values()
    }
    for value, spelling in PLANTED.values():
        assert spelling in LEAK and (value == spelling or value not in LEAK)
    assert len(LEAK.split()) <= 30 and LEAK.endswith(".")  # a playbook rule's form
    assert set(VALUES) <= set(named(LEAK, private))  # the matcher sees each one


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
    # a stem shorter than a checked value is no key: "Mars" is not named by "Mar" (a month)
    assert named("in Mar we met; a len test", {"Mars", "Lens"}) == []
    assert named("on Mars with Lens", {"Mars", "Lens"}) == ["Lens", "Mars"]
    # a word's stem is its American singular (inflect's and breame's data): houses/house,
    # boxes/box, parties/party, children/child, lives/life, centres/center
    assert words("HTTPServer nut_allergies boxes houses party children lives centres") == [
        *("http", "server", "nut", "allergy", "box", "house", "party", "child", "life", "center"),
    ]


# The issue's re-spellings, each made here independently of the matcher, for every value of the
# procedural catalogue and of the published sample: {form: how to write a value's words}.
CYRILLIC = str.maketrans({"a": "\u0430", "e": "\u0435", "o": "\u043e", "c": "\u0441"})
ACCENTS = str.maketrans({"a": "\u00e2", "e": "\u00e9", "o": "\u00f6", "u": "\u00fc", "i": "\u00ef"})
NUMBER_WORDS = dict(enumerate("zero one two three four five six seven eight nine ten".split()))


def plural(word: str) -> str:
    """English plural, the textbook rule; a word already plural is kept ("books", not "bookses":
    the form "singular" below writes such a value's singular)."""
    if word.endswith("s") and not word.endswith("ss"):
        return word
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def singular(word: str) -> str:
    if word.endswith(("ses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    if word.endswith("ies"):
        return word[:-3] + "y"
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def respelled(value: str) -> dict[str, str]:
    ws = value.replace("_", " ").split()
    digits = [NUMBER_WORDS.get(int(w), w) if w.isdigit() else w for w in ws]
    number = {"one": "1", "two": "2", "three": "3", "four": "4", "five": "5"}
    forms = {
        "spaces": " ".join(ws),
        "camel": "".join(w.capitalize() for w in ws),
        "upper": " ".join(ws).upper(),
        "hyphens": "-".join(ws),
        "run together": "".join(ws),
        "plural": " ".join([*ws[:-1], plural(ws[-1])]),
        "singular": " ".join([*ws[:-1], singular(ws[-1])]),
        "accents": " ".join(ws).translate(ACCENTS),
        "full width": "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in " ".join(ws)),
        "look-alikes": " ".join(ws).translate(CYRILLIC),
        "zero width": "\u200b".join(" ".join(ws)),
        "digits as words": " ".join(digits),
        "words as digits": " ".join(number.get(w, w) for w in ws),
    }
    if len(ws) > 1:
        forms["a word between"] = " ".join([ws[0], "(big)", *ws[1:]])
        forms["two words between"] = " ".join([ws[0], "very", "big", *ws[1:]])
    return forms


def matchable(value: str) -> bool:
    letters = "".join(c for c in value if c.isalnum())
    return len(letters) >= 4 and value not in {"none"}


def test_every_re_spelling_of_every_catalogue_and_published_value_is_matched():
    from memloop.environment.catalogue import VARIABLES
    from memloop.environment.datafile import load_items

    published = load_items(DATA / "published_sample.json")
    values = {v.name for var in VARIABLES.values() for v in var.values}
    values |= {v for item in published for v in item.private_values()}
    values |= {"2_children", "shared_house", "online_course", "nurse", "church", "party"}
    index = ValueIndex(values)  # as a run's leak check holds them: indexed once
    missed = [
        (value, form, text)
        for value in sorted(values)
        if matchable(value)
        for form, text in respelled(value).items()
        if value not in index.named(f"Note that {text} matters.")
    ]
    assert missed == []
    assert len(values) > 150


def test_inflect_imported_without_typeguard_singularizes_as_the_instrumented_one():
    """memloop imports inflect with typeguard's decorator as the identity (its import cost ~3 s
    per process); every word of the catalogue and published values, and its plural, gets the
    singular the instrumented inflect gives, read in a fresh interpreter."""
    import subprocess
    import sys

    from memloop.core.leaks import _inflect, tokens
    from memloop.environment.catalogue import VARIABLES
    from memloop.environment.datafile import load_items

    published = load_items(DATA / "published_sample.json")
    values = {v.name for var in VARIABLES.values() for v in var.values}
    values |= {v for item in published for v in item.private_values()}
    words = sorted({t for v in values for t in tokens(v) if len(t) > 3 and not t.isdigit()})
    words += "children lives centres boxes parties geese mice analyses".split()
    engine = _inflect()
    assert "typeguard" not in type(engine).singular_noun.__code__.co_names  # not instrumented
    script = (
        "import inflect, json, sys; e = inflect.engine(); ws = json.load(sys.stdin); "
        "assert 'typeguard' in type(e).singular_noun.__code__.co_names; "
        "print(json.dumps([[e.singular_noun(w), e.singular_noun(e.plural(w))] for w in ws]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(words), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    instrumented = json.loads(done.stdout)
    ours = [[engine.singular_noun(w), engine.singular_noun(engine.plural(w))] for w in words]
    assert len(words) > 200
    assert ours == instrumented


def test_the_issues_re_spellings_are_matched():
    private = {"shared_house", "online_course", "nurse", "2_children", "Bergen"}
    cases = {
        "many users live in shared houses": ["shared_house"],
        "take online courses": ["online_course"],
        "two nurses": ["nurse"],
        "sh\u00e2red house": ["shared_house"],
        "\uff53\uff48\uff41\uff52\uff45\uff44 \uff48\uff4f\uff55\uff53\uff45": ["shared_house"],
        "sh\u0430red house": ["shared_house"],  # Cyrillic a
        "two children": ["2_children"],
        "shared (big) house": ["shared_house"],
        "one grew up in Bergen": ["Bergen"],
    }
    for text, expected in cases.items():
        assert named(text, private) == expected, text


# Issue 57's audit: re-spellings of the catalogue's values that got through the folding of
# 6a40079, each now folded with a maintained library's data (inflect, Unicode's confusables data,
# anyascii, breame) or a decoder of the standard library: {what: (value, text)}.
AUDIT = {
    "-ves plural": ("quiet_social_life", "users lead quiet social lives"),
    "Greek lunate sigma for c": ("quiet_social_life", "a quiet so\u03f2ial life"),
    "Greek yot for j": ("job_hunting", "\u03f3ob hunting"),
    "Cyrillic ka for k": ("knee_injury", "\u043anee injury"),
    "Cyrillic palochka for l": ("quiet_social_life", "quiet socia\u04cf life"),
    "Cyrillic straight u for y": ("young_children", "\u04afoung children"),
    "a possessive is no word between": (
        "part_time_degree",
        "a part-time's (evening class) degree",
    ),
    "American for British": ("city_centre", "lives in the city center"),
    "percent-encoding": ("city_centre", "the city%20centre"),
    "backslash-u escapes": ("city_centre", "the \\u0063ity centre"),
    "HTML entities": ("city_centre", "the &#99;ity&nbsp;centre"),
    "leetspeak": ("city_centre", "the c1ty c3ntr3"),
}


@pytest.mark.parametrize("what", AUDIT)
def test_the_audits_re_spellings_are_matched(what):
    from memloop.environment.catalogue import VARIABLES

    values = {v.name for var in VARIABLES.values() for v in var.values}
    value, text = AUDIT[what]
    assert value in values  # a real value of the catalogue
    assert value in named(f"Note that {text} matters.", values)


def test_a_possessive_is_not_counted_as_a_word_between():
    values = {"master_degree_computer_science"}
    # master [s] degree [in the] computer science: three words between with the possessive's
    # "s", two (GAP) without it
    assert named("a master's degree in the computer science field", values) == sorted(values)
    assert named("a master big degree in the computer science field", values) == []


def test_common_words_and_memloops_own_prompts_name_no_value():
    from memloop.environment.catalogue import VARIABLES
    from memloop.environment.simulator import SIM_SYSTEM
    from memloop.feedback import probes
    from memloop.optimize import evolvers, playbook
    from memloop.policies import programs

    values = {v.name for var in VARIABLES.values() for v in var.values}
    values |= {"nurse", "chef", "Bergen", "none", "one_dog", "2_children", "shared_house"}
    own = [
        programs.AWI_WRITER_INSTRUCTIONS,
        programs.AWE_FACT_EXTRACTION_INSTRUCTIONS,
        programs.AWE_MEMORY_UPDATE_INSTRUCTIONS,
        evolvers.REFLECT_SYSTEM,
        evolvers.RULES_SYSTEM,
        playbook.DELTA_SYSTEM,
        probes.MC_PROMPT,
        probes.STATE_PROMPT,
        SIM_SYSTEM,
    ]
    common = [
        "Record none of the guesses; keep one fact per line.",  # "none", "one" are function words
        "The nursery and the chief of staff.",  # near a value, not it
        "Bergenia grows in the garden.",  # a longer word that starts with a value
        "House rules: a shared understanding of the facts.",  # value words far apart
        "Courses of action, online or not.",
        "Children and houses are facts like any other.",  # one word of a value
        "Note how many times a week the user travels.",
    ]
    for text in own + common:
        assert named(text, values) == [], text[:60]


def test_a_profiles_places_people_and_organisations_are_private():
    from memloop.core.leaks import proper_nouns

    text = (
        "Rosa grew up in Bergen, and now works for the University of Oslo. Tromsø is where her "
        "sister Ingrid lives. Growing up, she loved Mondays. She enjoys New York in June."
    )
    assert proper_nouns(text) == {
        *("Rosa", "Bergen", "University of Oslo", "Tromso", "Ingrid", "New York"),
    }
    items = generate_procedural(**ENV)
    item = items[0]
    assert "grew up in Tampere" in item.user_profile.complementary_info
    assert "Tampere" in item.private_values()


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
    if evolver == "edits":  # its model fills one slot (the only text it writes); examples too
        data["settings"] = {"edits": {"slot": True, "max_examples": 2}}
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
        ("episode", "edits"),
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
        asked = [
            r
            for r in fake.requests
            if is_evolver_request(r) or is_delta_request(r) or is_slot_request(r)
        ]
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
            for what, (value, spelling) in PLANTED.items():
                # independent of the matcher: neither the planted spelling nor the plain value
                assert spelling not in text and squash(value) not in squash(text), (o.mode, what)
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
        from memloop.runs.cycles import CycleRecord, split_results

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
    assert run.info.status == "FAILED"  # an error, not a Ctrl-C (runs/recorder.end_status)


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

    summary = FeedbackSummary(mode="complete", private=VALUES)
    evolver = Screens()
    step = propose(evolver, EvolveInput({"writer": SEED_PROMPT}, summary, screen=screen))
    assert screened == [{"writer": "Keep facts current."}]  # the leak was never replayed
    assert [r.state_accuracy for r in evolver.results] == [None, 0.5]
    assert step.prompts == {"writer": SEED_PROMPT} and step.leaks_rejected == 2
    assert (
        step.errors["writer"]
        == "the proposal names 7 private values of the users; kept the old one"
    )


# ---------------------------------------------------------------- starting prompts


def private_prompt_policy(folder: Path, text: str, accept: bool | None = None) -> Path:
    """An AWI policy YAML starting from a prompt file memloop's text format holds `text` in."""
    from memloop.policies.prompt_files import render_text

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "start.txt").write_text(render_text({"writer": text}, ["# a prompt file"]))
    body = "type: awi\nprompts_from: start.txt\n"
    if accept is not None:
        body += f"accept_private_values: {str(accept).lower()}\n"
    (folder / "policy.yaml").write_text(body)
    return folder / "policy.yaml"


class UserWith:
    """A run user as the starting-prompt check reads one: its private values."""

    def __init__(self, *values: str):
        self.values = set(values)

    def private_values(self) -> set[str]:
        return self.values


@pytest.mark.parametrize(
    "text",
    ["Most users lead quiet social lives.", "A quiet so\u03f2ial life is common."],
    ids=["-ves plural", "look-alike letter"],
)
def test_a_prompt_file_with_the_audits_re_spellings_is_refused(tmp_path, text):
    """Issue 57: a `prompts_from:` file holding a run user's value as the audit wrote it was
    accepted."""
    from memloop.core.errors import UserError
    from memloop.runs.inputs import load_policy

    policy = private_prompt_policy(tmp_path, text)
    with pytest.raises(UserError, match="name 1 private value of this run's users"):
        load_policy(policy, users=[UserWith("quiet_social_life")])


def test_eval_refuses_a_starting_prompt_naming_a_users_value_unless_accepted(tmp_path, capsys):
    from memloop.environment.datafile import save_items
    from memloop.experiments.cli import main
    from memloop.testing import schema_valid_reply
    from memloop.testing.commands import eval_argv

    items = generate_procedural(users=2, periods=1, questions=1, seed=37)
    save_items(items, tmp_path / "env.json")
    value = next(iter(items[1].state_at(0).values()))  # e.g. "one_cup"
    spelled = " ".join(w.upper() for w in value.split("_"))
    text = f"Store what the user says; many users mention {spelled} and grew up in Cork."
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        endpoint = tmp_path / "endpoint.yaml"
        endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
        files = (tmp_path / "env.json", endpoint, tmp_path / "c.db")
        refused = private_prompt_policy(tmp_path / "refused", text)
        argv = eval_argv(files[0], refused, files[1], files[2], tmp_path / "out")
        assert main([*argv, "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "name 2 private values of this run's users" in err[0]
        assert "accept_private_values: true" in err[0]
        assert value not in err[0] and spelled not in err[0] and "Cork" not in err[0]
        assert not (tmp_path / "out").exists()  # refused before anything is written
        accepted = private_prompt_policy(tmp_path / "accepted", text, accept=True)
        argv = eval_argv(files[0], accepted, files[1], files[2], tmp_path / "out")
        assert main([*argv, "--no-progress"]) == 0
        assert (tmp_path / "out" / "metrics.json").exists()
        writes = [r for r in fake.requests if text in json.dumps(r, ensure_ascii=False)]
        assert writes  # the accepted prompt really is the writer's
    # a prompt naming no value of these users starts without the flag
    clean = private_prompt_policy(tmp_path / "clean", "Store what the user says, in their words.")
    from memloop.runs.inputs import load_policy

    assert load_policy(clean, users=items).prompts == {
        "writer": "Store what the user says, in their words."
    }
    with pytest.raises(Exception, match="expected true or false"):
        (tmp_path / "bad.yaml").write_text("type: awi\naccept_private_values: 'yes'\n")
        load_policy(tmp_path / "bad.yaml", users=items)


def test_evolve_refuses_a_registry_seed_naming_a_value_and_keeps_only_accepted_ones(tmp_path):
    from memloop.core.errors import UserError
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.runs import tracker

    path = write_config(tmp_path, "episode", "reflective")
    data = yaml.safe_load(path.read_text())
    data["feedback_modes"] = ["complete"]
    # a registered version (e.g. another experiment's best) that names one user's hobby
    mlc = tracker.client(data["tracking_uri"])
    run_id = mlc.create_run(mlc.create_experiment("elsewhere")).info.run_id
    name = tracker.prompt_name("elsewhere", "awi")
    seed = "Record what the user states. Users often enjoy birdwatching."
    version = tracker.register_prompt(mlc, name, {"writer": seed}, cycle=0, run_id=run_id, score=0)
    policy = tmp_path / "seeded.yaml"
    policy.write_text(f"type: awi\nprompts_from: 'prompts:/{name}/{version}'\n")
    data["policy"] = str(policy)
    path.write_text(yaml.safe_dump(data))
    config = load_config(path, EvolveConfig)
    with pytest.raises(UserError, match="name 1 private value of this run's users") as err:
        run_evolve(config, progress=False, builder=scripted_builder())
    assert "birdwatching" not in str(err.value)
    assert mlc.get_experiment_by_name(config.experiment_name) is None  # nothing logged
    # accepted: the run starts from it; a candidate may keep that value but name no other
    policy.write_text(policy.read_text() + "accept_private_values: true\n")
    scripted = scripted_builder()

    def builder(config, client, workdir, prompts=None):  # the scripted policy, seeded
        return scripted(config, client, workdir, prompts or config.prompts)

    with FakeOpenAIServer(reply=leaking_reply) as fake:
        (outcome,) = run_evolve(
            config,
            progress=False,
            clients=fake_roles(fake.base_url, tmp_path / "c.sqlite"),
            builder=builder,
        )
    prompt_name = mlc.get_run(outcome.run_id).data.tags["memloop.prompt_name"]
    texts = [v.template for v in mlc.search_prompt_versions(prompt_name)]
    assert texts[-1] == seed  # cycle 0 (versions come newest first): the accepted seed
    assert sum(c.leaks_rejected for c in outcome.cycles) >= 1  # LEAK's values were refused
    for t in texts:
        for _, spelling in PLANTED.values():
            assert spelling not in t
