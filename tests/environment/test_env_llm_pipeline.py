"""The LLM generation pipeline against a scripted fake model: validators, failure reports, exit
codes, resume from step files, reproducible choice order and session times, persona loading."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from memloop.core.errors import UserError
from memloop.environment.datafile import load_items
from memloop.environment.llm_pipeline import (
    PipelineConfig,
    load_config,
    load_personas,
    run_pipeline,
)
from memloop.environment.llm_pipeline.asking import Invalid
from memloop.environment.llm_pipeline.assemble import session_times
from memloop.environment.llm_pipeline.personas import Persona, parse_list, select_personas
from memloop.environment.llm_pipeline.step_answers import plan_variants
from memloop.environment.llm_pipeline.step_questions import (
    merge_uses,
    validate_mapping,
    validate_questions,
)
from memloop.environment.llm_pipeline.step_states import (
    change_range,
    eligible_variables,
    validate_events,
    validate_update,
)
from memloop.environment.llm_pipeline.step_utterances import exposure_groups
from memloop.experiments.cli import main
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.testing.fake_server import FakeOpenAIServer
from memloop.testing.paths import REPO

ROOT = REPO

# --- a scripted model that answers every pipeline call from the request itself -----------------

Override = Callable[[str, dict[str, Any], str], str | None]


def _schema(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    spec = body["response_format"]["json_schema"]
    return spec["name"], spec["schema"]


def _prompt(body: dict[str, Any]) -> str:
    return body["messages"][1]["content"]


def _values(prompt: str) -> list[str]:
    return re.findall(r'"value": "([^"]+)"', prompt)


def _numbered(prompt: str) -> list[str]:
    return re.findall(r"^\d+\. (.+)$", prompt, flags=re.M)


def good_reply(name: str, schema: dict[str, Any], prompt: str) -> str:
    """A reply that passes every validator and check (the 'ideal model')."""
    props = schema.get("properties", {})
    if name == "profile":
        return json.dumps(
            {"name": "Pat Example", "summary": "Pat likes long walks and short lists."}
        )
    if name == "questions":
        qs = props["questions"]
        count = qs["minItems"]
        info = qs["items"]["properties"]["required_info"]
        per, choices = info["minItems"], info["items"]["properties"]["info_choices"]["minItems"]
        who = re.search(r"^name: (\w+)", prompt, flags=re.M).group(1)
        return json.dumps(
            {
                "questions": [
                    {
                        "question": f"I am {who}; how should I plan area {q} of my life?",
                        "required_info": [
                            {
                                "info_type": f"fact {q} {j}",
                                "info_choices": [f"q{q}f{j}v{c}x" for c in range(choices)],
                            }
                            for j in range(per)
                        ],
                    }
                    for q in range(count)
                ]
            }
        )
    if name == "schema_merge":
        names = list(props["variables"]["properties"])
        return json.dumps({"variables": {n: f"var_{n}" for n in names}})
    if name == "schema_unify":
        return json.dumps(
            {var: [f"{var}u{c}x" for c in range(spec["minItems"])] for var, spec in props.items()}
        )
    if name == "initial_state":
        return json.dumps(
            {var: spec["enum"][len(spec["enum"]) // 2] for var, spec in props.items()}
        )
    if name == "state_update":
        options = props["changes"]["items"]["anyOf"][: props["changes"]["minItems"]]
        return json.dumps(
            {
                "changes": [
                    {
                        "variable": o["properties"]["variable"]["enum"][0],
                        "new_value": o["properties"]["new_value"]["enum"][0],
                    }
                    for o in options
                ],
                "summary": "A few things shifted this season.",
            }
        )
    if name == "events":
        changed = list(props["event_of"]["properties"])
        return json.dumps(
            {
                "events": [f"Something specific happened about {v}." for v in changed],
                "event_of": {v: i for i, v in enumerate(changed, 1)},
            }
        )
    if name in ("opening_message", "refine_message"):
        return json.dumps(
            {"message": "Could you help me plan? Context: " + " ".join(_values(prompt))}
        )
    if name == "exposure_check":
        message = prompt.split('"')[1]
        return json.dumps(
            {
                var: next((v for v in spec["enum"] if v in message), spec["enum"][0])
                for var, spec in props.items()
            }
        )
    if name == "answers":
        return json.dumps(
            {"answers": [f"Advice that fits exactly {line}." for line in _numbered(prompt)]}
        )
    if name == "reflection_check":
        answer = prompt.split("An advisor's answer: \"")[1].split('"')[0]
        lines = _numbered(prompt)
        pick = next((i for i, line in enumerate(lines, 1) if line in answer), 1)
        return json.dumps({"situation": pick})
    if name == "refine_answer":
        target = re.search(r"Answer written for the situation: (.+)\n", prompt).group(1)
        return json.dumps({"answer": f"Advice that fits exactly {target}."})
    raise AssertionError(f"unexpected call {name}")


class ScriptedModel:
    """Replies like `good_reply`, unless `override(name, schema, prompt)` returns a text."""

    def __init__(self, override: Override | None = None) -> None:
        self.override = override
        self.calls: list[str] = []

    def __call__(self, body: dict[str, Any]) -> str:
        name, schema = _schema(body)
        prompt = _prompt(body)
        self.calls.append(name)
        if self.override is not None:
            text = self.override(name, schema, prompt)
            if text is not None:
                return text
        return good_reply(name, schema, prompt)


PERSONAS = [
    {
        "uuid": "user-good",
        "name": "Goodwin Able",
        "age": 40,
        "sex": "Male",
        "occupation": "baker",
        "persona": "Bakes bread before dawn.",
    },
    {
        "uuid": "user-bad",
        "name": "Badea Blocked",
        "age": 30,
        "sex": "Female",
        "occupation": "pilot",
        "persona": "Flies short regional routes.",
    },
]


@pytest.fixture()
def persona_file(tmp_path: Path) -> Path:
    path = tmp_path / "personas.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PERSONAS))
    return path


def make_config(persona_file: Path, **changes: Any) -> PipelineConfig:
    data = dict(
        users=2,
        questions=2,
        periods=2,
        states_per_question=2,
        choices_per_state=3,
        changes_per_period=2,
        refine_budget=2,
        personas=str(persona_file),
        seed=7,
    )
    data.update(changes)
    return PipelineConfig(**data)


def run_with(model: ScriptedModel, config: PipelineConfig, out: Path, cache: Path, **kwargs: Any):
    with FakeOpenAIServer(reply=model) as fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url, max_retries=0), cache=cache)
        try:
            return run_pipeline(config, out, client, **kwargs), fake
        finally:
            client.close()


def blocks_bad_user(name: str, schema: dict[str, Any], prompt: str) -> str | None:
    """The reflection checker always picks a wrong situation for Badea's questions."""
    if name == "reflection_check" and "Badea" in prompt:
        answer = prompt.split("An advisor's answer: \"")[1].split('"')[0]
        lines = _numbered(prompt)
        right = next(i for i, line in enumerate(lines, 1) if line in answer)
        return json.dumps({"situation": 1 if right != 1 else 2})
    return None


