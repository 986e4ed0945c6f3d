"""Train / validation / test users, the search registry, the period cadence's diagnosis and the
feedback budget, against a loopback fake model and a scripted policy.

The central property: no selection reads a test user. Every search runs twice, once with the test
users' results replaced by poison; the selected cycle, every prompt, every feedback summary and
every evolver step are identical, while the logged test numbers do differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.environment.episode import PeriodRecord
from memloop.feedback.records import QuestionRecord
from memloop.feedback.report import build_metrics, period_metrics
from memloop.feedback.summary import FeedbackSummary, budgeted_summary
from memloop.optimize.config import EvolveConfig, load_config
from memloop.optimize.contract import NoSettings
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.commands import write_small_evolve

builder = scripted_builder(garble_every=3)


def write_config(root: Path, **over) -> Path:
    """5 users (2 train, 1 val, 2 test), 3 cycles; GEPA's settings only for the gepa search (the
    settings of an optimizer the experiment does not use are refused)."""
    if over.get("search") == "gepa":
        over = {"evolvers": None, "gepa": {"minibatch_size": 1, "max_metric_calls": 6}, **over}
    return write_small_evolve(root, "splits", (2, 1, 2), **{"cycles": 3, **over})


def run(root: Path, fake: FakeOpenAIServer, cache: Path | None = None, **over):
    from memloop.optimize.evolve import run_evolve

    config = load_config(write_config(root, **over), EvolveConfig)
    roles = fake_roles(fake.base_url, cache or root / "c.sqlite")
    return config, run_evolve(config, progress=False, clients=roles, builder=builder)


def poison_test_users(monkeypatch) -> None:
    """Every evaluation of a test user reports a memory score that grows with the cycle folder
    (1.0 at the last cycle), so a selection reading test users would pick the last cycle."""
    import memloop.optimize.context as context

    real = context.run_evaluation_groups

    def poisoned(groups, factory, out, **kw):
        results = real(groups, factory, out, **kw)
        if "test" in results:
            digits = "".join(ch for ch in Path(out).name if ch.isdigit()) or "0"
            fake = min(1.0, 0.1 + 0.45 * int(digits[-2:]))
            metrics = results["test"].metrics
            metrics["memory_score"] = fake
            for row in metrics["per_user"].values():
                row["memory_score"] = fake
        return results

    monkeypatch.setattr(context, "run_evaluation_groups", poisoned)


def choices(outcome) -> dict:
    """Everything a run chose: the selection, each cycle's prompts, summaries and steps."""
    files = {}
    for path in sorted(outcome.run_dir.glob("cycle_*/*.json")):
        if path.name in ("prompts.json", "summary.json", "evolve.json"):
            files[f"{path.parent.name}/{path.name}"] = json.loads(path.read_text())
    gepa = outcome.run_dir / "gepa_cycles.json"
    if gepa.is_file():
        files["gepa_cycles"] = [
            {k: v for k, v in h.items() if k != "feedback_omitted_questions"}
            for h in json.loads(gepa.read_text())
        ]
    return {"selection": outcome.selection.model_dump(), "files": files}


@pytest.mark.parametrize("search", ["episode", "period", "gepa"])
def test_poisoned_test_users_change_no_selection(tmp_path, monkeypatch, search):
    # one response cache for both runs: the poison changes reported test numbers, not requests,
    # so the poisoned run is answered from the cache unless a test number steers a choice (a
    # different request then goes to the server, and the choices below differ)
    over = {"search": search, "cycles": 2, "cache": tmp_path / "c.sqlite"}
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        _, (clean,) = run(tmp_path / "clean", fake, **over)
        with monkeypatch.context() as m:
            poison_test_users(m)
            _, (dirty,) = run(tmp_path / "dirty", fake, **over)
    clean_test = [c.score("test") for c in clean.cycles]
    dirty_test = [c.score("test") for c in dirty.cycles]
    assert dirty_test != clean_test  # the poison reached the logged test numbers
    assert len(clean.cycles) >= 2
    assert choices(dirty) == choices(clean)
    for a, b in zip(clean.cycles, dirty.cycles, strict=True):
        assert a.splits["val"] == b.splits["val"] and a.splits["train"] == b.splits["train"]


# ---------------------------------------------------------------- registry and bad input


