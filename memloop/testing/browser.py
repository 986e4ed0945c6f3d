"""The MLflow UI in a real headless Chromium, for the UI tests and benchmarks/mlflow_ui.py.

`memloop_ui(uri, experiment)` starts `memloop ui` (the command users run) on a free port and
yields its printed address once the UI answers; `rendered(url)` is the DOM Chromium has after the
page's scripts ran; `screenshot(url, path)` saves what it shows. Chromium is Debian's
(`apt-get install chromium`; `make test` installs it when missing and run as root).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class RunningUI:
    address: str  # the address `memloop ui` printed
    pid: int  # its process (the UI's workers are below it)
    seconds: float  # from the start of the command until the UI answered HTTP 200


@contextmanager
def memloop_ui(tracking_uri: str, experiment: str, *, wait_s: float = 120) -> Iterator[RunningUI]:
    """`memloop ui --tracking-uri URI --experiment NAME` on a free port.

    Yields it once the UI answers; stopped (with its workers) when the block ends.
    """
    port = free_port()
    memloop = Path(sys.executable).with_name("memloop")
    started = time.perf_counter()
    ui = subprocess.Popen(
        [str(memloop), "ui", "--tracking-uri", tracking_uri, "--experiment", experiment]
        + ["--port", str(port)],
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
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.perf_counter() - started > wait_s:
                    raise RuntimeError(f"the UI did not answer within {wait_s:.0f} s") from None
                time.sleep(0.1)
        yield RunningUI(match.group(1), ui.pid, time.perf_counter() - started)
    finally:
        os.killpg(ui.pid, 15)
        ui.wait(timeout=30)
