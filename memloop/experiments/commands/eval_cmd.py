"""`memloop eval`: run a policy through an environment's episodes, probing after every period.

Writes metrics.json, records.jsonl and per_period.png; `--replay DIR` evaluates off-policy on the
conversations an earlier eval recorded; `--record-only` records conversations and nothing else
(no memory writes, no probes), to be scored by replay as often as needed.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from memloop.core.settings import DEFAULT_TRACKING_URI
from memloop.core.tables import wrap_prose
from memloop.experiments.commands.options import (
    add_cache_option,
    add_endpoint_options,
    add_format_option,
    add_objective_option,
    add_progress_option,
    add_tracking_uri_option,
    at_least_one,
    endpoint_ref,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a memory policy on an environment",
        description="Run on-policy episodes with probes after every period and "
        "score them. Rerunning a finished eval resumes from its checkpoints and "
        "makes no model call.",
        example="memloop eval --env data.json --policy memloop/experiments/policies/native.yaml "
        "--model local-0.5b --users 1 --periods 2 --out runs/eval-native",
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
    add_endpoint_options(p, "the assistant's endpoint YAML (default: the embedded model)")
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
    p.add_argument(
        "--state-read",
        choices=["json", "letters"],
        default=None,
        help="how the state queries read memory: one JSON query per question (0/1 scores), or "
        "one lettered query per variable with the letter's probability (state_prob); default: "
        "letters where the agent's endpoint returns log-probabilities (the embedded model, or "
        "`logprobs: true` in its file), else json",
    )
    p.add_argument(
        "--state-probes",
        choices=["questions", "all"],
        default="questions",
        help="read the variables the questions need, or every state variable (letters only)",
    )
    add_cache_option(p)
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
    add_tracking_uri_option(
        p,
        "MLflow store the eval is logged to, and registry versions (prompts_from: "
        "prompts:/...) are read from (default: $MLFLOW_TRACKING_URI, else "
        f"{DEFAULT_TRACKING_URI})",
        default=None,
    )
    p.add_argument(
        "--experiment",
        default="eval",
        help="MLflow experiment of the run (default: eval); `memloop compare --experiment "
        "NAME --baseline RUN` pairs its evals on the same users",
    )
    add_format_option(p)
    add_objective_option(p, "the measure listed first and recorded as the run's objective")
    add_progress_option(p)
    p.set_defaults(func=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from memloop.core.errors import UserError
    from memloop.core.files import json_sha256
    from memloop.environment.datafile import load_items
    from memloop.environment.episode import requests_sent, resumed_line, run_episodes
    from memloop.environment.replay import check_recording
    from memloop.environment.simulator import SimulatorConfig
    from memloop.feedback.evaluate import EvaluationSettings, run_evaluation
    from memloop.feedback.probes import ProbeSettings, probes_for
    from memloop.feedback.report import format_metrics
    from memloop.policies import build_policy, policy_prompts, recorder_config
    from memloop.runs.folder import open_run_folder
    from memloop.runs.inputs import describe_data_file, load_policy, roles
    from memloop.runs.spec import eval_spec
    from memloop.runs.tracker import experiment_name_problem

    at_least_one(args, "users", "periods", "rounds_init", "rounds_update", "parallel_users")
    if problem := experiment_name_problem(args.experiment):
        raise UserError(f"--experiment {args.experiment[:40]!r}: {problem}")
    items = load_items(args.env)
    if args.users:
        if args.users > len(items):
            raise UserError(f"--users {args.users}: {args.env} has {len(items)} users")
        items = items[: args.users]
    most = max((it.num_periods for it in items), default=0)
    if args.periods and args.periods > most:
        raise UserError(f"--periods {args.periods}: {args.env} has at most {most} periods")
    # every period of every user: --periods equal to the longest episode is no --periods
    periods = args.periods if args.periods and args.periods < most else None
    tracking_uri = (
        args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    )
    config = load_policy(args.policy, tracking_uri, users=items)
    if args.record_only:
        if args.replay:
            raise UserError("--record-only records conversations; it cannot also --replay one")
        config = recorder_config(config)
    clients = roles(
        endpoint_ref(args), args.sim_endpoint, args.checker_endpoint, cache=args.cache or "default"
    )
    clients.preflight()  # an unreachable server, a bad key or model: one line, before progress
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out}: is a file, not a folder")
    replay_from = None
    if args.replay:
        if Path(args.replay).resolve() == out.resolve():
            raise UserError(
                f"--replay {args.replay}: must differ from --out (it would be overwritten)"
            )
        replay_from = check_recording(items, args.replay, periods)
    try:
        chosen = {"state_read": args.state_read} if args.state_read else {}
        probes = ProbeSettings(**chosen, state_probes=args.state_probes)
    except ValueError:
        raise UserError("--state-probes all needs --state-read letters") from None
    # the JSON read's reason, when chosen, is state_prob's null reason in the metrics
    probes, _ = probes_for(probes, clients.agent.endpoint.returns_logprobs)
    prompts = policy_prompts(config, clients.agent)
    from memloop.runs.eval_log import SOURCE_TAG, log_eval, prompts_source, source_label

    source_tags = prompts_source(args.policy, tracking_uri)
    source_tags[SOURCE_TAG] = source_label(args.policy, source_tags)
    spec = eval_spec(
        environment=describe_data_file(args.env),
        user_ids=[it.id for it in items],
        policy=config.model_dump(mode="json"),
        prompts_sha256=json_sha256(prompts),
        prompts_source=source_tags[SOURCE_TAG],
        endpoints=clients.identity(),
        periods=periods,
        rounds={"init": args.rounds_init, "update": args.rounds_update},
        replay=str(replay_from) if replay_from else None,
        record_only=bool(args.record_only),
        probes=probes.spec(),
    )
    with open_run_folder(out, spec, "memloop eval", run_files=RUN_FILES, force=args.force):
        sim_config = SimulatorConfig(rounds_init=args.rounds_init, rounds_update=args.rounds_update)
        if args.record_only:
            episodes = run_episodes(
                items,
                lambda uid, workdir, client: build_policy(config, client, workdir),
                clients.agent,
                out / "episodes",
                sim_client=clients.user_sim,
                sim_config=sim_config,
                periods=periods,
                max_users_in_parallel=args.parallel_users,
                progress=not args.no_progress,
                label=f"record {config.display_name}",
            )
            done = sum(len(e.records) for e in episodes)
            print(f"recorded {len(episodes)} users, {done} periods in {out / 'episodes'}")
            if resumed := resumed_line(episodes):
                print(resumed)
            print(f"new model requests this run: {requests_sent(episodes)}")
            print(f"score a policy on it: memloop eval --replay {out} --policy YAML --out DIR ...")
            return 0
        result = run_evaluation(
            items,
            lambda uid, workdir, client: build_policy(config, client, workdir),
            out,
            clients=clients,
            replay_from=replay_from,
            label=f"eval {config.display_name}",
            settings=EvaluationSettings(
                sim_config=sim_config,
                periods=periods,
                max_users_in_parallel=args.parallel_users,
                progress=not args.no_progress,
                probes=probes,
            ),
        )
    from memloop.feedback.objective import Objective

    # the measure the agent's runs are ranked on by default comes first
    first = Objective.of(
        args.objective, clients.agent.endpoint.is_local, probes.state_read == "letters"
    ).value
    _, run_name = log_eval(
        tracking_uri,
        args.experiment,
        spec,
        policy=config.display_name,
        objective=first,
        prompts=prompts,
        result=result,
        out=out,
        tags=source_tags,
    )
    print(format_metrics(result.metrics, args.format, first=first))
    info = sys.stderr if args.format == "csv" else sys.stdout  # stdout: the CSV alone
    for note in result.metrics.get("warnings", []):
        print(wrap_prose(f"warning: {note}"), file=info)
    print(result.health.line(), file=info)
    if resumed := resumed_line(result.episodes):
        print(resumed, file=info)
    print(f"new model requests this run: {result.new_requests}", file=info)
    print(
        f"wrote {out / 'metrics.json'}, {out / 'records.jsonl'}, {out / 'per_period.png'}",
        file=info,
    )
    print(
        f"MLflow: run {run_name} in experiment {args.experiment!r} ({tracking_uri}); compare "
        f"evals: memloop compare --experiment {args.experiment} --baseline {run_name}",
        file=info,
    )
    return junk_verdict(result.metrics)


# the files an eval run writes in its --out folder (--force deletes these and nothing else)
RUN_FILES = ("metrics.json", "records.jsonl", "per_period.png", "episodes")


JUNK_SHARE = 0.2  # above this share of unparsed answers a run's numbers describe the endpoint


def junk_verdict(metrics: dict) -> int:
    """Exit status of an eval: loud when many answers were not valid JSON, 2 when all were.

    Unparsed answers are scored as `format` failures (never memory failures) and are not cached
    (except those cut off at max_tokens), so a rerun after fixing the endpoint asks them again.
    """
    asked, junk = metrics.get("questions", 0), metrics.get("json_errors", 0)
    if not asked or junk / asked <= JUNK_SHARE:
        return 0
    line = (
        f"{junk} of {asked} answers ({junk / asked:.0%}) were not valid JSON for their schema: "
        "they count as format failures, not memory failures; check the agent endpoint "
        "(memloop llm check --endpoint FILE); only those cut off at max_tokens were cached, so a "
        "rerun asks the others again"
    )
    if junk == asked:
        print(f"memloop: error: every answer failed: {line}", file=sys.stderr)
        return 2
    print(f"WARNING: {line}", file=sys.stderr)
    return 0
