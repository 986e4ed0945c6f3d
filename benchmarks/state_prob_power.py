"""What the letter read buys: the detectable effect of the evidence design with 0/1 vs probability
scores, per model token (issue 41).

The question, fixed before the run: on the evidence benchmark's design (benchmarks/evidence.py:
its 10 test users, their one-round conversations recorded once, AWI writing every turn on the
embedded 1.5B model, the state queries reading written memory only), how large is the SD across
users of the per-user difference between real prompts, and so the smallest effect 10 users detect
at 80% power, when the state queries are scored
- `json 0/1`: the JSON state query, one per question (the evidence benchmark's read);
- `letters 0/1`: the letter read, its most probable option right or not;
- `letters P`: the letter read's probability of the true value (`state_prob`)?
And what each read costs in model tokens, so the users (and read tokens) needed to detect +0.10.

Arms, on the same recorded conversations: the evidence benchmark's `seed` (a weak writer),
`default` (memloop's AWI writer), `hand` (a hand-written writer) and `oracle` (memory = the
conversation). The real prompt changes are hand - seed, default - seed and hand - default (oracle -
seed is the largest possible change, shown but not planned on). Each arm's memory writes are the
same for both reads (the response cache answers the second).

    .venv/bin/python benchmarks/state_prob_power.py --out runs/bench/state-prob
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import evidence  # noqa: E402  (this folder: the design, the arms, the prompts)
from embedded_cost import commit  # noqa: E402

ARMS = ("seed", "default", "hand", "oracle")
CHANGES = (("hand", "seed"), ("default", "seed"), ("hand", "default"), ("oracle", "seed"))
PLANNED = ("hand-seed", "default-seed", "hand-default")  # real prompt changes
SCORINGS = {
    "json 0/1": ("json", "accuracy"),
    "letters 0/1": ("letters", "accuracy"),
    "letters P": ("letters", "prob"),
}
EFFECT = 0.10


def main(argv: list[str] | None = None) -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    from memloop.core.stats import Paired, detectable_effect, users_needed
    from memloop.environment.procedural import generate_procedural
    from memloop.experiments.cli import stop_requests_on_ctrl_c
    from memloop.feedback.probes import ProbeSettings
    from memloop.optimize.replay_score import replay_screen
    from memloop.policies import build_policy
    from memloop.runs.inputs import roles

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench/state-prob")
    parser.add_argument("--agent-endpoint", help="writer and reader (default: embedded 1.5B)")
    parser.add_argument(
        "--results", default=str(ROOT / "benchmarks" / "results" / "state_prob_power.json")
    )
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    agent = args.agent_endpoint or str(evidence.EXPERIMENTS / "endpoints" / "local.yaml")
    clients = roles(agent, agent, agent, agent)
    design = evidence.DESIGN
    items = generate_procedural(**design["procedural"])
    sizes = design["splits"]
    test_items = items[sizes["train"] + sizes["val"] : sum(sizes.values())]
    recording = out / "test-recording"
    values: dict[str, dict[str, dict[str, dict[str, float | None]]]] = {}
    tokens: dict[str, dict[str, dict[str, int]]] = {}
    with stop_requests_on_ctrl_c():
        print(f"[{time.perf_counter() - started:.0f} s] recording the test users", flush=True)
        evidence.record_test_users(test_items, clients, recording, not args.no_progress)
        configs = evidence.arm_configs({"writer": evidence.SEED_PROMPT})
        for arm in ARMS:
            config, prompts = configs[arm]
            values[arm], tokens[arm] = {}, {}
            for read in ("json", "letters"):
                print(f"[{time.perf_counter() - started:.0f} s] {arm}, {read} read", flush=True)
                screening = replay_screen(
                    test_items,
                    lambda uid, workdir, c, config=config, prompts=prompts: build_policy(
                        config, c, workdir, prompts=prompts
                    ),
                    clients.agent,
                    recording,
                    out / "arms" / arm / read,
                    parallel_users=1,
                    probes=ProbeSettings(state_read=read),  # type: ignore[arg-type]
                )
                values[arm][read] = {
                    "accuracy": dict(screening.by_user),
                    "prob": dict(screening.prob_by_user),
                }
                tokens[arm][read] = dict(screening.tokens_by_component)

    users = [item.id for item in test_items]
    scorings: dict[str, Any] = {}
    for name, (read, field) in SCORINGS.items():
        changes = {}
        for a, b in CHANGES:
            cond = {u: v for u, v in values[a][read][field].items() if v is not None}
            base = {u: v for u, v in values[b][read][field].items() if v is not None}
            paired = Paired.of(cond, base)
            diffs = [cond[u] - base[u] for u in users if u in cond and u in base]
            sd = statistics.stdev(diffs) if len(diffs) > 1 else None
            mean = paired.mean
            # the scorings put effects on different scales (a probability moves less than a
            # 0/1): what compares them is how many users detect the same real change
            standardized = mean / sd if sd and mean is not None else None
            changes[f"{a}-{b}"] = {
                **paired.to_dict(),
                "sd": sd,
                "standardized": standardized,
                "users_to_detect": users_needed(mean, sd) if standardized else None,
            }
        sds = [changes[c]["sd"] for c in PLANNED if changes[c]["sd"]]
        sd = max(sds) if sds else None  # plan on the noisiest real change
        probe_tokens = statistics.mean(
            tokens[arm][read].get("probe", 0) / len(users) for arm in ARMS
        )
        scorings[name] = {
            "read": read,
            "score": field,
            "changes": changes,
            "planning_sd": sd,
            "planning_sd_of": "the largest SD of " + ", ".join(PLANNED),
            "detectable_effect_10_users": detectable_effect(len(users), sd) if sd else None,
            "users_for_0.10": users_needed(EFFECT, sd) if sd else None,
            "read_tokens_per_user": probe_tokens,
            "read_tokens_for_0.10": users_needed(EFFECT, sd) * probe_tokens if sd else None,
        }
    result = {
        "commit": commit(),
        "design": {
            "evidence_design": {k: design[k] for k in ("procedural", "splits", "policy", "rounds")},
            "arms": list(ARMS),
            "changes": [f"{a}-{b}" for a, b in CHANGES],
            "planned_on": list(PLANNED),
            "models": {"writer and reader": Path(agent).stem},
            "power": 0.8,
            "alpha": 0.05,
        },
        "users": len(users),
        "values": values,
        "tokens": tokens,
        "scorings": scorings,
        "seconds": round(time.perf_counter() - started, 1),
    }
    Path(args.results).write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    print()
    print(change_table(result))
    print(f"wrote {args.results} in {result['seconds']} s")
    return 0


def change_table(result: dict[str, Any]) -> str:
    """Per real change: its mean / SD under each scoring and the users that detect it."""
    lines = [
        "| change | " + " | ".join(result["scorings"]) + " |",
        "|---|" + "---|" * len(result["scorings"]),
    ]
    for change in result["design"]["changes"]:
        cells = []
        for s in result["scorings"].values():
            c = s["changes"][change]
            if c["mean"] is None or c["sd"] is None:
                cells.append("n/a")
                continue
            users = c["users_to_detect"]
            cells.append(
                f"{c['mean']:+.3f} / SD {c['sd']:.3f} (d = {c['standardized']:+.2f}; "
                f"{users if users else 'n/a'} users)"
            )
        lines.append(f"| {change} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(result: dict[str, Any]) -> str:
    lines = [
        "| scoring | SD hand-seed | SD default-seed | SD hand-default | detectable (10 users) "
        "| users for +0.10 | read tokens / user | read tokens for +0.10 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in result["scorings"].items():

        def sd(change: str, s: dict[str, Any] = s) -> str:
            value = s["changes"][change]["sd"]
            return "n/a" if value is None else f"{value:.3f}"

        def num(value: Any, digits: int = 3) -> str:
            return "n/a" if value is None else f"{value:.{digits}f}"

        lines.append(
            f"| {name} | {sd('hand-seed')} | {sd('default-seed')} | {sd('hand-default')} | "
            f"{num(s['detectable_effect_10_users'])} | {s['users_for_0.10'] or 'n/a'} | "
            f"{s['read_tokens_per_user']:.0f} | {num(s['read_tokens_for_0.10'], 0)} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
