"""`memloop quickstart`: the whole toolkit in one command with no key and no network.

A procedural environment with training, validation and test users; AWI without evolution and
with the playbook evolver; MLflow logging; the paired comparison on the test users; the prompt
diff; and a plot of memory score, state accuracy and factual recall per cycle.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from memloop.core.settings import DEFAULT_TRACKING_URI
from memloop.core.tables import format_number, format_table
from memloop.experiments.commands.optimize_cmd import every_role_clients
from memloop.experiments.commands.options import (
    add_cycles_option,
    add_endpoint_options,
    add_format_option,
    add_progress_option,
    add_tracking_uri_option,
    at_least_one,
)
from memloop.feedback.metrics import headline_metrics, metric_column, objective_first

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "quickstart.yaml"


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser(
        "quickstart",
        help="run a small end-to-end evolution experiment",
        description=__doc__,
        example="memloop quickstart --cycles 1 --format md",
    )
    q.add_argument(
        "--config",
        default=str(DEFAULT_CONFIG),
        metavar="YAML",
        help="experiment file (default: memloop/experiments/quickstart.yaml)",
    )
    add_endpoint_options(
        q, "one endpoint for every role (default: the config's, the embedded models)"
    )
    add_cycles_option(q)
    add_tracking_uri_option(q, f"MLflow store (default: {DEFAULT_TRACKING_URI})", default=None)
    q.add_argument(
        "--out",
        metavar="DIR",
        default="runs/quickstart",
        help="run folders and the plot",
    )
    add_format_option(q)
    add_progress_option(q)
    q.set_defaults(func=run_quickstart)


def run_quickstart(args: argparse.Namespace) -> int:
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.results.compare import compare
    from memloop.results.plots import plot_cycles

    started = time.perf_counter()
    config = load_config(args.config, EvolveConfig)
    at_least_one(args, "cycles")
    if args.cycles is not None:
        config.cycles = args.cycles
    clients = every_role_clients(args, config)
    if args.tracking_uri:
        config.tracking_uri = args.tracking_uri
    config.out_dir = args.out
    # with --format csv stdout holds the CSV alone: the runs' own lines go to stderr
    with contextlib.redirect_stdout(sys.stderr if args.format == "csv" else sys.stdout):
        outcomes = run_evolve(config, progress=not args.no_progress, clients=clients)
    evolving = [o for o in outcomes if o.evolver != "none"]
    shown = evolving[-1] if evolving else outcomes[-1]
    result = compare(config.tracking_uri, config.experiment_name, run=shown.run_id, to="last")
    plot = Path(args.out) / "quickstart.png"
    from memloop.results.compare import run_histories
    from memloop.runs import tracker

    figures = plot_cycles(
        run_histories(result["rows"]),
        plot,
        title=f"AWI prompt evolution ({config.experiment_name})",
    )
    mlc = tracker.client(config.tracking_uri)
    for row in result["rows"]:  # the comparison figure goes to every run it shows
        tracker.log_figure(mlc, row.run_id, [p for p in figures if p.suffix in (".png", ".svg")])
    from memloop.results.tables import compare_blocks, csv_parts, format_rows, one_csv

    fmt = args.format
    info = sys.stderr if fmt == "csv" else sys.stdout  # stdout: the CSV tables alone
    if fmt == "csv":  # one table: the comparison's tables and the per-cycle one
        per_cycle = ("per cycle", None, per_cycle_table(result["rows"], fmt))
        print(one_csv([*csv_parts(compare_blocks(result["rows"])), per_cycle]))
    else:
        print()
        print(per_cycle_table(result["rows"], fmt))
        print()
        print(result["table"] if fmt == "table" else format_rows(result["rows"], fmt))
    print(file=info)
    print(f"```diff\n{result['diff']}\n```" if fmt == "md" else result["diff"], file=info)
    print(file=info)
    for line in loop_lines(evolving):
        print(line, file=info)
    print(file=info)
    print(detectable_line(result["rows"]), file=info)
    print(f"\nplot: {plot}", file=info)
    print(f"MLflow: {config.tracking_uri} (browse with `memloop ui`)", file=info)
    cache = clients.agent.cache
    if cache is not None:
        print(
            f"model responses this run: {cache.stores} new, {cache.hits} from the response cache",
            file=info,
        )
    print(f"wall time: {time.perf_counter() - started:.0f} s", file=info)
    return 0


def loop_lines(outcomes) -> list[str]:
    """What the loop did in each evolving run, as lines.

    The seed prompt, each step's chosen edit and the named failures it addressed, the sentences
    it changed, the edits refused and why, and the selection's gate (optimize/report.py's step
    and selection lines): never a bare "unchanged".
    """
    from memloop.optimize.report import selection_line, step_lines
    from memloop.runs.store import CycleStore

    lines = []
    for o in outcomes:
        lines.append(f"what the loop did ({o.mode}/{o.evolver}):")
        for predictor, text in (CycleStore(o.run_dir).saved_prompts(0) or {}).items():
            lines.append(f"  seed {predictor} prompt: {' '.join(text.split())}")
        lines += [f"  {line}" for line in step_lines(o)] or ["  (no evolution step ran)"]
        lines.append(f"  selection: {selection_line(o)}")
    return lines


def detectable_line(rows) -> str:
    """What this many test users could detect: the minimum detectable effect at 80% power.

    On the measure the runs ranked on when it is state_prob (the letter read), else state
    accuracy: from the spread of its per-user differences between the evolved run and the
    baseline; when they do not vary (the same prompt, or no change), from sqrt(2) x the spread of
    the baseline's per-user values (the SD of a difference of two independent arms with that
    spread: a planning guess, said so).
    """
    import math
    import statistics

    from memloop.core.stats import detectable_effect
    from memloop.results.tables import shared_objective

    shown = [r for r in rows if r.baseline is not None and r is not r.baseline]
    if not shown:
        return "detectable effect: no run paired with a baseline"
    row = shown[-1]
    metric = "state_prob" if shared_objective(rows) == "state_prob" else "state_accuracy"
    mine = row.per_user.get(metric, {})
    base = row.baseline.per_user.get(metric, {}) if row.baseline else {}
    users = sorted(set(mine) & set(base))
    if len(users) < 2:
        return f"detectable effect: {len(users)} paired test user(s), too few for a t test"
    diffs = [mine[u] - base[u] for u in users]
    spread, source = statistics.stdev(diffs), "paired differences"
    if spread == 0:
        spread = math.sqrt(2) * statistics.stdev(base[u] for u in users)
        source = "no difference varied: sqrt(2) x the baseline's SD, a planning guess"
    if spread == 0:
        return f"detectable effect: no spread across the {len(users)} test users to plan from"
    effect = detectable_effect(len(users), spread)
    return (
        f"detectable effect: with {len(users)} test users and a per-user SD of {spread:.3f} "
        f"({source}), a {metric.replace('_', ' ')} difference below {effect:.2f} is not "
        "detectable at 80% "
        "power (two-sided 0.05): `memloop power --sd SD --effect E` gives the users E needs"
    )


def per_cycle_table(rows, fmt: str = "table") -> str:
    """The objective's measure, then memory score and factual recall, per cycle and run.

    On the headline users. As text one cell per cycle (`0.50 / n/a / 0.25`); as CSV or Markdown
    one row per run and cycle, a column per measure.
    """
    from memloop.results.tables import shared_objective

    objective = shared_objective(rows) if rows else None
    metrics = objective_first(headline_metrics(), objective)
    heads = [metric_column(m, objective=m == objective) for m in metrics]
    split = rows[0].split if rows else "test"

    def name(r) -> str:
        return r.condition + (f" r{r.repeat}" if r.repeat else "")

    if fmt != "table":
        long = [
            [name(r), c.cycle, *(c.score(r.split, m) for m in metrics)]
            for r in rows
            for c in r.records
        ]
        table = format_table(["condition", "cycle", *heads], long, digits=2, fmt=fmt)
        if fmt == "csv":
            return table
        return f"{' / '.join(heads)} per cycle on the {split} users:\n\n{table}"
    cycles = max((r.cycles for r in rows), default=0)

    def cell(value: float | None) -> str:
        return format_number(value, 2)

    cells = [
        [name(r)]
        + [" / ".join(cell(c.score(r.split, m)) for m in metrics) for c in r.records]
        + [""] * (cycles - r.cycles)
        for r in rows
    ]
    lines = [
        f"{' / '.join(heads)} per cycle on the {split} users:",
        format_table(["condition"] + [f"cycle {k}" for k in range(cycles)], cells),
    ]
    return "\n".join(lines)
