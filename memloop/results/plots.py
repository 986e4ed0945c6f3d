"""The figure of evolution runs: a panel per metric, a line per run, over the cycles.

Each panel is one metric on the runs' headline split (`compare.curves`): the per-cycle mean over
the users, a shaded 95% Student t interval over the per-user values (`core.stats.t_interval`;
none where fewer than two users have a value or all of them are equal), the chance level where
one is defined (state accuracy: `state_chance`; the normalized memory score: 0 = random
guessing, 1 = the upper bound, `feedback.report.style_memory_score_axis`) and each run's selected
cycle (chosen on the validation users, `cycles.select_cycle`) marked with a star. The title of a
panel names the metric, the split and the number of users; the objective's panel comes first.
A metric no run defines gets no panel. The legend sits below the panels.

`cycle_bands` is the numbers (pure); `cycles_figure` the matplotlib Figure; `plot_cycles` writes
it as PNG, PDF and SVG beside each other, each written atomically (`core.files.atomic_savefig`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memloop.core.files import atomic_savefig
from memloop.core.stats import LEVEL, t_interval
from memloop.feedback.metrics import metric_title, plotted_metrics
from memloop.feedback.objective import Objective

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = (".png", ".pdf", ".svg")
PNG_DPI = 150  # sharp on screen and in a PDF made from the PNG; the PDF and SVG are vectors
PANEL_WIDTH = 4.4  # inches
PANEL_HEIGHT = 3.3
STYLES = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")]
DODGE = 0.05  # x offset between runs, so equal values stay visible side by side
BAND_ALPHA = 0.15
GREY = "0.45"
DATELESS: dict[str, dict[str, Any]] = {".svg": {"Date": None}, ".pdf": {"CreationDate": None}}


@dataclass(frozen=True)
class Band:
    """One cycle of one metric of one run: `n` values, their mean and 95% t interval.

    `low`/`high` are None without an interval (fewer than two values, or all equal;
    `core.stats.no_interval`), and for a cycle drawn from the split's pooled value because its
    record holds no per-user values (runs logged before per-user values were kept).
    """

    cycle: int
    n: int
    mean: float
    low: float | None
    high: float | None


def cycle_bands(per_cycle: Iterable[tuple[int, Sequence[float]]]) -> list[Band]:
    """Per cycle, the mean of its per-user values and their t interval.

    Cycles without values are left out. E.g. [(1, [0.5, 0.75, 1.0, 0.25])] -> mean 0.625,
    0.625 +- t(0.975, 3) x 0.323 / 2.
    """
    out = []
    for cycle, values in per_cycle:
        vals = [float(v) for v in values]
        if not vals:
            continue
        interval = t_interval(vals, LEVEL)
        low, high = interval if interval is not None else (None, None)
        out.append(Band(cycle, len(vals), sum(vals) / len(vals), low, high))
    return out


def metric_bands(history: Any, metric: str) -> list[Band]:
    """`cycle_bands` of one run's `metric` (a `compare.curves` object).

    A cycle whose record holds no per-user values but a pooled value (an old record) is that
    value over the split's users, without interval. A cycle whose pooled value is undefined (the
    tables print `n/a`: the memory score when the upper bound does not beat guessing over the
    split) is not drawn, whatever single users say: the figure and the tables agree.
    """
    out = []
    for c in history.cycles:
        if metric in c and c[metric] is None:
            continue
        values = c.get("per_user", {}).get(metric, [])
        if values:
            out += cycle_bands([(c["cycle"], values)])
        elif not c.get("per_user") and c.get(metric) is not None:
            out.append(Band(c["cycle"], c.get("users", 0), float(c[metric]), None, None))
    return out


def panel_metrics(histories: list[Any]) -> list[str]:
    """The metrics with a value in some run: the runs' objectives first, then the plotted ones.

    The plotted ones are the catalogue's (feedback/metrics.py), in its order; an objective the
    catalogue does not plot (memory gain) is drawn only as a run's objective.
    """
    plotted = plotted_metrics()
    objectives = [h.objective for h in histories if h.objective in (*plotted, *Objective)]
    order = list(dict.fromkeys([*objectives, *plotted]))
    return [m for m in order if any(metric_bands(h, m) for h in histories)]


def _span(values: Iterable[int]) -> str:
    found = sorted(set(values))
    if not found:
        return "n=0"
    return f"n={found[0]}" if len(found) == 1 else f"n={found[0]}–{found[-1]}"


def panel_title(metric: str, histories: list[Any], bands: list[list[Band]]) -> str:
    """`state accuracy (objective) — test users, n=4`: the metric, the split and the users."""
    splits = list(dict.fromkeys(h.split for h, b in zip(histories, bands, strict=True) if b))
    objective = " (objective)" if any(h.objective == metric for h in histories) else ""
    users = _span(band.n for b in bands for band in b)
    return f"{metric_title(metric)}{objective} — {'/'.join(splits)} users, {users}"


def chance_levels(metric: str, histories: list[Any]) -> list[tuple[float, str]]:
    """(value, label) of the metric's chance lines; none for factual recall.

    State accuracy: each distinct `state_chance` of the runs' cycles (one, when the runs share
    their users). The memory score's levels (0 random, 1 upper bound) are drawn by
    `style_memory_score_axis`; memory gain's 0 is no gain over answering without memory.
    """
    if metric == "state_accuracy":
        values = {
            round(c["state_chance"], 6)
            for h in histories
            for c in h.cycles
            if c.get("state_chance") is not None
        }
        return [(v, f"chance {v:.2f}") for v in sorted(values)]
    if metric == "memory_gain":
        return [(0.0, "no gain")]
    return []


def cycles_figure(histories: list[Any], title: str = "") -> Figure:
    """The figure of `histories` (`compare.curves` objects): a panel per defined metric."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    metrics = panel_metrics(histories)
    ncol = 3 if len(metrics) > 1 else 2
    legend_rows = math.ceil((len(histories) + 3) / ncol)
    height = PANEL_HEIGHT + 0.6 + 0.2 * legend_rows  # the panels, the title, the legend
    fig = Figure(figsize=(PANEL_WIDTH * max(1, len(metrics)), height))
    fig.set_layout_engine("constrained")
    caption = (
        f"per-cycle mean over users; shaded: {LEVEL:.0%} t interval over users "
        "(none below 2 users or when all are equal)"
    )
    fig.suptitle(f"{title}\n{caption}" if title else caption, fontsize=10)
    if not metrics:
        fig.text(0.5, 0.5, "no metric is defined for these runs", ha="center", va="center")
        return fig
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    colors = [f"C{i % 10}" for i in range(len(histories))]
    cycles = [c["cycle"] for h in histories for c in h.cycles]
    for ax, metric in zip(axes, metrics, strict=True):
        bands = [metric_bands(h, metric) for h in histories]
        values: list[float] = []
        for i, (h, b) in enumerate(zip(histories, bands, strict=True)):
            if b:
                values += _draw_run(ax, h, b, i, len(histories), colors[i])
        ax.set_title(panel_title(metric, histories, bands), fontsize=9)
        ax.set_xlabel("cycle")
        ax.set_ylabel(metric_title(metric))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(min(cycles) - 0.4, max(cycles) + 0.4)
        ax.grid(axis="y", color="0.9", lw=0.6)
        _style_axis(ax, metric, histories, values)
    handles: list[Any] = [
        Line2D([], [], color=colors[i], marker=marker, ls=line)
        for i, (marker, line) in enumerate(_styles(len(histories)))
    ]
    labels = [h.label for h in histories]
    if any(b.low is not None for h in histories for m in metrics for b in metric_bands(h, m)):
        handles.append(Patch(color="0.5", alpha=BAND_ALPHA * 2))
        labels.append(f"{LEVEL:.0%} t interval")
    if any(h.selected is not None for h in histories):
        handles.append(Line2D([], [], marker="*", ms=11, mfc="white", mec="black", ls="none"))
        labels.append(_selected_label(histories))
    if any(chance_levels(m, histories) for m in metrics) or "memory_score" in metrics:
        handles.append(Line2D([], [], color=GREY, lw=0.9, ls=":"))
        labels.append("chance level")
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=min(len(labels), ncol),
        fontsize=8,
        frameon=False,
    )
    return fig


