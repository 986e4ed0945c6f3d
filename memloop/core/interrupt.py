"""A process-wide stop flag: Ctrl-C stops model requests within a fraction of a second.

The command line's SIGINT handler sets it; the chat client waits on its requests in slices and
gives up as soon as it is set, so worker threads end at once instead of after their HTTP timeouts.
"""

from __future__ import annotations

import threading

_STOP = threading.Event()
POLL_S = 0.2  # how often a waiting request looks at the flag


class Interrupted(KeyboardInterrupt):
    """Raised in a thread waiting on a model request when the user pressed Ctrl-C."""


def interrupt() -> None:
    _STOP.set()


def clear() -> None:
    _STOP.clear()


def interrupted() -> bool:
    return _STOP.is_set()


def check() -> None:
    """Raise Interrupted when the flag is set."""
    if _STOP.is_set():
        raise Interrupted("interrupted")


def sleep(seconds: float) -> None:
    """Sleep, or raise Interrupted as soon as the flag is set."""
    if _STOP.wait(seconds):
        raise Interrupted("interrupted")


def wait(done: threading.Event) -> None:
    """Wait for `done`, or raise Interrupted as soon as the flag is set."""
    while not done.wait(POLL_S):
        if _STOP.is_set():
            raise Interrupted("interrupted")


def by_user(error: BaseException) -> bool:
    """`error` ended the work because the user stopped it: a Ctrl-C, or the flag set.

    The flag too: a worker thread's error may wrap the Ctrl-C that stopped it.
    """
    return isinstance(error, KeyboardInterrupt) or interrupted()
