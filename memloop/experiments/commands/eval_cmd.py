"""`memloop eval`: run a policy through an environment's episodes, probing after every period.

Writes metrics.json, records.jsonl and per_period.png; `--replay DIR` evaluates off-policy on the
conversations an earlier eval recorded; `--record-only` records conversations and nothing else
(no memory writes, no probes), to be scored by replay as often as needed.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a memory policy on an environment",
        description="Run on-policy episodes with probes after every period and "
        "score them. Rerunning a finished eval resumes from its checkpoints and "
        "makes no model call.",
    )
    p.add_argument("--env", required=True, metavar="PATH", help="data.json environment file")
    p.add_argument(
        "--policy",
        required=True,
        metavar="YAML",
        help="policy config, e.g. memloop/experiments/policies/awi.yaml",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--users", type=int, metavar="N", help="only the first N users")
    p.add_argument(
        "--periods",
        type=int,
        metavar="P",
        help="only the first P periods (period 0, the initial one, counts)",
    )
    p.add_argument(
        "--endpoint",
        metavar="FILE",
        help="the assistant's endpoint YAML (default: the embedded model)",
    )
    p.add_argument(
        "--sim-endpoint",
        metavar="FILE",
        help="the user simulator's endpoint (default: the assistant's)",
    )
    p.add_argument(
        "--checker-endpoint",
        metavar="FILE",
        help="the factual-recall checker's endpoint (default: the assistant's)",
    )
    p.add_argument("--rounds-init", type=int, default=1, help="rounds per session in period 0")
    p.add_argument(
        "--rounds-update", type=int, default=2, help="rounds per session in later periods"
    )
    p.add_argument("--parallel-users", type=int, default=2, help="users run concurrently")
    p.add_argument("--cache", metavar="PATH", help="response cache file")
    p.add_argument(
        "--force",
        action="store_true",
        help="start over in the --out folder: its run's checkpoints and results are deleted "
        "(needed when it holds a run with other settings or damaged checkpoints); a folder "
        "without memloop eval's spec.json is refused, never emptied",
    )
    p.add_argument(
        "--replay",
        metavar="DIR",
        help="off-policy: feed the conversations recorded by an earlier eval (its --out folder) "
        "to this policy instead of simulating the user; the recording must match the users, "
        "periods and sessions",
    )
    p.add_argument(
        "--record-only",
        action="store_true",
        help="record the conversations once, for scoring any prompt later with --replay: the "
        "assistant replies to each user message alone (no memory, as a policy with "
        "reply_memory: false), no memory is written and nothing is probed or scored",
    )
    p.set_defaults(func=run_eval)


def positive(name: str, value: int | None) -> None:
    from memloop.core.errors import UserError

    if value is not None and value < 1:
        raise UserError(f"--{name} must be at least 1 (got {value})")


def run_eval(args: argparse.Namespace) -> int:
    import contextlib

    from memloop.core.errors import UserError
    from memloop.core.files import atomic_write_json, file_sha256, json_sha256, run_folder_lock
    from memloop.environment.datafile import load_items, local_path
    from memloop.environment.episode import requests_sent, run_episodes
    from memloop.environment.replay import check_recording
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import run_evaluation
    from memloop.feedback.report import format_metrics
    from memloop.llm.roles import RoleClients
    from memloop.optimize.context import load_policy
    from memloop.optimize.spec import run_spec
    from memloop.policies import build_policy, policy_prompts, recorder_config

    for name in ("users", "periods", "rounds_init", "rounds_update", "parallel_users"):
        positive(name.replace("_", "-"), getattr(args, name))
    items = load_items(args.env)
    if args.users:
        if args.users > len(items):
            raise UserError(f"--users {args.users}: {args.env} has {len(items)} users")
        items = items[: args.users]
    most = max((it.num_periods for it in items), default=0)
    if args.periods and args.periods > most:
        raise UserError(f"--periods {args.periods}: {args.env} has at most {most} periods")
    config = load_policy(args.policy)
    if args.record_only:
        if args.replay:
            raise UserError("--record-only records conversations; it cannot also --replay one")
        config = recorder_config(config)
    clients = RoleClients.from_files(
        args.endpoint,
        args.sim_endpoint or args.endpoint,
        args.checker_endpoint or args.endpoint,
        cache=args.cache or "default",
    )
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file, not a folder")
    replay_from = None
    if args.replay:
        if Path(args.replay).resolve() == out.resolve():
            raise UserError(
                f"--replay {args.replay}: must differ from --out (it would be overwritten)"
            )
        replay_from = check_recording(items, args.replay, args.periods)
    spec = run_spec(
        command="eval",
        env=str(args.env),
        env_sha256=file_sha256(local_path(args.env)),
        users=[it.id for it in items],
        periods=args.periods,
        policy=config.model_dump(mode="json"),
        # the prompts it starts from: an edited default prompt is another run
        prompts_sha256=json_sha256(policy_prompts(config, clients.agent)),
        endpoints=clients.public(),
        rounds={"init": args.rounds_init, "update": args.rounds_update},
        replay=str(replay_from) if replay_from else None,
        record_only=bool(args.record_only),
    )
    same_run_or_refuse(out, spec, force=args.force)  # before anything is written
    folder = contextlib.ExitStack()
    try:
        folder.enter_context(run_folder_lock(out, "memloop eval"))
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write there ({exc.strerror})") from None
    with folder:  # a second live eval in this folder is refused until this one ends
        same_run_or_refuse(out, spec, force=args.force)  # again, now that no other eval can write
        if args.force:
            _delete_run_files(out)
        atomic_write_json(out / "spec.json", spec, indent=2)
        sim_config = SimulatorConfig(rounds_init=args.rounds_init, rounds_update=args.rounds_update)
        if args.record_only:
            episodes = run_episodes(
                items,
                lambda uid, workdir, client: build_policy(config, client, workdir),
                clients.agent,
                out / "episodes",
                sim_client=clients.user_sim,
                sim_config=sim_config,
                periods=args.periods,
                max_users_in_parallel=args.parallel_users,
            )
            periods = sum(len(e.records) for e in episodes)
            print(f"recorded {len(episodes)} users, {periods} periods in {out / 'episodes'}")
            print(f"new model requests this run: {requests_sent(episodes)}")
            print(f"score a policy on it: memloop eval --replay {out} --policy YAML --out DIR ...")
            return 0
        result = run_evaluation(
            items,
            lambda uid, workdir, client: build_policy(config, client, workdir),
            out,
            agent_client=clients.agent,
            sim_client=clients.user_sim,
            checker_client=clients.checker,
            sim_config=sim_config,
            periods=args.periods,
            max_users_in_parallel=args.parallel_users,
            replay_from=replay_from,
        )
    print(format_metrics(result.metrics))
    for note in result.metrics.get("warnings", []):
        print(f"warning: {note}")
    print(f"new model requests this run: {result.new_requests}")
    print(f"wrote {out / 'metrics.json'}, {out / 'records.jsonl'}, {out / 'per_period.png'}")
    return junk_verdict(result.metrics)


# what makes an eval's numbers: a rerun into the same --out must match on every one
IDENTITY = (
    "env_sha256",
    "users",
    "periods",
    "policy",
    "prompts_sha256",
    "endpoints",
    "rounds",
    "replay",
    "record_only",
)
RUN_FILES = ("spec.json", "metrics.json", "records.jsonl", "per_period.png", "episodes")


def same_run_or_refuse(out: Path, spec: dict, *, force: bool) -> None:
    """Resume only the same work; start over (`force`) only on memloop's own eval run.

    Refused in one line, before anything is written or deleted: run files beside no spec.json or
    beside a spec.json memloop eval did not write (neither resumed nor deleted by --force), and,
    without `force`, a run with other settings (naming what differs). With `force` the caller then
    deletes the run's files (damaged checkpoints included).
    """
    from memloop.core.errors import UserError

    path = out / "spec.json"
    if not path.is_file():
        if any((out / name).exists() for name in RUN_FILES):
            raise UserError(
                f"--out {out}: holds files memloop did not write (no spec.json); "
                "choose another --out or remove them yourself"
            )
        return
    before = _eval_spec(path)
    if force:
        return
    now = {**spec["components"], "scorer_version": spec["scorer_version"]}
    differs = [k for k in (*IDENTITY, "scorer_version") if before.get(k) != now.get(k)]
    if differs:
        raise UserError(
            f"--out {out}: holds a run with other settings (changed: {', '.join(differs)}); "
            "choose another --out, or --force to start over there"
        )


def _eval_spec(path: Path) -> dict[str, Any]:
    """The identity a memloop eval recorded in `path` (its components and scorer version).

    Anything else (unreadable, not JSON, not the structure memloop eval writes) is refused in one
    line: the folder is not memloop's to resume or to delete.
    """
    import json

    from memloop.core.errors import UserError

    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        problem = f"{path.name} is unreadable: {exc}"
    else:
        if (
            isinstance(old, dict)
            and isinstance(old.get("components"), dict)
            and "scorer_version" in old
        ):
            return {**old["components"], "scorer_version": old["scorer_version"]}
        problem = f"{path.name} has no components and scorer_version: not memloop eval's"
    raise UserError(
        f"--out {path.parent}: holds files memloop did not write ({problem}); "
        "choose another --out or remove them yourself"
    )


def _delete_run_files(out: Path) -> None:
    """The files of an eval run in `out` (nothing else the folder holds)."""
    import shutil

    for name in RUN_FILES:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


JUNK_SHARE = 0.2  # above this share of unparsed answers a run's numbers describe the endpoint


def junk_verdict(metrics: dict) -> int:
    """Exit status of an eval: loud when many answers were not valid JSON, 2 when all were.

    Unparsed answers are scored as `format` failures (never memory failures) and are never
    cached, so a rerun after fixing the endpoint asks them again.
    """
    import sys

    asked, junk = metrics.get("questions", 0), metrics.get("json_errors", 0)
    if not asked or junk / asked <= JUNK_SHARE:
        return 0
    line = (
        f"{junk} of {asked} answers ({junk / asked:.0%}) were not valid JSON for their schema: "
        "they count as format failures, not memory failures; check the agent endpoint "
        "(memloop llm check --endpoint FILE); they were not cached, so a rerun asks again"
    )
    if junk == asked:
        print(f"memloop: error: every answer failed: {line}", file=sys.stderr)
        return 2
    print(f"WARNING: {line}", file=sys.stderr)
    return 0