# --- pure validators ---------------------------------------------------------------------------

SCHEMA = {
    "work": ["day", "night", "rotating"],
    "runs": ["low", "mid", "high"],
    "diet": ["veg", "omni"],
}
STATE = {"work": "day", "runs": "mid", "diet": "veg"}


def test_update_validator_accepts_k_minus_1_to_k_plus_1_valid_different_changes():
    ok = validate_update(
        {"changes": [{"variable": "work", "new_value": "night"}], "summary": "New rota."},
        SCHEMA,
        STATE,
        1,
        3,
    )
    assert ok == {"summary": "New rota.", "changes": {"work": "night"}}
    cases = [
        ([], "0 variables changed; change between 1 and 3"),
        ([{"variable": "mood", "new_value": "x"}], "unknown variable 'mood'"),
        ([{"variable": "work", "new_value": "evening"}], "'evening' is not a value of work"),
        ([{"variable": "work", "new_value": "day"}], "work is already 'day'"),
        (
            [
                {"variable": "work", "new_value": "night"},
                {"variable": "work", "new_value": "rotating"},
            ],
            "work is changed twice",
        ),
    ]
    for changes, message in cases:
        with pytest.raises(Invalid, match=re.escape(message)):
            validate_update({"changes": changes, "summary": "x" * 10}, SCHEMA, STATE, 1, 3)


