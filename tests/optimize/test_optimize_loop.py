"""The evolution loop's logic against a loopback fake model and a scripted policy: cycles,
MLflow metric histories, prompt artifacts and registry versions, resume without a second run or
repeated calls, and YAML errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.optimize.config import EvolveConfig, TuneConfig, load_config
from memloop.runs import tracker
from memloop.runs.spec import RunSpec, git_revision
from memloop.testing import (
    FakeOpenAIServer,
    evolve_loop_reply,
    fake_roles,
    is_evolver_request,
    scripted_builder,
)
from memloop.testing.commands import write_small_evolve
from memloop.testing.paths import REPO

builder = scripted_builder(garble_every=3)


fake_reply = evolve_loop_reply


def write_config(tmp_path: Path, **over) -> Path:
    """4 users (2 train, 1 val, 1 test), 2 periods x 2 questions, reflective, 2 cycles."""
    return write_small_evolve(tmp_path, "unit", (2, 1, 1), **{"cycles": 2, **over})


# a baseline and an evolved condition, two users in each split
BASELINE_AND_EVOLVED = dict(
    feedback_modes=["none", "complete"],
    environment={
        "procedural": {"users": 6, "periods": 2, "questions": 2, "seed": 1},
        "train_users": 2,
        "val_users": 2,
        "test_users": 2,
    },
)


def run(tmp_path, fake, **over):
    from memloop.optimize.evolve import run_evolve

    config = load_config(write_config(tmp_path, **over), EvolveConfig)
    roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
    return config, run_evolve(config, progress=False, clients=roles, builder=builder)


def mlflow_client(config):
    from memloop.runs import tracker

    return tracker.client(config.tracking_uri)


@pytest.mark.parametrize("search", ["episode", "period"])
def test_two_cycles_logged_and_rerun_is_free(tmp_path, search, capsys):
    with FakeOpenAIServer(reply=fake_reply) as fake:
        config, outcomes = run(tmp_path, fake, search=search)
        assert "resuming" not in capsys.readouterr().out
        sent = len(fake.requests)
        _, again = run(tmp_path, fake, search=search)
        assert len(fake.requests) == sent  # everything resumed from checkpoints or the cache
    (o,) = outcomes
    last = len(o.cycles) - 1  # the rerun says what it found
    assert f"resuming {o.run_dir}: cycle(s) 0-{last} already finished" in capsys.readouterr().out
    assert again[0].run_id == o.run_id
    assert [c.model_dump() for c in again[0].cycles] == [c.model_dump() for c in o.cycles]
    mlc = mlflow_client(config)
    exp = mlc.get_experiment_by_name("unit")
    assert len(mlc.search_runs([exp.experiment_id])) == 1
    # episode search: 2 configured cycles; period search: a cycle per period (0, 1, 2)
    steps = [0, 1] if search == "episode" else [0, 1, 2]
    for split in ("train", "val", "test"):
        for key in ("factual_recall", "overall", "write", "read", "utilization"):
            history = mlc.get_metric_history(o.run_id, f"{split}/{key}")
            assert [m.step for m in history] == steps, (split, key)
            assert [m.value for m in history] == [c.score(split, key) for c in o.cycles]
        # the memory score is not logged where it is undefined (the fake's UB may equal random)
        logged = [m.step for m in mlc.get_metric_history(o.run_id, f"{split}/memory_score")]
        assert logged == [c.cycle for c in o.cycles if c.score(split) is not None]
    assert not mlc.get_metric_history(o.run_id, "memory_score")  # no unprefixed names
    logged_run = mlc.get_run(o.run_id)
    # the params and tags are the run's spec.json: one source for the key, params and tags
    spec = RunSpec.from_document(json.loads((o.run_dir / "spec.json").read_text()))
    assert spec is not None and o.run_dir.name.endswith(spec.key()[:8])
    # the run's numbers, once selected, are params too: `headline.*` and `selection.*`
    params = logged_run.data.params
    assert {k: v for k, v in params.items() if k.startswith("spec.")} == spec.params()
    assert {k.split(".")[0] for k in params} == {"spec", "headline", "selection"}
    assert logged_run.data.tags["memloop.run_key"] == spec.key()
    assert logged_run.data.params["spec.scorer_version"] == "3"
    assert len(logged_run.data.params["spec.catalogue_sha256"]) == 64
    test_users = json.loads(logged_run.data.params["spec.users.test"])
    assert len(test_users) == 1 and set(test_users) == set(o.cycles[0].splits["test"].per_user)
    assert logged_run.data.params["spec.optimizer.search.name"] == search
    assert mlc.get_metric_history(o.run_id, "tokens/optimizer")
    arts = {a.path for a in mlc.list_artifacts(o.run_id, "prompts")}
    assert arts == {f"prompts/cycle_{k:02d}.json" for k in steps}
    assert {a.path for a in mlc.list_artifacts(o.run_id, "cycle")} == {
        f"cycle/cycle_{k:02d}.json" for k in steps
    }
    assert {a.path for a in mlc.list_artifacts(o.run_id, "summary")} >= {"summary/cycle_00.json"}
    name = logged_run.data.tags["memloop.prompt_name"]
    versions = sorted(int(v.version) for v in mlc.search_prompt_versions(name))
    # a version per new text, in the order the cycles first held it (an unchanged prompt is
    # not registered again)
    texts: list[str] = []
    for k in steps:
        text = json.loads((o.run_dir / f"cycle_{k:02d}" / "prompts.json").read_text())["writer"]
        texts += [text] if text not in texts else []
    assert versions == list(range(1, len(texts) + 1))
    assert [mlc.get_prompt_version(name, v).template for v in versions] == texts
    assert mlc.get_prompt_version(name, 1).template == "Remember what the user says."
    # the run is linked to every prompt version it made (MLflow's own link, shown on its page)
    linked = json.loads(mlc.get_run(o.run_id).data.tags["mlflow.linkedPrompts"])
    assert sorted(int(p["version"]) for p in linked if p["name"] == name) == versions
    assert logged_run.data.tags.get("mlflow.source.git.commit") == git_revision()
    assert "update stale ones" in mlc.get_prompt_version(name, 2).template
    # the alias `best` follows the validation score (earliest on a tie), never the test score
    val = {c.cycle: c.score("val") for c in o.cycles if c.score("val") is not None}
    chosen = max(val, key=lambda k: (val[k], -k)) if val else steps[-1]
    assert o.selection.cycle == chosen
    chosen_text = json.loads((o.run_dir / f"cycle_{chosen:02d}" / "prompts.json").read_text())
    best = mlc.get_prompt_version_by_alias(name, "best")
    assert int(best.version) == 1 + texts.index(chosen_text["writer"])
    # MLflow at a glance: the run's numbers are params (no one-point charts), the objective's
    # per-cycle curves come first (the capital section), the description names the verdict
    run_data = mlc.get_run(o.run_id).data
    assert not [k for k in run_data.metrics if k.startswith(("headline/", "selection/"))]
    assert (
        run_data.params["headline.test_overall"]
        == f"{o.cycles[chosen].score('test', 'overall'):.4g}"
    )
    assert run_data.params["selection.cycle"] == str(chosen)
    objective = run_data.tags["memloop.objective"]
    for split in ("val", "test"):
        curve = mlc.get_metric_history(o.run_id, f"Objective/{split}_{objective}")
        assert [(m.step, m.value) for m in sorted(curve, key=lambda m: m.step)] == [
            (c.cycle, c.score(split, objective)) for c in o.cycles
        ]
    sections = sorted({k.split("/")[0] for k in run_data.metrics})
    assert sections[0] == "Objective"
    note = run_data.tags["mlflow.note.content"]
    assert run_data.tags["memloop.verdict"] in note and f"cycle {chosen}" in note
    assert run_data.tags["mlflow.source.name"] == "memloop evolve"
    # the run page's paired result against the seed and the prompt diff, as artifacts
    assert "comparison/vs_seed.md" in note and "comparison/prompts_vs_seed.diff" in note
    comparison = tracker.artifact_text(mlc, o.run_id, "comparison/vs_seed.md")
    (user,) = test_users
    # state accuracy, paired on the one test user: the selected cycle minus the seed
    acc = [o.cycles[k].splits["test"].per_user[user]["state_accuracy"] for k in (chosen, 0)]
    row = next(line for line in comparison.splitlines() if line.startswith("| state_acc"))
    assert [c.strip() for c in row.split("|")[2:4]] == ["1", f"{acc[0] - acc[1]:+.3f}"], row
    assert f"Verdict: {run_data.tags['memloop.verdict']}." in comparison
    diff = tracker.artifact_text(mlc, o.run_id, "comparison/prompts_vs_seed.diff")
    seed_text = json.loads((o.run_dir / "cycle_00" / "prompts.json").read_text())["writer"]
    expected = (
        f"cycle {chosen}'s prompts are the seed's, character for character\n"
        if chosen_text["writer"] == seed_text
        else f"+{chosen_text['writer'].splitlines()[-1]}"
    )
    assert expected in diff
    summary = json.loads((o.run_dir / "cycle_00" / "summary.json").read_text())
    entry = summary["users"][0]["question_answer_history"][0]
    assert {"question", "assistant_response", "ground_truth", "retrieved_memories"} <= set(entry)
    # the summary comes from training users only
    from memloop.optimize.context import load_environment, split_users

    users = split_users(load_environment(config.environment)[0], config.environment)
    assert summary["users"] and {u["user"] for u in summary["users"]} <= {
        u.id for u in users["train"]
    }


def test_a_finished_run_extended_with_more_cycles_evolves_its_last_prompt(tmp_path):
    with FakeOpenAIServer(reply=fake_reply) as fake:
        _, (short,) = run(tmp_path, fake, cycles=2)
        assert not (short.run_dir / "cycle_01" / "evolve.json").exists()
        config, (longer,) = run(tmp_path, fake, cycles=3)
    assert longer.run_id == short.run_id
    step = json.loads((longer.run_dir / "cycle_01" / "evolve.json").read_text())
    assert json.loads((longer.run_dir / "cycle_02" / "prompts.json").read_text()) == step["prompts"]
    mlc = mlflow_client(config)
    assert [m.step for m in mlc.get_metric_history(longer.run_id, "train/overall")] == [0, 1, 2]
    assert {a.path for a in mlc.list_artifacts(longer.run_id, "evolve")} == {
        "evolve/cycle_00.json",
        "evolve/cycle_01.json",
    }


def test_no_evolution_keeps_prompt_and_calls_no_evolver(tmp_path):
    with FakeOpenAIServer(reply=fake_reply) as fake:
        _, (o,) = run(tmp_path, fake, feedback_modes=["none"])
        assert not any(is_evolver_request(r) for r in fake.requests)
    p0 = json.loads((o.run_dir / "cycle_00" / "prompts.json").read_text())
    p1 = json.loads((o.run_dir / "cycle_01" / "prompts.json").read_text())
    assert p0 == p1
    assert (o.mode, o.evolver) == ("none", "none")


def test_prompts_are_found_from_their_experiment_and_an_unchanged_one_is_registered_once(
    tmp_path,
):
    with FakeOpenAIServer(reply=fake_reply) as fake:
        config, (o,) = run(tmp_path, fake, feedback_modes=["none"], cycles=3)
    mlc = mlflow_client(config)
    logged = mlc.get_run(o.run_id)
    name = logged.data.tags["memloop.prompt_name"]
    assert name == f"{config.experiment_name}.{o.run_dir.name[: -len('-12345678')]}"
    # three cycles of one text: one version, `best` on it, linked to the run once
    (version,) = mlc.search_prompt_versions(name)
    assert version.template == "Remember what the user says."
    assert version.tags["memloop.cycle"] == "0"
    assert mlc.get_prompt_version_by_alias(name, "best").version == version.version
    linked = json.loads(logged.data.tags["mlflow.linkedPrompts"])
    assert linked == [{"name": name, "version": str(version.version)}]
    # the experiment's Prompts page (MLflow filters on the prompt's experiment tag) lists it,
    # MLflow's Default experiment does not
    experiment = logged.info.experiment_id
    assert experiment != "0"
    listed = mlc.search_prompts(filter_string=f"experiment_id = '{experiment}'")
    assert [p.name for p in listed] == [name]
    assert list(mlc.search_prompts(filter_string="experiment_id = '0'")) == []


def test_conditions_grid_and_yaml_errors(tmp_path):
    config = load_config(
        write_config(
            tmp_path, feedback_modes=["none", "complete"], evolvers=["reflective", "none"]
        ),
        EvolveConfig,
    )
    assert config.conditions() == [("none", "none"), ("complete", "reflective")]
    from memloop.experiments.cli import main

    bad = write_config(tmp_path, cycles="many")
    assert main(["evolve", str(bad)]) == 2
    bad = write_config(tmp_path, feedback_mode=["complete"])
    assert main(["evolve", str(bad)]) == 2
    bad = write_config(tmp_path, policy="nope.yaml")
    assert main(["evolve", str(bad)]) == 2


def test_evolve_yaml_error_is_one_line(tmp_path, capsys):
    from memloop.experiments.cli import main

    path = write_config(tmp_path, evolvers=["magic"])
    assert main(["evolve", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and "evolvers" in err[0]


def test_shipped_experiment_files_parse():
    root = REPO / "memloop" / "experiments"
    for path in sorted((root / "evolve").glob("*.yaml")):
        load_config(path, EvolveConfig)
    load_config(root / "tune" / "awe.yaml", TuneConfig)


def test_compare_table_and_prompt_diff(tmp_path, capsys):
    from memloop.experiments.cli import main
    from memloop.results.compare import compare

    with FakeOpenAIServer(reply=fake_reply) as fake:
        config, outcomes = run(
            tmp_path,
            fake,
            **BASELINE_AND_EVOLVED,
        )
    result = compare(config.tracking_uri, "unit")
    assert [(r.feedback_mode, r.evolver) for r in result["rows"]] == [
        ("none", "none"),
        ("complete", "reflective"),
    ]
    for r, o in zip(result["rows"], outcomes, strict=True):
        assert r.cycles == 2 and r.tokens > 0 and r.factual_recall is not None
        assert (r.split, r.n_users) == ("test", 2)
        # compare rebuilds the run's own selection from the logged records
        assert r.selection == o.selection
        assert r.selected == o.cycles[o.selection.cycle].score("test") == o.headline
        first = o.cycles[0].splits["test"].per_user
        chosen = o.cycles[o.selection.cycle].splits["test"].per_user
        pairs = [
            chosen[u]["memory_score"] - first[u]["memory_score"]
            for u in first
            if first[u]["memory_score"] is not None and chosen[u]["memory_score"] is not None
        ]
        assert r.delta == (pytest.approx(sum(pairs) / len(pairs)) if pairs else None)
    base, evolved = result["rows"]
    assert not base.vs_baseline  # the run without evolution is the baseline
    for metric in ("memory_score", "state_accuracy", "memory_gain", "factual_recall"):
        expected = {
            u: evolved.per_user[metric][u] - base.per_user[metric][u]
            for u in set(evolved.per_user[metric]) & set(base.per_user[metric])
        }
        paired = evolved.vs_baseline[metric]
        assert paired.n == len(expected)  # 2 test users; fewer define a memory score at times
        assert paired.up + paired.tied + paired.down == paired.n
        if expected:
            assert paired.diff == pytest.approx(sum(expected.values()) / len(expected))
        else:
            assert paired.diff is None
    assert "paired with the baseline none/none on the same users" in result["table"]
    assert "only 2 users per condition (fewer than 10): the intervals are wide" in result["table"]
    # the selected prompts were compared: equal ones print `same prompt` instead of numbers
    assert (evolved.selected_prompts == base.selected_prompts) == evolved.same_prompt_as_baseline
    assert ("same prompt" in result["table"].split("paired with the baseline")[1]) == (
        evolved.same_prompt_as_baseline
    )
    assert (
        main(
            [
                "compare",
                "--experiment",
                "unit",
                "--tracking-uri",
                config.tracking_uri,
                "--run",
                outcomes[1].run_id,
                "--to",
                "last",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "+Record every stated fact" in out and "-Remember what the user says." in out
    plot = tmp_path / "cmp.png"
    assert (
        main(
            [
                "compare",
                "--experiment",
                "unit",
                "--tracking-uri",
                config.tracking_uri,
                "--plot",
                str(plot),
            ]
        )
        == 0
    )
    from matplotlib.image import imread

    from memloop.results.plots import PANEL_WIDTH, PNG_DPI

    height, width = imread(plot).shape[:2]  # a panel per defined metric, the legend below
    assert width % round(PANEL_WIDTH * PNG_DPI) == 0 and width > height
    assert plot.with_suffix(".pdf").stat().st_size and plot.with_suffix(".svg").stat().st_size
    assert main(["compare", "--experiment", "nope", "--tracking-uri", config.tracking_uri]) == 2


def split(memory_score, users=None):
    from memloop.runs.cycles import SplitResult

    per_user = {
        u: {"memory_score": v, "overall": 0.5, "factual_recall": None}
        for u, v in (users or {}).items()
    }
    return SplitResult(
        users=len(per_user) or 1,
        memory_score=memory_score,
        overall=0.5,
        factual_recall=0.25,
        write=0.5,
        read=0.0,
        utilization=0.0,
        per_user=per_user,
    )


def log_one_cycle_run(mlc, exp, key, tags, record, prompts='{"writer": "a"}'):
    """An MLflow run as evolve logs it, with one cycle `record` (a dict) and its `prompts`."""
    from memloop.runs import tracker

    rid, _ = tracker.open_run(
        mlc, exp, key, key, {"a": 1}, tags={f"memloop.{k}": v for k, v in tags.items()}
    )
    tracker.log_text(mlc, rid, json.dumps(record), "cycle/cycle_00.json")
    tracker.log_text(mlc, rid, prompts, "prompts/cycle_00.json")


def test_compare_selects_on_validation_and_reports_the_test_score(tmp_path):
    from memloop.results.compare import compare, run_histories
    from memloop.runs import tracker
    from memloop.runs.cycles import CycleRecord

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "gaps", uri)
    rid, _ = tracker.open_run(
        mlc,
        exp,
        "k",
        "r",
        {"a": 1},
        tags={"memloop.feedback_mode": "complete", "memloop.evolver": "reflective"},
    )
    # val: undefined, 0.4, 0.2 -> cycle 1 is the candidate; test is best at cycle 2 (never
    # chosen). Its 7 validation users are all up on the seed: p = 2/128 <= 0.05 / 2 candidates
    val_users = [f"v{i}" for i in range(7)]
    cycles = [
        (None, {"u1": 0.1, "u2": 0.3}, dict.fromkeys(val_users, 0.1)),
        (0.4, {"u1": 0.2, "u2": 0.6}, dict.fromkeys(val_users, 0.4)),
        (0.2, {"u1": 0.9, "u2": 0.9}, dict.fromkeys(val_users, 0.2)),
    ]
    for k, (val, test, val_by_user) in enumerate(cycles):
        record = CycleRecord(
            cycle=k,
            splits={
                "val": split(val, val_by_user),
                "test": split(sum(test.values()) / 2, test),
            },
        )
        tracker.log_text(mlc, rid, record.model_dump_json(), f"cycle/cycle_{k:02d}.json")
    tracker.log_text(mlc, rid, '{"writer": "a"}', "prompts/cycle_00.json")
    tracker.log_text(mlc, rid, '{"writer": "b"}', "prompts/cycle_01.json")
    result = compare(uri, "gaps")
    (row,) = result["rows"]
    assert (row.cycles, row.selection.cycle, row.split, row.n_users) == (3, 1, "test", 2)
    assert row.selection.verdict == "improved" and row.selection.gate["n"] == 7
    assert row.selection.gate["comparisons"] == 2
    assert row.first == pytest.approx(0.2) and row.selected == pytest.approx(0.4)
    assert row.delta == pytest.approx(((0.2 - 0.1) + (0.6 - 0.3)) / 2)
    assert not row.same_prompt_as_first  # cycle 1 logged other prompts than cycle 0
    assert (row.vs_first.up, row.vs_first.tied, row.vs_first.down) == (2, 0, 0)
    assert "-a" in result["diff"] and "+b" in result["diff"]  # cycle 0 -> selected cycle 1
    (hist,) = run_histories(result["rows"])
    assert [c["memory_score"] for c in hist.cycles] == pytest.approx([0.2, 0.4, 0.9])


def test_compare_pairs_each_condition_with_the_baseline_on_shared_users(tmp_path):
    import json as _json

    from memloop.core.stats import sign_flip_p, t_interval
    from memloop.results.compare import compare
    from memloop.runs import tracker
    from memloop.runs.cycles import CycleRecord

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "paired", uri)
    base_users = {f"u{i}": 0.1 * i for i in range(6)}
    evolved_users = {f"u{i}": 0.1 * i + (0.2 if i % 2 else 0.05) for i in range(5)}  # no u5

    def log_run(key, mode, evolver, users, *, old=False):
        record = CycleRecord(cycle=0, splits={"test": split(0.3, users)})
        data = _json.loads(record.model_dump_json())
        if old:  # a cycle written before scorer versions were recorded
            data.pop("scorer_version")
        # one `memloop.like`: runs of the same settings, which compare pairs
        tags = {"feedback_mode": mode, "evolver": evolver, "like": "same"}
        log_one_cycle_run(mlc, exp, key, tags, data, prompts=f'{{"writer": "{key}"}}')

    log_run("base", "none", "none", base_users)
    log_run("evolved", "complete", "reflective", evolved_users, old=True)
    result = compare(uri, "paired")
    base, evolved = result["rows"]
    diffs = [evolved_users[u] - base_users[u] for u in sorted(evolved_users)]
    paired = evolved.vs_baseline["memory_score"]
    assert paired.n == 5
    assert paired.diff == pytest.approx(sum(diffs) / 5)  # 3 x .05 + 2 x .2 over 5 = .11
    assert paired.diff == pytest.approx(0.11)
    assert paired.t95 == t_interval(diffs)
    assert paired.t95[0] < paired.mean < paired.t95[1]
    assert paired.sign_flip_p == sign_flip_p(diffs) == pytest.approx(2 / 32)  # all 5 up
    assert (paired.up, paired.tied, paired.down) == (5, 0, 0)
    assert evolved.scorer_version == "1" and base.scorer_version != "1"
    assert "scored with the older scorer version 1" in result["table"]
    lo, hi = paired.t95
    cells = "complete/reflective mem_score 5 +0.110".split() + [f"[{lo:+.2f},{hi:+.2f}]"]
    assert cells + ["0.062", "5/0/0"] in [line.split() for line in result["table"].splitlines()]
    # another baseline by name; an unknown one is refused in one line
    assert not compare(uri, "paired", baseline="evolved")["rows"][1].vs_baseline
    from memloop.core.errors import UserError

    with pytest.raises(UserError, match="no baseline run 'nope'"):
        compare(uri, "paired", baseline="nope")


def test_compare_cells_show_t_interval_sign_flip_and_counts_or_same_prompt(tmp_path):
    import json as _json
    import math

    from scipy import stats as sps

    from memloop.results.compare import compare
    from memloop.runs import tracker
    from memloop.runs.cycles import CycleRecord

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "cells", uri)
    users = [f"u{i}" for i in range(6)]
    base = dict(zip(users, [0.25, 0.5, 0.75, 0.5, 0.5, 0.0], strict=True))
    evolved = dict(zip(users, [0.5, 0.5, 0.75, 1.0, 0.375, 0.0], strict=True))
    # a run whose selected prompt is the baseline's, with other numbers (another draw)
    redrawn = dict(zip(users, [0.75, 0.5, 0.75, 0.5, 0.5, 0.0], strict=True))

    def log_run(key, mode, per_user, prompts):
        record = CycleRecord(cycle=0, splits={"test": split(0.4, per_user)})
        data = _json.loads(record.model_dump_json())
        evolver = "reflective" if mode != "none" else "none"
        tags = {"feedback_mode": mode, "evolver": evolver, "like": "same"}
        log_one_cycle_run(mlc, exp, key, tags, data, prompts=_json.dumps(prompts))

    log_run("base", "none", base, {"writer": "a"})
    log_run("evolved", "complete", evolved, {"writer": "b"})
    log_run("redrawn", "diagnostic", redrawn, {"writer": "a"})
    result = compare(uri, "cells")
    _, ev, same = result["rows"]
    table = [line.split() for line in result["table"].splitlines()]

    diffs = [0.25, 0.0, 0.0, 0.5, -0.125, 0.0]
    mean = sum(diffs) / 6  # 0.625 / 6
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 5)
    half = sps.t.ppf(0.975, 5) * sd / math.sqrt(6)
    # the non-zero +.25, +.5, -.125 (sum .625): sign patterns with |sum| >= .625 are
    # +-(.25 + .5 + .125) and +-(.25 + .5 - .125): 4 of 8
    p = ev.vs_baseline["memory_score"]
    assert p.mean == pytest.approx(mean) and p.sign_flip_p == 0.5
    assert p.t95 == pytest.approx((mean - half, mean + half))
    assert (p.n, p.up, p.tied, p.down) == (6, 2, 3, 1)
    interval = f"[{mean - half:+.2f},{mean + half:+.2f}]"
    assert ["complete/reflective", "mem_score", "6", "+0.104", interval, "0.500", "2/3/1"] in (
        table
    )
    # no state accuracy in these records: the row says so without numbers
    assert "complete/reflective state_acc 0 n/a - - -".split() in table
    # the same selected prompt: one row, `same prompt` instead of numbers
    assert not ev.same_prompt_as_baseline and same.same_prompt_as_baseline
    assert same.vs_baseline["memory_score"].mean == pytest.approx(0.5 / 6)  # computed, not shown
    assert "diagnostic/reflective all - same prompt - - -".split() in table
    assert not [row for row in table if row[:2] == ["diagnostic/reflective", "mem_score"]]
    # one cycle each: the selected prompt is cycle 0's in every run
    assert all(r.same_prompt_as_first for r in result["rows"])
    assert "complete/reflective 0 -> 0 - same prompt - - -".split() in table


def test_repeats_run_each_condition_with_its_own_draws_and_rerun_free(tmp_path):
    from memloop.llm.client import DRAW_SEED_STRIDE
    from memloop.optimize.evolve import run_evolve
    from memloop.results.compare import compare
    from memloop.results.rows import repeat_summaries

    def go(fake, **more):
        config = load_config(write_config(tmp_path, **BASELINE_AND_EVOLVED, **more), EvolveConfig)
        roles = fake_roles(fake.base_url, tmp_path / "c.sqlite", temperature=0.7)
        return config, run_evolve(config, progress=False, clients=roles, builder=builder)

    with FakeOpenAIServer(reply=fake_reply) as fake:
        config, outcomes = go(fake, repeats=2, cycles=1)
        sent = len(fake.requests)
        seeds = {b["seed"] for b in fake.requests}
        _, again = go(fake, repeats=2, cycles=1)
        assert len(fake.requests) == sent  # every draw replays from checkpoints and the cache
        _, single = go(fake, cycles=1)  # no repeats: the same run as repeat 0
        assert len(fake.requests) == sent
    assert [(o.mode, o.repeat) for o in outcomes] == [
        ("none", 0),
        ("none", 1),
        ("complete", 0),
        ("complete", 1),
    ]
    assert [o.run_id for o in again] == [o.run_id for o in outcomes]
    assert [o.run_id for o in single] == [outcomes[0].run_id, outcomes[2].run_id]
    assert "-none-none-r1-" in outcomes[1].run_dir.name
    assert len({o.run_dir for o in outcomes}) == 4
    # repeat 1 drew with its own seeds, and its model answers (here: the scripted policy's
    # no-memory control, the one answer the fake model draws) differ from repeat 0's
    assert any(s < DRAW_SEED_STRIDE for s in seeds) and any(s >= DRAW_SEED_STRIDE for s in seeds)

    def answers(o):
        return {u: v["no_memory"] for u, v in o.cycles[0].splits["test"].per_user.items()}

    assert answers(outcomes[0]) != answers(outcomes[1])

    result = compare(config.tracking_uri, "unit")
    rows = result["rows"]
    assert [(r.feedback_mode, r.repeat) for r in rows] == [(o.mode, o.repeat) for o in outcomes]
    # each repeat is paired with the baseline's same repeat
    assert [r.baseline.repeat for r in rows[2:]] == [0, 1]
    base_s, evolved_s = repeat_summaries(rows)
    assert (evolved_s.repeats, evolved_s.users) == (2, 2)
    gains = [r.memory_gain for r in rows[2:]]
    assert evolved_s.mean["memory_gain"] == pytest.approx(sum(gains) / 2)
    assert evolved_s.sd["memory_gain"] == pytest.approx(abs(gains[0] - gains[1]) / 2**0.5)
    assert not base_s.pooled  # the baseline is not compared with itself
    assert "across repeats" in result["table"]
    assert "paired, pooled over repeats" in result["table"]
    # one cycle: the evolved runs' selected prompt is the initial prompt, the baseline's
    assert evolved_s.same_prompt and all(r.same_prompt_as_baseline for r in rows[2:])
    assert "complete/reflective all - same prompt - - - -".split() in [
        line.split() for line in result["table"].splitlines()
    ]


def test_repeats_without_sampling_are_refused_before_anything_runs(tmp_path):
    from memloop.core.errors import UserError

    with FakeOpenAIServer(reply=fake_reply) as fake:
        with pytest.raises(UserError, match="key 'repeats': 3 repeats would draw the same"):
            run(tmp_path, fake, repeats=3)  # fake_roles default: temperature 0
        assert fake.requests == []
    assert not (tmp_path / "runs").exists()


def test_compare_pools_repeats_per_user_then_over_users(tmp_path):
    import json as _json

    from memloop.results.compare import compare
    from memloop.runs import tracker
    from memloop.runs.cycles import CycleRecord

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "reps", uri)
    users = [f"u{i}" for i in range(4)]
    base = {0: {u: 0.1 * i for i, u in enumerate(users)}, 1: {u: 0.2 for u in users}}
    evolved = {
        0: {u: 0.1 * i + 0.3 for i, u in enumerate(users)},  # +0.3 each
        1: {u: 0.2 + (0.1 if i % 2 else -0.1) for i, u in enumerate(users[:3])},  # no u3
    }

    def log_run(key, mode, evolver, repeat, per_user):
        score = sum(per_user.values()) / len(per_user)
        record = CycleRecord(cycle=0, splits={"test": split(score, per_user)})
        tags = {"feedback_mode": mode, "evolver": evolver, "repeat": str(repeat), "like": "same"}
        data = _json.loads(record.model_dump_json())
        log_one_cycle_run(mlc, exp, key, tags, data, prompts=f'{{"writer": "{evolver}"}}')

    for r in (0, 1):
        log_run(f"base-r{r}", "none", "none", r, base[r])
    for r in (0, 1):
        log_run(f"evolved-r{r}", "complete", "reflective", r, evolved[r])
    result = compare(uri, "reps")
    from memloop.results.rows import repeat_summaries

    _, summary = repeat_summaries(result["rows"])
    # repeat 0: +0.3 for u0..u3; repeat 1: -0.1, +0.1, -0.1 for u0..u2 (u3 not in repeat 1)
    per_user = {"u0": (0.3 - 0.1) / 2, "u1": (0.3 + 0.1) / 2, "u2": (0.3 - 0.1) / 2, "u3": 0.3}
    pooled = summary.pooled["memory_score"]
    assert pooled.n == 4
    assert pooled.diff == pytest.approx(sum(per_user.values()) / 4)  # 0.7 / 4
    assert pooled.diff == pytest.approx(0.175)
    repeat_means = [0.3, (-0.1 + 0.1 - 0.1) / 3]
    mean = sum(repeat_means) / 2
    sd = (sum((m - mean) ** 2 for m in repeat_means) / 1) ** 0.5
    assert summary.diff_sd["memory_score"] == pytest.approx(sd)
    scores = [sum(evolved[r].values()) / len(evolved[r]) for r in (0, 1)]
    assert summary.mean["memory_score"] == pytest.approx(sum(scores) / 2)
    assert not summary.same_prompt
    assert "+0.175  [" in result["table"]


KILL_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from memloop.testing import scripted_builder
from memloop.testing.policies import ScriptedPolicy
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.optimize.config import EvolveConfig, load_config
from memloop.optimize.evolve import run_evolve
import time
orig = ScriptedPolicy.respond
def slow(self, msg):
    time.sleep(0.15)
    return orig(self, msg)
ScriptedPolicy.respond = slow
builder = scripted_builder(garble_every=3)
config = load_config({config!r}, EvolveConfig)
client = ChatClient(Endpoint(model="m", base_url={url!r}), cache={cache!r})
run_evolve(config, progress=False, clients=RoleClients(client, client, client, client),
           builder=builder)
"""


