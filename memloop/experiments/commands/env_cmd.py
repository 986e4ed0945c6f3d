"""`memloop env ...`: build, validate and check environments (data.json files)."""

from __future__ import annotations

import argparse
import json
import sys

from memloop.core.errors import UserError
from memloop.core.files import atomic_write_json
from memloop.core.tables import format_table, printable
from memloop.experiments.commands.options import (
    CommandGroup,
    add_cache_option,
    add_endpoint_options,
    add_group,
    add_progress_option,
    endpoint_ref,
)

_PROCEDURAL_EPILOG = """\
Each user gets QUESTIONS x STATES_PER_QUESTION distinct state variables drawn from the built-in
catalogue (questions share variables only when the catalogue runs out). CHOICES_PER_STATE is the
number of values each of those variables can take (2-4; the catalogue offers 3 or 4 per variable,
and with 4 only the variables that have four values are drawn).
Each question offers max(4, CHOICES_PER_STATE, variants the user actually lives through) answer
choices, capped by CHOICES_PER_STATE ** STATES_PER_QUESTION, which must therefore be at least 4.
The file holds PERIODS + 1 periods (period 0 is the initial state, as in the published data), and
every later period changes exactly CHANGES_PER_PERIOD variables. Same arguments, same bytes.
"""


GROUP = CommandGroup(
    "env",
    help="build, validate and check environments (data.json)",
    description="Environments: simulated users in the published AMemGym data.json format.",
    example="memloop env procedural --users 6 --out data.json",
)


def register(sub: argparse._SubParsersAction) -> None:
    env_sub = add_group(sub, GROUP)

    validate = env_sub.add_parser(
        "validate",
        help="check a data.json file and print its size, or every problem found",
        description="Check a data.json file in the published AMemGym format. A valid file prints a "
        "summary; otherwise every problem is printed with its JSON path and the exit code is 2.",
        example="memloop env validate data.json",
    )
    validate.add_argument(
        "path", metavar="PATH", help="the data.json file (or hf://OWNER/NAME) to check"
    )
    validate.add_argument("--json", action="store_true", help="print the summary as JSON")
    validate.set_defaults(func=cmd_validate)

    procedural = env_sub.add_parser(
        "procedural",
        help="generate an environment from the built-in catalogue (no LLM)",
        description="Generate simulated users in the published data.json format from a "
        "hand-written catalogue of life domains, without any LLM.",
        epilog=_PROCEDURAL_EPILOG,
        example="memloop env procedural --users 6 --periods 2 --out data.json",
    )
    procedural.add_argument("--users", type=int, default=3, help="number of users")
    procedural.add_argument(
        "--periods", type=int, default=4, help="update periods after the initial one"
    )
    procedural.add_argument("--questions", type=int, default=4, help="questions per user")
    procedural.add_argument(
        "--states-per-question",
        type=int,
        default=2,
        help="state variables each question's answer depends on",
    )
    procedural.add_argument(
        "--choices-per-state",
        type=int,
        default=2,
        help="values each state variable can take, 2-4",
    )
    procedural.add_argument(
        "--changes-per-period",
        type=int,
        default=2,
        help="variables changed in every update period",
    )
    procedural.add_argument("--seed", type=int, default=0, help="random seed")
    procedural.add_argument(
        "--start-date",
        default="2020-10-01",
        help="date of the initial state, YYYY-MM-DD",
    )
    procedural.add_argument(
        "--months-per-period",
        type=int,
        default=3,
        help="length of each update period in months",
    )
    procedural.add_argument(
        "--out",
        required=True,
        metavar="PATH",
        help="where to write the data.json file; an existing file is refused unless it holds "
        "exactly what these settings generate (a data.json carries no mark of who wrote it, so "
        "memloop never replaces one)",
    )
    procedural.set_defaults(func=cmd_procedural)

    _register_generate(env_sub)
    _register_check(env_sub)
    _register_pull(env_sub)


