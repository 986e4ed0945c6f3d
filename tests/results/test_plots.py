"""The evolution figure (results/plots.py): its numbers (per-cycle means and 95% t intervals over
users), its panels (titles with split and n, chance lines, the selected cycle, no panel for an
undefined metric, the objective first), its files (PNG, PDF, SVG) and its MLflow artifacts at the
end of `memloop evolve` on the fake endpoint and the real sqlite store."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest
from scipy import stats

from memloop.results.compare import curves
from memloop.results.plots import (
    Band,
    cycle_bands,
    cycles_figure,
    figure_paths,
    metric_bands,
    panel_metrics,
    plot_cycles,
)
from memloop.runs.cycles import CycleRecord, Selection, SplitResult
from memloop.testing.paths import REPO

USERS = ("u1", "u2", "u3", "u4")
# state accuracy per user and cycle on the test users; cycle 1 is [0.5, 0.75, 1.0, 0.25]
STATE = {0: [0.25, 0.5, 0.5, 0.25], 1: [0.5, 0.75, 1.0, 0.25], 2: [0.75, 0.75, 1.0, 0.5]}
MEMORY = {0: [0.0, 0.2, -0.2, 0.1], 1: [0.4, 0.3, 0.6, 0.1], 2: [0.5, 0.5, 0.7, 0.2]}
CHANCE = 0.3


def split_result(state: list[float], memory: list[float], *, recall: bool = False) -> SplitResult:
    per_user = {
        u: {
            "memory_score": m,
            "state_accuracy": s,
            "factual_recall": 0.5 if recall else None,
            "memory_gain": 0.1,
        }
        for u, s, m in zip(USERS, state, memory, strict=True)
    }
    return SplitResult(
        users=len(USERS),
        memory_score=statistics.mean(memory),
        overall=0.5,
        factual_recall=0.5 if recall else None,  # undefined: no panel
        write=0.2,
        read=0.2,
        utilization=0.1,
        state_accuracy=statistics.mean(state),
        state_chance=CHANCE,
        per_user=per_user,
    )


def records() -> list[CycleRecord]:
    return [
        CycleRecord(
            cycle=k,
            splits={
                "val": split_result(STATE[k], MEMORY[k]),
                "test": split_result(STATE[k], MEMORY[k]),
            },
        )
        for k in STATE
    ]


def history(objective: str = "state_accuracy", selected: int = 1, **over):
    selection = Selection(cycle=selected, rule=f"best val_{objective}", objective=objective)
    return curves("complete", "playbook", records(), "test", selection=selection, **over)


def t_bounds(values: list[float]) -> tuple[float, float]:
    """The 95% t interval by the formula, independently of core.stats."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean - half, mean + half


def test_cycle_bands_are_the_mean_and_t_interval_over_users():
    (band,) = cycle_bands([(1, [0.5, 0.75, 1.0, 0.25])])
    low, high = t_bounds([0.5, 0.75, 1.0, 0.25])
    assert band.cycle == 1 and band.n == 4
    assert band.mean == pytest.approx(0.625)
    # sd = 0.3227, t(0.975, 3) = 3.1824: 0.625 +- 0.5135
    assert (band.low, band.high) == (pytest.approx(low), pytest.approx(high))
    assert (band.low, band.high) == (
        pytest.approx(0.1115, abs=1e-4),
        pytest.approx(1.1385, abs=1e-4),
    )
    # no interval from one user or from equal values; a cycle without values is left out
    assert cycle_bands([(0, [0.4]), (1, [0.5, 0.5]), (2, [])]) == [
        Band(0, 1, 0.4, None, None),
        Band(1, 2, 0.5, None, None),
    ]


