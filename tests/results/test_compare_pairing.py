"""`memloop compare` pairs a run only with a baseline of its own settings (issue 28).

Runs of one experiment on two agent models (real `run_evolve` runs against the loopback fake,
on a real sqlite MLflow store) are shown in two groups headed by the model, each evolved run
paired with its own model's baseline; a group without a baseline run and runs logged before run
specs existed are shown unpaired with a note.
"""

from __future__ import annotations

import json
import re

import pytest

from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.optimize.config import EvolveConfig, load_config
from memloop.policies.base import Answer
from memloop.testing import FakeOpenAIServer, evolve_loop_reply, gate_passes
from memloop.testing.policies import ScriptedPolicy


def write_config(tmp_path, **over):
    """An evolve YAML as tests/optimize/test_optimize_loop.py writes one: a baseline and an evolved
    condition, two cycles, two training users, three validation and three test users; the gate
    is made to pass (`passing_gate`), so each evolved run's selection is its best cycle."""
    import yaml

    policy = tmp_path / "awi.yaml"
    policy.write_text("type: awi\n")
    data = {
        "experiment": "unit",
        "environment": {
            "procedural": {"users": 8, "periods": 2, "questions": 2, "seed": 1},
            "train_users": 2,
            "val_users": 3,
            "test_users": 3,
        },
        "policy": str(policy),
        "feedback_modes": ["none", "complete"],
        "evolvers": ["reflective"],
        "cycles": 2,
        "objective": "state_accuracy",  # the evolved prompt is the better on it for both models
        "tracking_uri": f"sqlite:///{tmp_path}/mlruns/mlflow.db",
        "out_dir": str(tmp_path / "runs"),
        **over,
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


METRICS = ("state_accuracy", "memory_score", "memory_gain", "factual_recall")  # objective first
# their column names in compare's tables (core.tables.metric_column); the objective comes first
COLUMNS = {"mem_score": "memory_score", "state_acc": "state_accuracy", "mem_gain": "memory_gain"}
COLUMNS["recall"] = "factual_recall"
NO_BASELINE = "no baseline run of its own settings: not paired"
OLDER = "logged by an older memloop: not paired"


def model_roles(base_url: str, model: str, cache) -> RoleClients:
    """Four roles sharing one client on `model` (as `fake_roles`, another model name)."""
    client = ChatClient(Endpoint(model=model, base_url=base_url), cache=cache)
    return RoleClients(client, client, client, client)


class ModelPolicy(ScriptedPolicy):
    """A scripted policy whose answers depend on its model and its prompts, as a real one's do.

    With the starting prompt it picks a fixed option per model (model-a: 1, else 2); with an
    evolved prompt (the fake evolver's "Record every stated fact ...") the option sharing most
    words with what the user said, so evolving changes the numbers and the two models' baselines
    differ.
    """

    def __init__(self, prompts=None, *, model: str = "model-a") -> None:
        super().__init__(prompts, choice=1 if model == "model-a" else 2)
        self.model = model

    def answer(self, prompt, *, schema=None, memory_only=False):
        evolved = "Record every stated fact" in " ".join(self.prompts().values())
        if schema is None or not evolved:
            return super().answer(prompt, schema=schema, memory_only=memory_only)
        words = {w for m in self.seen for w in m.lower().split() if len(w) > 3}

        def best(texts: list[str]) -> int:  # the text sharing most words with the memory
            return max(range(len(texts)), key=lambda i: sum(w in words for w in texts[i].split()))

        props = schema.get("properties", {})
        if "answer" in props:
            options = re.findall(r"^(\d+)\. (.+)$", prompt, flags=re.M) or [("1", "")]
            value: dict = {"answer": int(options[best([o[1].lower() for o in options])][0])}
        else:  # a state query: each variable's allowed value sharing most words with the memory
            value = {
                k: spec["enum"][best([str(e).lower() for e in spec["enum"]])]
                if "enum" in spec
                else "unknown"
                for k, spec in props.items()
            }
        return Answer(json.dumps(value), self.seen[-3:], value)

    def with_prompts(self, prompts, *, keep_memory=False):
        twin = ModelPolicy({**self.prompts(), **prompts}, model=self.model)
        if keep_memory:
            twin.seen = list(self.seen)
        return twin


def model_builder(config, client, workdir, prompts=None):
    """`build_policy`-shaped: a ModelPolicy on the agent client's model."""
    policy = ModelPolicy(model=client.endpoint.model)
    return policy.with_prompts(prompts) if prompts else policy


def evolve(tmp_path, fake, model: str, **over):
    """One `run_evolve` of the experiment `unit` on `model` (every role)."""
    from memloop.optimize.evolve import run_evolve

    config = load_config(write_config(tmp_path, **over), EvolveConfig)
    roles = model_roles(fake.base_url, model, tmp_path / "c.sqlite")
    return config, run_evolve(config, progress=False, clients=roles, builder=model_builder)


def selected_per_user(outcome, metric: str) -> dict[str, float]:
    """The selected cycle's per-user `metric` on the test users, from the run's CycleRecords."""
    per_user = outcome.cycles[outcome.selection.cycle].splits["test"].per_user
    return {u: v[metric] for u, v in per_user.items() if v.get(metric) is not None}


def by_hand(evolved, base, metric: str) -> dict[str, float]:
    """Per-user differences evolved - base on the users both define `metric` for."""
    mine, theirs = selected_per_user(evolved, metric), selected_per_user(base, metric)
    return {u: mine[u] - theirs[u] for u in sorted(set(mine) & set(theirs))}


def sections(table: str) -> list[str]:
    """The table's text per group (`=== group k: ... ===` onwards), the notes cut off."""
    parts = table.split("\n=== group ")[1:]
    return [p.split("\nmean diff:")[0] for p in parts]


def cells_of(text: str) -> list[list[str]]:
    """The lines of `text` split into table cells (columns are 2+ spaces apart)."""
    return [re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.strip()]


def paired_cells(section: str) -> list[list[str]]:
    """The rows of a section's `paired with the baseline` table, split into cells."""
    if "paired with the baseline" not in section:
        return []
    lines = section.split("paired with the baseline", 1)[1].splitlines()[1:]
    return [line.split() for line in lines if line.split()[:1] == ["complete/reflective"]]


def mean_cell(diffs: dict[str, float]) -> str:
    return f"{sum(diffs.values()) / len(diffs):+.3f}" if diffs else "n/a"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory):
    """Experiment `unit`: a baseline and an evolved run on model-a, then the same on model-b."""
    tmp_path = tmp_path_factory.mktemp("two_models")
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, on_a = evolve(tmp_path, fake, "model-a")
        _, on_b = evolve(tmp_path, fake, "model-b")
    return config, on_a, on_b


