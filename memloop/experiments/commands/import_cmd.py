"""`memloop import-amemgym`: bring a run of the published AMemGym evaluation scripts into memloop.

Writes records.jsonl and metrics.json (memloop's definitions, scored by memloop's scorer) and,
with `--tracking-uri` and `--experiment`, logs the metrics to MLflow.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from memloop.experiments.commands.options import add_tracking_uri_option

# metrics.json keys logged to MLflow: the run's totals at step 0, each period's at step = period
# (prefixed `period_`), so the MLflow UI draws them per period
LOGGED = (
    "overall",
    "published_overall",
    "random",
    "upper_bound",
    "memory_score",
    "state_accuracy",
    "state_chance",
    "state_score",
    "json_errors",
    "questions",
)
DIAGNOSIS = ("format", "write", "read", "utilization")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import-amemgym",
        help="import a run of the published AMemGym evaluation scripts",
        description="Read the per-user folders the published AMemGym scripts wrote "
        "(overall_results.json, diagnosis_results.json) and write memloop's records.jsonl and "
        "metrics.json. The memory score needs the published upper-bound run (--upper-bound). "
        "Nothing is written when a file is missing or malformed.",
        example="memloop import-amemgym tests/data/amemgym_run --upper-bound "
        "tests/data/amemgym_ub_run --out runs/imported",
    )
    p.add_argument(
        "run_dir",
        metavar="RUN_DIR",
        help="the published run: <output_dir>/<agent name>, one folder per user",
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder for records.jsonl and metrics.json; an earlier import there is "
        "replaced, a records.jsonl or metrics.json memloop did not import (or a run folder) is "
        "refused and nothing is written",
    )
    p.add_argument(
        "--upper-bound",
        metavar="UB_RUN_DIR",
        help="the published upper-bound run: <output_dir>/<llm model> with "
        "utilization_results.json (gives the answer options, random and the memory score)",
    )
    add_tracking_uri_option(
        p, "MLflow store, e.g. sqlite:///mlruns/mlflow.db", default=None, metavar="URI"
    )
    p.add_argument("--experiment", metavar="NAME", help="MLflow experiment to log the import to")
    p.set_defaults(func=run_import)


def run_import(args: argparse.Namespace) -> int:
    from memloop.core.errors import UserError
    from memloop.feedback.import_amemgym import import_run
    from memloop.runs.tracker import experiment_name_problem

    if bool(args.tracking_uri) != bool(args.experiment is not None):
        raise UserError("--tracking-uri and --experiment go together: give both, or neither")
    if args.experiment is not None and (problem := experiment_name_problem(args.experiment)):
        raise UserError(f"--experiment {args.experiment[:40]!r}: {problem}")
    out = Path(args.out)
    metrics = import_run(args.run_dir, out, args.upper_bound)
    print(format_import(metrics))
    for note in metrics.get("warnings", []):
        print(f"warning: {note}")
    print(f"wrote {out / 'records.jsonl'}, {out / 'metrics.json'}")
    if args.tracking_uri:
        run_id = log_import(metrics, args.tracking_uri, args.experiment)
        print(f"logged to MLflow experiment {args.experiment!r}, run {run_id}")
    return 0


def format_import(metrics: dict[str, Any]) -> str:
    from memloop.core.tables import format_table

    def row(label: Any, m: dict[str, Any]) -> list[Any]:
        d = m["diagnosis"]
        return [
            label,
            m["overall"],
            m["published_overall"],
            m["upper_bound"],
            m["memory_score"],
            m["state_accuracy"],
            d["format"],
            d["write"],
            d["read"],
            d["utilization"],
        ]

    headers = [
        "period",
        "overall",
        "published",
        "upper_bd",
        "mem_score",
        "state_acc",
        "format",
        "write",
        "read",
        "util",
    ]
    rows = [row(r["period"], r) for r in metrics["per_period"]] + [row("all", metrics)]
    source = metrics["imported_from"]
    lines = [
        f"imported {metrics['users']} users, {metrics['questions']} answers "
        f"from {source['run_dir']}",
        format_table(headers, rows, align="r" * len(headers)),
        "published = the published code's accuracy (a random option for an unparsed answer);",
        "n/a = not in the published files",
    ]
    return "\n".join(lines)


def mlflow_metrics(metrics: dict[str, Any]) -> dict[int, dict[str, float | None]]:
    """{step: {name: value}}: totals at step 0, `period_<name>` at step = period."""

    def flat(m: dict[str, Any], prefix: str) -> dict[str, float | None]:
        out = {f"{prefix}{k}": m.get(k) for k in LOGGED}
        out.update({f"{prefix}diagnosis_{k}": m["diagnosis"][k] for k in DIAGNOSIS})
        return {k: None if v is None else float(v) for k, v in out.items()}

    steps: dict[int, dict[str, float | None]] = {}
    steps.setdefault(0, {}).update(flat(metrics, ""))
    steps[0].update(users=float(metrics["users"]), periods=float(metrics["periods"]))
    for row in metrics["per_period"]:
        steps.setdefault(int(row["period"]), {}).update(flat(row, "period_"))
    return steps


def log_import(metrics: dict[str, Any], tracking_uri: str, experiment: str) -> str:
    """Log an import as one MLflow run (the same content again finds the same run); its id."""
    import json

    from memloop.runs import recorder, spec

    with recorder.recording(
        tracking_uri,
        experiment,
        spec.import_spec(metrics, experiment),
        f"amemgym-import:{Path(metrics['imported_from']['run_dir']).name}",
        tags={"memloop.source": "amemgym-import"},
    ) as rec:
        for step, values in sorted(mlflow_metrics(metrics).items()):
            rec.metrics(values, step=step)
        rec.text(json.dumps(metrics, indent=2), "metrics.json")
    return rec.run_id