def _styles(n: int) -> list[tuple[str, str]]:
    return [STYLES[i % len(STYLES)] for i in range(n)]


def _selected_label(histories: list[Any]) -> str:
    rules = {h.selection_rule for h in histories if h.selected is not None}
    if all(r.startswith("best val") for r in rules):
        return "selected on val"
    return "selected cycle (on val; the last one without a val score)"


def _draw_run(ax: Axes, h: Any, bands: list[Band], i: int, runs: int, color: str) -> list[float]:
    """One run's mean line, band and selected-cycle star; the values drawn (for the y range)."""
    marker, line = _styles(i + 1)[i]
    dodge = (i - (runs - 1) / 2) * DODGE
    xs = [b.cycle + dodge for b in bands]
    means = [b.mean for b in bands]
    lows = [b.mean if b.low is None else b.low for b in bands]
    highs = [b.mean if b.high is None else b.high for b in bands]
    ax.plot(xs, means, marker=marker, ls=line, color=color, ms=4.5, lw=1.4, label=h.label)
    if len(bands) > 1:
        ax.fill_between(xs, lows, highs, color=color, alpha=BAND_ALPHA, lw=0)
        for edge in (lows, highs):  # overlapping bands stay told apart by their edges
            ax.plot(xs, edge, color=color, lw=0.6, alpha=0.5, gid="band-edge")
    elif bands[0].low is not None:  # one cycle: a band has no width, an error bar has
        ax.errorbar(xs, means, yerr=[[means[0] - lows[0]], [highs[0] - means[0]]], color=color)
    chosen = [b for b in bands if b.cycle == h.selected]
    if chosen:
        ax.plot(
            [chosen[0].cycle + dodge],
            [chosen[0].mean],
            marker="*",
            ms=12,
            mfc=color,
            mec="black",
            mew=0.8,
            ls="none",
            zorder=5,
            gid="selected",
        )
    return [v for v in [*means, *lows, *highs] if math.isfinite(v)]


