"""How often each decision of the loop accepts a change that does nothing, and how often it finds a
real one: the gate (core/stats.py) calibrated at the sizes memloop ships and its benchmarks use.

Each stage runs memloop's own decision code on simulated per-user scores:
- `screen`: the playbook evolver's replay screen (`PlaybookEvolver._choose` with
  `screen_takes: improved`): the best of `candidates` candidates against the current prompt on
  the training users;
- `selection`: `cycles.select_cycle` over `cycles` cycles on the validation users: the best
  cycle against the seed (cycle 0);
- `registration`: the registry's `best` alias (`cycles.best_alias_cycle` of that selection): the
  version it names is not the seed's.
Beside each, the rule it replaced: the screen took the best candidate whose state accuracy beat
the current prompt's; selection took the best validation cycle; `best` named it.
- `screen (explore)`: the same screen with `screen_takes: explore` (the playbook's default): how
  often it takes a candidate that does nothing (an exploration step is not a claim; the
  confirmation below decides the claim);
- `confirmation`: the whole pipeline, loop + confirmation (optimize/confirm.py): `cycles` cycles
  on `val` validation users, the candidate pre-declared by its rule (`validation`: the best
  validation cycle, as the playbook and GEPA, whose candidates are built from validation scores;
  `last`: the last cycle, as the edits and reflective evolvers, whatever their screens took), then
  the gate on `users` fresh confirmation users against the seed, at 0.05, with one look or two
  (`core/stats.TwoLooks`). Under an effect the last cycle carries it, on the letter read's
  state_prob scale (+0.03, +0.05: CONFIRM_EFFECTS); found = the declared candidate is that cycle
  and the gate says improved. Its model is the measured per-user differences of state_prob.

Two models of the per-user scores:
- `binary (binomial)`: each user answers `pairs` state pairs (the evidence design: 2 questions x 2
  variables x 2 periods = 8), each right with the user's own rate. The rates are drawn from the
  per-user state accuracies measured on the evidence benchmark's test users (its seed, evolved,
  default and hand-written prompts: benchmarks/results/evidence.json), so users differ as they do
  there. Under no effect every prompt is the seed again with independent draws; under an effect
  of +d one candidate (the last cycle, one screen candidate) answers each pair right with the
  user's rate + d (capped at 1). With 8 pairs the SD of a per-user difference is about 0.25, the
  0.20-0.29 measured between real prompts.
- `measured differences` (when benchmarks/results/state_prob_power.json exists), for `binary`
  (the JSON state query's 0/1 state accuracy) and `probability` (the letter read's state_prob):
  the per-user differences measured between real prompts on the evidence design (hand - seed,
  default - seed, hand - default), each change centred on its mean, resampled with random signs;
  a candidate with an effect gets + d. The same scores the same way for both scorings, so their
  powers compare.

    .venv/bin/python benchmarks/gate_calibration.py --out benchmarks/results/gate_calibration.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from embedded_cost import commit  # noqa: E402  (this folder: the benchmarks' one commit record)

EFFECTS = (0.10, 0.15)
PAIRS = 8
SIZES: dict[str, list[dict[str, Any]]] = {
    # shipped: 2 training users (evidence), 1 (quickstart); larger: what a screen would need
    "screen": [
        {"users": 1, "candidates": 3, "where": "quickstart"},
        {"users": 2, "candidates": 3, "where": "evidence benchmark"},
        {"users": 8, "candidates": 3, "where": "larger"},
        {"users": 16, "candidates": 3, "where": "larger"},
    ],
    "selection": [
        {"users": 1, "cycles": 2, "where": "quickstart"},
        {"users": 4, "cycles": 2, "where": "evidence benchmark"},
        {"users": 10, "cycles": 2, "where": "larger"},
        {"users": 16, "cycles": 2, "where": "larger"},
        {"users": 16, "cycles": 4, "where": "larger"},
        {"users": 32, "cycles": 4, "where": "larger"},
    ],
}
SIZES["registration"] = SIZES["selection"]
MEASURED = {(4, 2), (10, 2), (16, 2), (16, 4)}  # (users, cycles) of the measured models
CHANGES = ("hand-seed", "default-seed", "hand-default")  # real prompt changes measured


def base_rates(path: Path) -> list[float]:
    """The per-user state accuracies of the evidence benchmark's test users, four prompts."""
    data = json.loads(path.read_text())
    rates = []
    for arm in ("seed", "evolved", "default", "hand"):
        rates += [float(v) for v in data["test"][arm].values()]
    return rates


