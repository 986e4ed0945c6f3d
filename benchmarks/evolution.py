"""Does an evolved write prompt beat no evolution on held-out users? (issue 16, item 6)

An embedded-model study larger than the quickstart: AWI (with no raw buffer and memloop's own
writer prompt, as the quickstart had before issue 42 gave it a weak seed) on a procedural
environment, four conditions on the same users and the same draws:

- `none`: the initial prompts every cycle (the baseline);
- `playbook`: one-sentence rules added, edited or removed, screened by replay (episode search);
- `reflective`: whole-prompt rewrites from complete feedback (episode search);
- `gepa`: GEPA's reflective Pareto search (its own search).

Every condition selects its cycle on the validation users (objective: state accuracy); the
numbers reported are on the test users, paired with `none` (same users), each with n, the t
95% interval, the sign-flip p and users up / tied / down (`core.stats.Paired`), plus the tokens
each condition used. Superseded by benchmarks/evidence.py (its measured result used scorer
version 2, whose state query also read the raw buffer; see benchmarks/README.md). The
environment seed (2026) and the sizes below were fixed before any run of this script; the
defaults are the issue's minimum (8 training, 8 validation, 16 test users, 4 cycles; a GEPA
cycle is one of its iterations, and its budget of episodes can give more of them).

Models: assistant, simulated user and recall checker on the embedded 0.5B model, the optimizer on
the embedded 1.5B model (as the quickstart, for the reasons in quickstart.yaml). Users run one at
a time (never run another model job beside it: two busy embedded servers on 2 cores are far
slower than one after the other).

Resumable: every episode is checkpointed and every model response cached, so an interrupted run
continues where it stopped and a finished one only rebuilds the report. It takes hours at the
default sizes (about 36 s per user per evaluated prompt); `--conditions` runs a subset first.

    .venv/bin/python benchmarks/evolution.py --out runs/bench/evolution
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXPERIMENTS = ROOT / "memloop" / "experiments"
CONDITIONS = ("playbook", "reflective", "gepa")  # each against `none`, which always runs
SEED = 2026  # fixed before any run; not to be changed after seeing a result


def experiment_config(args: argparse.Namespace, search: str, evolvers: list[str]) -> dict:
    """One `memloop evolve` experiment file's content (absolute paths: it is written under out)."""
    config: dict[str, Any] = {
        "experiment": args.experiment,
        "environment": {
            "procedural": {
                "users": args.train + args.val + args.test,
                "periods": args.periods,
                "questions": args.questions,
                "seed": SEED,
            },
            "train_users": args.train,
            "val_users": args.val,
            "test_users": args.test,
        },
        "policy": str(Path(args.out) / "policy.yaml"),
        "endpoints": {
            "agent": str(EXPERIMENTS / "endpoints" / "local-0.5b.yaml"),
            "user_sim": str(EXPERIMENTS / "endpoints" / "local-0.5b.yaml"),
            "checker": str(EXPERIMENTS / "endpoints" / "local-0.5b.yaml"),
            "optimizer": str(EXPERIMENTS / "endpoints" / "local.yaml"),
        },
        "feedback_modes": ["none", "complete"] if search == "episode" else ["complete"],
        "search": search,
        "objective": "state_accuracy",
        "cycles": args.cycles,
        "rounds": {"init": 1, "update": 1},
        "parallel_users": 1,
        "tracking_uri": args.tracking_uri,
        "out_dir": str(Path(args.out) / "runs"),
    }
    if search == "episode":
        config["evolvers"] = evolvers
    return config


def report(tracking_uri: str, experiment: str) -> dict[str, Any]:
    """The paired comparison (compare's table) and each condition's numbers, for the README."""
    from memloop.results.compare import compare

    result = compare(tracking_uri, experiment)
    rows = []
    for row in result["rows"]:
        rows.append(
            {
                "condition": row.condition,
                "search": row.search,
                "split": row.split,
                "n_users": row.n_users,
                "cycles": row.cycles,
                "selected_cycle": row.selection.cycle if row.selection else None,
                "state_accuracy": row.state_accuracy,
                "memory_score": row.selected,
                "memory_gain": row.memory_gain,
                "factual_recall": row.factual_recall,
                "tokens": row.tokens,
                "per_cycle": [
                    {
                        "cycle": c.cycle,
                        "val_state_accuracy": c.score("val", "state_accuracy"),
                        "test_state_accuracy": c.score("test", "state_accuracy"),
                        "tokens": sum(c.tokens.values()),
                    }
                    for c in row.records
                ],
                "vs_none": {metric: p.to_dict() for metric, p in row.vs_baseline.items()},
            }
        )
    return {"table": result["table"], "rows": rows}


def main() -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    import yaml

    from memloop.experiments.cli import stop_requests_on_ctrl_c
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.context import role_clients
    from memloop.optimize.evolve import run_evolve

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=8, help="training users")
    parser.add_argument("--val", type=int, default=8, help="validation users")
    parser.add_argument("--test", type=int, default=16, help="test users")
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--periods", type=int, default=1, help="update periods per user")
    parser.add_argument("--questions", type=int, default=1, help="questions per user")
    parser.add_argument(
        "--conditions",
        nargs="+",
        choices=CONDITIONS,
        default=list(CONDITIONS),
        help="evolving conditions to run (none always runs)",
    )
    parser.add_argument("--experiment", default="evolution-bench", help="MLflow experiment")
    parser.add_argument("--out", default="runs/bench/evolution")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="no model work: the report of what the MLflow store holds (finished cycles only)",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.out = str(out)
    args.tracking_uri = f"sqlite:///{out / 'mlflow.db'}"
    # the study's policy: AWI with no raw buffer and memloop's own writer prompt
    policy = {"type": "awi", "update_freq": 2, "short_term_len": 0, "reply_max_tokens": 48}
    (out / "policy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))

    started = time.perf_counter()
    episode = [c for c in args.conditions if c != "gepa"]
    plan = [("episode", episode or ["none"])]
    if "gepa" in args.conditions:
        plan.append(("gepa", []))
    clients = None
    if args.report_only:
        plan = []
    with stop_requests_on_ctrl_c():  # Ctrl-C ends it at once; finished periods stay checkpointed
        for search, evolvers in plan:
            path = out / f"{search}.yaml"
            config_data = experiment_config(args, search, evolvers)
            path.write_text(yaml.safe_dump(config_data, sort_keys=False))
            config = load_config(path, EvolveConfig)
            clients = clients or role_clients(config.endpoints)  # one server per model
            run_evolve(config, progress=not args.no_progress, clients=clients)

    result = report(args.tracking_uri, args.experiment)
    result["sizes"] = {
        k: getattr(args, k) for k in ("train", "val", "test", "cycles", "periods", "questions")
    }
    result["seed"] = SEED
    result["seconds_this_run"] = round(time.perf_counter() - started, 1)
    if clients is not None and clients.agent.cache is not None:
        result["new_responses_this_run"] = clients.agent.cache.stores
    (out / "report.json").write_text(json.dumps(result, indent=2))
    print(result["table"])
    print(f"\nreport: {out / 'report.json'} ({result['seconds_this_run']:.0f} s this run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
