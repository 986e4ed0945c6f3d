"""`memloop evolve` and `memloop tune`: the optimizer's commands."""

from __future__ import annotations

import argparse

from memloop.experiments.commands.options import (
    add_cycles_option,
    add_format_option,
    add_progress_option,
    at_least_one,
)


def register_evolve(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser(
        "evolve",
        help="run evolution cycles from an experiment YAML",
        description="Cycles of episodes -> probes -> feedback summary -> evolver "
        "-> new prompts, logged to MLflow. A killed run, started again, "
        "continues the same MLflow run from its last finished cycle.",
        example="memloop evolve memloop/experiments/evolve/complete.yaml --cycles 2",
    )
    ev.add_argument("config", metavar="YAML", help="e.g. memloop/experiments/evolve/complete.yaml")
    add_cycles_option(ev)
    add_progress_option(ev)
    ev.set_defaults(func=run_evolve_cmd)


def run_evolve_cmd(args: argparse.Namespace) -> int:
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.optimize.report import print_outcomes

    config = load_config(args.config, EvolveConfig)
    at_least_one(args, "cycles")
    if args.cycles is not None:
        config.cycles = args.cycles
    outcomes = run_evolve(config, progress=not args.no_progress)
    print_outcomes(config, outcomes)
    return 0


def register_tune(sub: argparse._SubParsersAction) -> None:
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
    add_progress_option(tu)
    tu.set_defaults(func=run_tune_cmd)


def run_tune_cmd(args: argparse.Namespace) -> int:
    from memloop.optimize.config import TuneConfig, load_config
    from memloop.optimize.tune import format_outcome, run_tune

    config = load_config(args.config, TuneConfig)
    at_least_one(args, "trials")
    if args.trials is not None:
        config.trials = args.trials
    print(format_outcome(run_tune(config, progress=not args.no_progress), args.format))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """The commands of this module, in the order `memloop --help` lists them."""
    register_evolve(sub)
    register_tune(sub)