class ReplayFirstPrompt:
    """A user search: evaluates the initial prompts once per cycle, on every split."""

    name = "constant"
    Settings = NoSettings
    needs_val = False
    evolves_itself = False

    def __init__(self, settings=None):
        self.settings = settings or NoSettings()

    def cycles(self, ctx):
        from memloop.runs.cycles import CycleRecord, split_results

        for k in range(ctx.config.cycles):
            prompts = ctx.store.prompts(k, ctx.initial_prompts)
            record = ctx.store.record(k)
            if record is None:
                results = ctx.evaluate_splits(prompts, ctx.store.cycle_dir(k))
                record = CycleRecord(cycle=k, splits=split_results(results))
                ctx.store.save(record)
            yield record


def test_a_registered_search_runs_through_the_same_context(tmp_path):
    from memloop.optimize import registry

    registry.register("constant", ReplayFirstPrompt)
    assert "constant" in registry.names("search") and "constant" not in registry.names("evolver")
    assert registry.build_search("constant").name == "constant"
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, (o,) = run(tmp_path, fake, search="constant", cycles=2)
    assert [c.cycle for c in o.cycles] == [0, 1] and o.search == "constant"
    assert "-complete-reflective-constant-" in o.run_dir.name
    from memloop.runs import tracker

    mlc = tracker.client(config.tracking_uri)
    assert len(mlc.get_metric_history(o.run_id, "test/overall")) == 2
    # a search named by module path works without registering
    with pytest.raises(Exception, match="unknown search"):
        registry.build_search("no-such-search")
    # a target written before issue 43 moved the searches still resolves (memloop.core.moved)
    assert registry.build_search("memloop.optimize.episode_search:EpisodeSearch").name == "episode"


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        (
            {
                "environment": {
                    "procedural": {"users": 3},
                    "train_users": 2,
                    "val_users": 1,
                    "test_users": 1,
                }
            },
            "= 4 users, but the environment has 3",
        ),
        ({"search": "magic"}, "unknown search 'magic'"),
        ({"evolvers": ["magic"]}, "key 'evolvers': unknown evolver 'magic'"),
        ({"search": "reflective"}, "'reflective' is not an search class"),
        (
            {"evolvers": ["playbook"], "settings": {"playbook": {"candidates": 0}}},
            "key 'settings.playbook.candidates': Input should be greater than or equal to 1",
        ),
        (
            {"settings": {"reflective": {"max_word": 9}}},
            "key 'settings.reflective': unknown setting 'max_word' (allowed: max_words, "
            "max_tokens, append_rules)",
        ),
        ({"settings": {"playbook": {}}}, "key 'settings': playbook is not an optimizer of"),
        (
            {"search": "gepa", "settings": {"gepa": {}}},
            "give GEPA's settings once: settings.gepa or gepa, not both",
        ),
        (
            {
                "search": "gepa",
                "environment": {
                    "procedural": {"users": 3},
                    "train_users": 2,
                    "val_users": 0,
                    "test_users": 1,
                },
            },
            "environment.val_users",
        ),
        ({"search": "gepa", "evolvers": ["reflective"]}, "evolves the prompts itself"),
        ({"evolvers": ["gepa"]}, "search: gepa"),
        ({"cadence": "period"}, "cadence was renamed search"),
        ({"environment": {"procedural": {"users": 3}, "heldout_users": 1}}, "val_users"),
        ({"environment": {"procedural": {"users": 3}, "train_users": 0}}, "train_users"),
    ],
)
def test_bad_splits_and_searches_are_one_line_with_nothing_written(tmp_path, capsys, over, needle):
    from memloop.experiments.cli import main

    path = write_config(tmp_path, **over)
    assert main(["evolve", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlruns").exists()


# ---------------------------------------------------------------- period cadence diagnosis


def question(period: int, *, believed: str, chosen: int, write_period: int = 0) -> dict:
    return QuestionRecord(
        user_id="u",
        period=period,
        question_index=0,
        question="Where does the user live?",
        choices=["Lisbon", "Porto", "Faro", "Braga"],
        required_info=["city"],
        gold_index=0,
        true_values={"city": "lisbon"},
        write_periods={"city": write_period},
        chosen_index=chosen,
        state_answers={"city": believed},
        ub_chosen_index=0,
    ).model_dump()


def period_record(period: int, q: dict) -> PeriodRecord:
    return PeriodRecord(
        user_id="u", period=period, mode="on_policy", sessions=[], probes={"questions": [q]}
    )


def test_period_metrics_keep_a_read_failure_a_read_failure():
    # the fact was written in period 0 and queried right then; in period 1 it is misread
    history = [
        period_record(0, question(0, believed="lisbon", chosen=0)),
        period_record(1, question(1, believed="porto", chosen=1)),
    ]
    m = period_metrics(history, 1)
    assert m["diagnosis"] == {"format": 0.0, "write": 0.0, "read": 1.0, "utilization": 0.0}
    assert m["overall"] == 0.0 and m["users"] == 1 and m["questions"] == 1
    # what the period cadence did before: period 1's records alone lose the write-time query
    alone, _ = build_metrics(history[1:])
    assert alone["diagnosis"] == {"format": 0.0, "write": 1.0, "read": 0.0, "utilization": 0.0}
    # and period 0 on its own history is right: no failure at all
    assert period_metrics(history, 0)["diagnosis"] == {
        "format": 0.0,
        "write": 0.0,
        "read": 0.0,
        "utilization": 0.0,
    }


def test_period_search_logs_read_failures_found_only_through_the_history(tmp_path, monkeypatch):
    """Through the loop: the period cadence's train_* diagnosis is period_metrics over the whole
    history (recomputed here from the run's checkpoints)."""
    from memloop.environment.episode import load_record

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        _, (o,) = run(tmp_path, fake, search="period")
    by_user = {}
    for path in sorted(o.run_dir.glob("episodes/*/period_*/record.json")):
        by_user.setdefault(path.parts[-3], []).append(load_record(path))
    history = [r for rs in by_user.values() for r in rs]
    for c in o.cycles:
        expected = period_metrics(history, c.cycle)["diagnosis"]
        got = c.splits["train"]
        assert (got.write, got.read, got.utilization) == (
            expected["write"],
            expected["read"],
            expected["utilization"],
        )


# ---------------------------------------------------------------- feedback budget


def test_summary_budget_drops_whole_questions_and_records_them():
    records = [
        QuestionRecord.model_validate(
            {**question(p, believed="lisbon", chosen=c), "user_id": u, "question_index": q}
        )
        for u in ("ann", "bob")
        for p in (0, 1)
        for q, c in ((0, 1), (1, 0))
    ]
    updates = {"ann": {"city": "lisbon"}, "bob": {"city": "lisbon"}}
    full = budgeted_summary(records, "complete", updates, max_questions=99, max_chars=10**6)
    assert full.report.questions == 8 and not full.report.omitted
    budget = len(full.render()) // 2
    small = budgeted_summary(records, "complete", updates, max_questions=99, max_chars=budget)
    report = small.report
    text = small.render()
    assert len(text) <= budget and report.chars == len(text)
    json.loads(text)  # whole JSON, never cut
    kept = sum(len(u["question_answer_history"]) for u in small.data()["users"])
    assert kept == report.questions == small.questions() and 0 < kept < 8
    assert len(report.omitted) == 8 - kept
    assert all(o.reason == "max_chars" for o in report.omitted)
    # priority: wrong answers (chosen 1) before right ones, then the latest period
    entries = [e for u in small.data()["users"] for e in u["question_answer_history"]]
    assert all(e["assistant_response"] == "B" for e in entries)
    capped = budgeted_summary(records, "complete", updates, max_questions=3, max_chars=10**6)
    assert capped.report.questions == 3
    assert [o.reason for o in capped.report.omitted] == ["max_questions"] * 5

    # fitted later to a smaller budget: the last questions to enter go first, whole
    fitted = full.fit(budget)
    assert len(fitted.render()) <= budget and fitted.report.chars == len(fitted.render())
    json.loads(fitted.render())
    n = fitted.questions()
    assert 0 < n < 8 and fitted.entered == full.entered[:n]
    dropped = [(o.user, o.period, o.question) for o in fitted.report.omitted]
    assert dropped == [(e.user, e.period, e.question) for e in reversed(full.entered[n:])]
    assert all(o.reason == "max_chars" for o in fitted.report.omitted)
    kept_entries = [e for u in fitted.data()["users"] for e in u["question_answer_history"]]
    assert all(e["assistant_response"] == "B" for e in kept_entries)
    assert full.fit(10**6) is full and full.questions() == 8  # fits: unchanged
    assert full.fit(10).users == [] and full.fit(10).render() == '{\n "users": []\n}'
    # the private values: every value the users' records and updates hold
    assert full.private == ["lisbon"] and small.private == ["lisbon"]


def test_the_budget_report_reaches_the_cycle_record_and_mlflow(tmp_path):
    from memloop.runs import tracker

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, (o,) = run(tmp_path, fake, summary_max_chars=900, cycles=2)
    report = o.cycles[0].feedback
    assert report is not None and report.max_chars == 900 and report.omitted
    summary = FeedbackSummary.load((o.run_dir / "cycle_00" / "summary.json").read_text())
    assert len(summary.render()) == report.chars <= 900 and summary.report == report
    mlc = tracker.client(config.tracking_uri)
    logged = mlc.get_metric_history(o.run_id, "optimizer/feedback_omitted_questions")
    assert logged[0].value == len(report.omitted)


@pytest.mark.parametrize("search", ["episode", "period", "gepa"])
def test_every_search_resumes_without_a_request_and_yields_the_same_records(tmp_path, search):
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        _, (first,) = run(tmp_path, fake, search=search, cycles=2)
        sent = len(fake.requests)
        _, (again,) = run(tmp_path, fake, search=search, cycles=2)
        assert len(fake.requests) == sent
    assert again.run_id == first.run_id and again.resumed
    assert [c.model_dump() for c in again.cycles] == [c.model_dump() for c in first.cycles]
    assert [c.cycle for c in first.cycles] == list(range(len(first.cycles)))
    assert all(set(c.splits) == {"train", "val", "test"} for c in first.cycles)


# ---------------------------------------------------------------- GEPA's replay screen


def test_gepa_screens_a_new_candidate_by_replaying_its_parents_conversations(tmp_path, monkeypatch):
    from memloop.feedback.scoring import state_accuracy
    from memloop.optimize.searches.gepa import EpisodeAdapter, candidate_id

    screened = []
    real = EpisodeAdapter.replay

    def spy(self, batch, candidate):
        recordings = {item.id: self.recorded[item.id] for item in batch}
        result = real(self, batch, candidate)
        screened.append((candidate, recordings, dict(zip(recordings, result.scores, strict=True))))
        return result

    monkeypatch.setattr(EpisodeAdapter, "replay", spy)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        # one iteration (1 validation episode, the parent, the new candidate); one cache
        over = {"search": "gepa", "cycles": 2, "cache": tmp_path / "c.sqlite"}
        config, (outcome,) = run(
            tmp_path / "replay", fake, gepa={"minibatch_size": 1, "max_metric_calls": 3}, **over
        )
        _, (on_policy,) = run(
            tmp_path / "none",
            fake,
            gepa={"minibatch_size": 1, "max_metric_calls": 3, "screen": "none"},
            **over,
        )
    assert screened, "GEPA proposed no candidate to screen"
    train_ids = {item.id for item in outcome_train(config)}
    for candidate, recordings, scores in screened:
        assert set(recordings) <= train_ids
        for user, recording in recordings.items():
            # the recording is the parent's on-policy episode, a different candidate's folder
            assert recording.parent.name != candidate_id(candidate)
            assert (recording / user / "period_00" / "record.json").is_file()
            folder = next(
                outcome.run_dir.glob(f"candidates/{candidate_id(candidate)}/screen/*/{user}")
            )
            records = [
                PeriodRecord.model_validate_json(p.read_text())
                for p in sorted(folder.glob("period_*/record.json"))
            ]
            assert records and {r.mode for r in records} == {"off_policy"}
            questions = [
                QuestionRecord.model_validate(q) for r in records for q in r.probes["questions"]
            ]
            assert scores[user] == state_accuracy(questions).accuracy
    assert not list(on_policy.run_dir.glob("candidates/*/screen"))


def outcome_train(config):
    from memloop.optimize.context import load_environment, split_users

    items, _ = load_environment(config.environment)
    return split_users(items, config.environment, config.source)["train"]


def test_search_records_are_what_no_cycle_counts(tmp_path):
    from memloop.feedback.report import usage_by_component
    from memloop.optimize.searches.gepa import search_records

    def search_tokens(root: Path, cycle_candidates: set[str]) -> int:
        return sum(usage_by_component(search_records(root, cycle_candidates)).values())

    def record(path: Path, tokens: int) -> None:
        path.mkdir(parents=True)
        rec = PeriodRecord(
            user_id="u",
            period=0,
            mode="on_policy",
            sessions=[],
            usage={"agent": {"total_tokens": tokens}, "probe": {"total_tokens": 1}},
        )
        (path / "record.json").write_text(rec.model_dump_json())

    record(tmp_path / "a" / "episodes" / "u" / "period_00", 10)  # a cycle's: counted there
    record(tmp_path / "a" / "screen" / "x" / "u" / "period_00", 5)
    record(tmp_path / "b" / "episodes" / "u" / "period_00", 7)  # a candidate no cycle shows
    assert search_tokens(tmp_path, {"a"}) == (5 + 1) + (7 + 1)
    assert search_tokens(tmp_path, set()) == (10 + 1) + (5 + 1) + (7 + 1)
