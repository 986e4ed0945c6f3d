"""Real servers on loopback for the scale-out tests: PostgreSQL and an MLflow tracking server.

Both are started in a temporary folder on a free port and stopped (and their folder removed)
when the block ends. Nothing here is a fake: PostgreSQL is Debian's (``initdb``/``pg_ctl`` on
PATH or under /usr/lib/postgresql/*/bin), the tracking server is ``mlflow server`` from this
Python environment.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

POSTGRES_HINT = "needs PostgreSQL's server programs: apt-get install postgresql (Debian)"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        raise RuntimeError(f"{name} not found: {POSTGRES_HINT}")
    return found


class PostgresServer:
    """A throw-away PostgreSQL cluster in a new temporary folder, listening on 127.0.0.1 only.

    Run as root (CI containers), the cluster belongs to the ``postgres`` account, as initdb
    refuses root (so the folder is made directly under the system's temp folder, which that
    account can reach). `url(db)` gives the SQLAlchemy URL of a database made by
    `create_database`.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="memloop-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.user = "postgres" if os.geteuid() == 0 else None

    def _run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        done = subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout)[-2000:]}")
        return done

    def __enter__(self) -> PostgresServer:
        if self.user:
            shutil.chown(self.folder, self.user)
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "memloop")
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off"
        log = str(self.folder / "server.log")
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-l", log, "-o", options, "-w", "start")
        return self

    def create_database(self, name: str) -> str:
        self._run(
            _pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "memloop", name
        )
        return self.url(name)

    def url(self, db: str) -> str:
        return f"postgresql+psycopg2://memloop@127.0.0.1:{self.port}/{db}"

    def __exit__(self, *exc: Any) -> None:
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 with one worker, artifacts served from `folder`.

    `backend` is any store URI MLflow's server takes (a sqlite file, a PostgreSQL URL).
    """

    def __init__(self, folder: str | Path, backend: str, *, start_timeout_s: float = 120):
        self.folder = Path(folder)
        self.backend = backend
        self.port = free_port()
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_in_s: float | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            self.backend,
            "--artifacts-destination",
            str(self.folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        from memloop.core.settings import apply_offline_defaults

        apply_offline_defaults()  # offline, litellm's cost-map fetch stalls the server's start
        env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING"}
        log = open(self.folder / "server.log", "wb")
        start = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            cwd=self.folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its workers are stopped with it, as one process group
        )
        log.close()
        while time.monotonic() - start < self.start_timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        self.started_in_s = time.monotonic() - start
                        return self
            except OSError:
                time.sleep(0.25)
        self.__exit__()
        raise RuntimeError(f"mlflow server did not answer in {self.start_timeout_s} s")

    def log_tail(self, chars: int = 3000) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-chars:] if path.is_file() else ""

    def __exit__(self, *exc: Any) -> None:
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, None)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