def test_change_range_and_cap():
    assert change_range(4, 10) == (3, 5)
    assert change_range(4, 3) == (3, 3)
    assert change_range(1, 5) == (1, 2)
    assert change_range(4, 1) == (1, 1)
    counts = {"work": 3, "runs": 0, "diet": 1}
    assert eligible_variables(SCHEMA, counts, 3, 2) == ["runs", "diet"]
    assert eligible_variables(SCHEMA, counts, 3, 3) == list(SCHEMA)  # too few fresh ones: all


def test_events_validator_requires_exact_coverage():
    changed = ["work", "runs"]
    good = {
        "events": ["Joined the ICU night team and trains less.", "An event that explains nothing."],
        "event_of": {"runs": 1, "work": 1},
    }
    assert validate_events(good, changed) == [
        {"variables": ["work", "runs"], "event": "Joined the ICU night team and trains less."}
    ]
    with pytest.raises(Invalid, match=r"no event explains \['runs'\]"):
        validate_events({"events": ["Joined the night team."], "event_of": {"work": 1}}, changed)
    with pytest.raises(Invalid, match="runs points to event 3, but there are 2 events"):
        validate_events(
            {
                "events": ["Night team now.", "Rota changed again."],
                "event_of": {"work": 1, "runs": 3},
            },
            changed,
        )
    with pytest.raises(Invalid, match="'diet'], which did not change"):
        validate_events(
            {"events": ["Big change."], "event_of": {"work": 1, "runs": 1, "diet": 1}}, changed
        )


def test_question_and_merge_validators():
    parsed = {
        "questions": [
            {
                "question": "How do I plan my week?",
                "required_info": [
                    {
                        "info_type": "Work Shift",
                        "info_choices": ["Day shifts", "night-shifts", "rotating"],
                    },
                    {"info_type": "budget", "info_choices": ["low", "mid", "high"]},
                ],
            },
            {
                "question": "What should I cook tonight?",
                "required_info": [
                    {"info_type": "budget", "info_choices": ["tight", "ok", "loose"]},
                    {"info_type": "diet", "info_choices": ["vegan", "veg", "omni"]},
                ],
            },
        ]
    }
    questions = validate_questions(parsed, 2, 2, 3)
    assert questions[0]["required_info"][0] == {
        "info_type": "work_shift",
        "info_choices": ["day_shifts", "night_shifts", "rotating"],
    }
    bad = json.loads(json.dumps(parsed))
    bad["questions"][1]["required_info"][1]["info_choices"] = ["Veg", "veg", "omni"]
    with pytest.raises(Invalid, match="lists the value 'veg' twice"):
        validate_questions(bad, 2, 2, 3)
    with pytest.raises(Invalid, match="exactly 3 questions"):
        validate_questions(parsed, 3, 2, 3)
    static = json.loads(json.dumps(parsed))
    static["questions"][0]["required_info"][1]["info_type"] = "Marital status"
    with pytest.raises(
        Invalid, match="depends on 'marital_status', which the person's sheet already states"
    ):
        validate_questions(static, 2, 2, 3)

    mapping = validate_mapping(
        {"variables": {"work_shift": "shift", "budget": "Food Budget", "diet": "diet"}}, questions
    )
    assert mapping == {"work_shift": "shift", "budget": "food_budget", "diet": "diet"}
    settled, conflicts = merge_uses(questions, mapping)
    assert list(conflicts) == ["food_budget"]  # one name, two different value lists -> unify
    assert settled == {
        "shift": ["day_shifts", "night_shifts", "rotating"],
        "diet": ["vegan", "veg", "omni"],
    }
    with pytest.raises(Invalid, match="both map to 'shift_budget'"):
        validate_mapping(
            {"variables": {"work_shift": "shift_budget", "budget": "shift_budget", "diet": "diet"}},
            questions,
        )
    with pytest.raises(Invalid, match="'walter_brennan' for the fact 'work_shift' does not say"):
        validate_mapping(
            {"variables": {"work_shift": "walter_brennan", "budget": "budget", "diet": "diet"}},
            questions,
        )


