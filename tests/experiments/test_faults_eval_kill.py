"""Kill and resume: `memloop eval` killed with SIGKILL after its first checkpoint, rerun, ends with
the records and metrics of a run that was never killed.

On the fake endpoint, each reply slowed so that the kill lands mid-run. Until issue 43 this ran on
the embedded model. The real-model pass's rule (for make test's budget): each path meets the
real model once (`memloop eval` does in test_quickstart_real.py), and what a second run on the
same path adds (here: a resume, then a run served from the cache) is checked on the fake model.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.testing import FakeOpenAIServer, schema_valid_reply
from memloop.testing.commands import eval_argv
from memloop.testing.paths import REPO

NATIVE = REPO / "memloop" / "experiments" / "policies" / "native.yaml"


def eval_command(tmp_path: Path, out: str, base_url: str) -> list[str]:
    env = tmp_path / "env.json"
    if not env.exists():
        save_items(generate_procedural(users=1, periods=1, questions=1, seed=0), env)
    endpoint, cache = tmp_path / "fake.yaml", tmp_path / "cache.sqlite"
    endpoint.write_text(f"model: fake\nbase_url: {base_url}\nmax_concurrency: 1\n")
    out_dir = tmp_path / out
    argv = eval_argv(env, NATIVE, endpoint, cache, out_dir)
    return [sys.executable, "-m", "memloop", *argv, "--rounds-update", "1"]  # short periods


def new_requests(stdout: str) -> int:
    line = next(x for x in stdout.splitlines() if x.startswith("new model requests this run:"))
    return int(line.rsplit(":", 1)[1])


def test_sigkill_after_the_first_checkpoint_then_rerun_equals_an_unkilled_run(tmp_path):
    with FakeOpenAIServer(reply=schema_valid_reply, latency_s=0.3) as fake:
        killed_and_resumed(tmp_path, fake.base_url)


def killed_and_resumed(tmp_path: Path, base_url: str) -> None:
    command = eval_command(tmp_path, "killed", base_url)
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = tmp_path / "killed" / "episodes"
    deadline = time.monotonic() + 120
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

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # an unkilled run on the same cache: every answer is one the killed+resumed run got
    fresh = subprocess.run(
        eval_command(tmp_path, "fresh", base_url), capture_output=True, text=True, timeout=300
    )
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    assert new_requests(fresh.stdout) == 0
    assert new_requests(resumed.stdout) > 0
    # the rerun says what it found: the periods the killed run finished, of the one user
    assert re.search(r"resumed from checkpoints: [12] period\(s\) of 1 of 1 user", resumed.stdout)
    assert "resumed from" not in fresh.stdout

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
