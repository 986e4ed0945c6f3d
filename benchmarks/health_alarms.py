"""Memory-health alarms: each alarm's false-alarm rate on healthy writers and its detection rate
on planted broken ones, on the embedded 1.5B (issue 60, point 1).

The question, fixed before the run: **when memloop's health alarms (feedback/health.py) fire, is
the writer broken, and when a writer is broken in a known way, does its alarm fire?** An alarm
that fires on most healthy writers (one drift detector's alarms were 56 of 64 false) is noise;
one that misses a writer that stores nothing is no alarm.

Design (the DESIGN dict below; fixed by a commit before the run, and the thresholds in
feedback/health.ALARMS were set before it on other users: the evidence benchmark's recorded arms,
26 users each, where the hand prompt tripped `nothing_stored` on 3 users at 3 sessions in a row
and on 13 at 2; 11 under the final measure, see benchmarks/README.md):
- a procedural environment never used by a benchmark (seed 101): 24 users, 3 periods (the
  initial one and 2 changes of 1 variable), 2 questions x 2 variables, 4 values per variable;
- one-round sessions recorded once on the 1.5B with memoryless replies (as the evidence
  benchmark's: the conversation does not depend on the writer), then replayed to every arm on
  the same users, so the arms differ only in their writer;
- healthy arms: AWI with the evidence benchmark's hand-written prompt on the 1.5B writer, and AWI
  `verbatim: user` (the user's messages as said); broken arms (memloop/testing/broken_writers.py,
  no model call to write): `SilentWriter` (stores nothing), `ReplyWriter` (stores the assistant's
  reply), `OneLabelWriter` (the user's words under one reused label), `ErrorWriter` (every write
  fails);
- per alarm: false-alarm rate = users of the two healthy arms on whom it fired / 48; detection
  rate = users of its planted writer on whom it fired / 24; each a binomial rate with its 95%
  Wilson interval (core/stats.rate_interval, the gate calibration's); every alarm on every arm
  beside them. No probes are asked: the alarms read the writes alone.
- sized: with 48 healthy users a false-alarm rate of 0 has a 95% upper bound of 0.074, and with
  24 broken users a detection rate of 1 a lower bound of 0.86.

Output: benchmarks/results/health_alarms.json (`commit`, `design`, `alarms`: a list of {name,
false_alarm_rate, n_healthy, detection_rate, n_broken, ...}). Resumable: every period is
checkpointed and every model response cached under --work.

    .venv/bin/python benchmarks/health_alarms.py --work runs/bench/health
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from embedded_cost import commit  # noqa: E402
from evidence import HAND_PROMPT  # noqa: E402  the evidence benchmark's hand-written prompt

RESULTS = Path(__file__).parent / "results" / "health_alarms.json"
DESIGN: dict[str, Any] = {
    "question": "when a health alarm fires, is the writer broken; when a writer is broken in a "
    "known way, does its alarm fire?",
    "preregistered": "issue 60, before the run; commit in the JSON",
    "procedural": {
        "users": 24,
        "periods": 2,
        "questions": 2,
        "states_per_question": 2,
        "choices_per_state": 4,
        "changes_per_period": 1,
        "seed": 101,
    },
    "policy": {
        "type": "awi",
        "update_freq": 2,
        "short_term_len": 0,
        "reply_memory": False,
        "reply_max_tokens": 32,
    },
    "rounds": {"init": 1, "update": 1},
    "model": "local-1.5b (every role)",
    "healthy": {"hand": "AWI, the hand-written prompt", "verbatim": "AWI verbatim: user"},
    "broken": {
        "nothing_stored": "SilentWriter",
        "assistant_words": "ReplyWriter",
        "label_reuse": "OneLabelWriter",
        "write_errors": "ErrorWriter",
    },
    "hand_prompt": HAND_PROMPT,
    "thresholds": "feedback/health.ALARMS, set on the evidence benchmark's arms before the run",
    "rates": "binomial, 95% Wilson interval (core/stats.rate_interval)",
}


def arms() -> dict[str, Any]:
    """{arm: policy factory (user_id, workdir, client) -> policy}."""
    from memloop.policies import AWIConfig, build_policy
    from memloop.testing import broken_writers

    awi = AWIConfig(**DESIGN["policy"])
    verbatim = AWIConfig(**{**DESIGN["policy"], "verbatim": "user"})
    planted = {name: getattr(broken_writers, cls) for name, cls in DESIGN["broken"].items()}
    out: dict[str, Any] = {
        "hand": lambda uid, wd, c: build_policy(awi, c, wd, prompts={"writer": HAND_PROMPT}),
        "verbatim": lambda uid, wd, c: build_policy(verbatim, c, wd),
    }
    for alarm, cls in planted.items():
        out[alarm] = lambda uid, wd, c, cls=cls: cls(awi, c, wd)
    return out


def main(argv: list[str] | None = None) -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    from memloop.core.stats import rate_interval
    from memloop.environment.episode import run_episodes
    from memloop.environment.procedural import generate_procedural
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.health import ALARMS, health_of
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint
    from memloop.policies import AWIConfig, build_policy, recorder_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="working folder (recording, arms, cache)")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--users", type=int, help="fewer users: a smoke run (not the design)")
    args = parser.parse_args(argv)
    if args.users and Path(args.results).resolve() == RESULTS.resolve():
        parser.error("--users is a smoke run: give --results elsewhere")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    client = ChatClient(Endpoint(model="local-1.5b"), cache=work / "responses.sqlite")
    items = generate_procedural(**DESIGN["procedural"])[: args.users]
    recording = work / "recording"
    recorder = recorder_config(AWIConfig(**DESIGN["policy"]))
    run_episodes(
        items,
        lambda uid, wd, c: build_policy(recorder, c, wd),
        client,
        recording,
        sim_client=client,
        sim_config=SimulatorConfig(
            rounds_init=DESIGN["rounds"]["init"], rounds_update=DESIGN["rounds"]["update"]
        ),
        max_users_in_parallel=1,
    )
    health = {}
    for arm, factory in arms().items():
        print(f"arm {arm}", file=sys.stderr, flush=True)
        folder = work / "arms" / arm
        episodes = run_episodes(
            items, factory, client, folder, replay_from=recording, max_users_in_parallel=1
        )
        health[arm] = health_of(episodes, folder)
    users = len(items)
    table = []
    for name, (meaning, threshold) in ALARMS.items():
        false = sum(len(health[a].tripped(name)) for a in DESIGN["healthy"])
        n_healthy = users * len(DESIGN["healthy"])
        found = len(health[name].tripped(name))
        fa, det = rate_interval(false, n_healthy), rate_interval(found, users)
        table.append(
            {
                "name": name,
                "meaning": meaning,
                "threshold": threshold,
                "false_alarm_rate": fa["rate"],
                "false_alarm_ci95": fa["ci95"],
                "false_alarms": false,
                "n_healthy": n_healthy,
                "detection_rate": det["rate"],
                "detection_ci95": det["ci95"],
                "detected": found,
                "n_broken": users,
                "broken_writer": DESIGN["broken"][name],
            }
        )
    result = {
        "commit": commit(),
        "design": DESIGN,
        "alarms": table,
        "users_tripped": {
            arm: {name: len(h.tripped(name)) for name in ALARMS} for arm, h in health.items()
        },
        "series_means": {arm: h.metrics() for arm, h in health.items()},
        "users": users,
        "seconds": round(time.monotonic() - started, 1),
    }
    Path(args.results).write_text(json.dumps(result, indent=1) + "\n")
    for row in table:
        print(
            f"{row['name']}: false alarms {row['false_alarms']}/{row['n_healthy']} "
            f"[{row['false_alarm_ci95'][0]:.3f}, {row['false_alarm_ci95'][1]:.3f}], detected "
            f"{row['detected']}/{row['n_broken']} "
            f"[{row['detection_ci95'][0]:.3f}, {row['detection_ci95'][1]:.3f}]"
        )
    print(f"wrote {args.results} ({result['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