def cmd_validate(args: argparse.Namespace) -> int:
    """Print the summary of a valid file, or every violation (one per line) and fail with exit 2."""
    from memloop.environment.datafile import read_items
    from memloop.environment.errors import EnvFileError
    from memloop.environment.summary import summarize

    items, problems = read_items(args.path)
    if problems:
        for problem in problems:
            print(printable(problem))
        sys.stdout.flush()
        noun = "problem" if len(problems) == 1 else "problems"
        raise EnvFileError(f"{args.path}: {len(problems)} {noun} found (listed above)", problems)
    summary = summarize(items)
    if args.json:
        print(json.dumps({"path": args.path, "valid": True, **summary.to_json()}, indent=2))
    else:
        print(f"{args.path}: valid")
        for line in summary.lines():
            print(f"  {line}")
    from memloop.core.files import safe_name

    for item in items:
        folder = safe_name(item.id)
        if folder != item.id:
            print(
                f"warning: user id {item.id!r} is not a plain file name: its checkpoints go to "
                f"episodes/{folder} (a readable slug plus a hash, so no two ids share a folder "
                "and none leaves the run folder)",
                file=sys.stderr,
            )
    return 0


def cmd_procedural(args: argparse.Namespace) -> int:
    """Generate a procedural environment and write it atomically to --out."""
    from memloop.core.files import refuse_foreign_file
    from memloop.environment.datafile import dump_items, save_items
    from memloop.environment.procedural import ProceduralSpec, generate_from_spec
    from memloop.environment.validation import check_items

    spec = ProceduralSpec(
        users=args.users,
        periods=args.periods,
        questions=args.questions,
        states_per_question=args.states_per_question,
        choices_per_state=args.choices_per_state,
        changes_per_period=args.changes_per_period,
        seed=args.seed,
        start_date=args.start_date,
        months_per_period=args.months_per_period,
    )
    items = generate_from_spec(spec)
    problems = check_items(items)
    if problems:  # a generator bug, not a user error: fail loudly rather than write a bad file
        raise RuntimeError(f"procedural generator produced an invalid environment: {problems[0]}")
    text = dump_items(items)
    refuse_foreign_file(
        args.out,
        "--out",
        lambda path: path.read_bytes() == text.encode("utf-8"),
        "memloop cannot tell a data.json it wrote, and this one is not what these settings "
        "generate",
    )
    save_items(items, args.out)

    def count(n: int, noun: str) -> str:
        return f"{n} {noun}" if n == 1 else f"{n} {noun}s"

    print(
        f"wrote {count(len(items), 'user')} ({count(spec.periods + 1, 'period')}, "
        f"{count(spec.questions, 'question')}, "
        f"{count(spec.variables_per_user, 'state variable')} each) to {args.out}"
    )
    return 0


_GENERATE_EPILOG = """\
Steps per user: profile, questions, schema, initial_state, update_KK and events_KK per period,
sessions_KK per period (opening messages + exposure check), answers_qNN per question (answers +
reflection check), item. Each finished step is saved in DIR/raw/<user_id>/<step>.json; running the
same command again skips finished steps (the folder must hold a run with the same generation
settings; --users and refine_budget may change). Every model output is schema-constrained JSON
and validated; junk, invalid content and failed checks each spend the refine budget of that unit
of work. A user still failing then is listed with its step and reason in DIR/report.json and on
the terminal, never dropped silently. Exit codes: 0 when every user passed (or with
--allow-partial when at least one did: data.json then holds those users); 2 otherwise (no
data.json is written, an older one in DIR is removed), and for bad settings or an unreachable
endpoint. A rerun retries failed users from their failed step with the same draws; raise
refine_budget in the config to give them more attempts.
"""


