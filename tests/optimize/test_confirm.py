"""Fresh confirmation users (optimize/confirm.py) against a loopback fake model.

The loop never reads a confirmation user before the confirmation: every policy built for one is
built after the last cycle's record exists, in the run folder's confirm/, and no cycle folder,
feedback summary, evolver step or optimizer request names one. The confirmation's decision is
the run's verdict, its `best`, compare's selection and export's cycle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.core.stats import gate
from memloop.optimize import confirm as confirm_module
from memloop.optimize.config import EvolveConfig, load_config
from memloop.runs.cycles import Confirmation, load_confirmation
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
from memloop.testing.commands import write_small_evolve


def run(root: Path, fake: FakeOpenAIServer, builder=None, confirm: int = 4, **over):
    from memloop.optimize.evolve import run_evolve

    path = write_small_evolve(root, "confirm", (2, 1, 1), confirm=confirm, **{"cycles": 2, **over})
    config = load_config(path, EvolveConfig)
    roles = fake_roles(fake.base_url, root / "c.sqlite")
    builder = builder or scripted_builder(garble_every=3)
    return config, run_evolve(config, progress=False, clients=roles, builder=builder)


def _prompts(outcome, k: int) -> dict[str, str]:
    return json.loads((outcome.run_dir / f"cycle_{k:02d}" / "prompts.json").read_text())


def confirmation_ids(config: EvolveConfig) -> list[str]:
    from memloop.optimize.context import load_environment, split_users

    items, _ = load_environment(config.environment)
    return [i.id for i in split_users(items, config.environment)["confirm"]]


def test_confirmation_users_are_read_only_by_the_confirmation(tmp_path, monkeypatch):
    """Every policy made for a user (RunContext.factory, the one way episodes get a policy) is
    noted with its folder and whether the last cycle was finished by then."""
    from memloop.optimize.context import RunContext

    built: list[tuple[str, Path, bool]] = []
    real = RunContext.factory

    def factory(self, prompts):
        make = real(self, prompts)

        def noted(user_id, workdir, client):
            done = self.store.record_file(self.config.cycles - 1).is_file()
            built.append((user_id, Path(workdir), done))
            return make(user_id, workdir, client)

        return noted

    monkeypatch.setattr(RunContext, "factory", factory)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, (outcome,) = run(tmp_path, fake, evolvers=["reflective"])
        requests = [json.dumps(r) for r in fake.requests]
    fresh = confirmation_ids(config)
    assert len(fresh) == 4
    confirmation = outcome.confirmation
    assert confirmation is not None and confirmation.users == fresh
    assert confirmation.verdict != Confirmation.IDENTICAL  # the fake evolver changes the prompt
    mine = [(w, done) for user, w, done in built if user in fresh]
    others = [w for user, w, _ in built if user not in fresh]
    assert len(mine) == 2 * 4  # the seed and the candidate, each user once (one look: 2 users)
    for workdir, done in mine:
        assert done, workdir
        assert workdir.relative_to(outcome.run_dir).parts[0] == "confirm", workdir
    assert others and all("confirm" not in w.relative_to(outcome.run_dir).parts for w in others)
    # nothing of the loop names them: cycle folders, summaries, steps, and no request made
    # before the confirmation (the optimizer's among them)
    for path in outcome.run_dir.glob("cycle_*/**/*"):
        assert not any(u in str(path) for u in fresh)
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not any(u in text for u in fresh), path
    naming = [i for i, r in enumerate(requests) if any(u in r for u in fresh)]
    first = naming[0] if naming else len(requests)
    evolver_requests = [r for r in requests[:first] if "instruction" in r.lower()]
    assert evolver_requests  # the optimizer was asked before the confirmation
    for r in requests[:first]:
        assert not any(u in r for u in fresh)


@pytest.fixture
def fake():
    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        yield server


def test_the_confirmation_decides_the_verdict_best_compare_and_export(tmp_path, monkeypatch, fake):
    """Confirmation scores made large (+0.2 for every user): the decision is `improved`, the run's
    selection is the declared cycle, `best` names its version, compare and export agree."""
    calls: list[list[str]] = []

    def scores(ctx, users, seed, candidate, out, objective, *rest):
        calls.append([u.id for u in users])
        base = {u.id: 0.3 + 0.01 * i for i, u in enumerate(users)}
        return base, {u: v + 0.2 for u, v in base.items()}

    monkeypatch.setattr(confirm_module, "_scores", scores)
    config, (outcome,) = run(tmp_path, fake, confirm=6, evolvers=["reflective"])
    confirmation = outcome.confirmation
    assert confirmation is not None
    declared = json.loads((outcome.run_dir / "confirm" / "declared.json").read_text())
    assert declared["candidate"] == 1 and declared["rule"] == "the last cycle"
    assert confirmation.verdict != Confirmation.IDENTICAL  # the fake evolver changes it
    # 6 users: look 1 (3 users) cannot reach its level, so one decision on all 6
    assert calls == [confirmation.users]
    diffs = [confirmation.scores[u] - confirmation.seed[u] for u in confirmation.users]
    expected = gate(diffs)
    assert confirmation.verdict == expected.verdict.value == "improved"
    assert confirmation.gate == expected.to_dict()
    assert outcome.selection.cycle == 1 and outcome.selection.verdict == "improved"
    assert outcome.selection.gate["split"] == "confirm"
    assert load_confirmation(outcome.run_dir) == confirmation

    from memloop.results.export import from_folder, from_mlflow
    from memloop.results.rows import experiment_rows
    from memloop.runs import tracker

    mlc = tracker.client(config.tracking_uri)
    run_ = mlc.get_run(outcome.run_id)
    assert "on 6 confirmation users: improved" in run_.data.tags["memloop.gate"]
    assert run_.data.params["confirmation.candidate"] == "1"
    best = mlc.get_prompt_version_by_alias(run_.data.tags["memloop.prompt_name"], "best")
    assert best.template == tracker.render_prompts(_prompts(outcome, 1))
    assert best.template != tracker.render_prompts(_prompts(outcome, 0))
    (row,) = experiment_rows(config.tracking_uri, config.experiment_name)
    assert row.selection == outcome.selection
    assert from_folder(outcome.run_dir, None).cycle == 1
    assert from_mlflow(outcome.run_id, config.tracking_uri, None).cycle == 1
    # a rerun reads the decision back: nothing is evaluated again
    calls.clear()
    _, (again,) = run(tmp_path, fake, confirm=6, evolvers=["reflective"])  # same server
    assert again.run_dir == outcome.run_dir
    assert calls == [] and again.confirmation == confirmation
    assert again.selection == outcome.selection
    log = [json.loads(line) for line in (outcome.run_dir / "gate_log.jsonl").open()]
    assert [e["stage"] for e in log if e["stage"] == "confirmation"] == ["confirmation"]


def test_two_looks_stop_at_half_the_users_on_a_large_effect_and_go_on_on_a_small_one(
    tmp_path, monkeypatch
):
    """18 confirmation users: look 1 on 9 (its level 0.0056 needs 9 users all one way)."""
    calls: list[int] = []
    effect = {"size": 0.2}

    def scores(ctx, users, seed, candidate, out, objective, *rest):
        calls.append(len(users))
        base = {u.id: 0.3 + 0.01 * (i % 5) for i, u in enumerate(users)}
        up, step = effect["size"], 0.01
        # large: every user up by 0.2; small: alternately +0.01 and -0.01 around a tiny mean
        moved = {
            u: v + (up if up > step else (step if i % 2 else -step + 0.001))
            for i, (u, v) in enumerate(base.items())
        }
        return base, moved

    monkeypatch.setattr(confirm_module, "_scores", scores)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        _, (large,) = run(tmp_path / "large", fake, confirm=18, evolvers=["reflective"])
        calls_large = list(calls)
        calls.clear()
        effect["size"] = 0.0
        _, (small,) = run(tmp_path / "small", fake, confirm=18, evolvers=["reflective"])
    assert large.confirmation is not None and small.confirmation is not None
    assert calls_large == [9]  # look 1 decided: the other 9 users were never evaluated
    assert large.confirmation.verdict == "improved" and large.confirmation.gate["look"] == 1
    assert len(large.confirmation.scores) == 9
    assert large.selection.cycle == 1
    assert calls == [9, 9]
    assert small.confirmation.gate["look"] == 2 and len(small.confirmation.scores) == 18
    assert small.confirmation.verdict == "inconclusive" and small.selection.cycle == 0


def test_a_candidate_identical_to_the_seed_is_reported_so_and_nothing_is_evaluated(tmp_path):
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        _, (outcome,) = run(tmp_path, fake, evolvers=["none"])
    confirmation = outcome.confirmation
    assert confirmation is not None
    assert confirmation.verdict == "identical to the seed" and confirmation.gate is None
    assert not (outcome.run_dir / "confirm" / "look_1").exists()
    assert outcome.selection.cycle == 0
    assert "is the seed" in outcome.selection.rule


def test_the_null_control_scores_the_reworded_seed_by_the_same_rule(tmp_path, monkeypatch, fake):
    """Deterministic endpoints (temperature 0): the null control is the seed reworded, evaluated
    on the confirmation users like a candidate; its decision is stored and printed."""
    from memloop.optimize.report import selection_line

    made: list[dict[str, str]] = []
    from memloop.optimize.context import RunContext

    real = RunContext.factory

    def factory(self, prompts):
        made.append(dict(prompts))
        return real(self, prompts)

    monkeypatch.setattr(RunContext, "factory", factory)
    from memloop.feedback import evaluate

    calibrated: list[list[str]] = []
    real_calibrate = evaluate.calibrate

    def calibrate(items, checker):
        calibrated.append(sorted(item.id for item in items))
        return real_calibrate(items, checker)

    monkeypatch.setattr(evaluate, "calibrate", calibrate)
    config, (outcome,) = run(tmp_path, fake, evolvers=["reflective"], null_control=True)
    from memloop.optimize.context import load_environment, split_users

    items, _ = load_environment(config.environment)
    outcome_users = {
        s: [i.id for i in split]
        for s, split in split_users(items, config.environment, config.source).items()
    }
    null = outcome.confirmation.null
    seed = _prompts(outcome, 0)
    assert null["what"] == "the seed reworded ('Task:' before each text)"
    assert {k: "Task: " + v for k, v in seed.items()} in made
    assert (outcome.run_dir / "confirm" / "look_1" / "null" / "metrics.json").is_file()
    assert set(null["scores"]) == set(outcome.confirmation.users)
    users = outcome.confirmation.users
    expected = gate([null["scores"][u] - null["seed"][u] for u in users])
    assert null["gate"] == expected.to_dict() and null["verdict"] == expected.verdict.value
    assert null["seed"] == outcome.confirmation.seed  # the seed's one evaluation, shared
    assert "; null control (the seed reworded" in selection_line(outcome)
    # one checker calibration, on all the run's users, in every evaluation of it: the cycles'
    # splits, the confirmation's candidate, seed and null control
    everyone = sorted(u for split in outcome_users.values() for u in split)
    assert len(calibrated) >= 3 and all(ids == everyone for ids in calibrated)


def test_the_null_control_runs_and_prints_when_the_candidate_is_the_seed(tmp_path, fake):
    from memloop.optimize.report import selection_line

    _, (outcome,) = run(tmp_path, fake, evolvers=["none"], null_control=True)
    assert outcome.confirmation.verdict == "identical to the seed"
    assert outcome.confirmation.null["gate"]["n"] == 4
    line = selection_line(outcome)
    assert "is the seed" in line and "; null control (the seed reworded" in line


def test_a_null_control_needs_confirmation_users(tmp_path):
    from memloop.core.errors import UserError

    path = write_small_evolve(tmp_path, "confirm", (2, 1, 1), null_control=True)
    with pytest.raises((UserError, ValueError), match="set environment.confirm_users"):
        load_config(path, EvolveConfig)


def test_an_experiment_says_when_no_outcome_can_pass_the_gate(tmp_path):
    from memloop.optimize.evolve import cannot_decide
    from memloop.testing.paths import REPO

    def reason(users, confirm=0, **over):
        path = write_small_evolve(tmp_path, "c", users, confirm=confirm, **over)
        return cannot_decide(load_config(path, EvolveConfig))

    assert reason((2, 1, 1), cycles=2) == (
        "1 validation user(s) and no confirmation users, and the gate needs 6 for a choice "
        "among 1 cycle(s)"
    )
    assert reason((2, 1, 1), confirm=5) == "5 confirmation user(s), and the gate needs 6"
    assert reason((2, 1, 1), confirm=6) is None
    assert reason((2, 6, 1), cycles=3) == (  # 0.05 / 2 candidates needs 7 users
        "6 validation user(s) and no confirmation users, and the gate needs 7 for a choice "
        "among 2 cycle(s)"
    )
    assert reason((2, 7, 1), cycles=3) is None
    shipped = REPO / "memloop" / "experiments"
    for name in ("complete", "diagnostic", "question-only", "no-evolution"):
        config = load_config(shipped / "evolve" / f"{name}.yaml", EvolveConfig)
        assert cannot_decide(config) is None, name
        assert "# Can it decide? Yes" in (shipped / "evolve" / f"{name}.yaml").read_text()
        small = shipped / "evolve" / f"{name}-small.yaml"
        assert cannot_decide(load_config(small, EvolveConfig)) is not None, name
        assert "# Can it decide? No" in small.read_text()
    quick = shipped / "quickstart.yaml"
    assert cannot_decide(load_config(quick, EvolveConfig)) is not None
    assert "# Can it decide? No" in quick.read_text()


def test_an_experiment_says_when_the_edits_screen_cannot_decide(tmp_path):
    from memloop.optimize.evolve import screen_cannot_decide

    def reason(train, **edits):
        path = write_small_evolve(
            tmp_path, "s", (train, 1, 1), evolvers=["edits"], settings={"edits": edits}
        )
        return screen_cannot_decide(load_config(path, EvolveConfig))

    # 5 candidates: 0.05 / 5 = 0.01 needs 2^(1-n) <= 0.01, n = 8
    assert reason(7) == (
        "7 training user(s), and the gate needs 8 to choose among 5 candidate edits"
    )
    assert reason(8) is None
    # 2 candidates: 0.025; 6 users reach 2^(1-6) = 0.031 only, 7 reach 0.016
    assert reason(6, candidates=2) == (
        "6 training user(s), and the gate needs 7 to choose among 2 candidate edits"
    )
    assert reason(7, candidates=2) is None
