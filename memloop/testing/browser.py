"""The MLflow UI in a real headless Chromium, for the UI tests and benchmarks/mlflow_ui.py.

`memloop_ui(uri, experiment)` starts `memloop ui` (the command users run) on a free port and
yields its printed address once the UI answers; `rendered(url)` is the DOM Chromium has after the
page's scripts ran; `screenshot(url, path)` saves what it shows; `driven(url)` is a page one can
click in (Chromium's DevTools protocol over its pipe: no driver package, no port). Chromium is
Debian's (`apt-get install chromium`; `make test` installs it when missing and run as root).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memloop.testing.servers import free_port

CHROMIUM_HINT = "needs Chromium: apt-get install chromium (Debian)"
# headless, as root in a container, on a machine without internet: no sandbox, no GPU and none of
# Chromium's own connections (each refused by the closed network, many at a time)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--force-prefers-reduced-motion",  # drawers open at once, not half-way through a slide
)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise RuntimeError(CHROMIUM_HINT)
    return found


def _browser(budget_ms: int, size: tuple[int, int], profile: str) -> list[str]:
    return [
        chromium(),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--virtual-time-budget={budget_ms}",
        f"--window-size={size[0]},{size[1]}",
    ]


def rendered(url: str, *, budget_ms: int = 20000, size: tuple[int, int] = (1500, 1100)) -> str:
    """The page's DOM after its scripts ran for `budget_ms` of virtual time."""
    with tempfile.TemporaryDirectory(prefix="memloop-chromium-") as profile:
        done = subprocess.run(
            [*_browser(budget_ms, size, profile), "--dump-dom", url],
            capture_output=True,
            text=True,
            timeout=180,
        )
    return done.stdout