@pytest.fixture(autouse=True, scope="module")
def passing_gate():
    """Pairing is this file's subject, not the gate: every selection takes its best cycle."""
    with gate_passes():
        yield


def test_each_model_is_paired_with_its_own_baseline(two_models):
    from memloop.results.compare import compare, run_histories

    config, (base_a, evolved_a), (base_b, evolved_b) = two_models
    result = compare(config.tracking_uri, "unit")
    rows = {r.run_id: r for r in result["rows"]}
    assert list(rows) == [o.run_id for o in (base_a, evolved_a, base_b, evolved_b)]

    # two groups, by memloop.like, each headed by the model that differs
    groups = result["groups"]
    assert [[r.run_id for r in g.rows] for g in groups] == [
        [base_a.run_id, evolved_a.run_id],
        [base_b.run_id, evolved_b.run_id],
    ]
    assert len({g.like for g in groups}) == 2 and None not in {g.like for g in groups}
    assert [g.heading for g in groups] == [
        "runs with endpoints.*.model = model-a",
        "runs with endpoints.*.model = model-b",
    ]
    table = result["table"]
    assert table.startswith("2 groups of runs with different settings: a run is paired only")
    assert "=== group 1: runs with endpoints.*.model = model-a ===" in table
    assert "=== group 2: runs with endpoints.*.model = model-b ===" in table
    assert NO_BASELINE not in table and OLDER not in table

    # each evolved run paired with its own model's baseline, never across models
    for evolved, base in ((evolved_a, base_a), (evolved_b, base_b)):
        row = rows[evolved.run_id]
        assert row.baseline is rows[base.run_id]
        assert rows[base.run_id].baseline is None and not rows[base.run_id].vs_baseline
        for metric in METRICS:
            diffs = by_hand(evolved, base, metric)
            paired = row.vs_baseline[metric]
            assert paired.n == len(diffs)
            if diffs:
                assert paired.diff == pytest.approx(sum(diffs.values()) / len(diffs))
                assert (paired.up, paired.tied, paired.down) == (
                    sum(d > 0 for d in diffs.values()),
                    sum(d == 0 for d in diffs.values()),
                    sum(d < 0 for d in diffs.values()),
                )
            else:
                assert paired.diff is None
    for row in result["rows"]:
        if row.baseline is not None:
            assert row.baseline.like == row.like
            assert row.baseline.spec["endpoints.agent.model"] == row.spec["endpoints.agent.model"]

    # the two models' numbers differ: pairing across models would have shown other values
    own = by_hand(evolved_b, base_b, "memory_score")
    across = by_hand(evolved_b, base_a, "memory_score")
    assert own.keys() == across.keys() and own != across
    assert rows[evolved_b.run_id].vs_baseline["memory_score"].diff == pytest.approx(
        sum(own.values()) / len(own)
    )
    assert sum(own.values()) != pytest.approx(sum(across.values()))

    # each section prints its own runs and its own model's paired numbers, with its own baseline
    section_a, section_b = sections(table)
    for section, evolved, base in ((section_a, evolved_a, base_a), (section_b, evolved_b, base_b)):
        marginal = cells_of(section.split("within each run")[0])
        # the objective (state accuracy, set in write_config) is the first metric column
        assert ["condition", "selected", "n", "state_acc (objective)"] in [c[:4] for c in marginal]
        shown = [(c[0], c[3]) for c in marginal if c[0] in ("none/none", "complete/reflective")]
        assert shown == [
            (
                f"{o.mode}/{o.evolver}",
                f"{o.cycles[o.selection.cycle].score('test', 'state_accuracy'):.3f}",
            )
            for o in (base, evolved)
        ]
        assert section.count("paired with the baseline none/none on the same users") == 1
        assert not rows[evolved.run_id].same_prompt_as_baseline  # numbers, not `same prompt`
        cells = paired_cells(section)
        assert [COLUMNS[c[1]] for c in cells] == list(METRICS)
        for c in cells:
            diffs = by_hand(evolved, base, COLUMNS[c[1]])
            counts = [sum(d > 0 for d in diffs.values()), sum(d == 0 for d in diffs.values())]
            counts.append(len(diffs) - sum(counts))
            assert c[2:4] == [str(len(diffs)), mean_cell(diffs)]
            assert c[-1] == "/".join(map(str, counts))
    (memory_b,) = [c for c in paired_cells(section_b) if c[1] == "mem_score"]
    assert memory_b[3] == mean_cell(own) != mean_cell(across)

    # the plot's lines and the prompt diff say which group a run is of
    labels = [h.label for h in run_histories(result["rows"])]
    assert labels == [  # mode / evolver / agent model (the groups' setting: not said twice)
        "none (no evolution) / model-a",
        "complete / reflective / model-a",
        "none (no evolution) / model-b",
        "complete / reflective / model-b",
    ]
    diff = compare(config.tracking_uri, "unit", run=evolved_b.run_id)["diff"]
    assert diff.splitlines()[0].startswith(
        f"run {rows[evolved_b.run_id].name} (runs with endpoints.*.model = model-b): prompts"
    )


