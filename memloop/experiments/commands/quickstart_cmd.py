"""`memloop quickstart`: the whole toolkit in one command with no key and no network.

A procedural environment with training, validation and test users; AWI without evolution and
with the playbook evolver; MLflow logging; the paired comparison on the test users; the prompt
diff; and a plot of memory score, state accuracy and factual recall per cycle.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from memloop.core.tables import format_number, format_table

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "quickstart.yaml"


def register(sub: argparse._SubParsersAction) -> None:
    q = sub.add_parser(
        "quickstart", help="run a small end-to-end evolution experiment", description=__doc__
    )
    q.add_argument(
        "--config",
        default=str(DEFAULT_CONFIG),
        metavar="YAML",
        help="experiment file (default: memloop/experiments/quickstart.yaml)",
    )
    q.add_argument(
        "--endpoint",
        metavar="FILE",
        help="one endpoint for every role (default: the embedded model)",
    )
    q.add_argument("--cycles", type=int, help="override the number of cycles")
    q.add_argument("--tracking-uri", help="MLflow store (default: sqlite:///mlruns/mlflow.db)")
    q.add_argument(
        "--out",
        metavar="DIR",
        default="runs/quickstart",
        help="run folders and the plot (default: runs/quickstart)",
    )
    q.add_argument("--no-progress", action="store_true")
    q.set_defaults(func=run_quickstart)


def run_quickstart(args: argparse.Namespace) -> int:
    from memloop.core.errors import UserError
    from memloop.optimize.compare import compare
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.optimize.plots import plot_cycles

    started = time.perf_counter()
    config = load_config(args.config, EvolveConfig)
    if args.cycles is not None:
        if args.cycles < 1:
            raise UserError(f"--cycles must be at least 1 (got {args.cycles})")
        config.cycles = args.cycles
    if args.endpoint:
        for role in ("agent", "user_sim", "checker", "optimizer"):
            setattr(config.endpoints, role, args.endpoint)
    if args.tracking_uri:
        config.tracking_uri = args.tracking_uri
    config.out_dir = args.out
    from memloop.optimize.context import role_clients

    clients = role_clients(config.endpoints)
    outcomes = run_evolve(config, progress=not args.no_progress, clients=clients)
    evolving = [o for o in outcomes if o.evolver != "none"]
    shown = evolving[-1] if evolving else outcomes[-1]
    result = compare(config.tracking_uri, config.experiment_name, run=shown.run_id, to="last")
    plot = Path(args.out) / "quickstart.png"
    from memloop.optimize.compare import run_histories

    plot_cycles(
        run_histories(result["rows"]),
        plot,
        title=f"AWI prompt evolution ({config.experiment_name})",
    )
    print()
    print(per_cycle_table(result["rows"]))
    print()
    print(result["table"])
    print()
    print(result["diff"])
    print(f"\nplot: {plot}")
    print(f"MLflow: {config.tracking_uri} (browse with `memloop ui`)")
    cache = clients.agent.cache
    if cache is not None:
        print(f"model responses this run: {cache.stores} new, {cache.hits} from the response cache")
    print(f"wall time: {time.perf_counter() - started:.0f} s")
    return 0


def per_cycle_table(rows) -> str:
    """Memory score / state accuracy / factual recall per cycle on the headline users, per run."""
    cycles = max((r.cycles for r in rows), default=0)

    def cell(value: float | None) -> str:
        return format_number(value, 2)

    cells = [
        [r.feedback_mode]
        + [
            f"{cell(c.score(r.split))} / {cell(c.score(r.split, 'state_accuracy'))} / "
            f"{cell(c.score(r.split, 'factual_recall'))}"
            for c in r.records
        ]
        + [""] * (cycles - r.cycles)
        for r in rows
    ]
    split = rows[0].split if rows else "test"
    lines = [
        f"memory score / state accuracy / factual recall per cycle on the {split} users",
        format_table(["feedback"] + [f"cycle {k}" for k in range(cycles)], cells),
    ]
    return "\n".join(lines)
