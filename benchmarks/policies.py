"""Cost and quality of each memory policy on a procedural environment.

For every policy (native, AWI, AWE, RAG) this runs `memloop eval` on the same procedural
environment and the same endpoint, then reports:
- the metrics (state accuracy and its chance level, overall, random, no-memory control, memory
  gain, upper bound, memory score, format/write/read/utilization, factual recall on the written
  memory);
- each policy paired with the baseline policy (--baseline, default native) on the same users:
  n, the mean per-user difference, its Student t 95% interval, the two-sided sign-flip p and the
  users up/tied/down (core.stats.Paired);
- tokens and seconds per period (mean over users), split by component: the conversation
  (user_sim + agent replies + memory writes) and the probes after the period (probe + checker);
- model calls per user, next to what the published AMemGym code would make for the same sizes
  (its reference notes, "LLM calls, rough counts").

Each eval has its own output folder and response cache under --out, so a first run measures real
model time and a rerun resumes from the checkpoints (no model call) and only rebuilds the report.

    .venv/bin/python benchmarks/policies.py --users 3 --periods 3 --questions 4 \
        --rounds-update 1 --reply-max-tokens 128 --out runs/bench/policies
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

POLICIES = ("awi", "rag", "awe", "native")  # cheapest first
CONVERSATION = ("user_sim", "agent", "memory")
METRICS = (
    "state_accuracy",
    "state_chance",
    "overall",
    "random",
    "no_memory",
    "memory_gain",
    "upper_bound",
    "memory_score",
    "factual_recall",
)
PAIRED = ("state_accuracy", "memory_gain", "memory_score", "factual_recall")
PROBES = ("probe", "checker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=3)
    p.add_argument(
        "--periods", type=int, default=3, help="update periods; the episode has one more (period 0)"
    )
    p.add_argument("--questions", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds-init", type=int, default=1)
    p.add_argument("--rounds-update", type=int, default=2)
    p.add_argument("--parallel-users", type=int, default=3)
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--baseline", default="native", help="the policy the others are paired with")
    p.add_argument(
        "--reply-max-tokens",
        type=int,
        help="cap the assistant's chat replies (policy reply_max_tokens; probes and "
        "memory writes are not capped); default: the endpoint's max_tokens",
    )
    p.add_argument("--endpoint", help="endpoint YAML for every role (default: embedded 1.5B)")
    p.add_argument("--out", default="runs/bench/policies")
    p.add_argument("--json", help="also write the report as JSON here")
    return p.parse_args(argv)


def usage_calls(usage: dict[str, dict[str, int]], component: str) -> int:
    u = usage.get(component, {})
    return u.get("calls", 0) + u.get("cached_calls", 0)


def usage_tokens(usage: dict[str, dict[str, int]], components: tuple[str, ...]) -> int:
    return sum(usage.get(c, {}).get("total_tokens", 0) for c in components)


def period_records(eval_dir: Path) -> list[dict]:
    return [
        json.loads(p.read_text())
        for p in sorted((eval_dir / "episodes").glob("*/period_*/record.json"))
    ]


def published_calls(items, rounds_init: int, rounds_update: int) -> float:
    """Calls per user of the published code for the same episodes, memory writes excluded (the
    same policies make the same writes): per period S*R agent replies, S*(R-1) simulator calls,
    Q multiple-choice answers and Q diagnosis state queries; the upper bound once per user with
    one call per choice of every question."""
    totals = []
    for item in items:
        calls = 0
        for p, period in enumerate(item.periods):
            s = len(period.sessions)
            r = rounds_init if p == 0 else rounds_update
            calls += s * r + s * (r - 1) + 2 * len(item.qas)
        calls += sum(len(qa.answer_choices) for qa in item.qas)
        totals.append(calls)
    return statistics.mean(totals)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from memloop.environment.datafile import load_items, save_items
    from memloop.environment.procedural import generate_procedural
    from memloop.experiments.cli import main as memloop

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = out / "env.json"
    if not env.is_file():
        save_items(
            generate_procedural(
                users=args.users, periods=args.periods, questions=args.questions, seed=args.seed
            ),
            env,
        )
    items = load_items(env)
    report: dict = {
        "sizes": {
            "users": args.users,
            "periods": args.periods,
            "questions": args.questions,
            "rounds_init": args.rounds_init,
            "rounds_update": args.rounds_update,
            "reply_max_tokens": args.reply_max_tokens,
        },
        "endpoint": args.endpoint or "embedded local-1.5b",
        "policies": {},
    }
    for name in args.policies.split(","):
        eval_dir = out / name
        policy = ROOT / f"memloop/experiments/policies/{name}.yaml"
        if args.reply_max_tokens:
            import yaml

            data = yaml.safe_load(policy.read_text())
            data["reply_max_tokens"] = args.reply_max_tokens
            policy = out / f"{name}.yaml"
            policy.write_text(yaml.safe_dump(data))
        cmd = [
            "eval",
            "--env",
            str(env),
            "--policy",
            str(policy),
            "--out",
            str(eval_dir),
            "--rounds-init",
            str(args.rounds_init),
            "--rounds-update",
            str(args.rounds_update),
            "--parallel-users",
            str(args.parallel_users),
            "--cache",
            str(eval_dir / "responses.sqlite"),
        ]
        if args.endpoint:
            cmd += ["--endpoint", args.endpoint]
        print(f"== {name}", flush=True)
        if memloop(cmd) != 0:
            return 1
        metrics = json.loads((eval_dir / "metrics.json").read_text())
        records = period_records(eval_dir)
        by_period: dict[int, list[dict]] = {}
        for rec in records:
            by_period.setdefault(rec["period"], []).append(rec)
        per_period = []
        for p in sorted(by_period):
            recs = by_period[p]
            per_period.append(
                {
                    "period": p,
                    "seconds": round(statistics.mean(r["seconds"] for r in recs), 1),
                    "conversation_tokens": round(
                        statistics.mean(usage_tokens(r["usage"], CONVERSATION) for r in recs)
                    ),
                    "memory_tokens": round(
                        statistics.mean(usage_tokens(r["usage"], ("memory",)) for r in recs)
                    ),
                    "probe_tokens": round(
                        statistics.mean(usage_tokens(r["usage"], PROBES) for r in recs)
                    ),
                }
            )
        calls: dict[str, float] = {}
        for rec in records:
            for comp in rec["usage"]:
                calls[comp] = calls.get(comp, 0) + usage_calls(rec["usage"], comp)
        users = len({r["user_id"] for r in records})
        report["policies"][name] = {
            "metrics": {k: metrics.get(k) for k in METRICS},
            "per_user": metrics.get("per_user", {}),
            "diagnosis": metrics.get("diagnosis"),
            "per_period": per_period,
            "calls_per_user": {k: round(v / users, 1) for k, v in sorted(calls.items())},
            "total_seconds": round(sum(r["seconds"] for r in records), 1),
        }
    report["paired"] = paired(report, args.baseline)
    report["published_calls_per_user_without_writes"] = published_calls(
        items, args.rounds_init, args.rounds_update
    )
    print(render(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def paired(report: dict, baseline: str) -> dict:
    """{policy: {metric: Paired.to_dict()}}: policy - baseline per user, on the users both have."""
    from memloop.core.stats import Paired

    policies = report["policies"]
    if baseline not in policies:
        return {}

    def values(name: str, metric: str) -> dict[str, float]:
        return {
            u: row[metric]
            for u, row in policies[name]["per_user"].items()
            if row.get(metric) is not None
        }

    out = {}
    for name in policies:
        if name == baseline:
            continue
        out[name] = {
            metric: Paired.of(values(name, metric), values(baseline, metric)).to_dict()
            for metric in PAIRED
        }
    return {"baseline": baseline, "policies": out}


def fmt(v) -> str:
    return "null" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def render(report: dict) -> str:
    lines = [
        f"sizes {report['sizes']}, endpoint {report['endpoint']}",
        "",
        "| policy | " + " | ".join(METRICS) + " | format | write | read | utilization |",
        "|---|" + "---|" * (len(METRICS) + 4),
    ]
    for name, r in report["policies"].items():
        m, d = r["metrics"], r["diagnosis"] or {}
        lines.append(
            f"| {name} | "
            + " | ".join(fmt(m[k]) for k in METRICS)
            + " | "
            + " | ".join(fmt(d.get(k)) for k in ("format", "write", "read", "utilization"))
            + " |"
        )
    pair = report.get("paired") or {}
    if pair:
        lines += [
            "",
            f"paired with {pair['baseline']} on the same users: mean per-user difference "
            "[Student t 95% interval], sign-flip p, n users (up/tied/down)",
            "",
            "| policy | " + " | ".join(f"diff {m}" for m in PAIRED) + " |",
            "|---|" + "---|" * len(PAIRED),
        ]
        for name, row in pair["policies"].items():
            cells = []
            for metric in PAIRED:
                c = row[metric]
                if c["mean"] is None:
                    cells.append("n/a (n=0)")
                    continue
                text = f"{c['mean']:+.3f}"
                text += (
                    f" [{c['t95'][0]:+.2f}, {c['t95'][1]:+.2f}]" if c["t95"] else " (no interval)"
                )
                text += f" p={c['sign_flip_p']:.3f}"
                cells.append(f"{text} (n={c['n']}: {c['up']}/{c['tied']}/{c['down']})")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "per period, mean over users: seconds / conversation tokens (of which memory "
        "writes) / probe tokens",
        "",
        "| policy | "
        + " | ".join(
            f"period {p['period']}" for p in next(iter(report["policies"].values()))["per_period"]
        )
        + " |",
        "|---|" + "---|" * len(next(iter(report["policies"].values()))["per_period"]),
    ]
    for name, r in report["policies"].items():
        lines.append(
            f"| {name} | "
            + " | ".join(
                f"{p['seconds']} s / {p['conversation_tokens']} ({p['memory_tokens']}) / "
                f"{p['probe_tokens']}"
                for p in r["per_period"]
            )
            + " |"
        )
    pub = report["published_calls_per_user_without_writes"]
    lines += [
        "",
        f"model calls per user (published code, same sizes, memory writes excluded: {pub:.0f})",
        "",
    ]
    for name, r in report["policies"].items():
        c = r["calls_per_user"]
        without = sum(v for k, v in c.items() if k != "memory")
        lines.append(
            f"- {name}: {c} -> {without:.0f} without memory writes; "
            f"eval time {r['total_seconds']} s"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
