"""One embedded runtime per machine: the files through which memloop processes share servers.

Every memloop process of a user (a second command, a tune worker, the test suite) finds the
embedded model servers through files in `runtime_dir()`, next to the joined model files, and
reuses a running server of the model it needs instead of starting its own. Per server id
(`server_id`: model file, slots, context, threads):

- `<id>.lock`: held (flock, exclusive) while the server is looked up, started or stopped, so a
  second process waits for a starting server instead of starting another;
- `<id>.json`: the running server's address (pid, base_url);
- `<id>.lease`: every process using the server holds a shared flock on it; the server exits when
  it can take it exclusively, i.e. when no process uses it any more, however they ended;
- `<id>.active` and `turn.lock`: compute turns (`ComputeTurn`). Each server runs with all the
  cores memloop may use (`available_cores`), so two servers computing at once would ask for twice
  the machine's threads; a request to one server first waits until no request to another is in
  flight. Requests to the same server still run together in its slots;
- `<id>.log`: the server's log (llama.cpp's own timings per request).

flock locks belong to an open file, not a process, and the kernel releases them when a process
dies: no stale lock survives a crash or a SIGKILL.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path

from memloop.core import interrupt
from memloop.core.errors import UserError
from memloop.core.files import atomic_writer, wait_for_flock

THREADS_ENV = "MEMLOOP_THREADS"
TURN_FILE = "turn.lock"
POLL_S = 0.02  # how often a waiting lock is tried again


RUNTIME_ENV = "MEMLOOP_RUNTIME_DIR"


def runtime_dir() -> Path:
    """Where the servers' lock, lease, address and log files live: <models dir>/servers.

    Next to the model files, which every process of the user shares (the test suite too: it
    gives each session its own cache folder but keeps the models folder). $MEMLOOP_RUNTIME_DIR
    gives a set of processes servers of their own.
    """
    explicit = os.environ.get(RUNTIME_ENV)
    if explicit:
        return Path(explicit).expanduser()
    from memloop.llm.model_files import models_dir

    return models_dir() / "servers"


def available_cores() -> int:
    """The CPU threads an embedded server may use.

    $MEMLOOP_THREADS when set, never more than the cores this process may run on (its CPU
    affinity: taskset, a container's cpuset), which is the default.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return cores
    try:
        wanted = int(raw)
    except ValueError:
        wanted = 0
    if wanted < 1:
        raise UserError(f"{THREADS_ENV}={raw!r}: give a whole number of cores, 1 or more")
    return min(wanted, cores)


def server_id(model_key: str, sha256: str, slots: int, ctx_per_slot: int, threads: int) -> str:
    return f"{model_key}-{sha256[:8]}-s{slots}-c{ctx_per_slot}-t{threads}"


def open_lock_file(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)


def try_flock(fd: int, operation: int) -> bool:
    """`operation` (LOCK_SH / LOCK_EX) without waiting; whether it was taken."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def wait_flock(fd: int, operation: int) -> None:
    """Take `operation` on `fd`, waiting as long as it takes; Ctrl-C ends the wait."""
    while not try_flock(fd, operation):
        interrupt.sleep(POLL_S)


@contextlib.contextmanager
def held(path: Path, operation: int = fcntl.LOCK_EX, what: str | None = None) -> Iterator[int]:
    """The lock file `path` held for the block (its fd given).

    With `what`, a long wait is said on stderr with the holder (`core.files.wait_for_flock`);
    compute turns wait in silence (taking turns is the normal way two servers share cores).
    """
    fd = open_lock_file(path)
    try:
        if what is None:
            wait_flock(fd, operation)
        else:
            wait_for_flock(fd, operation, path, what)
        yield fd
    finally:
        os.close(fd)


def read_address(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(value, dict) and isinstance(value.get("pid"), int)
    return value if ok and isinstance(value.get("base_url"), str) else None


def write_address(path: Path, address: dict) -> None:
    with atomic_writer(path) as fh:
        fh.write(json.dumps(address))


def _stat(pid: int) -> list[str]:
    """The fields of /proc/`pid`/stat after "pid (comm)": state first (OSError if gone)."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().decode("utf-8", "replace").rsplit(")", 1)[-1].split()


def is_server_process(pid: int) -> bool:
    """Whether `pid` is a live memloop embedded server (not a reused pid, not a zombie)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        state = _stat(pid)[0]
    except (OSError, IndexError):
        return False
    return b"memloop.llm.embedded_server" in cmdline and state not in ("Z", "X")


def cpu_ticks(pid: int | None) -> int | None:
    """User + system CPU clock ticks of process `pid` so far; None if unreadable."""
    if pid is None:
        return None
    try:
        fields = _stat(pid)
        return int(fields[11]) + int(fields[12])  # utime, stime: stat's 14th and 15th fields
    except (OSError, IndexError, ValueError):
        return None


class ComputeTurn:
    """Hold for the duration of one request to embedded server `ident`.

    Only one server computes at a time on the machine: the holder waits (under `turn.lock`, so
    no new request to any server starts meanwhile) until no request to another server is in
    flight, then joins its own server's turn (a shared lock on `<id>.active`).
    """

    def __init__(self, ident: str, directory: Path | None = None):
        self.ident = ident
        self.directory = directory or runtime_dir()
        self._fd: int | None = None

    def __enter__(self) -> ComputeTurn:
        mine = open_lock_file(self.directory / f"{self.ident}.active")
        try:
            if not try_flock(mine, fcntl.LOCK_SH) or self._others_busy():
                os.close(mine)  # the slow path: take the turn in order
                mine = self._take_turn()
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(mine)
            raise
        self._fd = mine
        return self

    def _others_busy(self) -> bool:
        """Whether a request to another server is in flight (the fast path's check)."""
        for path in self.directory.glob("*.active"):
            if path.stem == self.ident:
                continue
            fd = open_lock_file(path)
            try:
                if not try_flock(fd, fcntl.LOCK_EX):
                    return True
            finally:
                os.close(fd)
        # nobody queued for the turn either: a waiting request of another server goes first
        with held_nowait(self.directory / TURN_FILE) as free:
            return not free

    def _take_turn(self) -> int:
        with held(self.directory / TURN_FILE):
            for path in sorted(self.directory.glob("*.active")):
                if path.stem == self.ident:
                    continue
                with held(path):  # until that server's requests in flight are done
                    pass
            mine = open_lock_file(self.directory / f"{self.ident}.active")
            try:
                wait_flock(mine, fcntl.LOCK_SH)
            except BaseException:
                os.close(mine)
                raise
            return mine

    def __exit__(self, *exc: object) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


@contextlib.contextmanager
def held_nowait(path: Path) -> Iterator[bool]:
    """Try the lock file `path` once; whether it was free (released again after the block)."""
    fd = open_lock_file(path)
    try:
        yield try_flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(fd)
