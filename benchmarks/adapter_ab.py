"""The writer's DSPy adapter measured (issue 56, point 6): JSON against Chat and XML.

The question, fixed before the run: **does the 1.5B writer store more of the user's facts when
its request and reply use DSPy's Chat or XML adapter instead of the JSON adapter (memloop's
default, under the endpoint's JSON-schema constraint)?** Forcing a JSON schema on a ~1.5B model
has halved its extraction accuracy on a tool-call task elsewhere ("reason free, constrain
late"); memloop has never measured it on its own writer.

Design (the DESIGN dict below, committed before the run):
- the evidence benchmark's environment and policy (benchmarks/evidence.py: procedural, 4 values
  per state, one change, one-round scripted sessions recorded once and replayed, AWI with no
  raw buffer, letter reads of every state variable, 1.5B embedded writer and reader), on 16
  *fresh* users (procedural seed 61: never used by a benchmark before; nothing else is chosen
  on them);
- arms: the evidence run's weak seed prompt and its hand prompt, each with the adapter `json`,
  `chat` and `xml` (AWIConfig.adapter), no worked examples;
- `two_step` is in the design but not in this run: one two-step write took 365 s on the 0.5B
  model with the other core busy (the first step answers freely, up to the endpoint's token
  cap), against 46-73 s for the others, so its arms would take hours here. `--two-step` runs
  them too (a hosted endpoint: `--agent-endpoint`);
- the measure: per user the mean probability of the true value (`state_prob`), state accuracy
  beside it;
- comparisons, paired on the same users and the same recorded conversations: each adapter
  against json, for each prompt (t interval, exact sign-flip p, users up/tied/down, the gate
  with a non-inferiority margin of 0.02);
- the decision rule, fixed before the run: the default adapter changes from json to an adapter
  only if the gate says `improved` for it on one prompt and `improved` or `not worse` (margin
  0.02) on the other; otherwise json stays and the README says so. The smallest effect the
  design detects at 80% power, from the evidence run's per-user SD of paired differences
  (0.045): about 0.034.

Outputs: benchmarks/results/adapter_ab.json and .png. Resumable (every response cached).

    .venv/bin/python benchmarks/adapter_ab.py --out runs/bench/adapters
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

ADAPTERS = ("json", "chat", "xml")
MARGIN = 0.02
DESIGN: dict[str, Any] = {
    "question": "does the 1.5B writer store more facts with DSPy's Chat or XML adapter than JSON?",
    "preregistered": "issue 56, before the run; commit in the JSON",
    "procedural": {**evidence.DESIGN["procedural"], "users": 16, "seed": 61},
    "policy": evidence.DESIGN["policy"],
    "probes": evidence.DESIGN["probes"],
    "arms": {f"{p}/{a}": [p, a] for p in ("seed", "hand") for a in ADAPTERS},
    "two_step_arms": {f"{p}/two_step": [p, "two_step"] for p in ("seed", "hand")},
    "comparisons": [[f"{p}/{a}", f"{p}/json"] for a in ADAPTERS[1:] for p in ("seed", "hand")],
    "margin": MARGIN,
    "decision": "the default adapter becomes X only if X - json is improved by the gate on one "
    "prompt and improved or not worse (margin 0.02) on the other; else json stays",
    "planned_detectable": 0.034,
    "measure": "state_prob",
}


def prompts_of(arm: str, arms: dict[str, list[str]]) -> dict[str, str]:
    base = arms[arm][0]
    return {"writer": {"seed": evidence.SEED_PROMPT, "hand": evidence.HAND_PROMPT}[base]}


def decide(paired: dict[str, Any], adapters: list[str]) -> dict[str, Any]:
    """The pre-registered rule on the stored gate decisions."""
    out: dict[str, Any] = {"adapter": "json", "why": "no adapter passed the rule"}
    for adapter in adapters:
        verdicts = [
            paired[f"{p}/{adapter} - {p}/json"]["gate"]["verdict"] for p in ("seed", "hand")
        ]
        if "improved" in verdicts and all(v in ("improved", "not worse") for v in verdicts):
            return {"adapter": adapter, "why": f"gate verdicts seed, hand: {verdicts}"}
        out[adapter] = verdicts
    return out


def figure(test: dict[str, dict[str, float]], arms: dict[str, list[str]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memloop.core.stats import t_interval

    fig, ax = plt.subplots(figsize=(6.5, 4))
    adapters = list(dict.fromkeys(a for _, a in arms.values()))
    for offset, (base, color) in enumerate((("seed", "tab:blue"), ("hand", "tab:orange"))):
        xs, means = [], []
        for i, adapter in enumerate(adapters):
            values = list(test[f"{base}/{adapter}"].values())
            m = sum(values) / len(values)
            xs.append(i + 0.1 * offset)
            means.append(m)
            ci = t_interval(values)
            if ci is not None:
                ax.errorbar(xs[-1], m, yerr=[[m - ci[0]], [ci[1] - m]], color=color, capsize=4)
        ax.plot(xs, means, "o", color=color, label=f"{base} prompt")
    ax.axhline(
        1 / DESIGN["procedural"]["choices_per_state"], ls="--", color="0.4", lw=1, label="chance"
    )
    ax.set_xticks(range(len(adapters)), adapters)
    ax.set_xlabel("the writer's DSPy adapter")
    ax.set_ylabel("P(true value), letter read of written memory")
    n = len(next(iter(test.values())))
    ax.set_title(f"Writer adapters on {n} fresh users (mean, t 95%)")
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
    parser.add_argument("--out", default="runs/bench/adapters")
    parser.add_argument("--agent-endpoint", help="writer and reader (default: embedded 1.5B)")
    parser.add_argument("--results", default=str(RESULTS), help="where the JSON/figure go")
    parser.add_argument("--two-step", action="store_true", help="also the two_step arms")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()
    args.optimizer_endpoint = args.checker_endpoint = None
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    started = time.perf_counter()
    arms = {**DESIGN["arms"], **(DESIGN["two_step_arms"] if args.two_step else {})}
    adapters = list(dict.fromkeys(a for _, a in arms.values()))

    items = generate_procedural(**DESIGN["procedural"])
    save_items(items, out / "env.json")
    clients = role_clients(Endpoints(**evidence.endpoint_files(args)))
    test: dict[str, dict[str, float]] = {}
    accuracy: dict[str, dict[str, float]] = {}
    seconds: dict[str, float] = {}
    with stop_requests_on_ctrl_c():
        recording = out / "recording"
        print(f"[{time.perf_counter() - started:.0f} s] recording the users", flush=True)
        evidence.record_test_users(items, clients, recording, progress)
        for arm, (_, adapter) in arms.items():
            t0 = time.perf_counter()
            print(f"[{t0 - started:.0f} s] scoring arm {arm}", flush=True)
            config = AWIConfig(**DESIGN["policy"], adapter=adapter)
            screening, _, _ = evidence.score_arm(
                items, config, prompts_of(arm, arms), clients.agent, recording, out / "arms" / arm
            )
            test[arm] = {u: v for u, v in screening.prob_by_user.items() if v is not None}
            accuracy[arm] = {u: v for u, v in screening.by_user.items() if v is not None}
            seconds[arm] = round(time.perf_counter() - t0, 1)

    paired: dict[str, Any] = {}
    for adapter in adapters[1:]:
        for p in ("seed", "hand"):
            a, b = f"{p}/{adapter}", f"{p}/json"
            users = sorted(set(test[a]) & set(test[b]))
            paired[f"{a} - {b}"] = {
                **Paired.of(test[a], test[b]).to_dict(),
                "gate": gate([test[a][u] - test[b][u] for u in users], margin=MARGIN).to_dict(),
            }
    result = {
        "commit": evidence.git_commit(),
        "design": DESIGN,
        "ran_two_step": bool(args.two_step),
        "test": test,
        "test_accuracy": accuracy,
        "means": {a: sum(v.values()) / len(v) for a, v in test.items()},
        "accuracy_means": {a: sum(v.values()) / len(v) for a, v in accuracy.items()},
        "paired": paired,
        "decision": decide(paired, adapters[1:]),
        "seconds_per_arm": seconds,
        "seconds": round(time.perf_counter() - started, 1),
    }
    (results / "adapter_ab.json").write_text(json.dumps(result, indent=1))
    figure(test, arms, results / "adapter_ab.png")
    for arm, mean in result["means"].items():
        print(f"{arm:14s} state_prob {mean:.3f}  accuracy {result['accuracy_means'][arm]:.3f}")
    for key, p in paired.items():
        print(
            f"{key}: {p['mean']:+.3f} t95 {p['t95']} p {p['sign_flip_p']} "
            f"{p['up']}/{p['tied']}/{p['down']} gate {p['gate']['verdict']}"
        )
    print(f"decision: {result['decision']}  ({result['seconds']:.0f} s)")
    print(f"wrote {results / 'adapter_ab.json'}, adapter_ab.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
