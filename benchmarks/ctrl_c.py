"""How long `memloop eval`, `evolve` and `tune` take to stop after Ctrl-C (issue 29: within 1 s).

Each command runs as its own process (`python -m memloop ...`) against the loopback fake endpoint
answering after `--latency` seconds, so model requests are in flight when SIGINT arrives. SIGINT
is sent after each of `--waits` seconds (start-up, imports, episodes, MLflow) in a fresh folder,
and the time to the process's exit is measured. Writes benchmarks/results/ctrl_c.json.

    python benchmarks/ctrl_c.py                      # eval, evolve, tune; waits 2 5 10 20 30 s
    python benchmarks/ctrl_c.py --commands tune --waits 3 6
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.runs.spec import git_revision
from memloop.testing import FakeOpenAIServer, evolve_loop_reply

RESULTS = Path(__file__).parent / "results" / "ctrl_c.json"
POLICIES = Path(__file__).resolve().parents[1] / "memloop" / "experiments" / "policies"
ENV = {"users": 4, "periods": 2, "questions": 2, "seed": 1}


def argv_for(command: str, root: Path, endpoint: Path) -> list[str]:
    """The command line of `command` on a small procedural environment in `root`."""
    stores = {
        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
        "out_dir": str(root / "runs"),
        "endpoints": {"agent": str(endpoint)},
    }
    if command == "eval":
        save_items(generate_procedural(**ENV), root / "env.json")
        return [
            *("eval", "--env", str(root / "env.json"), "--policy", str(POLICIES / "awi.yaml")),
            *("--endpoint", str(endpoint), "--out", str(root / "out")),
        ]
    policy = root / "policy.yaml"
    policy.write_text("type: awi\n" if command == "evolve" else "type: awe\n")
    env = {"procedural": ENV, "val_users": 1, "test_users": 1}
    if command == "evolve":
        data = {**stores, "environment": {**env, "train_users": 2}, "cycles": 2}
    else:
        data = {**stores, "environment": env, "storage": f"sqlite:///{root}/mlruns/optuna.db"}
    data["policy"] = str(policy)
    (root / "config.yaml").write_text(yaml.safe_dump(data))
    return [command, str(root / "config.yaml"), "--no-progress"]


def stop_after(command: str, wait: float, fake: FakeOpenAIServer, endpoint: Path) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"ctrl-c-{command}-"))
    try:
        argv = [sys.executable, "-m", "memloop", *argv_for(command, root, endpoint)]
        before = len(fake.requests)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(wait)
        finished_first = proc.poll() is not None
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        return {
            "command": command,
            "wait_s": wait,
            "stop_s": round(time.perf_counter() - sent, 3),
            "exit": proc.returncode,
            "finished_before_sigint": finished_first,
            "requests_before_sigint": len(fake.requests) - before,
            "error_tail": "" if proc.returncode == 130 else err.strip()[-400:],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", nargs="+", default=["eval", "evolve", "tune"])
    parser.add_argument("--waits", nargs="+", type=float, default=[2, 5, 10, 20, 30])
    parser.add_argument("--latency", type=float, default=0.3, help="the fake's seconds per answer")
    args = parser.parse_args()
    rows = []
    with FakeOpenAIServer(reply=evolve_loop_reply, latency_s=args.latency) as fake:
        endpoint = Path(tempfile.mkdtemp(prefix="ctrl-c-endpoint-")) / "endpoint.yaml"
        endpoint.write_text(f"model: fake\nbase_url: {fake.base_url}\n")
        for command in args.commands:
            for wait in args.waits:
                row = stop_after(command, wait, fake, endpoint)
                rows.append(row)
                print(
                    f"{command:6s} SIGINT after {wait:4.1f} s: stopped in {row['stop_s']:.2f} s, "
                    f"exit {row['exit']}, {row['requests_before_sigint']} requests before",
                    flush=True,
                )
    commit = (git_revision() or "unknown")[:7]
    stopped = [r for r in rows if not r["finished_before_sigint"]]
    summary = {
        "commit": commit,
        "latency_s": args.latency,
        "worst_stop_s": max((r["stop_s"] for r in stopped), default=None),
        "all_exit_130": all(r["exit"] == 130 for r in stopped),
        "runs": rows,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"worst: {summary['worst_stop_s']} s; every stop exit 130: {summary['all_exit_130']}")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