def test_an_explicit_baseline_is_picked_within_its_group_only(two_models):
    from memloop.results.compare import compare

    config, (base_a, evolved_a), (base_b, evolved_b) = two_models
    # a run id: the baseline of its own group; the other group has none
    result = compare(config.tracking_uri, "unit", baseline=evolved_a.run_id)
    rows = {r.run_id: r for r in result["rows"]}
    assert rows[base_a.run_id].baseline is rows[evolved_a.run_id]
    for metric in METRICS:
        diffs = by_hand(base_a, evolved_a, metric)
        assert rows[base_a.run_id].vs_baseline[metric].n == len(diffs)
    assert rows[base_b.run_id].baseline is None and rows[evolved_b.run_id].baseline is None
    section_a, section_b = sections(result["table"])
    assert "paired with the baseline complete/reflective" in section_a
    assert NO_BASELINE not in section_a
    assert "paired with the baseline" not in section_b and NO_BASELINE in section_b
    # a condition: each group's own run of it
    result = compare(config.tracking_uri, "unit", baseline="complete/reflective")
    rows = {r.run_id: r for r in result["rows"]}
    assert rows[base_a.run_id].baseline is rows[evolved_a.run_id]
    assert rows[base_b.run_id].baseline is rows[evolved_b.run_id]


