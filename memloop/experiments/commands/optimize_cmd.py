"""`memloop evolve`, `memloop tune`, `memloop compare` and `memloop ui`."""

from __future__ import annotations

import argparse

from memloop.core.settings import DEFAULT_TRACKING_URI
from memloop.experiments.commands.options import add_format_option


def register(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "evolve",
        help="run evolution cycles from an experiment YAML",
        description="Cycles of episodes -> probes -> feedback summary -> evolver "
        "-> new prompts, logged to MLflow. A killed run, started again, "
        "continues the same MLflow run from its last finished cycle.",
        example="memloop evolve memloop/experiments/evolve/complete.yaml --cycles 2",
    )
    ev.add_argument("config", metavar="YAML", help="e.g. memloop/experiments/evolve/complete.yaml")
    ev.add_argument("--cycles", type=int, help="override the number of cycles")
    ev.add_argument("--no-progress", action="store_true", help="no progress bars")
    ev.set_defaults(func=run_evolve_cmd)
    register_more(sub)


def run_evolve_cmd(args: argparse.Namespace) -> int:
    from memloop.core.errors import UserError
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.optimize.report import print_outcomes

    config = load_config(args.config, EvolveConfig)
    if args.cycles is not None:
        if args.cycles < 1:
            raise UserError(f"--cycles must be at least 1 (got {args.cycles})")
        config.cycles = args.cycles
    outcomes = run_evolve(config, progress=not args.no_progress)
    print_outcomes(config, outcomes)
    return 0


def register_more(sub: argparse._SubParsersAction) -> None:
    tu = sub.add_parser(
        "tune",
        help="Optuna study over AWE's update_freq, short_term_len, top_k",
        description="Adds `trials` trials to the study named in the YAML "
        "(rerunning grows the same study); the paper's default (2, 4, 30) is "
        "the first trial. Prints the best trials.",
        example="memloop tune memloop/experiments/tune/awe.yaml --trials 1 --format md",
    )
    tu.add_argument("config", metavar="YAML", help="e.g. memloop/experiments/tune/awe.yaml")
    tu.add_argument("--trials", type=int, help="override the number of trials to add")
    add_format_option(tu)
    tu.add_argument("--no-progress", action="store_true", help="no progress bars")
    tu.set_defaults(func=run_tune_cmd)

    cmp = sub.add_parser(
        "compare",
        help="compare the runs of an MLflow experiment",
        description="Each run's prompt selected on validation users, its numbers on the test "
        "users, and each condition paired with the baseline on the same users; then the prompt "
        "diff of one run.",
        example="memloop compare --experiment feedback-modes --format md",
    )
    cmp.add_argument("--experiment", required=True, help="MLflow experiment name")
    cmp.add_argument(
        "--run", help="run name or id whose first/best prompt diff to show (default: the best run)"
    )
    cmp.add_argument(
        "--to",
        choices=["best", "last"],
        default="best",
        help="diff the first cycle's prompt against the one selected on validation users "
        "(best) or the last cycle's",
    )
    cmp.add_argument(
        "--baseline",
        default="none",
        help="the condition every other run is paired with on the same users: a run name or id, "
        "an evolver, or 'feedback/evolver' (default: the run without evolution)",
    )
    cmp.add_argument(
        "--tracking-uri",
        default=DEFAULT_TRACKING_URI,
        help="the MLflow store evolve logged to; it is only read: a store that does not exist is "
        "refused, never created",
    )
    cmp.add_argument(
        "--plot",
        metavar="PNG",
        help="also plot memory score, state accuracy and factual recall per cycle, one line per "
        "run",
    )
    add_format_option(cmp)
    cmp.set_defaults(func=run_compare_cmd)

    ex = sub.add_parser(
        "export",
        help="write an evolve run's prompts as text, a mem0 config or a DSPy program",
        description="Writes the prompts of the cycle selected on validation users (or --cycle) "
        "with where they came from (run, cycle, validation and test score, commit).",
        example="memloop export awi-2-4-complete-reflective --out prompts.txt",
    )
    ex.add_argument(
        "run", metavar="RUN", help="a run folder of `memloop evolve`, or an MLflow run name or id"
    )
    ex.add_argument(
        "--format",
        choices=["text", "mem0", "dspy"],
        default="text",
        help="text: the prompts; mem0: a MemoryConfig with custom_fact_extraction_prompt and "
        "custom_update_memory_prompt (AWE runs); dspy: the policy's program, for "
        "program.load(FILE)",
    )
    ex.add_argument("--cycle", type=int, help="this cycle instead of the one selected")
    ex.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="the file to write; an existing one is replaced only when it is an earlier export "
        "left unchanged (memloop never replaces a file it did not write: it refuses, and writes "
        "nothing)",
    )
    ex.add_argument(
        "--tracking-uri",
        default=DEFAULT_TRACKING_URI,
        help="where to look for RUN when it is no folder; only read",
    )
    ex.set_defaults(func=run_export_cmd)

    ui = sub.add_parser(
        "ui",
        help="open the MLflow UI on 127.0.0.1 (works offline)",
        description="Serve MLflow's web UI for a local store on 127.0.0.1 (Ctrl-C stops it).",
        example="memloop ui --experiment feedback-modes",
    )
    ui.add_argument("--tracking-uri", default=DEFAULT_TRACKING_URI, help="the MLflow store")
    ui.add_argument("--port", type=int, default=5000, help="the port to listen on")
    ui.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes (MLflow's own default of 4 takes longer to start and several GB)",
    )
    ui.add_argument("--experiment", help="print the address of this experiment's runs table")
    ui.set_defaults(func=run_ui_cmd)


