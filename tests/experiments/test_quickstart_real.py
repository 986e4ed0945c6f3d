"""`memloop quickstart` in a reduced size on the embedded 0.5B model with real MLflow: no
evolution against the edits evolver from the weak seed, two cycles, a training, a validation and
a test user; the MLflow contents, the printed paired comparison, what the loop did, the plot, and
a rerun that is served without a single new model response."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from memloop.experiments.cli import main
from memloop.testing.paths import REPO

pytestmark = pytest.mark.real_model

ROOT = REPO
MODES = ("none", "complete")


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory, local_client):
    root = tmp_path_factory.mktemp("quickstart")
    endpoint = root / "endpoint.yaml"
    # same model and slots as the session's local_client: one shared embedded server
    endpoint.write_text(
        "model: local-0.5b\nbase_url: local\nmax_concurrency: 2\ntimeout_s: 300\nmax_tokens: 384\n"
    )
    full = yaml.safe_load((ROOT / "memloop/experiments/quickstart.yaml").read_text())
    config = {
        **full,
        "experiment": "quickstart-test",
        "environment": {
            # one test user (the shipped file has four): the suite's time budget
            "procedural": {"users": 3, "periods": 1, "questions": 1, "seed": 5},
            "train_users": 1,
            "val_users": 1,
            "test_users": 1,
        },
        "cycles": 2,
        # two candidates screened, not four: the step's path is the same (the suite's budget)
        "settings": {"edits": {**full["settings"]["edits"], "candidates": 2}},
        # the copy lives elsewhere: name the shipped policy file absolutely
        "policy": str(ROOT / "memloop/experiments/policies/awi-quickstart.yaml"),
    }
    config.pop("endpoints")  # --endpoint below gives every role the session's 0.5B server
    path = root / "quickstart.yaml"
    path.write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    args = [
        "quickstart",
        "--config",
        str(path),
        "--endpoint",
        str(endpoint),
        "--out",
        str(root / "out"),
        "--tracking-uri",
        uri,
        "--no-progress",
    ]
    return root, uri, args


@pytest.fixture(scope="module")
def first_run(quickstart) -> str:
    """The first run's printed output."""
    import contextlib
    import io

    _, _, args = quickstart
    out = io.StringIO()
    # traces logged, as outside the tests: the embedded model's own calls become spans
    with pytest.MonkeyPatch.context() as traces_on, contextlib.redirect_stdout(out):
        traces_on.delenv("MEMLOOP_TRACES")
        assert main(args) == 0
    return out.getvalue()


def test_the_embedded_models_calls_are_spans_and_the_questions_results_feedback(
    quickstart, first_run
):
    """Traces of real calls: the writer's and the probes' requests to the embedded model, each
    with its messages, raw output, tokens and latency as they happened; each question's result
    as an assessment the search API filters on."""
    from memloop.runs import tracker

    _, uri, _ = quickstart
    mlc = tracker.client(uri)
    exp = mlc.get_experiment_by_name("quickstart-test").experiment_id
    (run,) = (
        r for r in mlc.search_runs([exp]) if r.data.tags["memloop.feedback_mode"] == "complete"
    )
    traces = mlc.search_traces(locations=[exp], run_id=run.info.run_id, max_results=500)
    assert traces
    calls = [s for t in traces for s in t.data.spans if s.get_attribute("component")]
    components = {s.get_attribute("component") for s in calls}
    assert {"agent", "memory", "probe"} <= components, components
    for span in calls:
        # the model as the embedded server loaded it: its name and weights hash
        assert span.get_attribute("model").startswith("qwen2.5-coder-0.5b-instruct")
        assert span.get_attribute("prompt_tokens") > 0
        assert span.get_attribute("completion_tokens") > 0 or span.get_attribute("cache_hit")
        assert span.end_time_ns > span.start_time_ns
        assert span.inputs["messages"] and isinstance(
            span.outputs["choices"][0]["message"]["content"], str
        )
    results = [
        a.value
        for t in traces
        for a in mlc.get_trace(t.info.trace_id).info.assessments
        if a.name == "result"
    ]
    assert results
    for value in set(results):
        found = mlc.search_traces(
            locations=[exp], run_id=run.info.run_id, filter_string=f"feedback.result = '{value}'"
        )
        assert found and all(
            value in {a.value for a in mlc.get_trace(t.info.trace_id).info.assessments}
            for t in found
        )


