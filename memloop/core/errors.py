"""Errors a user can cause and fix, and the one path they take out of the command line.

A :class:`UserError` names the file, field or URL at fault and what to do. The command line
prints it as a single line on stderr and exits with code 2, never with a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

USER_ERROR_EXIT = 2


class UserError(Exception):
    """A problem the user can fix; its message names the file, field or URL and what to do."""


def exit_on_user_error(
    run: Callable[[], int | None], *, prog: str = "memloop", stream: TextIO | None = None
) -> int:
    """Run ``run`` and turn its outcome into an exit code.

    A :class:`UserError` becomes one line ``<prog>: error: <message>`` and exit code 2; Ctrl-C
    becomes exit code 130. Any other exception propagates (it is a bug, and deserves its
    traceback).
    """
    out = stream if stream is not None else sys.stderr
    try:
        code = run()
    except UserError as exc:
        message = " ".join(str(exc).split("\n"))
        print(f"{prog}: error: {message}", file=out)
        return USER_ERROR_EXIT
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (finished work is checkpointed: rerun to resume)", file=out)
        return 130
    return int(code or 0)