def run_tune_cmd(args: argparse.Namespace) -> int:
    from memloop.core.errors import UserError
    from memloop.optimize.config import TuneConfig, load_config
    from memloop.optimize.tune import format_outcome, run_tune

    config = load_config(args.config, TuneConfig)
    if args.trials is not None:
        if args.trials < 1:
            raise UserError(f"--trials must be at least 1 (got {args.trials})")
        config.trials = args.trials
    print(format_outcome(run_tune(config, progress=not args.no_progress), args.format))
    return 0


def run_compare_cmd(args: argparse.Namespace) -> int:
    import sys

    from memloop.results.compare import compare, format_rows

    result = compare(args.tracking_uri, args.experiment, args.run, args.to, args.baseline)
    info = sys.stderr if args.format == "csv" else sys.stdout  # stdout: the CSV alone
    if args.format == "table":
        print(result["table"])
    else:
        print(format_rows(result["rows"], args.format))
    print(file=info)
    print(f"```diff\n{result['diff']}\n```" if args.format == "md" else result["diff"], file=info)
    if args.plot:
        from pathlib import Path

        from memloop.results.compare import run_histories
        from memloop.results.plots import plot_cycles

        written = plot_cycles(run_histories(result["rows"]), Path(args.plot), title=args.experiment)
        print(f"\nplot: {', '.join(str(p) for p in written)}", file=info)
    return 0


def run_export_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memloop.results.export import load_exported, write_export

    exported = load_exported(args.run, args.tracking_uri, args.cycle)
    written = write_export(exported, args.format, Path(args.out))
    print(
        f"cycle {exported.cycle} of {exported.run} ({exported.rule}) -> "
        + ", ".join(str(p) for p in written)
    )
    return 0


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Refuse, in one line, a port out of range or one another program already listens on."""
    import socket

    from memloop.core.errors import UserError

    if not 1 <= port <= 65535:
        raise UserError(f"--port {port}: must be 1-65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UserError(
                f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); "
                "choose another --port"
            ) from None


def run_ui_cmd(args: argparse.Namespace) -> int:
    import os

    from memloop.core.settings import apply_offline_defaults
    from memloop.runs.tracker import check_store

    if args.tracking_uri.startswith(("http://", "https://")):
        # a tracking server serves its own UI: nothing to start
        print(f"{args.tracking_uri} is an MLflow tracking server: its UI is at that address")
        return 0
    from memloop.core.errors import UserError

    if args.workers < 1:
        raise UserError(f"--workers must be at least 1 (got {args.workers})")
    check_port_free(args.port)
    page = ""
    if args.experiment:
        from memloop.runs import tracker

        # the client checks the store as check_store does
        mlc = tracker.client(args.tracking_uri, create=False)
        exp = tracker.find_experiment(mlc, args.experiment)
        if exp is None:
            raise UserError(f"--experiment {args.experiment}: no such experiment in the store")
        page = f"/#/experiments/{exp.experiment_id}/runs"
    else:
        check_store(args.tracking_uri)
    apply_offline_defaults()  # litellm's cost-map fetch deadlocks `mlflow ui` offline
    from memloop.runs.tracker import ui_command

    cmd, env = ui_command(args.tracking_uri, args.port, args.workers)
    os.environ.update(env)
    print(f"MLflow UI on http://127.0.0.1:{args.port}{page} (Ctrl-C to stop)", flush=True)
    os.execvp(cmd[0], cmd)
    return 0
