"""The embedded runtime trusts no stranger (issue 57, point 3).

A process that calls itself `memloop.llm.embedded_server` and answers `/health` used to receive
every conversation, its answers cached as the embedded model's, and a SIGTERM at exit; a newcomer
whose health check took over 10 s killed a server others were using. Here stand-in processes
(no model: a few lines of HTTP server) play the running server: one started without the secret,
one with it, one busy. Whether the real server requires its secret is checked on the real path
(tests/llm/test_llm_runtime_real.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from memloop.llm import embedded_server, runtime
from memloop.llm.model_files import QWEN_0_5B

STAND_IN = """
import http.server, sys, time
log = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        open(log, "a").write(self.path + "\\n")
        if self.path == "/health":
            time.sleep(float(sys.argv[2]))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(runtime.RUNTIME_ENV, str(tmp_path / "servers"))
    return tmp_path / "servers"


@pytest.fixture
def stand_in(tmp_path):
    """start(key, health_s): a process named like the embedded server, listening on 127.0.0.1,
    started with `key` in its environment (none: a stranger), slow to answer /health."""
    started: list[subprocess.Popen] = []

    def start(key: str | None, health_s: float = 0.0):
        env = {k: v for k, v in os.environ.items() if k != embedded_server.KEY_ENV}
        if key is not None:
            env[embedded_server.KEY_ENV] = key
        log = tmp_path / f"requests-{len(started)}.log"
        argv = [sys.executable, "-c", STAND_IN, str(log), str(health_s)]
        proc = subprocess.Popen(
            [*argv, "memloop.llm.embedded_server"], stdout=subprocess.PIPE, text=True, env=env
        )
        started.append(proc)
        port = int(proc.stdout.readline())
        return proc, f"http://127.0.0.1:{port}/v1", log

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def server_with_address(pid: int, base_url: str) -> embedded_server.EmbeddedServer:
    server = embedded_server.EmbeddedServer(QWEN_0_5B)
    runtime.write_address(server.address_path, {"pid": pid, "base_url": base_url})
    return server


def keep_key(server: embedded_server.EmbeddedServer, key: str) -> None:
    """`key` as the server's key file, as the process that started it wrote it."""
    server.key_path.parent.mkdir(parents=True, exist_ok=True)
    server.key_path.write_text(key)
    server.key_path.chmod(0o600)


def attach(server: embedded_server.EmbeddedServer) -> bool:
    lease = runtime.open_lock_file(server.lease_path)
    try:
        return server._attach(lease)
    finally:
        os.close(lease)


def test_a_stranger_named_like_the_server_is_never_used_nor_signalled(runtime_dir, stand_in):
    proc, url, log = stand_in(key=None)
    server = server_with_address(proc.pid, url)
    embedded_server.write_key(server.key_path)  # the runtime's secret, which it was not given
    assert runtime.is_server_process(proc.pid)  # what was trusted before: the command line
    assert not attach(server)
    assert not server.address_path.exists()  # dropped: a server of our own starts instead
    time.sleep(0.3)
    assert proc.poll() is None  # not signalled
    assert not log.exists()  # and asked nothing: not even its health


def test_the_server_started_with_the_secret_proves_itself(runtime_dir, stand_in):
    key = "k" * 43
    proc, url, log = stand_in(key=key)
    server = server_with_address(proc.pid, url)
    keep_key(server, key)
    assert embedded_server.proves_itself(proc.pid, url, key)
    assert not embedded_server.proves_itself(proc.pid, url, "another key")
    assert not embedded_server.proves_itself(os.getpid(), url, key)  # not the socket's owner
    wrong_port = url.replace(url.split(":")[-1].split("/")[0], "1")
    assert not embedded_server.proves_itself(proc.pid, wrong_port, key)
    assert attach(server) and server.key == key and server._pid == proc.pid
    # a key file others can read is no secret: not trusted
    server.key_path.chmod(0o644)
    assert embedded_server.read_key(server.key_path) == ""


def test_a_busy_server_is_attached_to_not_killed(runtime_dir, stand_in, monkeypatch):
    """Its health check answers after the newcomer's wait: before, the newcomer killed it."""
    monkeypatch.setattr(embedded_server, "HEALTH_WAIT_S", 0.3)
    key = "b" * 43
    proc, url, log = stand_in(key=key, health_s=2.0)
    server = server_with_address(proc.pid, url)
    keep_key(server, key)
    assert attach(server)
    assert proc.poll() is None and json.loads(server.address_path.read_text())["pid"] == proc.pid


def test_a_server_that_is_gone_is_replaced(runtime_dir, stand_in):
    key = "g" * 43
    proc, url, _ = stand_in(key=key)
    server = server_with_address(proc.pid, url)
    keep_key(server, key)
    proc.kill()
    proc.wait()
    assert not attach(server) and not server.address_path.exists()
