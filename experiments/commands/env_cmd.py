"""`memloop env ...`: build, validate and check environments (data.json files)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    env = sub.add_parser("env", help="build, validate and check environments (data.json)")
    env.add_subparsers(dest="env_command", metavar="SUBCOMMAND", required=True)
