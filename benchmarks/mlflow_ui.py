"""Does `memloop ui` answer quickly and open on the experiment's runs table? Checked in Chromium.

Builds a small experiment on the fake endpoint (two evolve runs, no evolution and the playbook
evolver, 2 cycles each, on a sqlite store in a temporary folder) unless `--tracking-uri` names a
store, starts `memloop ui --experiment NAME` and measures:
- seconds from the start of the command until the UI answers HTTP 200 on the printed address;
- the UI's processes and their resident memory (from /proc, once it answers);
- in headless Chromium (Debian's `chromium`), the DOM of the printed address after the page's
  scripts ran: it must name the experiment's runs (the runs table, not an empty traces page);
- the pages a researcher opens next, as screenshots: the experiment's Prompts page, the chart
  view (the objective's curves first), and one user's session as a trace (its conversation and
  what the writer stored: the built store's writer stores what the user said, `writing_reply`).
Writes benchmarks/results/mlflow_ui.json with the commit and the screenshots
benchmarks/results/mlflow_ui*.png.

    apt-get install chromium          # once
    python benchmarks/mlflow_ui.py
    python benchmarks/mlflow_ui.py --tracking-uri sqlite:///mlruns/mlflow.db --experiment quickstart
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from memloop.testing.browser import chromium, memloop_ui, rendered, screenshot

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 15.0


def build_store(folder: Path) -> tuple[str, str, list[str]]:
    """A 2-run evolve experiment on the fake endpoint; (tracking URI, experiment, run names)."""
    import yaml

    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.runs import tracker
    from memloop.testing import FakeOpenAIServer, fake_roles, writing_reply

    uri = f"sqlite:///{folder}/mlruns/mlflow.db"
    (folder / "awi.yaml").write_text("type: awi\n")
    data = {
        "experiment": "ui-check",
        "environment": {
            "procedural": {"users": 6, "periods": 2, "questions": 2, "seed": 1},
            "train_users": 2,
            "val_users": 2,
            "test_users": 2,
        },
        "policy": "awi.yaml",
        "feedback_modes": ["none", "complete"],
        "evolvers": ["playbook"],
        "cycles": 2,
        "tracking_uri": uri,
        "out_dir": str(folder / "runs"),
    }
    (folder / "exp.yaml").write_text(yaml.safe_dump(data))
    config = load_config(folder / "exp.yaml", EvolveConfig)
    with FakeOpenAIServer(reply=writing_reply) as fake:
        outcomes = run_evolve(config, progress=False, clients=fake_roles(fake.base_url, None))
    mlc = tracker.client(uri, create=False)
    names = [mlc.get_run(o.run_id).info.run_name for o in outcomes]
    return uri, "ui-check", names


def run_names(uri: str, experiment: str) -> list[str]:
    from memloop.runs import tracker

    mlc = tracker.client(uri, create=False)
    exp = mlc.get_experiment_by_name(experiment)
    if exp is None:
        sys.exit(f"no experiment {experiment!r} in {uri}")
    return [r.info.run_name for r in mlc.search_runs([exp.experiment_id], max_results=20)]


def first_stored_trace(uri: str, experiment: str) -> tuple[str, str | None]:
    """(experiment id, id of the first session trace in which memory gained a line)."""
    from memloop.runs import tracker

    mlc = tracker.client(uri, create=False)
    exp_id = mlc.get_experiment_by_name(experiment).experiment_id
    for t in mlc.search_traces(locations=[exp_id], max_results=200):
        if t.info.tags.get("memloop.session") == "0" and t.data.spans[0].outputs.get(
            "memory lines added"
        ):
            return exp_id, t.info.trace_id
    return exp_id, None


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def rss_mb(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        match = re.search(r"VmRSS:\s+(\d+) kB", status)
        total += int(match.group(1)) if match else 0
    return total / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracking-uri", help="an existing store (default: build one)")
    ap.add_argument("--experiment", help="its experiment (with --tracking-uri)")
    ap.add_argument("--out", default=str(RESULTS / "mlflow_ui.json"))
    args = ap.parse_args()
    try:
        chromium()
    except RuntimeError as exc:
        sys.exit(str(exc))
    with tempfile.TemporaryDirectory(prefix="memloop-ui-") as tmp:
        folder = Path(tmp)
        if args.tracking_uri:
            if not args.experiment:
                sys.exit("--tracking-uri needs --experiment")
            uri, experiment = args.tracking_uri, args.experiment
            names = run_names(uri, experiment)
        else:
            uri, experiment, names = build_store(folder)
        cmd = f"memloop ui --tracking-uri {uri} --experiment {experiment}"
        try:
            with memloop_ui(uri, experiment) as ui:
                address, answered = ui.address, ui.seconds
                pids = process_tree(ui.pid)
                memory = rss_mb(pids)
                shot = RESULTS / "mlflow_ui.png"
                dom = rendered(address)
                screenshot(address, shot)
                shots = [str(shot.relative_to(ROOT))]
                exp_id, trace_id = first_stored_trace(uri, experiment)
                base = address.split("#")[0]
                pages = {
                    "prompts": f"#/experiments/{exp_id}/prompts",
                    "charts": f"#/experiments/{exp_id}/runs?compareRunsMode=CHART",
                }
                if trace_id is not None:
                    pages["trace"] = (
                        f"#/experiments/{exp_id}/traces?selectedEvaluationId={trace_id}"
                    )
                for name, path in pages.items():
                    out = RESULTS / f"mlflow_ui_{name}.png"
                    # a trace opens, and charts draw, after the list's requests: more time
                    screenshot(base + path, out, budget_ms=45000)
                    shots.append(str(out.relative_to(ROOT)))
        except RuntimeError as exc:
            sys.exit(str(exc))
    shown = [n for n in names if n in dom]
    result = {
        "commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "command": cmd,
        "address": re.sub(r":\d+/", ":PORT/", address),
        "seconds_to_answer": round(answered, 2),
        "target_seconds": TARGET_S,
        "processes": len(pids),
        "rss_mb": round(memory, 1),
        "runs": names,
        "runs_in_the_rendered_page": shown,
        "runs_table_rendered": bool(names) and len(shown) == len(names),
        "screenshots": shots,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    ok = result["runs_table_rendered"] and answered <= TARGET_S
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