def test_curves_carry_what_the_figure_needs():
    h = history(model="gpt-x", objective="memory_score", selected=2)
    assert h.label == "complete / playbook / gpt-x"
    assert (h.split, h.selected, h.objective) == ("test", 2, "memory_score")
    assert [c["per_user"]["state_accuracy"] for c in h.cycles] == list(STATE.values())
    assert [c["state_chance"] for c in h.cycles] == [CHANCE] * 3
    bands = metric_bands(h, "state_accuracy")
    assert [b.mean for b in bands] == pytest.approx([statistics.mean(v) for v in STATE.values()])
    assert [(b.low, b.high) for b in bands] == [
        (pytest.approx(lo), pytest.approx(hi)) for lo, hi in map(t_bounds, STATE.values())
    ]
    assert metric_bands(h, "factual_recall") == []  # undefined for every user
    base = curves("none", "none", records(), "test", model="gpt-x", settings="gpt-x", repeat=1)
    assert base.label == "none (no evolution) / gpt-x, repeat 1"
    assert base.selected is None and base.objective == "memory_score"  # the legacy objective


def test_an_old_record_without_per_user_values_is_drawn_from_its_pooled_value():
    record = CycleRecord(cycle=0, splits={"test": split_result(STATE[1], MEMORY[1])})
    record.splits["test"].per_user = {}
    h = curves("complete", "playbook", [record], "test")
    assert metric_bands(h, "state_accuracy") == [Band(0, 4, 0.625, None, None)]


def test_a_metric_the_tables_call_undefined_is_not_drawn_from_single_users():
    """The quickstart's memory score: the pooled ratio undefined (n/a in every table) while one
    user's own ratio is -1: no band, so no panel (issue 42's figure/table agreement)."""
    recs = records()
    for r in recs[1:]:
        r.splits["test"].memory_score = None
    h = curves("complete", "playbook", recs, "test")
    assert [b.cycle for b in metric_bands(h, "memory_score")] == [0]
    for r in recs[:1]:
        r.splits["test"].memory_score = None
    h = curves("complete", "playbook", recs, "test")
    assert metric_bands(h, "memory_score") == []
    assert "memory_score" not in panel_metrics([h])
    assert metric_bands(h, "state_accuracy") != []


def _lines(ax):
    return [line for line in ax.get_lines() if len(line.get_xdata()) > 0]


def test_the_figure_panels_titles_chance_and_selected_cycle():
    h = history(objective="state_accuracy", selected=1, model="gpt-x")
    fig = cycles_figure([h], title="unit")
    titles = [ax.get_title() for ax in fig.axes]
    # the objective's panel first; factual recall undefined everywhere: no panel for it
    assert titles == [
        "state accuracy (objective) — test users, n=4",
        "normalized memory score — test users, n=4",
    ]
    state_ax, memory_ax = fig.axes
    # the mean line at the per-cycle means over users
    (mean_line,) = [ln for ln in _lines(state_ax) if ln.get_label() == h.label]
    assert list(mean_line.get_ydata()) == pytest.approx(
        [statistics.mean(v) for v in STATE.values()]
    )
    # the band: the t interval of cycle 1 among the shaded polygon's vertices
    (band,) = state_ax.collections
    ys = {round(float(y), 6) for y in band.get_paths()[0].vertices[:, 1]}
    low, high = t_bounds(STATE[1])
    assert {round(low, 6), round(high, 6)} <= ys
    # the selected cycle: one star per panel, at x = 1 and the cycle's mean
    for ax, values in ((state_ax, STATE[1]), (memory_ax, MEMORY[1])):
        (star,) = [ln for ln in ax.get_lines() if ln.get_gid() == "selected"]
        assert list(star.get_xdata()) == [1] and star.get_marker() == "*"
        assert list(star.get_ydata()) == pytest.approx([statistics.mean(values)])
    # chance lines: state accuracy's state_chance, the memory score's 0 (random)
    (chance,) = [ln for ln in state_ax.get_lines() if ln.get_gid() == "chance"]
    assert list(chance.get_ydata()) == [CHANCE, CHANCE]
    flat = [list(ln.get_ydata()) for ln in memory_ax.get_lines()]
    assert [0, 0] in flat and [1, 1] in flat  # random and the upper bound
    # the legend below the panels, naming the run, the band, the star and the chance line
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == [
        "complete / playbook / gpt-x",
        "95% t interval",
        "selected on val",
        "chance level",
    ]
    fig.canvas.draw()  # the layout is made on drawing
    box = legend.get_window_extent()
    assert all(box.y1 <= ax.get_window_extent().y0 for ax in fig.axes)


