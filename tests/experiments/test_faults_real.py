"""Kill and resume on the embedded model: `memloop eval` killed with SIGKILL after its first
checkpoint, rerun, ends with the records and metrics of a run that was never killed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.testing.commands import eval_argv
from memloop.testing.paths import REPO

pytestmark = pytest.mark.real_model

NATIVE = REPO / "memloop" / "experiments" / "policies" / "native.yaml"


def eval_command(tmp_path: Path, out: str) -> list[str]:
    env = tmp_path / "env.json"
    if not env.exists():
        save_items(generate_procedural(users=1, periods=1, questions=1, seed=0), env)
    endpoint, cache = tmp_path / "local.yaml", tmp_path / "cache.sqlite"
    endpoint.write_text(
        "model: local-0.5b\nbase_url: local\nmax_tokens: 64\nmax_concurrency: 1\n"
        "context_window: 4096\ntimeout_s: 300\n"
    )
    out_dir = tmp_path / out
    argv = eval_argv(env, NATIVE, endpoint, cache, out_dir)
    return [sys.executable, "-m", "memloop", *argv, "--rounds-update", "1"]  # short periods


def new_requests(stdout: str) -> int:
    line = next(x for x in stdout.splitlines() if x.startswith("new model requests this run:"))
    return int(line.rsplit(":", 1)[1])


def test_sigkill_after_the_first_checkpoint_then_rerun_equals_an_unkilled_run(tmp_path):
    command = eval_command(tmp_path, "killed")
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = tmp_path / "killed" / "episodes"
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if list(first.glob("*/period_00/record.json")):
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert not (tmp_path / "killed" / "metrics.json").exists()

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # an unkilled run on the same cache: every answer is one the killed+resumed run got
    fresh = subprocess.run(
        eval_command(tmp_path, "fresh"), capture_output=True, text=True, timeout=900
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert new_requests(fresh.stdout) == 0
    assert new_requests(resumed.stdout) > 0

    def read(out: str) -> tuple[str, dict]:
        folder = tmp_path / out
        return (folder / "records.jsonl").read_text(), json.loads(
            (folder / "metrics.json").read_text()
        )

    killed_records, killed_metrics = read("killed")
    fresh_records, fresh_metrics = read("fresh")
    assert killed_records == fresh_records
    for key in ("overall", "state_accuracy", "no_memory", "diagnosis", "questions", "usage"):
        assert killed_metrics[key] == fresh_metrics[key], key