class Draws:
    """Per-user binary scores: users drawn from `rates`, `pairs` pairs each."""

    def __init__(self, rates: list[float], pairs: int, seed: int):
        self.rates = np.asarray(rates)
        self.pairs = pairs
        self.rng = np.random.default_rng(seed)

    def users(self, n: int) -> np.ndarray:
        return self.rng.choice(self.rates, size=n, replace=True)

    def scores(self, p: np.ndarray, effect: float = 0.0) -> dict[str, float]:
        hits = self.rng.binomial(self.pairs, np.clip(p + effect, 0.0, 1.0))
        return {f"u{i}": float(h) / self.pairs for i, h in enumerate(hits)}

    def baseline(self, p: np.ndarray) -> dict[str, float]:
        """The current prompt's (the seed's) scores: an independent draw."""
        return self.scores(p)

    def candidate(self, p: np.ndarray, effect: float = 0.0) -> dict[str, float]:
        """A candidate's scores: an independent draw, right with the rate + `effect`."""
        return self.scores(p, effect)


class MeasuredDifferences:
    """Per-user differences resampled from those measured between real prompts.

    `pool`: the per-user differences of real prompt changes, each change centred on its own mean
    (so the pool has the spread of real changes and no effect). A candidate's difference from
    the baseline is a draw from the pool with a random sign (+ the effect); candidates are drawn
    independently of each other (real candidates share the baseline's draw, which correlates
    them: this model ignores that).
    """

    def __init__(self, pool: list[float], seed: int):
        self.pool = np.asarray(pool)
        self.rng = np.random.default_rng(seed)

    def users(self, n: int) -> np.ndarray:
        return np.full(n, 0.5)

    def baseline(self, p: np.ndarray) -> dict[str, float]:
        return {f"u{i}": float(v) for i, v in enumerate(p)}

    def candidate(self, p: np.ndarray, effect: float = 0.0) -> dict[str, float]:
        d = self.rng.choice(self.pool, size=p.size) * self.rng.choice([-1.0, 1.0], size=p.size)
        return {f"u{i}": float(v) for i, v in enumerate(p + d + effect)}


def effect_scale(path: Path, scoring: str, changes: list[str]) -> float:
    """How far `scoring` moves for a change that moves the JSON read's 0/1 accuracy by 1.

    The ratio of the summed mean changes (`changes` and oracle - seed) under `scoring` to those
    under `json 0/1`: a probability moves less than a 0/1 for the same change of prompt.
    """
    data = json.loads(path.read_text())

    def moved(name: str) -> float:
        scored = data["scorings"][name]["changes"]
        return sum(abs(scored[c]["mean"]) for c in [*changes, "oracle-seed"])

    return moved(scoring) / moved("json 0/1")


def measured_pool(path: Path, scoring: str, changes: list[str]) -> list[float]:
    """The centred per-user differences of `changes` under `scoring` (state_prob_power.json)."""
    data = json.loads(path.read_text())
    read, field = data["scorings"][scoring]["read"], data["scorings"][scoring]["score"]
    pool: list[float] = []
    for change in changes:
        a, b = change.split("-")
        cond, base = data["values"][a][read][field], data["values"][b][read][field]
        diffs = [cond[u] - base[u] for u in cond if cond[u] is not None and base.get(u) is not None]
        mean = sum(diffs) / len(diffs)
        pool += [d - mean for d in diffs]
    return pool


# ------------------------------------------------------------------ the stages