def test_the_memory_score_objective_comes_first_and_a_defined_recall_gets_its_panel():
    rec = records()
    for r in rec:
        r.splits["test"] = split_result(STATE[r.cycle], MEMORY[r.cycle], recall=True)
    selection = Selection(cycle=2, rule="best val_memory_score", objective="memory_score")
    h = curves("complete", "playbook", rec, "test", selection=selection)
    titles = [ax.get_title() for ax in cycles_figure([h]).axes]
    assert titles == [
        "normalized memory score (objective) — test users, n=4",
        "state accuracy — test users, n=4",
        "memory factual recall — test users, n=4",
    ]


def test_plot_cycles_writes_png_pdf_and_svg(tmp_path):
    a = history(model="gpt-x")
    b = curves("none", "none", records()[:2], "test", model="gpt-x")
    written = plot_cycles([a, b], tmp_path / "out" / "figure.png", title="unit")
    assert written == [tmp_path / "out" / f"figure{ext}" for ext in (".png", ".pdf", ".svg")]
    for path in written:
        assert 1000 < path.stat().st_size < 400_000, path
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert written[1].read_bytes()[:5] == b"%PDF-"
    svg = written[2].read_text()
    assert "n=4" in svg and "selected on val" in svg  # text stays text
    assert figure_paths(Path("x/plot")) == [
        Path("x/plot.png"),
        Path("x/plot.pdf"),
        Path("x/plot.svg"),
    ]
    assert figure_paths(Path("x/plot.jpg"))[0] == Path("x/plot.jpg")


def test_evolve_logs_each_runs_figure_to_its_mlflow_run(tmp_path):
    from memloop.optimize.evolve import run_evolve
    from memloop.runs import tracker
    from memloop.testing import FakeOpenAIServer, evolve_loop_reply, fake_roles, scripted_builder
    from memloop.testing.commands import small_evolve

    config = small_evolve(
        tmp_path, "figures", (1, 1, 1), periods=1, feedback_modes=["none", "complete"], cycles=2
    )
    fake = FakeOpenAIServer(reply=evolve_loop_reply).__enter__()  # one port: one run identity
    roles = fake_roles(fake.base_url, tmp_path / "c.sqlite")
    outcomes = run_evolve(config, progress=False, clients=roles, builder=scripted_builder())
    mlc = tracker.client(config.tracking_uri, create=False)
    assert len(outcomes) == 2
    for o in outcomes:
        logged = {a.path for a in mlc.list_artifacts(o.run_id, "figures")}
        assert logged == {"figures/cycles.png", "figures/cycles.svg"}, logged
        for ext in (".png", ".svg"):
            assert (o.run_dir / "figures" / f"cycles{ext}").stat().st_size > 1000
        assert mlc.get_run(o.run_id).info.status == "FINISHED"
    # a rerun that adds no cycle leaves the figure as it is; a cycle record newer than the
    # figure (a cycle finished since) has it drawn again
    import os

    def drawn():
        return {
            o.run_dir: (o.run_dir / "figures" / "cycles.png").stat().st_mtime_ns for o in outcomes
        }

    before = drawn()
    try:
        again = run_evolve(config, progress=False, clients=roles, builder=scripted_builder())
        assert [o.run_dir for o in again] == list(before) and drawn() == before
        newer = before[outcomes[0].run_dir] + 10**9
        os.utime(outcomes[0].run_dir / "cycle_01" / "cycle.json", ns=(newer, newer))
        run_evolve(config, progress=False, clients=roles, builder=scripted_builder())
    finally:
        fake.__exit__(None, None, None)
    after = drawn()
    assert after[outcomes[0].run_dir] > before[outcomes[0].run_dir]
    assert after[outcomes[1].run_dir] == before[outcomes[1].run_dir]


def test_one_user_has_no_interval_and_the_legend_says_none():
    one = CycleRecord(cycle=0, splits={"test": split_result(STATE[1], MEMORY[1])})
    one.splits["test"].per_user = {"u1": one.splits["test"].per_user["u1"]}
    h = curves("complete", "playbook", [one], "test")
    fig = cycles_figure([h])
    assert [ax.get_title() for ax in fig.axes][0].endswith("test users, n=1")
    assert all(not ax.collections for ax in fig.axes)  # no band
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "95% t interval" not in texts and "selected on val" not in texts  # nor a selection


