"""Is memloop or the endpoint the limit? `memloop eval` throughput against the fake endpoint.

Each configuration runs in a fresh process (so its peak memory is its own): an AWI eval of a
procedural environment (2 periods x 2 questions, 1 round per session) with U users, P = min(U,
256) of them in parallel (the endpoint's max_concurrency too), against the project's fake endpoint
served from its own process (so it does not share memloop's GIL), answering at once or after a
latency. Reported per configuration: model calls, wall seconds, calls/s, memloop process CPU
seconds per call (start-up measured separately and left out), the share of the endpoint's bound
reached (P / latency calls/s when the fake waits) and of the bound the work itself sets (calls /
(the busiest worker thread's calls x latency): a user's calls are sequential and users differ in
their number of calls), and peak memory; and between sizes at one latency the marginal CPU per
call. Writes benchmarks/results/throughput.json with the commit.

    python benchmarks/throughput.py                          # the targets' configurations
    python benchmarks/throughput.py --configs 32:0 128:0.125  # users:latency pairs
    python benchmarks/throughput.py --configs 16:0 64:0 logged:16:0 logged:64:0 \\
        --out benchmarks/results/throughput-traces.json      # the CPU per call of traces
    python benchmarks/throughput.py --configs 32:0 128:0:64 \\
        --out benchmarks/results/throughput-issue-table.json  # the issue's table
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "throughput.json"
MAX_PARALLEL = 256  # the endpoint's largest max_concurrency
DEFAULT = [
    *("16:0", "64:0", "256:0", "16:0.125", "64:0.125", "256:0.125", "1000:0"),
    *("evolve:16:0", "evolve:64:0", "evolve:256:0", "evolve:16:0.125", "evolve:64:0.125"),
]


def count_calls_per_thread(chat_client_class) -> Counter:
    """Count the model calls each worker thread makes (benchmark instrumentation only)."""
    import threading

    counts: Counter = Counter()
    send = chat_client_class._send

    def counted(self, *args, **kwargs):
        counts[threading.get_ident()] += 1
        return send(self, *args, **kwargs)

    chat_client_class._send = counted
    return counts


@contextlib.contextmanager
def fake_endpoint(latency: float, reply, parallel: int):
    """(client, calls per thread) on the fake endpoint served from its own process."""
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint
    from memloop.testing.fake_server import serve_in_subprocess

    server, base_url = serve_in_subprocess(latency_s=latency, reply=reply)
    try:
        endpoint = Endpoint(
            model="fake", base_url=base_url, max_concurrency=parallel, timeout_s=600, max_retries=0
        )
        yield ChatClient(endpoint, cache=None), count_calls_per_thread(ChatClient)
    finally:
        server.terminate()


def measured(
    users: int, parallel: int, latency: float, calls: int, run: tuple[float, float, float, float]
) -> dict:
    """The numbers every configuration reports; `run` = (start-up wall, start-up CPU, wall, CPU)."""
    startup_wall, startup_cpu, wall, cpu = run
    return {
        "users": users,
        "parallel": parallel,
        "latency_s": latency,
        "calls": calls,
        "wall_s": round(wall, 2),
        "calls_per_s": round(calls / wall, 1),
        "cpu_s": round(cpu, 2),
        "cpu_ms_per_call": round(1000 * cpu / calls, 2),
        "startup_s": round(startup_wall, 2),
        "startup_cpu_s": round(startup_cpu, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def one(users: int, latency: float, parallel: int | None = None, logged: bool = False) -> dict:
    """Run one configuration in this process; its numbers.

    `logged`: the eval is also logged to MLflow as `memloop eval` logs it (a sqlite store, each
    user's sessions as traces with their model calls and question results), inside the
    measured time: what the traces cost per call.
    """
    started = time.perf_counter()
    cpu_started = time.process_time()
    from memloop.core.settings import program_gc

    program_gc()  # as the `memloop` program does
    from memloop.environment.procedural import generate_procedural
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
    from memloop.llm.roles import RoleClients
    from memloop.policies import build_policy
    from memloop.policies.config import AWIConfig
    from memloop.testing.fake_server import schema_valid_reply

    parallel = min(users, MAX_PARALLEL) if parallel is None else parallel
    with fake_endpoint(latency, schema_valid_reply, parallel) as (client, per_thread):
        items = generate_procedural(users=users, periods=2, questions=2, seed=0)
        config = AWIConfig()
        startup_wall = time.perf_counter() - started
        startup_cpu = time.process_time() - cpu_started
        with tempfile.TemporaryDirectory() as out:
            wall0, cpu0 = time.perf_counter(), time.process_time()
            result = run_evaluation(
                items,
                lambda uid, workdir, c: build_policy(config, c, workdir),
                Path(out),
                clients=RoleClients.single(client),
                settings=EvaluationSettings(
                    sim_config=SimulatorConfig(rounds_init=1, rounds_update=1),
                    max_users_in_parallel=parallel,
                    progress=False,
                ),
            )
            parts: dict[str, float] = {}
            if logged:
                parts = log_to_mlflow(items, config, result, Path(out))
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    calls = result.new_requests
    bound = parallel / latency if latency > 0 else None
    # A user's calls are sequential, and a worker thread runs its users one after another: the
    # run cannot end before the busiest thread's calls, each one latency long, are done.
    longest = max(per_thread.values())
    chain_bound = calls / (longest * latency) if latency > 0 else None
    return {
        **({"kind": "logged"} if logged else {}),
        **measured(users, parallel, latency, calls, (startup_wall, startup_cpu, wall, cpu)),
        **{f"{part}_cpu_s": round(seconds, 2) for part, seconds in parts.items()},
        "endpoint_bound_calls_per_s": None if bound is None else round(bound, 1),
        "share_of_bound": None if bound is None else round(calls / wall / bound, 3),
        "busiest_thread_calls": longest,
        "chain_bound_calls_per_s": None if chain_bound is None else round(chain_bound, 1),
        "share_of_chain_bound": None
        if chain_bound is None
        else round(calls / wall / chain_bound, 3),
    }


def timed(owner, name: str, spent: dict[str, float], part: str) -> None:
    """Add the process CPU of each call of `owner.name` to `spent[part]` (instrumentation)."""
    inner = getattr(owner, name)

    def measured_call(*args, **kwargs):
        started = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[part] = spent.get(part, 0.0) + time.process_time() - started

    setattr(owner, name, measured_call)


def log_to_mlflow(items, config, result, out: Path) -> dict[str, float]:
    """The eval's MLflow run with traces, as `memloop eval` logs it; the CPU seconds of its parts.

    Parts (single-threaded here, so process CPU is theirs): `traces` (all of `log_traces`: the
    traces checked against the store, built into MLflow spans and sent), of which
    `mlflow_spans` (MLflow's `TracingClient.log_spans`: its store writing spans and traces) and
    `mlflow_assessments` (`log_assessment`, one store transaction per question result).
    """
    import os

    from mlflow.tracing.client import TracingClient

    from memloop.runs import tracker
    from memloop.runs.eval_log import log_eval
    from memloop.runs.spec import eval_spec

    spent: dict[str, float] = {}
    timed(tracker, "log_traces", spent, "traces")
    timed(TracingClient, "log_spans", spent, "mlflow_spans")
    timed(TracingClient, "log_assessment", spent, "mlflow_assessments")

    os.environ.pop("MEMLOOP_TRACES", None)  # traces on, as outside the tests
    spec = eval_spec(
        environment={"procedural": {"users": len(items), "seed": 0}},
        user_ids=[i.id for i in items],
        policy=config.model_dump(mode="json"),
        prompts_sha256="-",
        prompts_source="seed",
        endpoints={},
        periods=None,
        rounds={"init": 1, "update": 1},
        replay=None,
        record_only=False,
        probes=None,
    )
    log_eval(
        f"sqlite:///{out}/mlflow.db",
        "throughput",
        spec,
        policy="awi",
        objective="state_accuracy",
        prompts={},
        result=result,
        out=out,
    )
    return spent


def marginal_cpu(rows: list[dict]) -> dict[str, dict[str, float]]:
    """CPU ms per extra call between consecutive sizes at one latency: what one more call costs,
    with the one-time work of a run (lazy imports, the plot, thread start-up) left out."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("eval", "logged"):
        evals = [r for r in rows if r.get("kind", "eval") == kind]
        for latency, steps in _marginal(evals).items():
            out[latency if kind == "eval" else f"{latency} logged"] = steps
    logged = [r for r in rows if r.get("kind") == "logged"]
    for part in ("traces", "mlflow_spans", "mlflow_assessments"):
        if all(f"{part}_cpu_s" in r for r in logged):
            for latency, steps in _marginal(logged, f"{part}_cpu_s").items():
                out[f"{latency} logged: {part}"] = steps
    return out


def _marginal(evals: list[dict], key: str = "cpu_s") -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for latency in sorted({r["latency_s"] for r in evals}):
        same = sorted((r for r in evals if r["latency_s"] == latency), key=lambda r: r["calls"])
        steps = {}
        for small, large in zip(same, same[1:], strict=False):
            extra_calls = large["calls"] - small["calls"]
            if extra_calls > 0:
                extra_cpu_ms = 1000 * (large[key] - small[key])
                steps[f"{small['users']}->{large['users']}"] = round(extra_cpu_ms / extra_calls, 2)
        if steps:
            out[str(latency)] = steps
    return out


def one_evolve(users: int, latency: float) -> dict:
    """One evolve run of two cycles (cycle 0, the playbook evolver with its replay screen, cycle
    1) of AWI on `users` users (half train, a quarter val, the rest test), every role on the
    fake endpoint, MLflow on a sqlite store; the same numbers as `one`."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    from memloop.core.settings import program_gc

    program_gc()  # as the `memloop` program does
    import yaml

    from memloop.llm.roles import RoleClients
    from memloop.optimize.config import EvolveConfig, load_config
    from memloop.optimize.evolve import run_evolve
    from memloop.testing import evolve_loop_reply

    parallel = min(users, MAX_PARALLEL)
    with fake_endpoint(latency, evolve_loop_reply, parallel) as (client, per_thread):
        with tempfile.TemporaryDirectory() as root:
            (Path(root) / "awi.yaml").write_text("type: awi\n")
            train, val = users // 2, users // 4
            (Path(root) / "exp.yaml").write_text(
                yaml.safe_dump(
                    {
                        "experiment": "throughput",
                        "environment": {
                            "procedural": {"users": users, "periods": 2, "questions": 2},
                            "train_users": train,
                            "val_users": val,
                            "test_users": users - train - val,
                        },
                        "policy": "awi.yaml",
                        "evolvers": ["playbook"],
                        "objective": "state_accuracy",
                        "cycles": 2,
                        "rounds": {"init": 1, "update": 1},
                        "parallel_users": parallel,
                        "tracking_uri": f"sqlite:///{root}/mlruns/mlflow.db",
                        "out_dir": f"{root}/runs",
                    }
                )
            )
            config = load_config(Path(root) / "exp.yaml", EvolveConfig)
            startup_wall = time.perf_counter() - started
            startup_cpu = time.process_time() - cpu_started
            wall0, cpu0 = time.perf_counter(), time.process_time()
            (outcome,) = run_evolve(
                config, progress=False, clients=RoleClients(client, client, client, client)
            )
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            screened = len(list((outcome.run_dir / "cycle_00" / "screen").iterdir()))
    calls = sum(per_thread.values())
    return {
        "kind": "evolve",
        **measured(users, parallel, latency, calls, (startup_wall, startup_cpu, wall, cpu)),
        "prompts_screened": screened,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--configs",
        nargs="+",
        default=DEFAULT,
        help="users:latency_s[:parallel] (an eval), logged:users:latency_s (an eval logged to "
        "MLflow with traces), or evolve:users:latency_s",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="the JSON file to write")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one config, run in this process
    args = parser.parse_args()
    if args.one:
        if args.one.startswith("evolve:"):
            _, users, latency = args.one.split(":")
            print(json.dumps(one_evolve(int(users), float(latency))))
            return
        logged = args.one.startswith("logged:")
        users, latency, *parallel = args.one.removeprefix("logged:").split(":")
        print(
            json.dumps(one(int(users), float(latency), *(int(p) for p in parallel), logged=logged))
        )
        return
    rows = []
    for config in args.configs:
        done = subprocess.run(
            [sys.executable, __file__, "--one", config], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"{config} failed:\n{done.stderr[-2000:]}")
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        share = (
            ""
            if row.get("share_of_bound") is None
            else f", {row['share_of_bound']:.0%} of bound "
            f"({row['share_of_chain_bound']:.0%} of the busiest thread's)"
        )
        kind = {
            "evolve": "evolve, 2 cycles + replay screen: ",
            "logged": "eval logged to MLflow with traces: ",
        }.get(row.get("kind", ""), "")
        print(
            f"{kind}{row['users']:5d} users ({row['parallel']} parallel), latency "
            f"{row['latency_s']:.3f} s: {row['calls']} calls in {row['wall_s']} s = "
            f"{row['calls_per_s']} calls/s, {row['cpu_ms_per_call']} ms CPU per call{share}, "
            f"peak {row['peak_rss_mb']} MB",
            flush=True,
        )
    marginal = marginal_cpu(rows)
    for latency, steps in marginal.items():
        shown = ", ".join(f"{k}: {v} ms" for k, v in steps.items())
        print(f"marginal CPU per call at latency {latency} s ({shown})")
    from memloop.runs.spec import git_revision  # here: one() measures memloop's imports

    commit = (git_revision() or "unknown")[:7]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    document = {"commit": commit, "runs": rows, "marginal_cpu_ms_per_call": marginal}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