def test_variants_cover_every_experienced_state_and_are_seeded():
    import random

    states = [
        {"work": "day", "runs": "mid"},
        {"work": "night", "runs": "mid"},
        {"work": "day", "runs": "mid"},
    ]
    one = plan_variants(["work", "runs"], SCHEMA, states, 4, random.Random("a"), random.Random("b"))
    two = plan_variants(["work", "runs"], SCHEMA, states, 4, random.Random("a"), random.Random("b"))
    assert one == two and len(one) == 4
    kinds = {tuple(v): k for v, k in one}
    assert kinds[("day", "mid")] == "experience" and kinds[("night", "mid")] == "experience"
    assert sorted(kinds.values()).count("random") == 2
    assert (
        len(
            plan_variants(
                ["diet"], SCHEMA, [{"diet": "veg"}], 4, random.Random(1), random.Random(2)
            )
        )
        == 2
    )


def test_session_times_spread_over_the_period_and_increase():
    import random

    first, last = datetime(2021, 1, 2).date(), datetime(2021, 4, 1).date()
    stamps = session_times(random.Random(3), first, last, 3)
    days = [datetime.strptime(s, "%Y-%m-%d %H:%M:%S") for s in stamps]
    assert days == sorted(days) and len(set(days)) == 3
    assert (
        days[0].date() < datetime(2021, 2, 1).date()
        and days[-1].date() > datetime(2021, 3, 1).date()
    )
    assert all(first <= d.date() <= last for d in days)
    assert session_times(random.Random(3), first, last, 3) == stamps
    many = session_times(random.Random(4), first, first, 5)  # more sessions than days
    assert many == sorted(many) and len(set(many)) == 5


def test_opening_message_validator_rejects_refusals():
    from memloop.environment.llm_pipeline.step_utterances import validate_message

    assert validate_message(
        {"message": "  I now work nights; how do I sleep   in the day?"}
    ).startswith("I now")
    for text in (
        "I'm sorry, but I can't assist with that request.",
        "As an AI, I do not have a job.",
        "Hi",
    ):
        with pytest.raises(Invalid):
            validate_message({"message": text})


def test_exposure_groups_cover_each_variable_once():
    import random

    questions = [
        {"required_info": ["a", "b"]},
        {"required_info": ["b", "c"]},
        {"required_info": ["d", "e"]},
    ]
    schema = dict.fromkeys("abcdef", ["x", "y"])
    groups = exposure_groups(questions, schema, 2, random.Random(0))
    flat = [v for g in groups for v in g]
    assert sorted(flat) == list("abcdef") and all(1 <= len(g) <= 2 for g in groups)
    assert groups == exposure_groups(questions, schema, 2, random.Random(0))


# --- personas and config -----------------------------------------------------------------------


def test_builtin_personas_and_nemotron_like_rows(tmp_path: Path):
    builtin = load_personas(ROOT / "memloop" / "environment" / "personas" / "personas.jsonl")
    assert len(builtin) >= 10 and len({p.id for p in builtin}) == len(builtin)
    assert not any(p.needs_llm_profile() for p in builtin)
    profile = builtin[0].profile()
    assert profile.name and profile.formatted_str.startswith("name: ")

    row = {
        "uuid": "n-1",
        "persona": "Kai Moana is a ferry mechanic in Auckland.",
        "sex": "Male",
        "age": 51.0,
        "education_level": "bachelors",
        "bachelors_field": "engineering",
        "hobbies_and_interests_list": "['surfing', \"kapa haka\"]",
        "skills_and_expertise_list": "__import__('os').system('echo pwned')",
    }
    persona = Persona(row)
    fields = persona.basic_fields()
    assert fields["age"] == 51 and fields["education_level"] == "bachelors (engineering)"
    assert fields["hobbies_and_interests"] == "surfing, kapa haka"
    assert (
        "pwned" not in fields["skills_and_expertise"]
        or "__import__" in fields["skills_and_expertise"]
    )
    assert persona.needs_llm_profile()  # no name column
    assert (
        parse_list('["a", "b"]') == ["a", "b"]
        and parse_list("a, b") == ["a", "b"]
        and parse_list(None) == []
    )

    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([row, {**row, "uuid": "n-2"}]), path)
    assert [p.id for p in load_personas(path)] == ["n-1", "n-2"]


