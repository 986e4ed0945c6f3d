"""`memloop evolve` and `memloop tune`: the optimizer's commands."""

from __future__ import annotations

import argparse
from typing import Any

from memloop.core.errors import UserError
from memloop.experiments.commands.options import (
    add_cycles_option,
    add_endpoint_options,
    add_format_option,
    add_objective_option,
    add_progress_option,
    add_tracking_uri_option,
    at_least_one,
    endpoint_ref,
)

EVERY_ROLE_HELP = (
    "endpoint YAML for every role (the assistant, the simulated user, the recall checker, the "
    "optimizer), in place of the experiment YAML's endpoints:"
)


def every_role_clients(args: argparse.Namespace, config: Any) -> Any:
    """The RoleClients of an experiment `config` (evolve, tune, quickstart) and the command line.

    `--endpoint FILE` or `--model NAME [--base-url URL]` (add_endpoint_options) puts every role
    on that endpoint, as `endpoints:` naming it for each role would; else the YAML's `endpoints:`.
    A file given here becomes the config's, so the run's identity names it.
    """
    from memloop.optimize.context import role_clients
    from memloop.runs.inputs import roles

    ref = endpoint_ref(args)
    if isinstance(ref, str):
        for role in ("agent", "user_sim", "checker", "optimizer"):
            setattr(config.endpoints, role, ref)
    clients = role_clients(config.endpoints) if ref is None or isinstance(ref, str) else roles(ref)
    clients.preflight()  # an unreachable server, a bad key or model: one line, before progress
    return clients


def set_objective(config: Any, args: argparse.Namespace) -> None:
    """`--objective` in place of the YAML's `objective:` (a run's spec records the one used)."""
    if args.objective is not None:
        from memloop.feedback.objective import Objective

        config.objective = Objective(args.objective)


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """`--confirm-users N` and `--tracking-uri URI`, in place of the YAML's values."""
    parser.add_argument(
        "--confirm-users",
        type=int,
        metavar="N",
        help="fresh users after the test users that the loop never reads; the run's one "
        "pre-declared candidate is compared with the seed on them, once (environment."
        "confirm_users; a procedural environment grows to have them)",
    )
    add_tracking_uri_option(
        parser, "the MLflow store (default: the YAML's tracking_uri)", default=None
    )


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The YAML keys `add_run_options` replaces (None: the YAML's own)."""
    if args.confirm_users is not None and args.confirm_users < 0:
        raise UserError(f"--confirm-users must be at least 0 (got {args.confirm_users})")
    return {"environment.confirm_users": args.confirm_users, "tracking_uri": args.tracking_uri}


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
    add_objective_option(ev, "the validation measure the cycles are selected on")
    add_run_options(ev)
    add_endpoint_options(ev, EVERY_ROLE_HELP)
    add_progress_option(ev)
    ev.set_defaults(func=run_evolve_cmd)


def run_evolve_cmd(args: argparse.Namespace) -> int:
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.optimize.report import print_outcomes

    config = load_config(args.config, EvolveConfig, overrides(args))
    at_least_one(args, "cycles")
    if args.cycles is not None:
        config.cycles = args.cycles
    set_objective(config, args)
    clients = every_role_clients(args, config)
    outcomes = run_evolve(config, progress=not args.no_progress, clients=clients)
    print_outcomes(config, outcomes)
    return 0


def register_tune(sub: argparse._SubParsersAction) -> None:
    tu = sub.add_parser(
        "tune",
        help="Optuna study over a policy's memory options (the YAML's search_space)",
        description="Adds `trials` trials to the study named in the YAML "
        "(rerunning grows the same study); the paper's default (2, 4, 30) is "
        "the first trial. Prints the best trials.",
        example="memloop tune memloop/experiments/tune/awe.yaml --trials 1 --format md",
    )
    tu.add_argument("config", metavar="YAML", help="e.g. memloop/experiments/tune/awe.yaml")
    tu.add_argument("--trials", type=int, help="override the number of trials to add")
    add_objective_option(tu, "the validation measure the trials are ranked on")
    add_run_options(tu)
    add_format_option(tu)
    add_endpoint_options(tu, EVERY_ROLE_HELP)
    add_progress_option(tu)
    tu.set_defaults(func=run_tune_cmd)


def run_tune_cmd(args: argparse.Namespace) -> int:
    from memloop.optimize.config import TuneConfig, load_config
    from memloop.optimize.tune import format_outcome, run_tune

    config = load_config(args.config, TuneConfig, overrides(args))
    at_least_one(args, "trials")
    if args.trials is not None:
        config.trials = args.trials
    set_objective(config, args)
    clients = every_role_clients(args, config)
    print(
        format_outcome(
            run_tune(config, progress=not args.no_progress, clients=clients), args.format
        )
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """The commands of this module, in the order `memloop --help` lists them."""
    register_evolve(sub)
    register_tune(sub)
