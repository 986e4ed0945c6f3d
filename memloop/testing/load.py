"""Another process that keeps the machine's cores busy, for tests of timing-dependent paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_SPIN = """
import multiprocessing, sys

def spin():
    while True:
        pass

if __name__ == "__main__":
    for _ in range(int(sys.argv[1]) - 1):
        multiprocessing.Process(target=spin, daemon=True).start()
    print("busy", flush=True)
    spin()
"""


@contextmanager
def busy_cores(cores: int = 2) -> Iterator[None]:
    """Inside the block, one other process (with `cores` - 1 children) spins on `cores` cores.

    The block starts once the spinning has begun; the process group is killed when it ends.
    """
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPIN, str(cores)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "busy":
            raise RuntimeError("the busy process did not start")
        yield
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