def test_mlflow_holds_every_mode_with_two_cycles(quickstart, first_run):
    from memloop.runs import tracker

    _, uri, _ = quickstart
    mlc = tracker.client(uri)
    exp = mlc.get_experiment_by_name("quickstart-test")
    runs = {r.data.tags["memloop.feedback_mode"]: r for r in mlc.search_runs([exp.experiment_id])}
    assert set(runs) == set(MODES)
    for mode, run in runs.items():
        rid = run.info.run_id
        assert run.info.status == "FINISHED"
        # the embedded model returns log-probabilities: the letter read and state_prob by
        # default (the shipped file sets neither)
        assert run.data.tags["memloop.objective"] == "state_prob"
        # the cycle with the best validation state_prob (the earliest on a tie) is the
        # candidate; one validation user is too few for the gate, so the seed stands
        val = [m.value for m in mlc.get_metric_history(rid, "val/state_prob")]
        chosen = max(range(len(val)), key=lambda k: (val[k], -k))
        expected = (
            "cycle 0: the seed (no cycle beat it on val_state_prob)"
            if chosen == 0
            else f"cycle 0: kept the seed: the gate says too few users for cycle {chosen} on "
            "val_state_prob"
        )
        assert run.data.tags["memloop.selection"] == expected
        assert run.data.tags["memloop.verdict"] == (
            "too few users" if chosen else ("no candidate (the seed is best on validation)")
        )
        for split in ("train", "val", "test"):
            for key in ("state_accuracy", "overall", "health/stored_share"):
                steps = [m.step for m in mlc.get_metric_history(rid, f"{split}/{key}")]
                assert steps == [0, 1], (split, key)
        assert run.data.params["spec.scorer_version"] == "3"
        assert len(json.loads(run.data.params["spec.users.test"])) == 1
        artifacts = {a.path for a in mlc.list_artifacts(rid, "prompts")}
        assert artifacts == {"prompts/cycle_00.json", "prompts/cycle_01.json"}
        name = run.data.tags["memloop.prompt_name"]
        # a version per distinct text (the no-evolution run's prompt never changes: one), found
        # from the experiment's Prompts page
        texts = {tracker.artifact_text(mlc, rid, f"prompts/cycle_{k:02d}.json") for k in (0, 1)}
        assert len(mlc.search_prompt_versions(name)) == len(texts)
        assert mode != "none" or len(texts) == 1
        listed = mlc.search_prompts(filter_string=f"experiment_id = '{exp.experiment_id}'")
        assert name in {p.name for p in listed}
        assert run.data.params["spec.mode"] == run.data.tags["memloop.feedback_mode"] == mode
        assert run.data.params["spec.environment.procedural.seed"] == "5"
        assert len(run.data.params["spec.environment.procedural.catalogue_sha256"]) == 64
    # an evolution step after cycle 0 only (none after the last cycle); the none run kept its
    # prompt, the feedback modes logged the summary the evolver read
    for mode, run in runs.items():
        rid = run.info.run_id
        assert {a.path for a in mlc.list_artifacts(rid, "evolve")} == {"evolve/cycle_00.json"}
        # the run's own figure (evolve) and the quickstart's comparison figure
        assert {a.path for a in mlc.list_artifacts(rid, "figures")} == {
            f"figures/{stem}{ext}" for stem in ("cycles", "quickstart") for ext in (".png", ".svg")
        }
        first, second = (
            json.loads(tracker.artifact_text(mlc, rid, f"prompts/cycle_0{k}.json")) for k in (0, 1)
        )
        assert set(first) == set(second) == {"writer"}
        evolve = json.loads(tracker.artifact_text(mlc, rid, "evolve/cycle_00.json"))
        assert second == evolve["prompts"]  # cycle 1 ran the evolver's proposal
        if mode == "none":
            assert first == second
        else:
            summary = json.loads(tracker.artifact_text(mlc, rid, "summary/cycle_00.json"))
            assert summary["users"], mode


def test_table_and_plot(quickstart, first_run):
    root, _, _ = quickstart
    out = first_run
    for mode in MODES:
        assert re.search(rf"\b{mode}\b", out), out
    assert "model responses this run:" in out
    assert "paired with the baseline none/none on the same users" in out
    # one row per metric (n = the test user), or one `same prompt` row when the selected prompt
    # is still the initial one, which the baseline runs too
    assert re.search(r"complete/edits\s+(\w+\s+1\s|all\s+-\s+same prompt)", out), out
    # what the loop did: the weak seed, then the step's chosen edit with the named failures it
    # addressed, or why nothing was taken with the refused edits; never a bare "unchanged"
    assert "what the loop did (complete/edits):" in out, out
    seed = yaml.safe_load((ROOT / "memloop/experiments/policies/awi-quickstart.yaml").read_text())[
        "prompts"
    ]["writer"]
    assert f"seed writer prompt: {seed}" in out
    chose = re.search(r"cycle 0: writer: chose (add|remove) \S+ \(addresses [^)]+\)", out)
    kept = "cycle 0: writer unchanged: " in out and re.search(r"cycle 0: writer: refused ", out)
    assert chose or kept, out
    assert re.search(r"selection: cycle \d+ stands for the run \(", out), out
    # the selected cycle's writer's memory health, beside the verdict
    flat = " ".join(out.split())
    health = r"; memory health: (no alarm on 1 test users|ALARM [a-z_]+ on 1/1 test users)"
    assert re.search(r"selection: cycle \d+ stands for the run \([^\n]*" + health, flat), out
    assert re.search(r"mean diff\s+95% CI\s+p \(sign-flip\)\s+up/tied/down", out), out
    assert "prompts of cycle 0 -> last cycle" in out  # compare's prompt diff
    plot = root / "out" / "quickstart.png"
    from matplotlib.image import imread

    from memloop.results.plots import PANEL_WIDTH, PNG_DPI

    pixels = imread(plot)
    height, width = pixels.shape[:2]  # a panel per defined metric, the legend below
    assert width % round(PANEL_WIDTH * PNG_DPI) == 0 and width > height
    assert plot.with_suffix(".pdf").stat().st_size and plot.with_suffix(".svg").stat().st_size
    assert pixels.std() > 0.01  # not a blank canvas


