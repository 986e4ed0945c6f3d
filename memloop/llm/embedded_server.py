"""The embedded model: xllamacpp's OpenAI-compatible server on 127.0.0.1, one per machine.

The server runs in its own process (llama.cpp's log noise and any native crash stay away from
the caller) and is shared by every memloop process of the user through the files of
`memloop.llm.runtime`: a process that needs a model reuses its running server, or starts one and
waits its turn while another process starts it. A server never outlives its users: each holds a
lease on it, and it exits as soon as none does (even after a SIGKILL); the last user stops it on
exit, Ctrl-C or exception. It runs in a session of its own, so a Ctrl-C at the terminal of one
command does not stop the server another command is using.

A server proves who it is before anything is sent to it or any signal (`proves_itself`): it
listens on 127.0.0.1 only, and is started with a secret (`<id>.key`, readable by its user alone,
handed over in its environment, never on its command line) that it requires of every request
(llama.cpp's API keys) and that its process environment must hold; the process must own the
listening socket of the address it gave. A process that does not prove it is never used and
never signalled, whatever its command line says; a proven server busy with another process's
requests is attached to however slowly it answers its health check.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from memloop.core import interrupt
from memloop.core.errors import UserError
from memloop.llm import runtime
from memloop.llm.errors import ModelFileError
from memloop.llm.model_files import PackagedModel, ensure_model_file

# the server is on 127.0.0.1: never through a proxy (http_proxy without no_proxy would route
# its requests, and the secret they carry, through one)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
READY_PREFIX = "MEMLOOP_SERVER_LISTENING "
KEY_ENV = "MEMLOOP_SERVER_KEY"  # the server's secret, in its environment (never its argv)
SERVER_LOCK = "the embedded model server's lock (held while a server starts or stops)"
START_NOTICE = True  # a line on stderr while the model starts (off under --no-progress)


@dataclass(frozen=True)
class ServerSettings:
    slots: int = 4  # parallel sequences (continuous batching)
    ctx_per_slot: int = 8192  # tokens of context each request may use
    threads: int | None = None  # CPU threads; default: runtime.available_cores()
    start_timeout_s: float = 180.0


class EmbeddedServer:
    """Start with `start()` (or as a context manager); `base_url` is the OpenAI /v1 root.

    `start()` attaches to the machine's running server of the same model and settings when there
    is one (`started` says whether this process started it); `stop()` detaches, and stops the
    server when no other process uses it.
    """

    def __init__(self, model: PackagedModel, settings: ServerSettings = ServerSettings()):
        self.model = model
        self.settings = settings
        self.threads = settings.threads or runtime.available_cores()
        self.ident = runtime.server_id(
            model.key, model.sha256, settings.slots, settings.ctx_per_slot, self.threads
        )
        directory = runtime.runtime_dir()
        self.lock_path = directory / f"{self.ident}.lock"
        self.lease_path = directory / f"{self.ident}.lease"
        self.address_path = directory / f"{self.ident}.json"
        self.log_path = directory / f"{self.ident}.log"
        self.key_path = directory / f"{self.ident}.key"
        self.key = ""  # the secret every request carries (read from key_path, or made anew)
        self._proc: subprocess.Popen | None = None  # when this process started the server
        self._lease: int | None = None
        self._pid: int | None = None
        self.base_url: str | None = None
        self.started = False
        self._progress: DecodeProgress | None = None

    def start(self) -> EmbeddedServer:
        if self._lease is not None:
            return self
        with runtime.held(self.lock_path, what=SERVER_LOCK):
            lease = runtime.open_lock_file(self.lease_path)
            try:
                if not self._attach(lease):
                    runtime.wait_flock(lease, fcntl.LOCK_SH)  # the new server sees a user at once
                    self._launch()
            except BaseException:
                os.close(lease)
                self._terminate_own()
                raise
            self._lease = lease
        atexit.register(self.stop)
        return self

    def _attach(self, lease: int) -> bool:
        """Use the running server of this id, if it proves it is that server and is alive.

        A server that proves itself is used even when its health check is slow (it may be busy
        with another process's requests); one that does not is never signalled: its address
        file is dropped and a server of our own is started.
        """
        address = runtime.read_address(self.address_path)
        if address is None:
            return False
        pid, base_url = address["pid"], address["base_url"]
        key = read_key(self.key_path)
        proven = bool(key) and proves_itself(pid, base_url, key)
        if proven and _answers(base_url.removesuffix("/v1")):
            # it takes the lease exclusively only under the lock we hold: never refused here
            if runtime.try_flock(lease, fcntl.LOCK_SH):
                self._pid, self.base_url, self.key = pid, base_url, key
                return True
        if proven:  # ours, alive, but refusing connections: replaced, not left holding memory
            _terminate(pid, base_url, key)
        self.address_path.unlink(missing_ok=True)
        return False

    def _launch(self) -> None:
        if START_NOTICE:  # verifying and loading the weights takes ~1 s per 180 MB (2 cores)
            from tqdm import tqdm  # its write: a line above any progress bar drawn

            tqdm.write(
                f"starting the embedded model {self.model.display_name} "
                f"(takes ~{max(2, round(self.model.size / 180e6))} s)...",
                file=sys.stderr,
            )
        path = ensure_model_file(self.model)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.key = write_key(self.key_path)
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
            str(self.threads),
            "--runtime",
            str(self.lock_path.parent),
            "--ident",
            self.ident,
        ]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,  # a Ctrl-C at the terminal is for the command, not it
                env={**os.environ, KEY_ENV: self.key},
            )
        self.started = True
        self._pid = self._proc.pid
        self.base_url = self._await_ready()
        runtime.write_address(self.address_path, {"pid": self._pid, "base_url": self.base_url})

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
            if _healthy(root):
                return root + "/v1"
            time.sleep(0.2)
        raise UserError(
            f"the embedded model server was not healthy within "
            f"{self.settings.start_timeout_s:.0f} s; see {self.log_path}"
        )

    @property
    def progress(self) -> DecodeProgress:
        """The server's decode-step count (the client's measure of a request's progress)."""
        if self._progress is None:
            assert self.base_url is not None, "start() the server first"
            self._progress = DecodeProgress(self.base_url, self.key, self.pid)
        return self._progress

    @property
    def pid(self) -> int | None:
        return None if self._lease is None and self._proc is None else self._pid

    def stop(self) -> None:
        """Detach; stop the server when no other process uses it."""
        lease, self._lease = self._lease, None
        if lease is None:
            self._terminate_own()
            return
        pid = self._pid
        try:
            with runtime.held(self.lock_path, what=SERVER_LOCK):
                if runtime.try_flock(lease, fcntl.LOCK_EX):  # nobody else holds a lease
                    address = runtime.read_address(self.address_path)
                    if address is not None and address["pid"] == pid:
                        self.address_path.unlink(missing_ok=True)
                    if self._proc is not None:
                        self._terminate_own()
                    elif (
                        pid is not None
                        and self.base_url is not None
                        and proves_itself(pid, self.base_url, self.key)
                    ):
                        _terminate(pid, self.base_url, self.key)  # proved itself again
        except interrupt.Interrupted:
            pass  # exiting anyway: the server sees its last lease go and exits by itself
        finally:
            os.close(lease)
            proc, self._proc = self._proc, None
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()

    def _terminate_own(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class DecodeProgress:
    """A server's count of decode steps (llama.cpp's /metrics `n_decode_total`) and CPU time.

    Every prompt batch and every generated token of any slot is a step, so the count moves as
    long as the server works through its queue. /metrics answers only between steps, so during
    one long step (a prompt batch of thousands of tokens on a busy machine) the count stands
    still: the server process's CPU time (`pid`, from /proc) moves then. Read at most once a
    second, shared by every request waiting on the server; None where it cannot be read.
    """

    EVERY_S = 1.0

    def __init__(self, base_url: str, key: str = "", pid: int | None = None):
        self.url = base_url.removesuffix("/v1") + "/metrics"
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.pid = pid
        self._lock = threading.Lock()
        self._marks: tuple[int | None, int | None] = (None, None)
        self._read_at = float("-inf")

    def marks(self) -> tuple[int | None, int | None]:
        """(decode-step count, CPU clock ticks of the server process); None where unreadable."""
        with self._lock:
            if time.monotonic() - self._read_at >= self.EVERY_S:
                count = _decode_count(self.url, self.headers)  # waits while a step runs
                self._marks = (count, runtime.cpu_ticks(self.pid))
                self._read_at = time.monotonic()
            return self._marks


def _decode_count(url: str, headers: dict[str, str]) -> int | None:
    try:
        with _DIRECT.open(urllib.request.Request(url, headers=headers), timeout=5) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    for line in text.splitlines():
        if line.startswith("llamacpp:n_decode_total"):
            try:
                return int(float(line.split()[-1]))
            except ValueError:
                return None
    return None


def read_key(path: Path) -> str:
    """A server's secret from its key file ("" when there is none or another user could read it)."""
    try:
        if path.stat().st_mode & 0o077:
            return ""  # readable by others: not a secret any more
        return path.read_text().strip()
    except OSError:
        return ""


def write_key(path: Path) -> str:
    """A new secret for a server, written to `path` readable by this user alone."""
    key = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, key.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return key


def proves_itself(pid: int, base_url: str, key: str) -> bool:
    """Whether process `pid` is the embedded server started with `key`, listening at `base_url`.

    The address is on 127.0.0.1; the process is a live memloop embedded server whose
    environment holds `key` (a process of another user, or one started without the key, cannot
    show it); it owns the socket listening on that port. Nothing is sent to the process.
    """
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    if not key or parts.hostname != "127.0.0.1" or parts.port is None:
        return False
    if not runtime.is_server_process(pid):
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read().split(b"\0")
    except OSError:
        return False
    if f"{KEY_ENV}={key}".encode() not in environ:
        return False
    return _listening_inode(parts.port) in _socket_inodes(pid)


def _listening_inode(port: int) -> str | None:
    """The inode of the socket listening on 127.0.0.1:`port` (/proc/net/tcp), or None."""
    local = f"0100007F:{port:04X}"
    try:
        with open("/proc/net/tcp") as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[1] == local and fields[3] == "0A":  # 0A: LISTEN
                    return fields[9]
    except OSError:
        return None
    return None


def _socket_inodes(pid: int) -> set[str | None]:
    """The inodes of the sockets process `pid` holds open."""
    found: set[str | None] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:[") : -1])
    found.discard(None)
    return found


HEALTH_WAIT_S = 10.0  # how long a newcomer waits for a proven server's health check


def _answers(root: str) -> bool:
    """Whether a proven server is still up: it answers its health check, or is busy.

    A server computing for another process may take long to answer: a slow health check is
    not a dead server (it was killed for it before, under everyone using it). Only a refused
    connection is.
    """
    try:
        with _DIRECT.open(root + "/health", timeout=HEALTH_WAIT_S) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 503  # loading, or no slot free
    except (TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return not isinstance(reason, ConnectionRefusedError)


def _healthy(root: str, timeout_s: float = 2.0) -> bool:
    try:
        with _DIRECT.open(root + "/health", timeout=timeout_s) as resp:
            return resp.status == 200 and json.loads(resp.read()).get("status") == "ok"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _terminate(pid: int, base_url: str, key: str) -> None:
    """Stop a server this process did not start (SIGTERM, then SIGKILL after 10 s).

    Each signal goes only to a process that proves it is that server (`proves_itself`): never
    to a pid reused in the meantime.
    """
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if not proves_itself(pid, base_url, key):
            return
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + wait_s
        while runtime.is_server_process(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not runtime.is_server_process(pid):
            return


_servers: dict[tuple[str, ServerSettings], EmbeddedServer] = {}
_servers_lock = threading.Lock()


def shared_server(model: PackagedModel, settings: ServerSettings) -> EmbeddedServer:
    """The machine's server of (model, settings), attached once per process on first use."""
    with _servers_lock:
        server = _servers.get((model.key, settings))
        if server is None or server.pid is None:
            server = EmbeddedServer(model, settings).start()
            _servers[(model.key, settings)] = server
        return server


# ---------------------------------------------------------------- child process side


def _exit_when_unused(directory: Path, ident: str) -> None:
    """Exit as soon as no process holds a lease on this server (checked twice a second).

    The lease is tried under the server's lock, which a process attaching holds: a process is
    never handed the address of a server that is about to exit.
    """
    lease = runtime.open_lock_file(directory / f"{ident}.lease")
    address = directory / f"{ident}.json"

    def watch() -> None:
        while True:
            time.sleep(0.5)
            lock = runtime.open_lock_file(directory / f"{ident}.lock")
            if runtime.try_flock(lock, fcntl.LOCK_EX):
                if runtime.try_flock(lease, fcntl.LOCK_EX):
                    found = runtime.read_address(address)
                    if found is not None and found["pid"] == os.getpid():
                        address.unlink(missing_ok=True)
                    os._exit(0)  # the lock goes with the process
            os.close(lock)

    threading.Thread(target=watch, daemon=True).start()


def _serve(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m llm.embedded_server")
    ap.add_argument("--model", required=True)
    ap.add_argument("--alias", required=True)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx-per-slot", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runtime", required=True)
    ap.add_argument("--ident", required=True)
    args = ap.parse_args(argv)
    _exit_when_unused(Path(args.runtime), args.ident)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    import xllamacpp

    key = os.environ.get(KEY_ENV, "")
    if not key:
        print(f"{KEY_ENV} is not set: the server is started by memloop only", file=sys.stderr)
        return 2
    params = xllamacpp.CommonParams()
    params.api_keys = [key]  # every request must carry it (/health and /v1/models excepted)
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.n_parallel = args.slots
    params.n_ctx = args.slots * args.ctx_per_slot
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    # idle threads sleep instead of spinning (llama.cpp's default polls at 50): with another
    # process on the cores a spinning thread pool slowed decoding 10-50x; alone no slower
    params.cpuparams.poll = 0
    params.cpuparams_batch.poll = 0
    params.endpoint_metrics = True  # /metrics: n_decode_total tells the client it progresses
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