def screenshot(
    url: str, path: Path, *, budget_ms: int = 20000, size: tuple[int, int] = (1500, 1100)
) -> Path:
    """Save the page as Chromium shows it (PNG) to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="memloop-chromium-") as profile:
        subprocess.run(
            [*_browser(budget_ms, size, profile), f"--screenshot={path}", url],
            capture_output=True,
            timeout=180,
        )
    if not path.is_file():
        raise RuntimeError(f"Chromium saved no screenshot of {url}")
    return path


class Page:
    """A page open in Chromium, driven over the DevTools protocol (`driven`)."""

    def __init__(self, commands: int, replies: int, session: str = "") -> None:
        self._commands, self._replies, self._session = commands, replies, session
        self._next = 0
        self._buffer = b""

    def send(self, method: str, **params: object) -> dict:
        """One DevTools command; its result (RuntimeError on the protocol's error)."""
        self._next += 1
        message: dict[str, object] = {"id": self._next, "method": method, "params": params}
        if self._session:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._replies, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._next:  # events and other replies are skipped
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (awaited when a promise)."""
        result = self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        return result.get("result", {}).get("value")

    def text(self) -> str:
        """What the page shows as text now."""
        return str(self.evaluate("document.body ? document.body.innerText : ''") or "")

    def wait_for_text(self, wanted: str, timeout_s: float = 60) -> str:
        """The page's text once it holds `wanted` (RuntimeError after `timeout_s`)."""
        return _until(
            lambda: shown if wanted in (shown := self.text()) else None,
            timeout_s,
            f"the page did not show {wanted!r} within {timeout_s:.0f} s",
        )

    def click_text(self, wanted: str, timeout_s: float = 60) -> None:
        """Click the innermost element whose text starts with `wanted`, once it is shown."""
        script = (
            f"(() => {{ const want = {json.dumps(wanted)};"
            " const hits = [...document.querySelectorAll('body *')].filter(e =>"
            " e.children.length === 0 && e.textContent.trim().startsWith(want));"
            " if (!hits.length) return false; hits[0].click(); return true; })()"
        )
        _until(
            lambda: self.evaluate(script),
            timeout_s,
            f"nothing on the page reads {wanted!r} to click",
        )


def _until(check: Callable[[], Any], timeout_s: float, failure: str, every_s: float = 0.25) -> Any:
    """`check()`'s first truthy value, tried every `every_s`.

    RuntimeError(`failure`) once `timeout_s` has passed.
    """
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(every_s)
    return found


@contextmanager
def driven(url: str, *, size: tuple[int, int] = (1500, 1100)) -> Iterator[Page]:
    """`url` open in a headless Chromium one can click in (`Page`); closed when the block ends.

    Chromium reads DevTools commands on its descriptor 3 and writes replies on 4
    (`--remote-debugging-pipe`).
    """
    to_chromium, commands = os.pipe()
    replies, from_chromium = os.pipe()

    def descriptors() -> None:  # in the child, before Chromium starts: its ends on 3 and 4
        read_end = fcntl.fcntl(to_chromium, fcntl.F_DUPFD, 10)
        write_end = fcntl.fcntl(from_chromium, fcntl.F_DUPFD, 10)
        os.dup2(read_end, 3)
        os.dup2(write_end, 4)

    with tempfile.TemporaryDirectory(prefix="memloop-chromium-") as profile:
        browser = subprocess.Popen(
            [
                chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=descriptors,  # its descriptors 3 and 4, set before exec
            pass_fds=(3, 4),
            start_new_session=True,  # its renderers are stopped with it, as one process group
        )
        os.close(to_chromium)
        os.close(from_chromium)
        try:
            browser_page = Page(commands, replies)
            target = browser_page.send("Target.createTarget", url=url)["targetId"]
            attached = browser_page.send("Target.attachToTarget", targetId=target, flatten=True)
            page = Page(commands, replies, attached["sessionId"])
            page._next = browser_page._next  # one numbering for the pipe's commands
            yield page
        finally:
            # the whole group: a renderer left writing into the profile fails its removal
            os.killpg(browser.pid, signal.SIGKILL)
            browser.wait(timeout=30)
            os.close(commands)
            os.close(replies)


@dataclass
class RunningUI:
    address: str  # the address `memloop ui` printed
    pid: int  # its process (the UI's workers are below it)
    seconds: float  # from the start of the command until the UI answered HTTP 200
    dashboard: str = ""  # the study's optuna-dashboard address it printed (with `study`)


def _answers(url: str, wait_s: float) -> None:
    """Return once `url` answers HTTP 200 (RuntimeError after `wait_s`)."""

    def ok() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    _until(ok, wait_s, f"{url} did not answer within {wait_s:.0f} s", every_s=0.1)


@contextmanager
def memloop_ui(
    tracking_uri: str, experiment: str, *, study: str = "", wait_s: float = 120
) -> Iterator[RunningUI]:
    """`memloop ui --tracking-uri URI --experiment NAME [--study STUDY]` on free ports.

    Yields it once the UI (and the study's optuna-dashboard) answers; stopped (with its workers
    and the dashboard) when the block ends.
    """
    port = free_port()
    memloop = Path(sys.executable).with_name("memloop")
    started = time.perf_counter()
    more = ["--study", study, "--dashboard-port", str(free_port())] if study else []
    ui = subprocess.Popen(
        [str(memloop), "ui", "--tracking-uri", tracking_uri, "--experiment", experiment]
        + ["--port", str(port), *more],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        match = re.search(r"(http://\S+)", line)
        if match is None:
            raise RuntimeError(f"memloop ui printed no address: {line!r}")
        dashboard = ""
        if study:
            second = ui.stdout.readline()
            found = re.search(r"optuna-dashboard on (http://\S+)", second)
            if found is None:
                raise RuntimeError(f"memloop ui printed no dashboard address: {second!r}")
            dashboard = found.group(1)
        _answers(f"http://127.0.0.1:{port}/", wait_s - (time.perf_counter() - started))
        seconds = time.perf_counter() - started
        if dashboard:
            _answers(dashboard, wait_s - seconds)
        yield RunningUI(match.group(1), ui.pid, seconds, dashboard)
    finally:
        os.killpg(ui.pid, 15)
        ui.wait(timeout=30)