def screen_once(
    draws: Any, users: int, candidates: int, effect: float, takes: str = "improved"
) -> dict[str, bool]:
    """One screen: the gate's choice (`screen_takes: takes`) and the old rule's, on one draw."""
    from memloop.optimize.evolvers.playbook import PlaybookEvolver, PlaybookSettings

    p = draws.users(users)
    values = {"current": draws.baseline(p)}
    for j in range(candidates):
        last = j == candidates - 1
        values[f"c{j}"] = draws.candidate(p, effect if last else 0.0)

    def screen(prompts: dict[str, str]) -> Any:
        by_user = values[prompts["writer"]]
        return SimpleNamespace(
            state_prob=None,  # binary scores: the screen ranks on state accuracy
            state_accuracy=sum(by_user.values()) / len(by_user),
            by_user=by_user,
            tokens=0,
            cost_usd=None,
        )

    options = [(f"c{j}", f"candidate {j}") for j in range(candidates)]
    evolver = PlaybookEvolver(None, PlaybookSettings(screen_takes=takes))  # type: ignore[arg-type]
    chosen, _ = evolver._choose("writer", {"writer": "current"}, options, screen)
    good = f"c{candidates - 1}"
    now = screen({"writer": "current"}).state_accuracy
    scored = [(screen({"writer": c}).state_accuracy, c) for c, _ in options]
    best_value, best = max(scored, key=lambda x: x[0])  # the first of equals
    old = best_value > now
    return {
        "gate": chosen is not None,
        "gate_found": chosen is not None and chosen[0] == good,
        "old": old,
        "old_found": old and best == good,
    }


def cycle_records(draws: Any, users: int, cycles: int, effect: float) -> list[Any]:
    from memloop.runs.cycles import CycleRecord, SplitResult

    p = draws.users(users)
    records = []
    for k in range(cycles):
        if k == 0:
            by_user = draws.baseline(p)
        else:
            by_user = draws.candidate(p, effect if k == cycles - 1 else 0.0)
        split = SplitResult(
            users=users,
            memory_score=None,
            overall=0.0,
            factual_recall=None,
            write=0.0,
            read=0.0,
            utilization=0.0,
            state_accuracy=sum(by_user.values()) / users,
            per_user={u: {"state_accuracy": v} for u, v in by_user.items()},
        )
        records.append(CycleRecord(cycle=k, splits={"val": split}))
    return records


def selection_once(draws: Any, users: int, cycles: int, effect: float) -> dict[str, bool]:
    from memloop.runs.cycles import best_alias_cycle, select_cycle

    records = cycle_records(draws, users, cycles, effect)
    selection = select_cycle(records, "state_accuracy")
    assert selection is not None
    values = [r.score("val", "state_accuracy") for r in records]
    old = max(range(cycles), key=lambda k: (values[k], -k))
    alias = best_alias_cycle(selection)
    return {
        "gate": selection.cycle != 0,
        "gate_found": selection.cycle == cycles - 1,
        "alias": alias != 0,
        "alias_found": alias == cycles - 1,
        "old": old != 0,
        "old_found": old == cycles - 1,
    }


def rate(hits: int, runs: int) -> dict[str, float]:
    """A rate with its binomial 95% (Wilson) interval (core/stats.rate_interval)."""
    from memloop.core.stats import rate_interval

    return rate_interval(hits, runs)