def _register_generate(env_sub: argparse._SubParsersAction) -> None:
    generate = env_sub.add_parser(
        "generate",
        help="generate an environment with an LLM (the paper's pipeline)",
        description="Generate simulated users in the published data.json format with an LLM: "
        "questions, state schema, state evolution, life events, opening messages and "
        "personalised answers, with exposure and reflection checks.",
        epilog=_GENERATE_EPILOG,
        example="memloop env generate memloop/experiments/env/base.yaml --users 1 --periods 1 "
        "--questions 2 --out runs/env-llm",
    )
    generate.add_argument(
        "config", metavar="CONFIG", help="pipeline YAML, e.g. memloop/experiments/env/base.yaml"
    )
    generate.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="output folder: data.json, report.json, config.json, raw/ (a folder holding one of "
        "those files without being an earlier run of env generate is refused)",
    )
    generate.add_argument("--users", type=int, help="override the number of users")
    generate.add_argument("--periods", type=int, help="override the number of update periods")
    generate.add_argument("--questions", type=int, help="override the questions per user")
    add_endpoint_options(generate, "endpoint YAML (overrides the config's)")
    generate.add_argument(
        "--personas",
        metavar="PATH",
        help="persona file (.jsonl, .json or Nemotron-Personas .parquet)",
    )
    generate.add_argument(
        "--allow-partial",
        action="store_true",
        help="write data.json with the users that passed even if others failed",
    )
    add_cache_option(generate, "response cache file (default: the user cache; 'none' to disable)")
    add_progress_option(generate, "hide the progress bar")
    generate.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    """Run the LLM pipeline; print failures and a summary.

    Exits 2 unless every user passed (or --allow-partial and at least one did).
    """
    from memloop.environment.llm_pipeline import GenerationIncomplete, load_config, run_pipeline
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import Endpoint

    config = load_config(
        args.config,
        users=args.users,
        periods=args.periods,
        questions=args.questions,
        personas=args.personas,
    )
    ref = endpoint_ref(args)
    if isinstance(ref, Endpoint):  # --model: the config names it as an inline endpoint mapping
        endpoint = ref
        config = config.model_copy(update={"endpoint": ref.model_dump(exclude_defaults=True)})
    elif ref:
        endpoint = Endpoint.from_yaml(ref)
        config = config.model_copy(update={"endpoint": str(ref)})
    else:
        endpoint = config.endpoint_config()
    refuse_foreign_generate_folder(args.out)
    cache = "default" if args.cache is None else (None if args.cache == "none" else args.cache)
    client = ChatClient(endpoint, cache=cache)
    try:
        result = run_pipeline(
            config,
            args.out,
            client,
            allow_partial=args.allow_partial,
            progress=not args.no_progress,
        )
    finally:
        client.close()
    for failure in result.failures:
        print(f"FAILED {failure.line()}")
    total = result.usage.get("total", {})
    print(
        f"{len(result.items)} of {result.requested} users generated in {result.elapsed_s:.0f}s "
        f"({result.steps_run} steps run, {result.steps_skipped} resumed; "
        f"{total.get('calls', 0)} model calls, {total.get('total_tokens', 0)} tokens)"
    )
    print(f"report: {result.report_path}")
    if result.data_path is not None:
        print(f"data: {result.data_path}")
    if result.failures and result.data_path is None:
        sys.stdout.flush()
        raise GenerationIncomplete(
            f"{len(result.failures)} of {result.requested} users failed (listed above and in "
            f"{result.report_path}); no data.json written. Rerun to resume, raise refine_budget "
            "for more attempts, or pass --allow-partial to keep the users that passed"
        )
    return 0


GENERATE_FILES = ("config.json", "data.json", "report.json")


def refuse_foreign_generate_folder(out: str) -> None:
    """Refuse an `env generate` --out folder holding its file names without being its run.

    A run of `env generate` writes config.json (its settings' fingerprint) first, then replaces
    data.json and report.json, and removes an older data.json when users fail: none of that may
    happen to files memloop did not write.
    """
    from pathlib import Path

    folder = Path(out)
    if not folder.is_dir():
        return
    try:
        document = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        document = None
    if isinstance(document, dict) and isinstance(document.get("fingerprint"), dict):
        return  # an earlier run of env generate: resumed or refused by its settings
    held = [name for name in GENERATE_FILES if (folder / name).exists()]
    if held:
        raise UserError(
            f"--out {folder}: holds files memloop did not write ({', '.join(held)}, and no "
            "config.json of `memloop env generate`); choose another --out or remove them yourself"
        )