def _style_axis(ax: Axes, metric: str, histories: list[Any], values: list[float]) -> None:
    if metric == "memory_score":
        from memloop.feedback.report import style_memory_score_axis

        style_memory_score_axis(ax, values)  # 0 = random (the chance level), 1 = upper bound
        return
    for value, label in chance_levels(metric, histories):
        ax.axhline(value, color=GREY, lw=0.9, ls=":", gid="chance")
        ax.annotate(
            label,
            (1.0, value),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            fontsize=7,
            color=GREY,
        )
    if metric in ("state_accuracy", "state_prob", "factual_recall"):
        ax.set_ylim(-0.02, 1.02)


def figure_paths(path: Path, formats: tuple[str, ...] = FORMATS) -> list[Path]:
    """The files `plot_cycles` writes for `path`: its stem in each of `formats`.

    And `path` itself when it names another format matplotlib writes (`.jpg`).
    """
    suffix = path.suffix.lower()
    stem = path.with_suffix("") if suffix in FORMATS else path
    out = [path if ext == suffix else stem.with_name(stem.name + ext) for ext in formats]
    if path.suffix and suffix not in FORMATS:
        out.insert(0, path)
    return out


# how a whole file of each format ends (matplotlib's files end so; a cut one does not)
ENDINGS = {".png": b"IEND\xaeB`\x82", ".svg": b"</svg>", ".pdf": b"%%EOF"}


def figure_complete(path: Path) -> bool:
    """Whether `path` is a whole figure file: present, not empty, ending as its format ends."""
    try:
        size = path.stat().st_size
        if size == 0:
            return False
        with open(path, "rb") as handle:
            handle.seek(max(0, size - 64))
            tail = handle.read().rstrip()
    except OSError:
        return False
    ending = ENDINGS.get(path.suffix.lower())
    return ending is None or tail.endswith(ending)


def plot_cycles(
    histories: list[Any], path: Path, title: str = "", formats: tuple[str, ...] = FORMATS
) -> list[Path]:
    """`cycles_figure` written as PNG, PDF and SVG (`formats`) beside each other.

    Returns the files written. Text stays text in the SVG and the PDF (editable, small files).
    """
    import matplotlib

    path.parent.mkdir(parents=True, exist_ok=True)
    paths = figure_paths(path, formats)
    # text stays text in the SVG and PDF; the SVG's ids do not change from one run to the next
    with matplotlib.rc_context(
        {"svg.fonttype": "none", "pdf.fonttype": 42, "svg.hashsalt": "memloop"}
    ):
        fig = cycles_figure(histories, title)
        for i, target in enumerate(paths):
            # no creation date: the same runs give the same files
            metadata = DATELESS.get(target.suffix.lower())
            # to a temporary file renamed into place: a kill leaves no empty or cut figure
            atomic_savefig(fig, target, dpi=PNG_DPI, metadata=metadata)
            if i == 0:  # laid out once: the other formats reuse it (a third of the time)
                fig.set_layout_engine("none")
    return paths
