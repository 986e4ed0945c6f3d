"""The `memloop` command line: one sub-command group per module in experiments/commands."""

from __future__ import annotations

import argparse
import sys

from memloop.core.errors import exit_on_user_error
from memloop.core.settings import apply_offline_defaults


def build_parser() -> argparse.ArgumentParser:
    from memloop.experiments.commands import (
        env_cmd,
        eval_cmd,
        import_cmd,
        llm_cmd,
        optimize_cmd,
        policy_cmd,
        quickstart_cmd,
    )

    parser = argparse.ArgumentParser(
        prog="memloop",
        description="Evaluate and self-evolve the memory policies of LLM assistants.",
    )
    sub = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    modules = (quickstart_cmd, llm_cmd, env_cmd, policy_cmd, eval_cmd, optimize_cmd, import_cmd)
    for module in modules:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    apply_offline_defaults()
    parser = build_parser()
    args = parser.parse_args(argv)
    return exit_on_user_error(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
