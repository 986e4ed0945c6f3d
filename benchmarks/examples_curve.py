"""Worked examples in the writer prompt: the curve over their number (issue 42, deliverable 5).

The question, fixed before the run: **does a writer prompt store more of the user's facts when
it shows worked examples (optimize/evolvers/examples.py), and how does that depend on their
number?**

Design (the DESIGN dict below, committed before the run):
- the evidence benchmark's environment and policy (benchmarks/evidence.py: procedural, 4 values
  per state, one change, one-round scripted sessions recorded once and replayed, AWI with no
  raw buffer, letter reads of every state variable, 1.5B embedded writer and reader), on 16
  *fresh* users (procedural seed 7): none of them is a user of the evidence run, and nothing
  else is chosen on them;
- arms: the evidence run's weak seed prompt with 0, 2 and 4 examples, and its hand prompt
  with 0 and 2 examples (examples drawn with seed 0; the value style follows the prompt: the
  user's own words);
- the measure: per user the mean probability of the true value (`state_prob`), state accuracy
  beside it;
- comparisons, paired on the same users and the same recorded conversations: each k against
  k = 0 of its prompt (t interval, exact sign-flip p, users up/tied/down);
- the decision rule, fixed before the run: the edits evolver's default `max_examples` becomes 2
  only if seed+2 - seed+0 passes the gate (`improved`, core/stats.py) and hand+2 - hand+0 is
  not significantly negative; otherwise it stays 0 and the README says examples showed no
  effect. The smallest effect the design detects at 80% power, from the evidence run's per-user
  SD of paired differences (0.045): about 0.034. Cost: about 11 min per arm (16 users x 2
  periods, a write and a letter read per state variable each), so 5 arms (k = 1 was dropped from
  the first draft of this design, before any arm had finished, to fit the session).

Outputs: benchmarks/results/examples_curve.json and .png. Resumable (every response cached).

    .venv/bin/python benchmarks/examples_curve.py --out runs/bench/examples
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
sys.path.insert(0, str(ROOT / "benchmarks"))
RESULTS = ROOT / "benchmarks" / "results"

import evidence  # noqa: E402  (the evidence benchmark's design, recording and scoring)

DESIGN: dict[str, Any] = {
    "question": "do worked examples in the writer prompt store more facts, by their number?",
    "preregistered": "issue 42, before the run; commit in the JSON",
    "procedural": {**evidence.DESIGN["procedural"], "users": 16, "seed": 7},
    "policy": evidence.DESIGN["policy"],
    "probes": evidence.DESIGN["probes"],
    "examples_seed": 0,
    "arms": {
        "seed+0": ["seed", 0],
        "seed+2": ["seed", 2],
        "seed+4": ["seed", 4],
        "hand+0": ["hand", 0],
        "hand+2": ["hand", 2],
    },
    "comparisons": [
        ["seed+2", "seed+0"],
        ["seed+4", "seed+0"],
        ["hand+2", "hand+0"],
    ],
    "decision": "max_examples 2 if seed+2 - seed+0 is improved by the gate and hand+2 - hand+0 "
    "is not significantly negative; else 0",
    "planned_detectable": 0.034,
    "measure": "state_prob",
}


def prompts_of(arm: str) -> dict[str, str]:
    from memloop.optimize.evolvers.examples import with_examples

    base, k = DESIGN["arms"][arm]
    text = {"seed": evidence.SEED_PROMPT, "hand": evidence.HAND_PROMPT}[base]
    return {"writer": with_examples(text, k, DESIGN["examples_seed"])}


def figure(test: dict[str, dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memloop.core.stats import t_interval

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for base, color in (("seed", "tab:blue"), ("hand", "tab:orange")):
        arms = [a for a, (b, _) in DESIGN["arms"].items() if b == base]
        ks = [DESIGN["arms"][a][1] for a in arms]
        means = [sum(test[a].values()) / len(test[a]) for a in arms]
        ax.plot(ks, means, "o-", color=color, label=f"{base} prompt")
        for k, a, m in zip(ks, arms, means, strict=True):
            ci = t_interval(list(test[a].values()))
            if ci is not None:
                ax.errorbar(k, m, yerr=[[m - ci[0]], [ci[1] - m]], color=color, capsize=4)
    ax.axhline(
        1 / DESIGN["procedural"]["choices_per_state"], ls="--", color="0.4", lw=1, label="chance"
    )
    ax.set_xticks([0, 2, 4])
    ax.set_xlabel("worked examples in the writer prompt")
    ax.set_ylabel("P(true value), letter read of written memory")
    n = len(next(iter(test.values())))
    ax.set_title(f"Examples curve on {n} fresh users (mean, t 95%)")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    from memloop.core.stats import Paired, gate
    from memloop.environment.datafile import save_items
    from memloop.environment.procedural import generate_procedural
    from memloop.experiments.cli import stop_requests_on_ctrl_c
    from memloop.optimize.config import Endpoints
    from memloop.optimize.context import role_clients
    from memloop.policies import AWIConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench/examples")
    parser.add_argument("--agent-endpoint", help="writer and reader (default: embedded 1.5B)")
    parser.add_argument("--results", default=str(RESULTS), help="where the JSON/figure go")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    args.optimizer_endpoint = args.checker_endpoint = None
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    started = time.perf_counter()

    items = generate_procedural(**DESIGN["procedural"])
    save_items(items, out / "env.json")
    clients = role_clients(Endpoints(**evidence.endpoint_files(args)))
    config = AWIConfig(**DESIGN["policy"])
    test: dict[str, dict[str, float]] = {}
    accuracy: dict[str, dict[str, float]] = {}
    seconds: dict[str, float] = {}
    with stop_requests_on_ctrl_c():
        recording = out / "recording"
        print(f"[{time.perf_counter() - started:.0f} s] recording the users", flush=True)
        evidence.record_test_users(items, clients, recording, progress)
        for arm in DESIGN["arms"]:
            t0 = time.perf_counter()
            print(f"[{t0 - started:.0f} s] scoring arm {arm}", flush=True)
            screening, _, _ = evidence.score_arm(
                items, config, prompts_of(arm), clients.agent, recording, out / "arms" / arm
            )
            test[arm] = {u: v for u, v in screening.prob_by_user.items() if v is not None}
            accuracy[arm] = {u: v for u, v in screening.by_user.items() if v is not None}
            seconds[arm] = round(time.perf_counter() - t0, 1)

    paired: dict[str, Any] = {}
    for a, b in DESIGN["comparisons"]:
        users = sorted(set(test[a]) & set(test[b]))
        paired[f"{a} - {b}"] = {
            **Paired.of(test[a], test[b]).to_dict(),
            "gate": gate([test[a][u] - test[b][u] for u in users]).to_dict(),
        }
    main_gate = paired["seed+2 - seed+0"]["gate"]["verdict"]
    hand = paired["hand+2 - hand+0"]
    hand_harm = hand["mean"] is not None and hand["mean"] < 0 and (hand["sign_flip_p"] or 1) < 0.05
    result = {
        "commit": evidence.git_commit(),
        "design": DESIGN,
        "prompts": {arm: prompts_of(arm)["writer"] for arm in DESIGN["arms"]},
        "test": test,
        "test_accuracy": accuracy,
        "means": {a: sum(v.values()) / len(v) for a, v in test.items()},
        "accuracy_means": {a: sum(v.values()) / len(v) for a, v in accuracy.items()},
        "paired": paired,
        "decision": {
            "max_examples": 2 if main_gate == "improved" and not hand_harm else 0,
            "seed+2 gate": main_gate,
            "hand+2 significantly worse": hand_harm,
        },
        "seconds_per_arm": seconds,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (results / "examples_curve.json").write_text(json.dumps(result, indent=1))
    figure(test, results / "examples_curve.png")
    for arm, mean in result["means"].items():
        print(f"{arm:8s} state_prob {mean:.3f}  accuracy {result['accuracy_means'][arm]:.3f}")
    for key, p in paired.items():
        print(
            f"{key}: {p['mean']:+.3f} t95 {p['t95']} p {p['sign_flip_p']} "
            f"{p['up']}/{p['tied']}/{p['down']} gate {p['gate']['verdict']}"
        )
    print(f"decision: {result['decision']}  ({result['seconds']:.0f} s)")
    print(f"wrote {results / 'examples_curve.json'}, examples_curve.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