def test_a_group_without_a_baseline_is_shown_unpaired_with_a_note(tmp_path, capsys):
    from memloop.experiments.cli import main
    from memloop.results.compare import compare

    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        config, (base_a, evolved_a) = evolve(tmp_path, fake, "model-a")
        _, (evolved_b,) = evolve(tmp_path, fake, "model-b", feedback_modes=["complete"])
    result = compare(config.tracking_uri, "unit")
    rows = {r.run_id: r for r in result["rows"]}
    lone = rows[evolved_b.run_id]
    assert lone.baseline is None and lone.vs_baseline == {} and not lone.is_baseline
    assert rows[evolved_a.run_id].baseline is rows[base_a.run_id]
    diffs = by_hand(evolved_a, base_a, "state_accuracy")
    assert rows[evolved_a.run_id].vs_baseline["state_accuracy"].diff == pytest.approx(
        sum(diffs.values()) / len(diffs)
    )
    assert [g.note for g in result["groups"]] == [None, NO_BASELINE]
    section_a, section_b = sections(result["table"])
    assert section_b.startswith("2: runs with endpoints.*.model = model-b ===")
    assert "paired with the baseline" not in section_b and paired_cells(section_b) == []
    assert section_b.rstrip().endswith(NO_BASELINE)
    assert result["table"].count(NO_BASELINE) == 1
    # its own numbers are still shown, marginally
    marginal = cells_of(section_b.split("within each run")[0].split("the gate on")[0])
    assert [c[0] for c in marginal if c[0].startswith("complete")] == ["complete/reflective"]
    assert [c[1] for c in paired_cells(section_a)][:1] in (["state_acc"], ["all"])
    # the CLI prints the same, and its plot follows the groups
    plot = tmp_path / "cmp.png"
    argv = ["compare", "--experiment", "unit", "--tracking-uri", config.tracking_uri]
    assert main([*argv, "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert result["table"] in out and plot.exists()


# -- runs logged by hand: older runs, and headings ------------------------------------------------


def log_run(mlc, exp, key, *, mode, evolver, per_user, like=None, spec=None):
    """An MLflow run as evolve logs it: one cycle, `spec.*` params and (if given) `memloop.like`."""
    from memloop.runs import tracker
    from memloop.runs.cycles import CycleRecord, SplitResult

    split = SplitResult(
        users=len(per_user),
        memory_score=sum(per_user.values()) / len(per_user),
        overall=0.5,
        factual_recall=None,
        write=0.5,
        read=0.0,
        utilization=0.0,
        per_user={u: {"memory_score": v, "overall": 0.5} for u, v in per_user.items()},
    )
    record = CycleRecord(cycle=0, splits={"test": split})
    tags = {"memloop.feedback_mode": mode, "memloop.evolver": evolver}
    if like is not None:
        tags["memloop.like"] = like
    params = {f"spec.{k}": v for k, v in (spec or {"a": "1"}).items()}
    rid, _ = tracker.open_run(mlc, exp, key, key, params, tags=tags)
    tracker.log_text(mlc, rid, record.model_dump_json(), "cycle/cycle_00.json")
    tracker.log_text(mlc, rid, json.dumps({"writer": key}), "prompts/cycle_00.json")
    return rid


def spec(agent: str, users: str = '["u0", "u1"]') -> dict[str, str]:
    roles = {f"endpoints.{r}.model": "m" for r in ("user_sim", "checker", "optimizer")}
    return {
        "kind": "evolve",
        "users.test": users,
        "endpoints.agent.model": agent,
        **roles,
        "mode": "x",  # the optimizer's choices and the key never head a group
        "optimizer.evolver": "x",
        "key": agent + users,
    }


def test_older_runs_form_their_own_unpaired_group_and_headings_name_what_differs(tmp_path):
    from memloop.core.errors import UserError
    from memloop.results.compare import compare
    from memloop.runs import tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlc = tracker.client(uri)
    exp = tracker.experiment_id(mlc, "mixed", uri)
    base = {"u0": 0.25, "u1": 0.5}
    up = {"u0": 0.5, "u1": 1.0}
    for key, like, agent in (("a", "like-a", "big"), ("b", "like-b", "small")):
        s = {**spec(agent), "mode": "none", "optimizer.evolver": "none"}
        log_run(
            mlc, exp, f"{key}-base", mode="none", evolver="none", per_user=base, like=like, spec=s
        )
        log_run(
            mlc,
            exp,
            f"{key}-evo",
            mode="complete",
            evolver="reflective",
            per_user=up,
            like=like,
            spec={**spec(agent), "mode": "complete"},
        )
    log_run(mlc, exp, "old-base", mode="none", evolver="none", per_user=base)
    log_run(mlc, exp, "old-evo", mode="complete", evolver="reflective", per_user=up)

    result = compare(uri, "mixed")
    names = {r.name: r for r in result["rows"]}
    # only the agent's model differs: named alone, the other roles' models are shared
    assert [g.heading for g in result["groups"]] == [
        "runs with endpoints.agent.model = big",
        "runs with endpoints.agent.model = small",
        "runs logged by an older memloop (no run spec)",
    ]
    assert names["a-evo"].baseline is names["a-base"]
    assert names["b-evo"].baseline is names["b-base"]
    assert names["a-evo"].vs_baseline["memory_score"].diff == pytest.approx(0.375)
    # the older runs are shown, never paired (not even with each other), with one note
    assert names["old-evo"].baseline is None and names["old-base"].baseline is None
    assert not names["old-evo"].vs_baseline
    old_section = sections(result["table"])[2]
    assert old_section.startswith("3: runs logged by an older memloop (no run spec) ===")
    assert "paired with the baseline" not in old_section
    # the note ends the section (wrapped at 100 columns: compared with its spaces joined)
    from memloop.results.rows import OLDER_NOTE

    assert " ".join(old_section.split()).endswith(OLDER_NOTE) and OLDER_NOTE.startswith(OLDER)
    assert result["table"].count(OLDER) == 1
    # an older run named as the baseline is refused in one line
    with pytest.raises(UserError, match="'old-base' in 'mixed' was logged by an older memloop"):
        compare(uri, "mixed", baseline="old-base")

    # several settings differ: each named, the role models merged; long values cut
    exp2 = tracker.experiment_id(mlc, "users", uri)
    many = json.dumps([f"user-{i:03d}" for i in range(20)])
    log_run(
        mlc,
        exp2,
        "x",
        mode="none",
        evolver="none",
        per_user=base,
        like="x",
        spec={**spec("m"), "key": "x"},
    )
    log_run(
        mlc,
        exp2,
        "y",
        mode="none",
        evolver="none",
        per_user=base,
        like="y",
        spec={
            **spec("q", many),
            **{f"endpoints.{r}.model": "q" for r in ("user_sim", "checker", "optimizer")},
        },
    )
    headings = [g.heading for g in compare(uri, "users")["groups"]]
    assert headings == [
        'runs with users.test = ["u0", "u1"], endpoints.*.model = m',
        f"runs with users.test = {many[:37]}..., endpoints.*.model = q",
    ]


def test_a_single_group_keeps_its_layout(two_models):
    """One model's runs alone: no group headings or notes, and the tables its group shows."""
    from memloop.results.compare import compare
    from memloop.results.tables import format_rows

    config, (base_a, evolved_a), _ = two_models
    result = compare(config.tracking_uri, "unit")
    rows = [r for r in result["rows"] if r.run_id in (base_a.run_id, evolved_a.run_id)]
    table = format_rows(rows)
    assert table.startswith("marginal (each condition alone")
    assert "=== group" not in table and NO_BASELINE not in table and OLDER not in table
    body = table.split("\nmean diff:")[0]
    assert body == sections(result["table"])[0].split(" ===\n", 1)[1].rstrip("\n")


def test_the_default_prompt_diff_is_the_best_evolving_runs_never_the_no_evolution_run():
    from types import SimpleNamespace

    from memloop.results.compare import default_diff_run

    def run(name, mode, evolver, selected):
        return SimpleNamespace(name=name, feedback_mode=mode, evolver=evolver, selected=selected)

    baseline = run("none", "none", "none", 0.9)  # the best score, but nothing evolved
    first = run("complete-edits", "complete", "edits", 0.4)
    better = run("complete-reflective", "complete", "reflective", 0.6)
    unscored = run("brief-playbook", "brief", "playbook", None)
    no_evolver = run("complete-none", "complete", "none", 0.95)
    rows = [baseline, first, better, unscored, no_evolver]
    assert default_diff_run(rows) is better
    assert default_diff_run([baseline, first, run("tie", "brief", "edits", 0.4)]) is first
    assert default_diff_run([baseline, no_evolver]) is no_evolver