def run_stage(
    stage: str,
    size: dict[str, Any],
    draws: Any,
    null_runs: int,
    power_runs: int,
    scoring: str = "binary",
    model: str = "binomial",
    scale: float = 1.0,
):
    users = size["users"]
    if stage in ("screen", "screen (explore)"):
        takes = "explore" if stage == "screen (explore)" else "improved"
        once = lambda effect: screen_once(  # noqa: E731
            draws, users, size["candidates"], effect, takes
        )
        key = "gate"
    else:
        once = lambda effect: selection_once(draws, users, size["cycles"], effect)  # noqa: E731
        key = "gate" if stage == "selection" else "alias"
    null = [once(0.0) for _ in range(null_runs)]
    power = {}
    old_power = {}
    for effect in EFFECTS:  # the change that moves 0/1 state accuracy by `effect`
        found = [once(effect * scale) for _ in range(power_runs)]
        power[f"{effect:.2f}"] = rate(sum(f[f"{key}_found"] for f in found), power_runs)
        old_power[f"{effect:.2f}"] = rate(sum(f["old_found"] for f in found), power_runs)
    return {
        "stage": stage,
        "scoring": scoring,
        "model": model,
        "sizes": {k: v for k, v in size.items() if k != "where"} | {"pairs_per_user": PAIRS},
        "where": size["where"],
        "effect_scale": scale,  # the effects on this scoring's scale: EFFECTS x scale
        "null_runs": null_runs,
        "power_runs": power_runs,
        "false_accept": rate(sum(n[key] for n in null), null_runs),
        "power": power,
        "before": {
            "rule": "best candidate above the current prompt"
            if stage.startswith("screen")
            else "best validation cycle",
            "false_accept": rate(sum(n["old"] for n in null), null_runs),
            "power": old_power,
        },
    }


CONFIRM_EFFECTS = (0.03, 0.05)  # on the state_prob scale
CONFIRM_SIZES: list[dict[str, Any]] = [
    {"users": users, "looks": looks, "rule": rule, "val": 4, "cycles": 4}
    for rule, users, looks in (
        ("validation", 16, 1),
        ("validation", 26, 1),
        ("validation", 26, 2),
        ("last", 20, 1),
        ("last", 26, 2),
        ("last", 40, 2),
    )
]


def confirmation_once(
    draws: MeasuredDifferences, size: dict[str, Any], effect: float
) -> dict[str, bool]:
    """The loop's validation cycles, the declared candidate, the gate on fresh users."""
    from memloop.core.stats import TwoLooks, gate
    from memloop.optimize.confirm import declare

    records = cycle_records(draws, size["val"], size["cycles"], effect)
    k = declare(records, size["rule"], "state_accuracy")
    real = k == size["cycles"] - 1  # the cycle that carries the effect (none under no effect)
    n = size["users"]
    p = draws.users(n)
    seed = draws.baseline(p)
    candidate = draws.candidate(p, effect if real else 0.0)
    diffs = [candidate[u] - seed[u] for u in seed]
    rule = TwoLooks(n)
    if size["looks"] == 2 and rule.can_stop_early:
        decision = rule.look_one(diffs[: rule.first]) or rule.look_two(
            diffs[: rule.first], diffs[rule.first :], draws=20_000
        )
    else:
        decision = gate(diffs)
    loop_alone = select_cycle_improved(records)
    return {
        "gate": decision.improved,
        "gate_found": decision.improved and real,
        "stopped_early": decision.look == 1,
        "old": loop_alone,
        "old_found": loop_alone and real,
    }


def select_cycle_improved(records: list[Any]) -> bool:
    """The loop alone (no confirmation): its validation selection left the seed."""
    from memloop.runs.cycles import select_cycle

    selection = select_cycle(records, "state_accuracy")
    return selection is not None and selection.cycle != 0


def run_confirmation(
    size: dict[str, Any], draws: MeasuredDifferences, null_runs: int, power_runs: int
) -> dict[str, Any]:
    null = [confirmation_once(draws, size, 0.0) for _ in range(null_runs)]
    power, old_power, early = {}, {}, {}
    for effect in CONFIRM_EFFECTS:
        found = [confirmation_once(draws, size, effect) for _ in range(power_runs)]
        power[f"{effect:.2f}"] = rate(sum(f["gate_found"] for f in found), power_runs)
        old_power[f"{effect:.2f}"] = rate(sum(f["old_found"] for f in found), power_runs)
        early[f"{effect:.2f}"] = rate(sum(f["stopped_early"] for f in found), power_runs)
    return {
        "stage": "confirmation",
        "scoring": "probability",
        "model": "measured differences",
        "sizes": {k: v for k, v in size.items()},
        "where": "loop + confirmation",
        "effect_scale": 1.0,  # the effects are on state_prob's own scale
        "null_runs": null_runs,
        "power_runs": power_runs,
        "false_accept": rate(sum(n["gate"] for n in null), null_runs),
        "power": power,
        "stopped_at_look_1": early,
        "before": {
            "rule": "the loop alone: its validation selection (4 users, 4 cycles)",
            "false_accept": rate(sum(n["old"] for n in null), null_runs),
            "power": old_power,
        },
    }