def test_persona_selection_is_a_seeded_prefix_stable_shuffle():
    pool = [Persona({"uuid": f"p{i}"}) for i in range(30)]
    three = [p.id for p in select_personas(pool, 3, seed=5)]
    five = [p.id for p in select_personas(pool, 5, seed=5)]
    assert five[:3] == three and three != ["p0", "p1", "p2"]
    assert "p1" not in [p.id for p in select_personas(pool, 29, seed=5, exclude_ids=["p1"])]
    with pytest.raises(UserError, match="only 30 distinct personas"):
        select_personas(pool, 31, seed=5)


def test_base_and_extra_configs_load(tmp_path: Path):
    base = load_config(ROOT / "memloop" / "experiments" / "env" / "base.yaml")
    extra = load_config(ROOT / "memloop" / "experiments" / "env" / "extra.yaml")
    assert (base.periods, base.states_per_question, base.rounds_init, base.rounds_update) == (
        10,
        2,
        1,
        2,
    )
    assert (extra.periods, extra.states_per_question, extra.rounds_init, extra.rounds_update) == (
        20,
        3,
        2,
        5,
    )
    assert base.users == extra.users == 20 and base.questions == 10 and base.changes_per_period == 4
    assert base.endpoint_config().model == "local-1.5b"
    assert len(load_personas(base.persona_path())) >= base.users  # runs out of the box
    assert (
        load_config(
            ROOT / "memloop" / "experiments" / "env" / "base.yaml", users=1, periods=None
        ).users
        == 1
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("users: 2\nperiodz: 3\n")
    with pytest.raises(UserError, match="unknown key 'periodz'"):
        load_config(bad)
    bad.write_text("start_date: 2021-02-03\n")
    assert load_config(bad).start_date == "2021-02-03"  # an unquoted YAML date
    bad.write_text("start_date: 2020-13-01\n")
    with pytest.raises(UserError, match="start_date"):
        load_config(bad)


# --- whole runs against the scripted model -----------------------------------------------------


def test_happy_run_writes_valid_data_and_is_reproducible(tmp_path: Path, persona_file: Path):
    config = make_config(persona_file)
    result, _ = run_with(ScriptedModel(), config, tmp_path / "a", tmp_path / "a.sqlite")
    assert result.complete and len(result.items) == 2
    items = load_items(tmp_path / "a" / "data.json")  # raises on any validation problem
    assert [i.id for i in items] == [
        p.id for p in select_personas(load_personas(persona_file), 2, 7)
    ]
    item = items[0]
    assert len(item.periods) == 3 and len(item.qas) == 2
    assert all(len(qa.answer_choices) >= 4 for qa in item.qas)
    for period in item.periods[1:]:
        assert 1 <= len(period.updates) <= 3 and period.sessions
        for session in period.sessions:
            when = datetime.strptime(session.session_time, "%Y-%m-%d %H:%M:%S").date()
            assert period.period_start < when.isoformat() <= period.period_end
    exposed = {var for s in item.periods[0].sessions for var in s.exposed_states}
    assert exposed == set(item.state_schema)
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert (
        report["status"] == "complete" and report["failed"] == [] and len(report["succeeded"]) == 2
    )

    again, _ = run_with(ScriptedModel(), config, tmp_path / "b", tmp_path / "b.sqlite")
    assert (tmp_path / "a" / "data.json").read_bytes() == (
        tmp_path / "b" / "data.json"
    ).read_bytes()
    orders = [[c.type for c in qa.answer_choices] for i in items for qa in i.qas]
    assert any(order[0] == "random" for order in orders) or any(
        order != sorted(order) for order in orders
    )  # shuffled, not experienced-first


def test_failing_user_is_reported_with_step_and_reason_not_dropped(
    tmp_path: Path, persona_file: Path
):
    config = make_config(persona_file)
    result, _ = run_with(
        ScriptedModel(blocks_bad_user), config, tmp_path / "out", tmp_path / "c.sqlite"
    )
    assert [i.id for i in result.items] == ["user-good"]
    [failure] = result.failures
    assert failure.user_id == "user-bad" and failure.step.startswith("answers_q")
    assert "reflection check failed" in failure.reason and "refine_budget is 2" in failure.reason
    assert failure.failed_attempts == 3
    assert not (tmp_path / "out" / "data.json").exists()  # not presented as complete
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "incomplete"
    assert [f["user_id"] for f in report["failed"]] == ["user-bad"] and report["failed"][0][
        "step"
    ] == failure.step
    assert len(report["succeeded"]) + len(report["failed"]) == config.users


def test_junk_output_fails_the_step_with_the_json_problem(tmp_path: Path, persona_file: Path):
    def junk(name, schema, prompt):
        return "Sure! Here are some questions: 1. ..." if name == "questions" else None

    model = ScriptedModel(junk)
    result, _ = run_with(
        model, make_config(persona_file, users=1), tmp_path / "o", tmp_path / "c.sqlite"
    )
    [failure] = result.failures
    assert failure.step == "questions" and "not the requested JSON" in failure.reason
    assert model.calls.count("questions") == 3  # first try + refine_budget re-asks
    assert result.items == []


def test_cli_exit_codes_without_and_with_allow_partial(tmp_path: Path, persona_file: Path, capsys):
    config_file = tmp_path / "gen.yaml"
    with FakeOpenAIServer(reply=ScriptedModel(blocks_bad_user)) as fake:
        (tmp_path / "ep.yaml").write_text(f"model: m\nbase_url: {fake.base_url}\nmax_retries: 0\n")
        config_file.write_text(
            "users: 2\nquestions: 2\nperiods: 1\nchanges_per_period: 2\nrefine_budget: 1\nseed: 7\n"
            f"personas: {persona_file.name}\nendpoint: ep.yaml\n"
        )
        args = [
            "env",
            "generate",
            str(config_file),
            "--out",
            str(tmp_path / "out"),
            "--no-progress",
            "--cache",
            str(tmp_path / "c.sqlite"),
        ]
        assert main(args) == 2
        captured = capsys.readouterr()
        assert "FAILED user" in captured.out and "Badea Blocked" in captured.out
        assert "1 of 2 users failed" in captured.err and "--allow-partial" in captured.err
        assert not (tmp_path / "out" / "data.json").exists()

        assert main(args + ["--allow-partial"]) == 0
        captured = capsys.readouterr()
        assert "1 of 2 users generated" in captured.out and "FAILED user" in captured.out
    items = load_items(tmp_path / "out" / "data.json")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [i.id for i in items] == ["user-good"] and report["status"] == "partial"
    assert len(items) + len(report["failed"]) == 2


def test_resume_skips_finished_steps(tmp_path: Path, persona_file: Path):
    config = make_config(persona_file)
    out = tmp_path / "out"
    first, fake = run_with(ScriptedModel(), config, out, tmp_path / "1.sqlite")
    full = len(fake.requests)
    assert first.complete and full > 20 and first.steps_skipped == 0

    # A fresh response cache, so only the step files can avoid requests.
    second, fake = run_with(ScriptedModel(), config, out, tmp_path / "2.sqlite")
    assert len(fake.requests) == 0 and second.steps_run == 0 and second.complete

    user_dir = next((out / "raw").iterdir())
    for step in ("answers_q01.json", "item.json"):
        (user_dir / step).unlink()
    third, fake = run_with(ScriptedModel(), config, out, tmp_path / "3.sqlite")
    names = [_schema(body)[0] for body in fake.requests]
    assert set(names) <= {"answers", "reflection_check"} and names.count("answers") == 1
    assert third.steps_run == 2
    assert (out / "data.json").read_text() == json.dumps(
        [i.to_json() for i in first.items], ensure_ascii=False, indent=2
    ) + "\n"


def test_killed_run_resumes_where_it_stopped(tmp_path: Path, persona_file: Path):
    config = make_config(persona_file, users=1)
    calls = {"n": 0}

    def dies_midway(name, schema, prompt):
        calls["n"] += 1
        if calls["n"] > 8:
            raise RuntimeError("model server crashed")  # the fake answers HTTP 500... via exception
        return None

    with pytest.raises(UserError):
        run_with(ScriptedModel(dies_midway), config, tmp_path / "out", tmp_path / "1.sqlite")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["status"] == "interrupted" and report["not_finished"]
    finished = sorted(p.name for p in next((tmp_path / "out" / "raw").iterdir()).iterdir())
    assert "questions.json" in finished and "item.json" not in finished

    result, fake = run_with(ScriptedModel(), config, tmp_path / "out", tmp_path / "2.sqlite")
    assert result.complete and result.steps_skipped == len(finished)
    names = [_schema(body)[0] for body in fake.requests]
    assert "questions" not in names and "schema_merge" not in names


def test_output_folder_of_another_config_is_refused(tmp_path: Path, persona_file: Path):
    run_with(
        ScriptedModel(), make_config(persona_file, users=1), tmp_path / "out", tmp_path / "c.sqlite"
    )
    with pytest.raises(UserError, match="periods=2.*periods=3"):
        run_with(
            ScriptedModel(),
            make_config(persona_file, users=1, periods=3),
            tmp_path / "out",
            tmp_path / "c.sqlite",
        )
    # more users extends the run: the first user is resumed, not regenerated
    result, fake = run_with(
        ScriptedModel(), make_config(persona_file, users=2), tmp_path / "out", tmp_path / "d.sqlite"
    )
    assert result.complete and len(result.items) == 2 and result.steps_skipped > 0


def test_merge_the_model_cannot_do_falls_back_to_own_names_and_is_noted(
    tmp_path: Path, persona_file: Path
):
    def bad_names(name, schema, prompt):
        if name == "schema_merge":
            return json.dumps(
                {
                    "variables": {
                        n: "same_thing" for n in schema["properties"]["variables"]["properties"]
                    }
                }
            )
        return None

    result, _ = run_with(
        ScriptedModel(bad_names),
        make_config(persona_file, users=1),
        tmp_path / "o",
        tmp_path / "c.sqlite",
    )
    assert result.complete
    [item] = result.items
    assert sorted(item.state_schema) == sorted(f"fact_{q}_{j}" for q in range(2) for j in range(2))
    [notes] = result.notes.values()
    assert "merge skipped" in notes[0] and "same_thing" in notes[0]
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert (
        report["notes"] == result.notes
        and report["failed_attempts_by_step"][item.id]["schema"] == 3
    )


def test_all_failed_parallel_steps_are_listed(tmp_path: Path, persona_file: Path):
    def no_messages(name, schema, prompt):
        return '{"message": "too short"}' if name == "opening_message" else None

    result, _ = run_with(
        ScriptedModel(no_messages),
        make_config(persona_file, users=1, refine_budget=0),
        tmp_path / "o",
        tmp_path / "c.sqlite",
    )
    [failure] = result.failures
    assert failure.step == "sessions_00" and "too short" in failure.reason
    assert [f["step"] for f in failure.also_failed] == ["sessions_01", "sessions_02"]
    finished = {p.stem for p in (tmp_path / "o" / "raw").glob("*/*.json")}
    assert {"answers_q00", "answers_q01"} <= finished  # the parallel stage's good steps are kept


def test_inline_endpoint_mapping_is_validated():
    config = PipelineConfig(endpoint={"model": "m", "base_url": "http://127.0.0.1:9/v1"})
    endpoint = config.endpoint_config()
    assert (endpoint.model, endpoint.base_url) == ("m", "http://127.0.0.1:9/v1")
    with pytest.raises(UserError, match="unknown key 'colour'"):
        PipelineConfig(endpoint={"model": "m", "colour": "red"}).endpoint_config()
