"""Plots of evolution runs: memory score, state accuracy and factual recall per cycle.

One line per condition.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_cycles(outcomes: list[Any], path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from memloop.feedback.report import style_memory_score_axis

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    keys = ("memory_score", "state_accuracy", "factual_recall")
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--")]
    n = len(outcomes)
    scores: list[float] = []
    for i, o in enumerate(outcomes):
        label = o.mode if o.evolver in ("none", "reflective") else f"{o.mode} / {o.evolver}"
        marker, line = styles[i % len(styles)]
        dodge = (i - (n - 1) / 2) * 0.04  # equal values stay visible side by side
        for ax, key in zip(axes, keys, strict=True):
            points = [(c["cycle"], c[key]) for c in o.cycles if c.get(key) is not None]
            if key == "memory_score":
                scores += [v for _, v in points]
            if points:
                ax.plot(
                    [p + dodge for p, _ in points],
                    [v for _, v in points],
                    marker=marker,
                    linestyle=line,
                    label=label,
                )
    names = ("normalized memory score", "state accuracy", "memory factual recall")
    for ax, name in zip(axes, names, strict=True):
        ax.set(xlabel="cycle", ylabel=name, title=name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.get_legend_handles_labels()[0]:  # a panel with no defined value has no lines
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "undefined", ha="center", va="center", transform=ax.transAxes)
    style_memory_score_axis(axes[0], scores)
    axes[1].set_ylim(-0.02, 1.02)
    axes[2].set_ylim(-0.02, 1.02)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
