"""The gate in the loop: the run's selection, the registry's `best` alias, MLflow tags and the gate
log follow the gate's verdict on the validation users (a real sqlite MLflow store)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from memloop.runs.cycles import CycleRecord, SplitResult, best_alias_cycle, select_cycle
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder

VAL = [f"v{i}" for i in range(10)]


def split(by_user: dict[str, float]) -> SplitResult:
    return SplitResult(
        users=len(by_user),
        memory_score=None,
        overall=0.5,
        factual_recall=None,
        write=0.0,
        read=0.0,
        utilization=0.0,
        state_accuracy=sum(by_user.values()) / len(by_user),
        per_user={u: {"state_accuracy": v} for u, v in by_user.items()},
    )


def records(*val: dict[str, float]) -> list[CycleRecord]:
    return [CycleRecord(cycle=k, splits={"val": split(v)}) for k, v in enumerate(val)]


SEED = dict.fromkeys(VAL, 0.5)
ONE_PAIR = {**SEED, "v3": 0.625}  # one user better by one pair of 8
ALL_UP = {u: 0.625 + 0.125 * (i % 2) for i, u in enumerate(VAL)}


def test_better_on_one_pair_only_keeps_the_seed():
    selection = select_cycle(records(SEED, ONE_PAIR), "state_accuracy")
    assert selection is not None
    assert (selection.cycle, selection.candidate, selection.verdict) == (0, 1, "inconclusive")
    assert selection.gate["n"] == 10 and selection.gate["sign_flip_p"] == 1.0
    assert selection.gate["up"] == 1 and selection.gate["tied"] == 9
    assert selection.rule == (
        "kept the seed: the gate says inconclusive for cycle 1 on val_state_accuracy"
    )
    assert selection.val_objective == pytest.approx(0.5)
    assert best_alias_cycle(selection) == 0


def test_a_cycle_better_on_every_user_replaces_the_seed():
    selection = select_cycle(records(SEED, ALL_UP), "state_accuracy")
    assert selection is not None and selection.cycle == 1 and selection.verdict == "improved"
    assert selection.gate["sign_flip_p"] == pytest.approx(2 / 2**10)
    assert best_alias_cycle(selection) == 1
    # chosen among three cycles the level is 0.05 / 2; 2/1024 still passes
    selection = select_cycle(records(SEED, ONE_PAIR, ALL_UP), "state_accuracy")
    assert selection.cycle == 2 and selection.gate["comparisons"] == 2


def test_without_validation_values_the_seed_stands_and_no_gate_is_asked():
    bare = [
        CycleRecord(
            cycle=k,
            splits={"test": split({"t": 0.5})},
        )
        for k in range(3)
    ]
    selection = select_cycle(bare, "state_accuracy")
    assert selection.cycle == 0 and selection.verdict is None
    assert selection.rule == "the seed (no val_state_accuracy: nothing to choose on)"


def context(root: Path, fake):
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.context import RunContext
    from memloop.optimize.evolve import conditions

    root.mkdir(parents=True, exist_ok=True)
    (root / "awi.yaml").write_text("type: awi\n")
    (root / "exp.yaml").write_text(
        yaml.safe_dump(
            {
                "experiment": "gate",
                "environment": {
                    "procedural": {"users": 12, "periods": 1, "questions": 1},
                    "train_users": 1,
                    "val_users": 10,
                    "test_users": 1,
                },
                "policy": "awi.yaml",
                "feedback_modes": ["complete"],
                "evolvers": ["playbook"],
                "objective": "state_accuracy",
                "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
                "out_dir": str(root / "runs"),
            }
        )
    )
    config = load_config(root / "exp.yaml", EvolveConfig)
    clients = fake_roles(fake.base_url, root / "cache.sqlite")
    ((mode, evolver, search),) = conditions(config)
    return RunContext(config, mode, evolver, search, clients=clients, builder=scripted_builder())


@pytest.mark.parametrize(
    ("second", "best_version", "verdict"), [(ONE_PAIR, 1, "inconclusive"), (ALL_UP, 2, "improved")]
)
def test_best_alias_tags_and_gate_log_follow_the_verdict(tmp_path, second, best_version, verdict):
    from memloop.runs import gate_log, tracker

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        ctx = context(tmp_path, fake)
        given = records(SEED, second)
        for k, prompt in enumerate(
            ["Keep what the user says.", "Keep every fact the user states."]
        ):
            ctx.store.prompts(k, {"writer": prompt})
            ctx.store.save(given[k])
        outcome = ctx.run(iter(given))
    mlc = tracker.client(ctx.config.tracking_uri)
    run = mlc.get_run(outcome.run_id)
    name = run.data.tags["memloop.prompt_name"]
    assert int(mlc.get_prompt_version_by_alias(name, "best").version) == best_version
    assert run.data.tags["memloop.verdict"] == verdict
    assert "cycle 1 vs seed on 10 validation users: " + verdict in run.data.tags["memloop.gate"]
    assert run.data.params["selection.gate_n"] == "10"
    assert run.data.params["selection.cycle"] == str(best_version - 1)
    # the description names the selection and the gate's verdict
    note = run.data.tags["mlflow.note.content"]
    assert f"Selected: cycle {best_version - 1}" in note and f"Verdict: {verdict}." in note
    (entry,) = gate_log.read(outcome.run_dir)
    assert entry["stage"] == "selection" and entry["verdict"] == verdict
    assert entry["compared"] == "cycle 1 vs cycle 0 on val_state_accuracy"
    assert entry["users"] == sorted(VAL) and entry["n"] == 10
    assert json.loads((outcome.run_dir / gate_log.FILE).read_text().splitlines()[0]) == entry


def test_an_evolve_run_with_the_letter_read_logs_state_prob_and_can_rank_on_it(tmp_path):
    from memloop.experiments.cli import main
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.results.compare import compare
    from memloop.runs import tracker

    (tmp_path / "awi.yaml").write_text("type: awi\n")
    data = {
        "experiment": "letters",
        "environment": {
            "procedural": {"users": 4, "periods": 1, "questions": 2, "seed": 2},
            "train_users": 1,
            "val_users": 1,
            "test_users": 2,
        },
        "policy": "awi.yaml",
        "feedback_modes": ["none", "complete"],
        "evolvers": ["playbook"],
        "objective": "state_prob",
        "probes": {"state_read": "letters"},
        "cycles": 2,
        "tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db",
        "out_dir": str(tmp_path / "runs"),
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    config = load_config(tmp_path / "exp.yaml", EvolveConfig)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        # the scripted policy's answers carry log-probabilities: the endpoint declares them
        clients = fake_roles(fake.base_url, tmp_path / "c.sqlite", logprobs=True)
        outcomes = run_evolve(config, progress=False, clients=clients, builder=scripted_builder())
    evolved = outcomes[-1]
    record = evolved.cycles[0]
    for split in ("val", "test"):
        per_user = record.splits[split].per_user
        values = [row["state_prob"] for row in per_user.values()]
        assert all(v is not None for v in values)
        assert record.splits[split].state_prob == pytest.approx(
            json.loads((evolved.run_dir / "cycle_00" / split / "metrics.json").read_text())[
                "state_prob"
            ]
        )
    mlc = tracker.client(config.tracking_uri)
    logged = [m.value for m in mlc.get_metric_history(evolved.run_id, "val/state_prob")]
    assert logged == [c.score("val", "state_prob") for c in evolved.cycles]
    assert evolved.selection.objective.value == "state_prob"
    result = compare(config.tracking_uri, "letters")
    assert "state_prob (objective)" in result["table"]
    (row,) = [r for r in result["rows"] if r.run_id == evolved.run_id]
    assert row.state_prob == pytest.approx(
        evolved.cycles[evolved.selection.cycle].score("test", "state_prob")
    )
    assert main(["compare", "--experiment", "letters", "--tracking-uri", config.tracking_uri]) == 0
