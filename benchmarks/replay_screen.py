"""What screening a candidate prompt by replay costs against an on-policy evaluation.

Runs an on-policy `eval` of AWI on a procedural environment (the simulated user, chat replies,
memory writes and every probe: multiple choice, state query, upper bound, no-memory control,
recall check), then screens the same prompt on the same users by replay
(optimize/replay_score.py: the recorded conversations ingested, memory writes and state queries
only). It reports the tokens and seconds of each and their ratio; issue 16's target is at least 5x
fewer tokens. Each part has its own response cache, so the first run measures real model work; a
rerun only rebuilds the report (tokens count the work, cached or not).

    .venv/bin/python benchmarks/replay_screen.py --users 2 --periods 2 --questions 3 \
        --endpoint memloop/experiments/endpoints/local-0.5b.yaml --out runs/bench/replay
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    from memloop.core.settings import apply_offline_defaults

    apply_offline_defaults()
    from memloop.environment.datafile import save_items
    from memloop.environment.procedural import generate_procedural
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
    from memloop.llm.roles import RoleClients
    from memloop.optimize.replay_score import replay_screen
    from memloop.policies import AWIConfig, build_policy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--periods", type=int, default=2, help="update periods")
    parser.add_argument("--questions", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds-update", type=int, default=1)
    parser.add_argument("--reply-max-tokens", type=int, default=128)
    parser.add_argument("--endpoint", help="endpoint YAML (default: the embedded 1.5B model)")
    parser.add_argument("--out", default="runs/bench/replay")
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items = generate_procedural(
        users=args.users, periods=args.periods, questions=args.questions, seed=args.seed
    )
    save_items(items, out / "env.json")
    config = AWIConfig(reply_max_tokens=args.reply_max_tokens)

    def factory(uid, workdir, client):
        return build_policy(config, client, workdir)

    onpolicy_clients = RoleClients.from_files(args.endpoint, cache=out / "onpolicy-cache.sqlite")
    started = time.perf_counter()
    result = run_evaluation(
        items,
        factory,
        out / "onpolicy",
        clients=onpolicy_clients,
        settings=EvaluationSettings(
            sim_config=SimulatorConfig(rounds_init=1, rounds_update=args.rounds_update),
            max_users_in_parallel=1,
        ),
    )
    onpolicy_s = time.perf_counter() - started
    onpolicy_tokens = sum(result.metrics["usage"].values())

    screen_clients = RoleClients.from_files(args.endpoint, cache=out / "screen-cache.sqlite")
    started = time.perf_counter()
    screening = replay_screen(
        items,
        factory,
        screen_clients.agent,
        out / "onpolicy" / "episodes",
        out / "screen",
        parallel_users=1,
    )
    screen_s = time.perf_counter() - started

    report = {
        "sizes": vars(args),
        "model": onpolicy_clients.agent.endpoint.model,
        "onpolicy": {
            "tokens": onpolicy_tokens,
            "tokens_by_component": result.metrics["usage"],
            "seconds_this_run": round(onpolicy_s, 1),
            "state_accuracy": result.metrics["state_accuracy"],
        },
        "replay_screen": {
            "tokens": screening.tokens,
            "seconds_this_run": round(screen_s, 1),
            "state_accuracy": screening.state_accuracy,
            "pairs": screening.pairs,
        },
        "token_ratio": round(onpolicy_tokens / screening.tokens, 2) if screening.tokens else None,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
