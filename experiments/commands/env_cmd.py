"""`memloop env ...`: build, validate and check environments (data.json files)."""

from __future__ import annotations

import argparse
import json
import sys

_PROCEDURAL_EPILOG = """\
Each user gets QUESTIONS x STATES_PER_QUESTION distinct state variables drawn from the built-in
catalogue (questions share variables only when the catalogue runs out). CHOICES_PER_STATE is the
number of values each of those variables can take (2-4; the catalogue offers 3 or 4 per variable,
and with 4 only the variables that have four values are drawn).
Each question offers max(4, CHOICES_PER_STATE, variants the user actually lives through) answer
choices, capped by CHOICES_PER_STATE ** STATES_PER_QUESTION, which must therefore be at least 4.
The file holds PERIODS + 1 periods (period 0 is the initial state, as in the published data), and
every later period changes exactly CHANGES_PER_PERIOD variables. Same arguments, same bytes.
"""


def register(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="build, validate and check environments (data.json)")
    env_sub = env.add_subparsers(dest="env_command", metavar="SUBCOMMAND", required=True)

    validate = env_sub.add_parser(
        "validate", help="check a data.json file and print its size, or every problem found",
        description="Check a data.json file in the published AMemGym format. A valid file prints a "
                    "summary; otherwise every problem is printed with its JSON path and the exit code is 2.",
    )
    validate.add_argument("path", metavar="PATH", help="the data.json file to check")
    validate.add_argument("--json", action="store_true", help="print the summary as JSON")
    validate.set_defaults(func=cmd_validate)

    procedural = env_sub.add_parser(
        "procedural", help="generate an environment from the built-in catalogue (no LLM)",
        description="Generate simulated users in the published data.json format from a hand-written "
                    "catalogue of life domains, without any LLM.",
        epilog=_PROCEDURAL_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    procedural.add_argument("--users", type=int, default=3, help="number of users (default 3)")
    procedural.add_argument("--periods", type=int, default=4,
                            help="update periods after the initial one (default 4)")
    procedural.add_argument("--questions", type=int, default=4, help="questions per user (default 4)")
    procedural.add_argument("--states-per-question", type=int, default=2,
                            help="state variables each question's answer depends on (default 2)")
    procedural.add_argument("--choices-per-state", type=int, default=2,
                            help="values each state variable can take, 2-4 (default 2)")
    procedural.add_argument("--changes-per-period", type=int, default=2,
                            help="variables changed in every update period (default 2)")
    procedural.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    procedural.add_argument("--start-date", default="2020-10-01",
                            help="date of the initial state, YYYY-MM-DD (default 2020-10-01)")
    procedural.add_argument("--months-per-period", type=int, default=3,
                            help="length of each update period in months (default 3)")
    procedural.add_argument("--out", required=True, metavar="PATH", help="where to write the data.json file")
    procedural.set_defaults(func=cmd_procedural)


def cmd_validate(args: argparse.Namespace) -> int:
    """Print the summary of a valid file, or every violation (one per line) and fail with exit 2."""
    from environment.datafile import read_items
    from environment.errors import EnvFileError
    from environment.summary import summarize

    items, problems = read_items(args.path)
    if problems:
        for problem in problems:
            print(problem)
        sys.stdout.flush()
        noun = "problem" if len(problems) == 1 else "problems"
        raise EnvFileError(f"{args.path}: {len(problems)} {noun} found (listed above)", problems)
    summary = summarize(items)
    if args.json:
        print(json.dumps({"path": args.path, "valid": True, **summary.to_json()}, indent=2))
    else:
        print(f"{args.path}: valid")
        for line in summary.lines():
            print(f"  {line}")
    return 0


def cmd_procedural(args: argparse.Namespace) -> int:
    """Generate a procedural environment and write it atomically to --out."""
    from environment.datafile import save_items
    from environment.procedural import ProceduralSpec, generate_from_spec
    from environment.validation import check_items

    spec = ProceduralSpec(
        users=args.users, periods=args.periods, questions=args.questions,
        states_per_question=args.states_per_question, choices_per_state=args.choices_per_state,
        changes_per_period=args.changes_per_period, seed=args.seed, start_date=args.start_date,
        months_per_period=args.months_per_period,
    )
    items = generate_from_spec(spec)
    problems = check_items(items)
    if problems:  # a generator bug, not a user error: fail loudly rather than write a bad file
        raise RuntimeError(f"procedural generator produced an invalid environment: {problems[0]}")
    save_items(items, args.out)
    def count(n: int, noun: str) -> str:
        return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

    print(
        f"wrote {count(len(items), 'user')} ({count(spec.periods + 1, 'period')}, "
        f"{count(spec.questions, 'question')}, {count(spec.variables_per_user, 'state variable')} each) "
        f"to {args.out}"
    )
    return 0
