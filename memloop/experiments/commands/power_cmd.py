"""`memloop power`: how many users a comparison needs, or what it can detect (paired t test)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    power = sub.add_parser(
        "power",
        help="users needed for an effect, or the effect a number of users can detect",
        description="Power planning for a paired t test over users (the test behind compare's "
        "intervals), exact from the noncentral t distribution. With --effect: the fewest users "
        "that detect it; with --users: the smallest effect those users detect.",
        example="memloop power --sd 0.15 --effect 0.1",
    )
    power.add_argument(
        "--sd",
        type=float,
        help="SD across users of what is averaged: the per-user difference condition - baseline "
        "(or the measure itself, for one mean)",
    )
    power.add_argument(
        "--planning",
        metavar="JSON",
        help="instead of --sd: a design's measured SDs of real prompt changes "
        "(benchmarks/results/state_prob_power.json), read for --scoring",
    )
    power.add_argument(
        "--scoring",
        help="with --planning: the scoring whose SD to plan on (e.g. 'json 0/1', 'letters P')",
    )
    power.add_argument("--effect", type=float, help="the true mean difference to detect")
    power.add_argument("--users", type=int, help="the number of users available")
    power.add_argument("--power", type=float, default=0.8, help="the chance to detect it")
    power.add_argument("--alpha", type=float, default=0.05, help="two-sided significance level")
    power.set_defaults(func=cmd_power)


def cmd_power(args: argparse.Namespace) -> int:
    from memloop.core import stats
    from memloop.core.errors import UserError

    if (args.effect is None) == (args.users is None):
        raise UserError(
            "give either --effect (to get the users needed) or --users (to get the effect)"
        )
    if (args.sd is None) == (args.planning is None):
        raise UserError("give either --sd or --planning FILE --scoring NAME")
    source = ""
    if args.planning is not None:
        args.sd, source = planning_sd(args.planning, args.scoring)
    setting = (
        f"(paired t test, two-sided alpha {args.alpha:g}, power {args.power:g}, "
        f"SD of the per-user differences {args.sd:.4g}{source})"
    )
    try:
        if args.effect is not None:
            users = stats.users_needed(args.effect, args.sd, power=args.power, alpha=args.alpha)
            print(f"users needed: {users} to detect a mean difference of {abs(args.effect):g}")
        else:
            effect = stats.detectable_effect(
                args.users, args.sd, power=args.power, alpha=args.alpha
            )
            print(f"minimum detectable effect: {effect:.4g} with {args.users} users")
    except ValueError as exc:
        raise UserError(f"power: {exc}") from None
    print(setting)
    return 0


def planning_sd(path: str, scoring: str | None) -> tuple[float, str]:
    """(the planning SD of `scoring` in a design's results file, where it comes from)."""
    import json
    from pathlib import Path

    from memloop.core.errors import UserError

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        scorings = data["scorings"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"--planning {path}: not a design's results file with 'scorings' ({exc})"
        ) from None
    names = ", ".join(repr(k) for k in scorings)
    if scoring not in scorings:
        raise UserError(f"--scoring {scoring!r}: {path} has {names}")
    entry = scorings[scoring]
    sd = entry.get("planning_sd")
    if not isinstance(sd, int | float) or sd <= 0:
        raise UserError(f"--planning {path}: {scoring!r} has no planning SD")
    return float(sd), f": {scoring}, {entry.get('planning_sd_of', 'measured')}, from {path}"
