"""The transfer matrix (issue 60, point 2): the quickstart's run and the evidence benchmark's
evolved prompt, each against its seed, under the embedded 0.5B and 1.5B writers.

`memloop transfer` evaluates a run's selected prompts and its seed prompts on the run's test
users (the evidence run's 26 confirmation users: it has no test users) under each writer and
pairs them user by user (module docstring of memloop/optimize/transfer.py). This script runs:

1. `memloop quickstart --out WORK/quickstart` (its complete/edits run: the loop's selection);
2. `memloop transfer` of that run, writers local-0.5b and local-1.5b;
3. `memloop transfer` of the evidence benchmark's evolve run (`--evidence-run`: the folder its
   measured run wrote, runs/bench/evidence/evolve/<run> of the clone it ran in), same writers;
4. `memloop rerun` of the quickstart run's manifest into a new folder (issue 60, point 3):
   served from the response cache, it must report `identical`.

A selection that is its seed (same prompts and settings) is reported as `same prompt`, and no
cell is evaluated for it: there is nothing to transfer. Output:
benchmarks/results/transfer_matrix.json (`commit`, `manifest`, each matrix as transfer.json holds
it, the rerun's comparison, the commands, the time).

    .venv/bin/python benchmarks/transfer_matrix.py --work runs/bench/transfer \\
        --evidence-run runs/bench/evidence/evolve/awi-2-0-complete-edits-821b9878
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from embedded_cost import commit  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "transfer_matrix.json"
WRITERS = ["local-0.5b", "local-1.5b"]


def main(argv: list[str] | None = None) -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    from memloop.experiments.cli import main as memloop
    from memloop.runs.manifest import manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="working folder (runs, cells, stores)")
    parser.add_argument("--evidence-run", required=True, help="the evidence benchmark's run")
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args(argv)
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    uri = f"sqlite:///{work}/mlruns/mlflow.db"
    writers = [x for w in WRITERS for x in ("--writer", w)]
    commands = {
        "quickstart": ["quickstart", "--out", str(work / "quickstart"), "--tracking-uri", uri],
    }
    if memloop([*commands["quickstart"], "--no-progress"]) != 0:
        return 1
    (edits,) = [
        p for p in (work / "quickstart").iterdir() if p.is_dir() and "complete-edits" in p.name
    ]
    matrices = {}
    for name, run in (("quickstart", edits), ("evidence", Path(args.evidence_run))):
        out = work / f"transfer-{name}"
        command = ["transfer", str(run), *writers, "--out", str(out), "--tracking-uri", uri]
        commands[f"transfer-{name}"] = command
        if memloop([*command, "--no-progress"]) != 0:
            return 1
        matrices[name] = json.loads((out / "transfer.json").read_text())
    # 4. the quickstart again from its manifest (the response cache serves it): identical?
    again = work / "quickstart-again"
    commands["rerun"] = ["rerun", str(edits / "manifest.json"), "--out", str(again)]
    if memloop(commands["rerun"]) != 0:
        return 1
    rerun = json.loads((again / "rerun.json").read_text())
    result = {
        "commit": commit(),
        "manifest": manifest(),
        "rerun_of_quickstart": {k: rerun[k] for k in ("command", "identical", "units")},
        "writers": WRITERS,
        "matrices": matrices,
        "commands": {k: "memloop " + " ".join(v) for k, v in commands.items()},
        "seconds": round(time.monotonic() - started, 1),
    }
    Path(args.results).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.results} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
