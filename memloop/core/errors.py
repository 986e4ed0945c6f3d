"""Errors a user can cause and fix, and the one path they take out of the command line.

A :class:`UserError` names the file, field or URL at fault and what to do. The command line
prints it as a single line on stderr and exits with code 2, never with a traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from typing import TextIO

USER_ERROR_EXIT = 2
INTERRUPTED_EXIT = 130  # 128 + SIGINT
BROKEN_PIPE_EXIT = 141  # 128 + SIGPIPE, what a shell reports for a tool stopped by a closed pipe


class UserError(Exception):
    """A problem the user can fix; its message names the file, field or URL and what to do."""


def exit_on_user_error(
    run: Callable[[], int | None], *, prog: str = "memloop", stream: TextIO | None = None
) -> int:
    """Run ``run`` and turn its outcome into an exit code.

    A :class:`UserError` becomes one line ``<prog>: error: <message>`` (control characters
    escaped, `core.tables.printable`) and exit code 2; Ctrl-C becomes exit code 130, also when
    its KeyboardInterrupt was swallowed but the stop flag (`core.interrupt`) is set; a closed
    output pipe ends quietly with 141 (128 + SIGPIPE); a path that
    cannot be written (read-only, immutable, full disk, under a file) is one line naming it, exit
    2. Any other exception propagates (it is a bug, and deserves its traceback).
    """
    from memloop.core import interrupt
    from memloop.core.tables import printable

    out = stream if stream is not None else sys.stderr
    try:
        code = run()
    except UserError as exc:
        if interrupt.interrupted():  # the error of a Ctrl-C a library turned into another
            return _interrupted(prog, out)
        message = printable(" ".join(str(exc).split("\n")))
        print(f"{prog}: error: {message}", file=out)
        return USER_ERROR_EXIT
    except KeyboardInterrupt:
        return _interrupted(prog, out)
    except BrokenPipeError:
        # the reader went away (`memloop ... | head -1`): stop quietly, as Unix tools do, and
        # keep Python from failing again when it flushes stdout at exit
        _stdout_to_devnull()
        return BROKEN_PIPE_EXIT
    except OSError as exc:
        # a path the user gave that cannot be written (read-only, immutable, full, under a file)
        hint = _PATH_PROBLEMS.get(exc.errno or 0)
        if hint is None or not (exc.filename or exc.errno in _NO_SPACE):
            raise
        # a full disk under a write of a library's own (a log, a database page) names no file
        where = printable(exc.filename) if exc.filename else "writing"
        print(f"{prog}: error: {where}: {exc.strerror or exc} ({hint})", file=out)
        return USER_ERROR_EXIT
    if interrupt.interrupted():
        # Ctrl-C set the stop flag, but its KeyboardInterrupt was swallowed on the way (raised
        # inside a __del__ or a library's catch-all): the command still ends as interrupted
        return _interrupted(prog, out)
    return int(code or 0)


def _interrupted(prog: str, out: TextIO) -> int:
    print(f"{prog}: interrupted (finished work is checkpointed: rerun to resume)", file=out)
    return INTERRUPTED_EXIT


_PATH_PROBLEMS = {
    errno.EACCES: "check its permissions, or choose another folder",
    errno.EPERM: "not permitted: an immutable file or folder (lsattr) or another owner's",
    errno.EROFS: "the file system is read-only: choose another folder",
    errno.ENOSPC: "the disk is full: free space or choose another folder",
    errno.EDQUOT: "the disk quota is used up: free space or choose another folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EEXIST: "a file of that name is in the way (a part of the path is a file?)",
    errno.EISDIR: "it is a folder: name a file",
    errno.ENAMETOOLONG: "the name is too long",
}


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _stdout_to_devnull() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor
        pass