def test_the_quickstart_logs_its_figure_to_each_of_its_runs(tmp_path, capsys):
    """The quickstart on the fake endpoint (every role), shrunk: its comparison figure is written
    as PNG, PDF and SVG and logged to both runs beside each run's own figure."""
    import yaml

    from memloop.experiments.cli import main
    from memloop.runs import tracker
    from memloop.testing import FakeOpenAIServer, evolve_loop_reply

    root = REPO
    config = yaml.safe_load((root / "memloop/experiments/quickstart.yaml").read_text())
    config.update(
        experiment="quickstart-figure",
        environment={
            "procedural": {"users": 4, "periods": 1, "questions": 1, "seed": 1},
            "train_users": 1,
            "val_users": 1,
            "test_users": 2,
        },
        policy=str(root / "memloop/experiments/policies/awi-quickstart.yaml"),
    )
    config.pop("endpoints")
    (tmp_path / "quickstart.yaml").write_text(yaml.safe_dump(config))
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        (tmp_path / "endpoint.yaml").write_text(f"model: fake-m\nbase_url: {fake.base_url}\n")
        argv = ["quickstart", "--config", str(tmp_path / "quickstart.yaml"), "--cycles", "1"]
        argv += ["--endpoint", str(tmp_path / "endpoint.yaml"), "--out", str(tmp_path / "out")]
        assert main([*argv, "--tracking-uri", uri, "--no-progress"]) == 0
        assert f"plot: {tmp_path / 'out' / 'quickstart.png'}" in capsys.readouterr().out
        # rerun from the cache, as CSV: one table (a `table` column), the rest on stderr
        assert main([*argv, "--tracking-uri", uri, "--no-progress", "--format", "csv"]) == 0
    import io

    import pandas

    out = capsys.readouterr().out
    frame = pandas.read_csv(io.StringIO(out), dtype=str, keep_default_na=False)
    assert list(frame.columns[:3]) == ["table", "condition", "selected"]
    assert {"marginal", "within each run", "per cycle"} <= set(frame["table"])
    per_cycle = frame[frame["table"] == "per cycle"]
    assert list(per_cycle["cycle"]) == ["0", "0"]  # 2 runs x their one cycle (--cycles 1)
    for ext in (".png", ".pdf", ".svg"):
        assert (tmp_path / "out" / f"quickstart{ext}").stat().st_size > 1000
    mlc = tracker.client(uri, create=False)
    runs = mlc.search_runs([mlc.get_experiment_by_name("quickstart-figure").experiment_id])
    assert len(runs) == 2
    for run in runs:
        assert {a.path for a in mlc.list_artifacts(run.info.run_id, "figures")} == {
            f"figures/{stem}{ext}" for stem in ("cycles", "quickstart") for ext in (".png", ".svg")
        }


def test_a_non_latin_name_is_drawn_without_glyph_warnings(tmp_path):
    """Characters the figure's font has no glyph for become a drawn box, with no warning."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memloop.core.files import MISSING_GLYPH, atomic_savefig

    fig, ax = plt.subplots()
    fig.suptitle("实验 évolution")  # CJK: not in DejaVu Sans; é: in it
    ax.plot([0, 1], [0, 1], label="données")
    ax.legend()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a glyph warning would fail the save
        atomic_savefig(fig, tmp_path / "f.png")
        atomic_savefig(fig, tmp_path / "f.svg")
    assert fig._suptitle.get_text() == f"{MISSING_GLYPH * 2} évolution"
    assert ax.get_legend().get_texts()[0].get_text() == "données"
    plt.close(fig)
    # without the replacement matplotlib warns: the test sees the warning it prevents
    fig, _ = plt.subplots()
    fig.suptitle("实验")
    with pytest.warns(UserWarning, match="missing from font"):
        fig.savefig(tmp_path / "raw.png")
    plt.close(fig)