def confirmation_table(stages: list[dict[str, Any]]) -> str:
    head = (
        "| candidate rule | confirmation users | looks | false accepts | power +0.03 | "
        "power +0.05 | stopped at look 1 (+0.05) |\n|---|---|---|---|---|---|---|\n"
    )
    rows = [
        f"| {s['sizes']['rule']} | {s['sizes']['users']} | {s['sizes']['looks']} | "
        f"{s['false_accept']['rate']:.3f} | {s['power']['0.03']['rate']:.3f} | "
        f"{s['power']['0.05']['rate']:.3f} | {s['stopped_at_look_1']['0.05']['rate']:.3f} |"
        for s in stages
        if s["stage"] == "confirmation"
    ]
    return head + "\n".join(rows)


def table(stages: list[dict[str, Any]]) -> str:
    head = (
        "| stage | scores | sizes | false accepts (gate) | power +0.10 | power +0.15 | "
        "false accepts (before) | power +0.10 (before) |\n|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for s in stages:
        if s["stage"] == "confirmation":
            continue  # its own table (confirmation_table)
        sizes = ", ".join(f"{k} {v}" for k, v in s["sizes"].items() if k != "pairs_per_user")
        rows.append(
            f"| {s['stage']} | {s['scoring']} ({s['model']}) | {sizes} ({s['where']}) | "
            f"{s['false_accept']['rate']:.3f} | "
            f"{s['power']['0.10']['rate']:.3f} | {s['power']['0.15']['rate']:.3f} | "
            f"{s['before']['false_accept']['rate']:.3f} | "
            f"{s['before']['power']['0.10']['rate']:.3f} |"
        )
    return head + "\n".join(rows)


# the sizes the measured-difference models run at (the shipped ones and what would be needed)
MEASURED_SIZES: dict[str, list[dict[str, Any]]] = {
    "screen": [s for s in SIZES["screen"] if s["users"] in (2, 16)],
    "screen (explore)": [s for s in SIZES["screen"] if s["users"] in (2, 8)],
    "selection": [s for s in SIZES["selection"] if (s["users"], s["cycles"]) in MEASURED],
    "registration": [s for s in SIZES["selection"] if (s["users"], s["cycles"]) in MEASURED],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--null-runs", type=int, default=2000)
    parser.add_argument("--power-runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument(
        "--confirm-null-runs",
        type=int,
        default=1000,
        help="runs under no effect per confirmation row (each is a whole loop + confirmation; "
        "above 20 users the sign-flip test draws 100,000 patterns)",
    )
    parser.add_argument("--confirm-power-runs", type=int, default=400)
    parser.add_argument(
        "--evidence",
        default=str(ROOT / "benchmarks" / "results" / "evidence.json"),
        help="the evidence benchmark's results (the per-user rates)",
    )
    parser.add_argument(
        "--measured",
        default=str(ROOT / "benchmarks" / "results" / "state_prob_power.json"),
        help="state_prob_power.py's results (per-user differences of real prompt changes)",
    )
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "gate_calibration.json")
    )
    args = parser.parse_args(argv)
    if min(args.null_runs, args.power_runs, args.confirm_null_runs, args.confirm_power_runs) < 1:
        parser.error("every --*-runs must be at least 1")
    started = time.perf_counter()
    user_rates = base_rates(Path(args.evidence))
    models: list[tuple[str, str, Any, dict[str, list[dict[str, Any]]], float]] = [
        ("binary", "binomial", Draws(user_rates, PAIRS, args.seed), SIZES, 1.0)
    ]
    measured = Path(args.measured)
    pools: dict[str, int] = {}
    if measured.is_file():
        for scoring, name in (("binary", "json 0/1"), ("probability", "letters P")):
            pool = measured_pool(measured, name, list(CHANGES))
            pools[scoring] = len(pool)
            draws = MeasuredDifferences(pool, args.seed)
            scale = effect_scale(measured, name, list(CHANGES))
            models.append((scoring, "measured differences", draws, MEASURED_SIZES, scale))
    stages = []
    if measured.is_file():  # the whole pipeline on the letter read's measured differences
        pool = measured_pool(measured, "letters P", list(CHANGES))
        confirm_draws = MeasuredDifferences(pool, args.seed + 1)
        for size in CONFIRM_SIZES:
            result = run_confirmation(
                size, confirm_draws, args.confirm_null_runs, args.confirm_power_runs
            )
            stages.append(result)
            print(
                f"confirmation {size}: false accepts {result['false_accept']['rate']:.3f} "
                f"(loop alone {result['before']['false_accept']['rate']:.3f}), power +0.03 "
                f"{result['power']['0.03']['rate']:.3f}, +0.05 "
                f"{result['power']['0.05']['rate']:.3f}",
                flush=True,
            )
    for scoring, model, draws, sizes, scale in models:
        for stage, at in sizes.items():
            for size in at:
                result = run_stage(
                    stage, size, draws, args.null_runs, args.power_runs, scoring, model, scale
                )
                stages.append(result)
                shown = (
                    result["false_accept"]["rate"],
                    result["before"]["false_accept"]["rate"],
                    result["power"]["0.10"]["rate"],
                    result["power"]["0.15"]["rate"],
                )
                print(
                    f"{stage:12s} {scoring:11s} {model:20s} {result['sizes']}: false accepts "
                    f"{shown[0]:.3f} (before {shown[1]:.3f}), power +0.10 {shown[2]:.3f}, "
                    f"+0.15 {shown[3]:.3f}",
                    flush=True,
                )
    out = {
        "commit": commit(),  # embedded_cost.py's: sha, dirty, changed files
        "design": {
            "binomial": "binary scores: each user's score is the share right of its "
            f"{PAIRS} state pairs, each right with the user's own rate (drawn from the "
            f"{len(user_rates)} per-user state accuracies of the evidence benchmark's test users "
            "under its seed, evolved, default and hand prompts); a changed prompt is right with "
            "the rate + the effect (capped at 1)",
            "measured differences": "per-user differences of real prompt changes ("
            + ", ".join(CHANGES)
            + ", state_prob_power.json), each change centred on its mean, resampled with random "
            "signs; + the effect for the changed candidate. binary: the JSON state query's 0/1 "
            "state accuracy; probability: the letter read's state_prob",
            "pool_sizes": pools,
            "effects": list(EFFECTS),
            "effects_mean": "the change of prompt that moves the JSON read's 0/1 state accuracy "
            "by that much; on the probability scale it moves state_prob by effect x "
            "effect_scale (the measured ratio of mean changes, state_prob_power.json)",
            "gate": "exact sign-flip test, two-sided 0.05 / the number of candidates chosen "
            "among; improved = p <= level and mean > 0",
            "confirmation": "loop + confirmation: 4 cycles on 4 validation users (measured "
            "differences), the candidate declared by its rule (validation: best validation "
            "cycle; last: the last cycle), then the gate at 0.05 on fresh confirmation users "
            "(one look, or TwoLooks: half the users at 0.0056, then the sequential p); effects "
            "+0.03 / +0.05 state_prob carried by the last cycle",
            "seed": args.seed,
        },
        "stages": stages,
        # over the decisions that accept a change (an explore screen's step is not one: it
        # takes a candidate on purpose, and only a later gate may keep it)
        "max_false_accept": max(
            s["false_accept"]["rate"] for s in stages if s["stage"] != "screen (explore)"
        ),
        "seconds": round(time.perf_counter() - started, 1),
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(table(stages))
    print(confirmation_table(stages))
    print(f"wrote {args.out} in {out['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
