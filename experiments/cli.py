"""The `memloop` command line: one sub-command group per module in experiments/commands."""

from __future__ import annotations

import argparse
import sys

from llm.settings import apply_offline_defaults


def build_parser() -> argparse.ArgumentParser:
    from experiments.commands import env_cmd, eval_cmd, llm_cmd, optimize_cmd, quickstart_cmd

    parser = argparse.ArgumentParser(
        prog="memloop",
        description="Evaluate and self-evolve the memory policies of LLM assistants.",
    )
    sub = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    for module in (quickstart_cmd, llm_cmd, env_cmd, eval_cmd, optimize_cmd):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    apply_offline_defaults()
    from llm.errors import UserError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except UserError as exc:
        print(f"memloop: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memloop: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