def test_killed_evolve_resumes_same_run_without_repeating_calls(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    # reference: the uninterrupted run's request count
    with FakeOpenAIServer(reply=fake_reply) as fake:
        (tmp_path / "ref").mkdir()
        run(tmp_path / "ref", fake, cycles=3)
        reference = len(fake.requests)
    work = tmp_path / "work"
    work.mkdir()
    path = write_config(work, cycles=3)
    with FakeOpenAIServer(reply=fake_reply) as fake:
        script = KILL_SCRIPT.format(
            root=str(REPO),
            config=str(path),
            url=fake.base_url,
            cache=str(work / "c.sqlite"),
        )
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not list((work / "runs").glob("*/cycle_01/episodes/*/period_00/record.json")):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = len(fake.requests)
        config, (o,) = run(work, fake, cycles=3)
        total = len(fake.requests)
    mlc = mlflow_client(config)
    runs = mlc.search_runs([mlc.get_experiment_by_name("unit").experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == o.run_id
    assert [m.step for m in mlc.get_metric_history(o.run_id, "train/overall")] == [0, 1, 2]
    assert 0 < before < reference
    # at most the calls in flight at the kill are sent twice
    assert total <= reference + 2


@pytest.mark.parametrize(
    "reply, expected, error",
    [
        (
            "<instructions>\nKeep the user's current facts and update them when they change."
            "\n</instructions>",
            "Keep the user's current facts and update them when they change.",
            None,
        ),
        ("Keep the facts the user states. A `[Current Time: ...]", "Old rule.", "cut off"),
        ("Keep facts.", "Old rule.", "too short"),
        (
            "  Keep the   facts the user states about themselves. ",
            "Keep the facts the user states about themselves.",
            "identical",
        ),
    ],
)
def test_reflective_rewrite_is_cleaned_or_rejected(reply, expected, error):
    from memloop.optimize.evolvers import ReflectiveEvolver

    def answer(body):
        return f"<changes>\n- c\n</changes>\n<new_instructions>\n{reply}\n</new_instructions>"

    with FakeOpenAIServer(reply=answer) as fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=None)
        old = expected if error == "identical" else "Old rule."
        step = ReflectiveEvolver(client).propose(evolve_input({"writer": old}, {"users": []}))
    assert step.prompts == {"writer": expected}
    if error:
        assert error in step.errors["writer"]
    else:
        assert not step.errors and step.changes == {"writer": ["c"]}


def test_parse_reflection_reports_missing_or_unclosed_blocks():
    from memloop.optimize.evolvers import parse_reflection

    text = (
        "<changes>\n- a\n* b\n</changes>\n<new_instructions>\nNew text here.\n</new_instructions>"
    )
    assert parse_reflection(text) == ("New text here.", ["a", "b"], None)
    assert (
        parse_reflection("<new_instructions>\nhalf of it")[2] == "rewrite cut off (no closing tag)"
    )
    assert "no <new_instructions> block" in parse_reflection("Sure! Here it is.")[2]


def test_a_rejected_rewrite_falls_back_to_appended_rules():
    from memloop.optimize.evolvers import ReflectiveEvolver

    old = "- Keep the facts the user states about themselves."
    asked = []

    def answer(body):
        system = body["messages"][0]["content"]
        asked.append("rules" if "NEW rules" in system else "rewrite")
        if asked[-1] == "rewrite":  # a verbatim copy
            return f"<changes>\n- none\n</changes>\n<new_instructions>\n{old}\n</new_instructions>"
        # no tags, one rule already present, one fragment, one run-on of four good ones
        return (
            "- Record how often the user travels and update it when it changes.\n"
            "- Keep the facts the user states about themselves.\n- half a ru\n"
            "- Store the kind of home the user lives in.\n"
            "- Note the user's current workload level.\n"
            "- Note the user's preferred reading format.\n"
            "- Note the user's usual commute."
        )

    with FakeOpenAIServer(reply=answer) as fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=None)
        step = ReflectiveEvolver(client).propose(evolve_input({"writer": old}, {"users": []}))
        assert asked == ["rewrite", "rules"]
        assert step.prompts["writer"] == "\n".join(
            [
                old,
                "- Record how often the user travels and update it when it changes.",
                "- Store the kind of home the user lives in.",
                "- Note the user's current workload level.",
            ]
        )
        assert not step.errors
        assert "identical" in step.changes["writer"][0]
        assert step.changes["writer"][1:] == [
            "added: Record how often the user travels and update it when it changes.",
            "added: Store the kind of home the user lives in.",
            "added: Note the user's current workload level.",
        ]
        asked.clear()
        copy = ReflectiveEvolver(client, append_rules=False).propose(
            evolve_input({"writer": old}, {})
        )
        assert asked == ["rewrite"] and copy.prompts["writer"] == old
        assert "identical" in copy.errors["writer"]


@pytest.mark.parametrize(
    "reply, error",
    [
        ("Sure, happy to help!", "no <rules> block or bullet lines"),
        (
            "<rules>\n- ok.\n- Keep the facts the user states about themselves.\n</rules>",
            "no usable new rule",
        ),
        ("<rules>\n- Record the user's home city and update it when they move.", None),
    ],
)
def test_parse_rules_keeps_only_new_whole_sentences(reply, error):
    from memloop.optimize.evolvers import parse_rules

    rules, problem = parse_rules(reply, "- Keep the facts the user states about themselves.")
    if error:
        assert error in problem
    else:
        assert problem is None
    assert rules == ([] if error else ["Record the user's home city and update it when they move."])


@pytest.mark.parametrize(
    "values, expected",
    [
        ([], (-1.08, 1.08)),
        ([-1.0, -1.0], (-1.08, 1.08)),
        ([-3.0, 0.5], (-3.08, 1.08)),
        ([1.5], (-1.08, 1.58)),
    ],
)
def test_memory_score_axis_keeps_the_reference_levels_in_view(values, expected):
    """A flat line at -1 must not be magnified into a band of +-0.04 (matplotlib's autoscale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memloop.feedback.report import style_memory_score_axis

    fig, ax = plt.subplots()
    style_memory_score_axis(ax, values)
    assert ax.get_ylim() == pytest.approx(expected)
    assert sorted(line.get_ydata()[0] for line in ax.lines) == [0, 1]
    plt.close(fig)


def test_revealed_values_are_collected_at_any_depth_in_complete_and_diagnostic_summaries():
    from memloop.feedback.summary import revealed_values

    summary = {
        "users": [
            {
                "question_answer_history": [
                    {"state_query": {"home_type": {"believed": "flat", "actual": "shared_house"}}}
                ],
                "user_information_updates": {"trip_frequency": "monthly_trips", "pets": None},
            },
            {"question_answer_history": [], "user_information_updates": {"city": "Lyon"}},
        ]
    }
    assert revealed_values(summary) == {"shared_house", "monthly_trips", "Lyon"}
    assert revealed_values({"question_answer_history": [{"question": "Q?"}]}) == set()


def test_rules_and_rewrites_naming_a_users_values_are_rejected():
    """A prompt shared by every user must not carry one user's facts (e.g. `shared_house`)."""
    from memloop.core.leaks import LeakCheck, named
    from memloop.optimize.evolvers import ReflectiveEvolver, parse_rules

    old = "- Keep the facts the user states about themselves, e.g. whether they live alone."
    values = {"shared_house", "monthly_trips", "no", "alone"}
    assert named("Record that the user lives in a Shared-House.", values, old) == ["shared_house"]
    # too short to tell apart ("no"), or already in the instructions ("alone"): not a leak
    assert named("Say no to guesses; note who lives alone.", values, old) == []
    assert named("Record the kind of home the user lives in.", values, old) == []
    check = LeakCheck(frozenset(values))
    rules, problem = parse_rules(
        "<rules>\n- Record that the user takes monthly trips.\n"
        "- Record how often the user travels.\n</rules>",
        old,
        leaks=check,
    )
    assert (rules, problem, check.rejected) == (["Record how often the user travels."], None, 1)
    rules, problem = parse_rules(
        "<rules>\n- Note the user's shared house.\n</rules>", old, leaks=check
    )
    assert rules == [] and check.rejected == 2
    assert problem == "no usable new rule in the reply (1 named a user's private value)"

    summary = {"users": [{"user_information_updates": {"home_type": "shared_house"}}]}
    leaky = old + "\n- The user lives in a shared house; keep that."

    def answer(body):
        if "NEW rules" in body["messages"][0]["content"]:
            return "<rules>\n- Update the home type when the user moves.\n</rules>"
        return f"<changes>\n- home\n</changes>\n<new_instructions>\n{leaky}\n</new_instructions>"

    with FakeOpenAIServer(reply=answer) as fake:
        client = ChatClient(Endpoint(model="m", base_url=fake.base_url), cache=None)
        step = ReflectiveEvolver(client).propose(evolve_input({"writer": old}, summary))
    assert step.prompts["writer"] == old + "\n- Update the home type when the user moves."
    assert "rewrite names 1 private value of the users" in step.changes["writer"][0]
    assert "shared_house" not in json.dumps(step.model_dump())  # the step is logged: no value


def evolve_input(prompts, summary):
    """An evolver's input: `prompts` and a summary in its plain form."""
    from memloop.feedback.summary import FeedbackSummary
    from memloop.optimize.contract import EvolveInput

    return EvolveInput(prompts=prompts, summary=FeedbackSummary.from_data(summary))


@pytest.mark.parametrize("objective", ["state_accuracy", "memory_score"])
def test_evolve_prints_the_objective_its_selection_and_the_compare_command(
    tmp_path, capsys, objective
):
    from memloop.core.tables import format_number
    from memloop.optimize.report import print_outcomes

    with FakeOpenAIServer(reply=fake_reply) as fake:
        config, (outcome,) = run(tmp_path, fake, objective=objective)
    capsys.readouterr()
    print_outcomes(config, [outcome])
    out = capsys.readouterr().out
    column = {"state_accuracy": "state_acc", "memory_score": "mem_score"}[objective]
    assert f"{column} (objective) on the train / val / test users per cycle" in out
    # prose wraps at 100 columns; only a path, or a command naming one, may run longer
    long = [line for line in out.splitlines() if len(line) > 100]
    assert all(" " not in line.strip() or str(tmp_path) in line for line in long), long
    selected = outcome.cycles[outcome.selection.cycle]
    val = selected.score("val", objective)
    row = next(line for line in out.splitlines() if line.startswith("complete") and "*" in line)
    cells = row.split()
    assert cells[0] == "complete/reflective"
    assert cells[2:5] == [
        format_number(selected.score(s, objective)) for s in ("train", "val", "test")
    ]
    assert (
        f"complete/reflective: cycle {outcome.selection.cycle} stands for the run "
        f"({outcome.selection.rule} = {val:.3f})" in " ".join(out.split())  # prose wraps
    )
    assert f"memloop compare --experiment unit --tracking-uri {config.tracking_uri}" in out


def test_a_selection_without_a_validation_value_says_so(tmp_path, capsys):
    from memloop.optimize.report import selection_line
    from memloop.runs.cycles import Selection

    class Outcome:
        selection = Selection(cycle=0, rule="the seed (no val_memory_score: nothing to choose on)")

    line = selection_line(Outcome())
    assert (
        line == "cycle 0 stands for the run (the seed (no val_memory_score: nothing to choose on))"
    )


def test_a_prompt_left_unchanged_prints_the_evolvers_reason(tmp_path):
    from memloop.optimize.contract import EvolveStep
    from memloop.optimize.report import step_lines
    from memloop.runs.store import CycleStore

    store = CycleStore(tmp_path)
    store.cycle_dir(1).mkdir(parents=True)
    store.save_step(1, EvolveStep(prompts={"writer": "w"}, errors={"writer": "no JSON\nreply"}))

    class Record:
        cycle = 1

    class Outcome:
        run_dir = tmp_path
        cycles = [Record()]

    assert step_lines(Outcome()) == ["cycle 1: writer unchanged: no JSON reply"]


def test_a_changed_prompt_prints_the_edit_its_reason_the_diff_and_what_was_refused(tmp_path):
    from memloop.optimize.contract import EvolveStep
    from memloop.optimize.report import step_lines
    from memloop.runs.store import CycleStore

    store = CycleStore(tmp_path)
    store.cycle_dir(0).mkdir(parents=True)
    (store.cycle_dir(0) / "prompts.json").write_text(
        json.dumps({"writer": "Keep a memory. Do not record details."})
    )
    refused = [
        {"predictor": "writer", "edit": f"add op{i}", "stage": "screen", "reason": "0.40; lost"}
        for i in range(6)
    ]
    step = EvolveStep(
        prompts={"writer": "Keep a memory.\nWrite one edit for every fact."},
        changes={
            "writer": [
                "named failures: never written 3",
                "chose add every_fact (addresses never written 3)",
                "added (every_fact): Write one edit for every fact.",
                "replay screen 0.500 vs current 0.400: gate too few users; taken as an "
                "exploration step (not shown better)",
            ]
        },
        rejected=refused,
    )
    store.save_step(0, step)

    class Record:
        cycle = 0

    class Outcome:
        run_dir = tmp_path
        cycles = [Record()]

    assert step_lines(Outcome()) == [
        "cycle 0: writer: chose add every_fact (addresses never written 3)",
        "cycle 0: writer: replay screen 0.500 vs current 0.400: gate too few users; taken as an "
        "exploration step (not shown better)",
        "  - Do not record details.",
        "  + Write one edit for every fact.",
        *[f"cycle 0: writer: refused add op{i} (screen: 0.40; lost)" for i in range(4)],
        "cycle 0: 2 more refused edits in cycle_00/evolve.json",
    ]
