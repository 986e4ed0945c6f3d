"""One optimizer contract and one registry: every shipped evolver and search passes its suite,
broken ones are caught, every name form resolves, and settings are validated and recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memloop.core.errors import UserError
from memloop.feedback.summary import FeedbackSummary
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.optimize import registry
from memloop.optimize.contract import EvolveInput, EvolveStep, NoSettings, propose
from memloop.optimize.evolver_check import check_evolver
from memloop.optimize.search_check import SearchCheckError, check_search
from memloop.optimize.searches.gepa import GepaReflection
from memloop.runs.cycles import CycleRecord
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.evolvers import EMPTY_SEARCH_MODULE

SEARCH_SETTINGS = {"gepa": {"minibatch_size": 1, "max_metric_calls": 4}}


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        yield server


def check(factory, fake, tmp_path, **kw):
    return check_search(
        factory,
        clients=fake_roles(fake.base_url, tmp_path / "cache.sqlite"),
        workdir=tmp_path,
        builder=scripted_builder(garble_every=3),
        **kw,
    )


# ---------------------------------------------------------------- every shipped optimizer


@pytest.mark.parametrize("name", registry.names("search"))
def test_every_shipped_search_passes_check_search(name, fake, tmp_path):
    report = check(lambda: registry.build_search(name, SEARCH_SETTINGS.get(name)), fake, tmp_path)
    assert report.ok, report.problems
    assert len(report.checks) == 9
    assert name in {"episode", "period", "gepa"}


@pytest.mark.parametrize("name", registry.names("evolver"))
def test_every_shipped_evolver_passes_check_evolver(name, fake, tmp_path):
    client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "c.sqlite")
    report = check_evolver(lambda: registry.build_evolver(name, client))
    assert report.ok, report.problems
    assert name in {"none", "reflective", "playbook", "edits"}


def test_gepas_own_proposer_passes_check_evolver_and_sends_gepas_prompt(fake, tmp_path):
    client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=tmp_path / "c.sqlite")
    before = len(fake.requests)
    report = check_evolver(lambda: GepaReflection(client))
    assert report.ok, report.problems
    sent = [r["messages"][-1]["content"] for r in fake.requests[before:]]
    # one request per prompt (the second evolver is answered from the shared cache)
    assert len(sent) == 2 and all("``` blocks" in text for text in sent)
    assert all("## Feedback" in text and "gym schedule" in text for text in sent)


def test_the_search_names_are_the_registry_names():
    assert registry.names("search")[:3] == ["episode", "period", "gepa"]
    assert registry.names("evolver")[:3] == ["none", "reflective", "playbook"]
    for name, target in registry.BUILTIN.items():
        kind = "search" if name in ("episode", "period", "gepa") else "evolver"
        cls = registry.optimizer_class(name, kind, "test")
        assert f"{cls.__module__}:{cls.__name__}" == target and cls.name == name


# ---------------------------------------------------------------- broken searches are caught


class Counting:
    """A search that evaluates nothing: each cycle one record, numbered by `order`."""

    name = "counting"
    Settings = NoSettings
    needs_val = False
    evolves_itself = False
    order = (0, 1)
    runs = 0

    def __init__(self, settings=None):
        self.settings = settings or NoSettings()

    def record(self, k, ctx):
        from memloop.runs.cycles import SplitResult

        zero = SplitResult(
            users=1,
            memory_score=0.0,
            overall=0.0,
            factual_recall=None,
            write=0,
            read=0,
            utilization=0,
        )
        return CycleRecord(cycle=k, splits={"val": zero, "test": zero})

    def cycles(self, ctx):
        type(self).runs += 1
        for k in self.order:
            record = ctx.store.record(k) or self.record(k, ctx)
            ctx.store.save(record)
            yield record


class OutOfOrder(Counting):
    order = (1, 0)


class Unsaved(Counting):
    def cycles(self, ctx):
        for k in self.order:
            yield self.record(k, ctx)


class RedoesOnResume(Counting):
    def cycles(self, ctx):  # ignores the store: a resumed run gets other numbers
        type(self).runs += 1
        for k in self.order:
            record = self.record(k, ctx)
            record.extra = {"run": float(type(self).runs)}
            ctx.store.save(record)
            yield record


class NoSettingsModel:
    name = "bare"
    needs_val = False
    evolves_itself = False

    def cycles(self, ctx):
        yield from ()


@pytest.mark.parametrize(
    ("cls", "problem"),
    [
        (OutOfOrder, "cycles yielded in the order [1, 0]"),
        (Unsaved, "cycles not saved (or saved otherwise) when yielded: 0, 1"),
        (
            RedoesOnResume,
            "resuming in the same folder gave 2 cycles that differ from the 2 of the first run",
        ),
        (NoSettingsModel, "missing: Settings, settings"),
    ],
)
def test_broken_searches_are_caught(cls, problem, fake, tmp_path):
    report = check(cls, fake, tmp_path, raise_on_problem=False)
    assert report.problems == [problem]
    with pytest.raises(SearchCheckError, match="breaks the Search contract"):
        check(cls, fake, tmp_path / "again")


def test_a_working_user_search_passes(fake, tmp_path):
    assert check(Counting, fake, tmp_path).ok


# ---------------------------------------------------------------- the proposal's one door


def test_propose_keeps_a_predictor_an_evolver_drops_or_empties():
    class Sloppy:
        name = "sloppy"
        Settings = NoSettings
        settings = NoSettings()

        def propose(self, inputs):
            return EvolveStep(prompts={"writer": " ", "extra": "Hello there."}, tokens=3)

    inputs = EvolveInput(
        prompts={"writer": "Keep facts.", "update": "Replace old facts."},
        summary=FeedbackSummary(mode="complete"),
    )
    step = propose(Sloppy(), inputs)
    assert step.prompts == {"writer": "Keep facts.", "update": "Replace old facts."}
    assert step.errors == {
        "writer": "empty proposal; kept the old one",
        "extra": "not a predictor of this policy; dropped",
    }
    assert step.tokens == 3

    class NotAStep(Sloppy):
        def propose(self, inputs):
            return {"writer": "x"}

    with pytest.raises(TypeError, match="evolver sloppy: propose returned dict, not an EvolveStep"):
        propose(NotAStep(), inputs)


# ---------------------------------------------------------------- names and settings


SEARCH_FILE = EMPTY_SEARCH_MODULE


def test_every_name_form_resolves(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(SEARCH_FILE)
    # a file next to the YAML
    assert registry.build_search("mine.py:Mine", base_dir=tmp_path).name == "mine"
    # a module on the path, and an installed package's entry point
    site = tmp_path / "site"
    (site / "mysearch").mkdir(parents=True)
    (site / "mysearch" / "__init__.py").write_text(SEARCH_FILE)
    dist = site / "mysearch-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mysearch\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[memloop.optimizers]\nmine = mysearch:Mine\n")
    monkeypatch.syspath_prepend(str(site))
    assert registry.build_search("mysearch:Mine").name == "mine"
    assert registry.build_search("mine").name == "mine" and "mine" in registry.names("search")
    with pytest.raises(UserError, match=r"no such file .*other\.py"):
        registry.build_search("other.py:Mine", base_dir=tmp_path)
    with pytest.raises(UserError, match="cannot load 'mysearch:Nope'"):
        registry.build_search("mysearch:Nope")
    with pytest.raises(UserError, match="'mysearch:Mine' is not an evolver class"):
        registry.build_evolver("mysearch:Mine", client=None)
    with pytest.raises(TypeError, match="give the class"):
        registry.register("x", Counting())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="neither an evolver"):
        registry.register("x", dict)


def write_experiment(root: Path, **over) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "awi.yaml").write_text("type: awi\n")
    data = {
        "experiment": "contract",
        "environment": {
            "procedural": {"users": 3, "periods": 1, "questions": 1},
            "train_users": 1,
            "val_users": 1,
            "test_users": 1,
        },
        "policy": "awi.yaml",
        "feedback_modes": ["complete"],
        "evolvers": ["playbook"],
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
    }
    data.update(over)
    data = {k: v for k, v in data.items() if v is not None}
    (root / "exp.yaml").write_text(yaml.safe_dump(data))
    return root / "exp.yaml"


def specs(path: Path, fake) -> list[dict]:
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.context import RunContext
    from memloop.optimize.evolve import conditions

    config = load_config(path, EvolveConfig)
    clients = fake_roles(fake.base_url)
    return [
        RunContext(
            config, mode, evolver, search, clients=clients, builder=scripted_builder()
        ).spec.document()["spec"]
        for mode, evolver, search in conditions(config)
    ]


def test_settings_are_recorded_in_the_run_spec_and_change_the_run(tmp_path, fake):
    (default,) = specs(write_experiment(tmp_path / "a"), fake)
    assert default["optimizer"] == {
        "evolver": {
            "name": "playbook",
            "candidates": 3,
            "sample_temperature": 0.8,
            "max_rules": 8,
            "max_words": 30,
            "max_tokens": 160,
            "feedback_chars": 6000,
            "screen_takes": "explore",
        },
        "search": {"name": "episode"},
    }
    (two,) = specs(write_experiment(tmp_path / "b", settings={"playbook": {"candidates": 2}}), fake)
    assert two["optimizer"]["evolver"]["candidates"] == 2
    # GEPA's settings, under settings.gepa or the older top-level gepa key, are its search's
    gepa = {"minibatch_size": 1, "max_metric_calls": 5}
    for over in ({"settings": {"gepa": gepa}}, {"gepa": gepa}):
        found = specs(write_experiment(tmp_path / "g", search="gepa", evolvers=None, **over), fake)
        assert [s["optimizer"]["search"] for s in found] == [
            {"name": "gepa", **gepa, "reflection_max_tokens": 1024, "screen": "replay"}
        ]
        assert found[0]["optimizer"]["evolver"] == found[0]["optimizer"]["search"]


COUNTING_FILE = SEARCH_FILE.replace(
    "        yield from ()",
    """        from memloop.runs.cycles import CycleRecord, SplitResult

        zero = SplitResult(users=1, memory_score=0.0, overall=0.0, factual_recall=None,
                           write=0, read=0, utilization=0)
        for k in range(2):
            record = ctx.store.record(k) or CycleRecord(cycle=k, splits={"val": zero})
            ctx.store.save(record)
            yield record""",
)


def test_a_search_in_a_file_named_by_the_yaml_runs(tmp_path, fake):
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve

    (tmp_path / "counting.py").write_text(COUNTING_FILE)
    path = write_experiment(tmp_path, search="counting.py:Mine", evolvers=["none"])
    config = load_config(path, EvolveConfig)
    (outcome,) = run_evolve(
        config, progress=False, clients=fake_roles(fake.base_url), builder=scripted_builder()
    )
    assert [c.cycle for c in outcome.cycles] == [0, 1] and outcome.search == "mine"
    spec = json.loads((outcome.run_dir / "spec.json").read_text())["spec"]
    assert spec["optimizer"] == {"evolver": {"name": "none"}, "search": {"name": "mine"}}
