"""Command lines the tests drive memloop through."""

from __future__ import annotations

from pathlib import Path


def eval_argv(
    env: str | Path, policy: str | Path, endpoint: str | Path, cache: str | Path, out: str | Path
) -> list[str]:
    """`memloop eval` arguments (without the program name) for these files."""
    return [
        "eval",
        "--env",
        str(env),
        "--policy",
        str(policy),
        "--endpoint",
        str(endpoint),
        "--cache",
        str(cache),
        "--out",
        str(out),
    ]