def test_a_rerun_of_its_manifest_is_served_from_the_cache_and_identical(
    quickstart, first_run, capfd
):
    from memloop.llm.model_files import QWEN_0_5B

    root, _, args = quickstart
    manifests = sorted((root / "out").glob("*/manifest.json"))
    assert len(manifests) == len(MODES)
    manifest = json.loads(manifests[0].read_text())
    assert manifest["command"] == ["memloop", *args]
    assert manifest["models"]["agent"] == {"file": QWEN_0_5B.file_name, "sha256": QWEN_0_5B.sha256}
    assert main(["rerun", str(manifests[0]), "--out", str(root / "again")]) == 0
    captured = capfd.readouterr()  # the rerun is a process of its own
    assert re.search(r"model responses this run: 0 new", captured.out), captured.out
    flat = " ".join(captured.out.split())
    assert f"rerun of {root / 'out'} in {root / 'again'}: identical to the original" in flat
    rerun = json.loads((root / "again" / "rerun.json").read_text())
    # every mode's run, every cycle and split, compared user by user
    assert len(rerun["units"]) == len(MODES) * 2 * 3 and rerun["identical"]
    # no library noise: MLflow's artifact bars, matplotlib's or any other warning
    assert "Downloading artifacts" not in captured.err and "Warning" not in captured.err


def test_a_prompt_transferred_to_the_embedded_writer_is_paired_with_the_seed(
    quickstart, first_run, capsys
):
    from memloop.policies.prompt_files import render_text
    from memloop.runs import tracker

    root, uri, _ = quickstart
    (run,) = [p for p in (root / "out").iterdir() if p.is_dir() and "complete" in p.name]
    hand = root / "hand.txt"  # another writer prompt than the run's seed
    hand.write_text(
        render_text(
            {
                "writer": "Store each fact the user states about themselves, in the user's "
                "own words, under its own short label."
            }
        )
    )
    out = root / "transfer"
    argv = ["transfer", str(run), "--writer", str(root / "endpoint.yaml"), "--prompts", str(hand)]
    assert main([*argv, "--out", str(out), "--tracking-uri", uri, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    matrix = json.loads((out / "transfer.json").read_text())
    (row,) = matrix["rows"]
    assert row["writer"] == "local-0.5b" and not row["same_prompt"]
    # each arm evaluated on the run's one test user; the pair is their difference
    (user,) = matrix["test_users"]
    diff = row["scores"]["selected"][user] - row["scores"]["seed"][user]
    assert row["paired"]["n"] == 1 and row["paired"]["mean"] == pytest.approx(diff)
    assert row["gate"]["verdict"] == "too few users" and "local-0.5b" in printed
    mlc = tracker.client(uri)
    exp = mlc.get_experiment_by_name("transfer").experiment_id
    arms = {r.data.tags["memloop.transfer.arm"] for r in mlc.search_runs([exp])}
    assert arms == {"seed", "selected"}


def test_eval_cli_on_the_quickstart_users(quickstart, first_run, capsys):
    """`memloop eval` with the quickstart's policy on its users: the episodes equal the
    quickstart's cycle-0 episodes, so the model work is the quickstart's (served from the cache)."""
    root, _, _ = quickstart
    env = root / "env.json"
    procedural = ["--users", "3", "--periods", "1", "--questions", "1", "--seed", "5"]
    assert main(["env", "procedural", *procedural, "--out", str(env)]) == 0
    args = [
        "eval",
        "--env",
        str(env),
        "--policy",
        str(ROOT / "memloop/experiments/policies/awi-quickstart.yaml"),
        "--out",
        str(root / "eval"),
        "--endpoint",
        str(root / "endpoint.yaml"),
        "--rounds-update",
        "1",
        "--users",
        "2",
    ]
    capsys.readouterr()
    assert main(args) == 0
    printed = capsys.readouterr().out
    m = json.loads((root / "eval" / "metrics.json").read_text())
    keys = ("overall", "random", "upper_bound", "memory_score", "per_period", "diagnosis")
    assert all(key in m for key in (*keys, "factual_recall", "usage"))
    d = m["diagnosis"]
    assert d["write"] + d["read"] + d["utilization"] == pytest.approx(1 - m["overall"])
    assert m["questions"] == 2 * 2 * 1 and len(m["per_period"]) == 2  # users x periods x q
    lines = (root / "eval" / "records.jsonl").read_text().splitlines()
    assert len(lines) == m["questions"]
    print(printed.splitlines()[-2])  # how many requests the cache did not answer
    assert main(args) == 0  # rerun: served from checkpoints
    assert "new model requests this run: 0" in capsys.readouterr().out