def _register_check(env_sub: argparse._SubParsersAction) -> None:
    check = env_sub.add_parser(
        "check",
        help="measure state exposure with a checker LLM",
        description="For every session, a checker LLM that sees only the opening utterance "
        "predicts the values of the session's exposed variables; prints the agreement "
        "rate per user and overall (an automatic version of the paper's human check).",
        example="memloop env check data.json --users 2 --model local-0.5b",
    )
    check.add_argument(
        "path", metavar="PATH", help="the data.json file (or hf://OWNER/NAME) to check"
    )
    add_endpoint_options(check, "the checker's endpoint YAML (default: the embedded model)")
    check.add_argument("--users", type=int, metavar="N", help="only the first N users")
    check.add_argument("--json", metavar="OUT", help="also write every session's result here")
    check.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:

    from memloop.environment.datafile import load_items
    from memloop.environment.exposure_check import check_exposure
    from memloop.llm.client import ChatClient
    from memloop.llm.endpoint import load_endpoint

    items = load_items(args.path)[: args.users] if args.users else load_items(args.path)
    client = ChatClient(load_endpoint(endpoint_ref(args)))
    report = check_exposure(items, client)
    rows = []
    for item in items:
        sessions = [s for s in report.sessions if s.user_id == item.id]
        rows.append(
            [item.id, len(sessions), sum(len(s.intended) for s in sessions), report.rate(item.id)]
        )
    print(format_table(["user", "sessions", "exposed values", "agreement"], rows))
    overall = report.rate()
    print(
        f"overall agreement: {'n/a' if overall is None else f'{overall:.3f}'} "
        f"({sum(s.agreed for s in report.sessions)} of "
        f"{sum(len(s.intended) for s in report.sessions)} exposed values recovered)"
    )
    if args.json:
        atomic_write_json(args.json, [s.__dict__ for s in report.sessions])
    unread = sum(1 for s in report.sessions if s.json_error is not None)
    if report.sessions and unread == len(report.sessions):
        raise UserError(
            f"the checker never answered in the expected JSON form ({unread} of {unread} "
            "sessions unreadable), so the agreement above measures nothing: use a checker "
            "endpoint that follows a JSON schema (--endpoint)"
        )
    if unread:
        print(
            f"warning: {unread} of {len(report.sessions)} sessions got no readable answer from "
            "the checker (counted as not recovered)"
        )
    return 0


_PULL_EPILOG = """\
NAME is OWNER/NAME[@REVISION][/FILE], with or without hf:// in front. Without FILE every data.json
of the dataset is fetched; FILE is a path ending in .json, or a folder (a config such as v1.base)
holding a data.json. Files go to huggingface_hub's cache (HF_HUB_CACHE, else HF_HOME/hub), where
`--env hf://NAME` finds them later without network. memloop sets HF_HUB_OFFLINE=1 unless you set
it, so only the cache is read: download with `HF_HUB_OFFLINE=0 memloop env pull NAME`. Offline
and not cached: one line saying what to do, exit code 2, nothing written.
"""


def _register_pull(env_sub: argparse._SubParsersAction) -> None:
    pull = env_sub.add_parser(
        "pull",
        help="download environment data from the Hugging Face Hub (or find it in the cache)",
        description="Fetch a dataset's data.json files into the Hugging Face cache (or find them "
        "there) and print each one's local path and number of users. The published AMemGym "
        "data is AGI-Eval/AMemGym (its file v1.base/data.json is what hf://AGI-Eval/AMemGym "
        "loads).",
        epilog=_PULL_EPILOG,
        example="HF_HUB_OFFLINE=0 memloop env pull AGI-Eval/AMemGym",
    )
    pull.add_argument("name", metavar="NAME", help="dataset, e.g. AGI-Eval/AMemGym")
    pull.set_defaults(func=cmd_pull)


def cmd_pull(args: argparse.Namespace) -> int:
    """Fetch (or find) the data files; print each one's path, user count and --env reference."""
    from memloop.environment.datafile import load_items
    from memloop.environment.hf_data import HfRef, pull

    pulled = pull(args.name)
    for filename, local in pulled.files:
        users = len(load_items(local))
        noun = "user" if users == 1 else "users"
        print(f"{local}: {users} {noun} (--env {pulled.ref.uri(filename)})")
    pinned = HfRef(pulled.ref.repo_id, pulled.commit)
    example = pinned.uri(pulled.files[0][0]) if len(pulled.files) == 1 else pinned.uri() + "[/FILE]"
    print(f"dataset {pulled.ref.repo_id} at commit {pulled.commit}; to pin it: --env {example}")
    return 0
