"""Errors the environment raises for problems a user can fix.

For example a bad data file or bad generator options. All are `UserError`s, so the CLI prints one
line and exits 2.
"""

from __future__ import annotations

from memloop.core.errors import UserError


class EnvFileError(UserError):
    """A data.json file cannot be read or breaks the format.

    `violations` lists every problem found.
    """

    def __init__(self, message: str, violations: list[str] | None = None) -> None:
        super().__init__(message)
        self.violations: list[str] = list(violations or [])


class EnvDataError(UserError):
    """A user item is inconsistent in a way only noticed when used.

    For example, no choice matches the gold state.
    """


class ProceduralArgumentError(UserError):
    """The options given to the procedural generator cannot produce a valid environment."""
