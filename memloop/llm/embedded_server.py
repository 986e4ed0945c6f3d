"""The embedded model: xllamacpp's OpenAI-compatible server on 127.0.0.1, run in a child process.

A child process keeps llama.cpp's log noise and any native crash away from the caller. It cannot
outlive its parent: it polls its parent's pid and exits when the parent is gone (even after a
SIGKILL), and the parent stops it on exit, Ctrl-C or exception.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from memloop.core.errors import UserError
from memloop.core.settings import cache_root
from memloop.llm.errors import ModelFileError
from memloop.llm.model_files import PackagedModel, ensure_model_file

READY_PREFIX = "MEMLOOP_SERVER_LISTENING "
START_NOTICE = True  # a line on stderr while the model starts (off under --no-progress)


@dataclass(frozen=True)
class ServerSettings:
    slots: int = 4  # parallel sequences (continuous batching)
    ctx_per_slot: int = 8192  # tokens of context each request may use
    threads: int | None = None  # CPU threads; default: all cores
    start_timeout_s: float = 180.0


class EmbeddedServer:
    """Start with `start()` (or as a context manager); `base_url` is the OpenAI /v1 root."""

    def __init__(self, model: PackagedModel, settings: ServerSettings = ServerSettings()):
        self.model = model
        self.settings = settings
        self._proc: subprocess.Popen | None = None
        self.base_url: str | None = None
        self.log_path = cache_root() / "logs" / f"embedded-{model.key}.log"

    def start(self) -> EmbeddedServer:
        if self._proc is not None:
            return self
        if START_NOTICE:  # verifying and loading the weights takes ~1 s per 180 MB (2 cores)
            from tqdm import tqdm  # its write: a line above any progress bar drawn

            tqdm.write(
                f"starting the embedded model {self.model.display_name} "
                f"(takes ~{max(2, round(self.model.size / 180e6))} s)...",
                file=sys.stderr,
            )
        path = ensure_model_file(self.model)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        threads = self.settings.threads or os.cpu_count() or 2
        cmd = [
            sys.executable,
            "-m",
            "memloop.llm.embedded_server",
            "--model",
            str(path),
            "--alias",
            self.model.key,
            "--slots",
            str(self.settings.slots),
            "--ctx-per-slot",
            str(self.settings.ctx_per_slot),
            "--threads",
            str(threads),
            "--parent-pid",
            str(os.getpid()),
        ]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
            )
        atexit.register(self.stop)
        try:
            self.base_url = self._await_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _await_ready(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        deadline = time.monotonic() + self.settings.start_timeout_s
        line_box: list[str] = []
        reader = threading.Thread(target=lambda: line_box.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.settings.start_timeout_s)
        line = line_box[0] if line_box else ""
        if not line.startswith(READY_PREFIX):
            raise UserError(
                f"the embedded model server did not start (exit code {self._proc.poll()}); "
                f"see its log {self.log_path}"
            )
        root = line[len(READY_PREFIX) :].strip().rstrip("/")
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise UserError(
                    f"the embedded model server exited while loading; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(root + "/health", timeout=2) as resp:
                    if resp.status == 200 and json.loads(resp.read()).get("status") == "ok":
                        return root + "/v1"
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        raise UserError(
            f"the embedded model server was not healthy within "
            f"{self.settings.start_timeout_s:.0f} s; see {self.log_path}"
        )

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_servers: dict[tuple[str, ServerSettings], EmbeddedServer] = {}
_servers_lock = threading.Lock()


def shared_server(model: PackagedModel, settings: ServerSettings) -> EmbeddedServer:
    """One running server per (model, settings) in this process, started on first use."""
    with _servers_lock:
        server = _servers.get((model.key, settings))
        if server is None or server.pid is None:
            server = EmbeddedServer(model, settings).start()
            _servers[(model.key, settings)] = server
        return server


# ---------------------------------------------------------------- child process side


def _die_with_parent(parent_pid: int) -> None:
    """Exit as soon as the parent process is gone (re-parented child).

    Polling is used rather than PR_SET_PDEATHSIG, which fires when the *thread* that started the
    child ends.
    """

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()


def _serve(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m llm.embedded_server")
    ap.add_argument("--model", required=True)
    ap.add_argument("--alias", required=True)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx-per-slot", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parent-pid", type=int, default=os.getppid())
    args = ap.parse_args(argv)
    _die_with_parent(args.parent_pid)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.n_parallel = args.slots
    params.n_ctx = args.slots * args.ctx_per_slot
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    server = xllamacpp.Server(params)
    address = server.listening_address
    if not address.startswith("http"):
        address = "http://" + address
    print(READY_PREFIX + address, flush=True)
    stop.wait()
    del server
    os._exit(0)


if __name__ == "__main__":
    try:
        sys.exit(_serve(sys.argv[1:]))
    except ModelFileError as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(2)
