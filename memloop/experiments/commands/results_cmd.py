"""`memloop compare`, `memloop export` and `memloop ui`: reading runs back."""

from __future__ import annotations

import argparse

from memloop.experiments.commands.options import (
    add_cache_option,
    add_format_option,
    add_progress_option,
    add_tracking_uri_option,
    at_least_one,
)


def register_compare(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser(
        "compare",
        help="compare the runs of an MLflow experiment",
        description="Each run's prompt selected on validation users, its numbers on the test "
        "users, and each condition paired with the baseline on the same users; then the prompt "
        "diff of one run.",
        example="memloop compare --experiment feedback-modes --format md",
    )
    cmp.add_argument("--experiment", required=True, help="MLflow experiment name")
    cmp.add_argument(
        "--run",
        help="run name or id whose first/best prompt diff to show (default: the evolving run "
        "with the best headline score)",
    )
    cmp.add_argument(
        "--to",
        choices=["best", "last"],
        default="best",
        help="diff the first cycle's prompt against the one selected on validation users "
        "(best) or the last cycle's",
    )
    cmp.add_argument(
        "--baseline",
        default="none",
        help="the condition every other run is paired with on the same users: a run name or id, "
        "an evolver, or 'feedback/evolver' (default: the run without evolution)",
    )
    add_tracking_uri_option(
        cmp,
        "the MLflow store evolve logged to; it is only read: a store that does not exist is "
        "refused, never created",
    )
    cmp.add_argument(
        "--plot",
        metavar="PNG",
        help="also plot memory score, state accuracy and factual recall per cycle, one line per "
        "run",
    )
    add_format_option(cmp)
    cmp.set_defaults(func=run_compare_cmd)


def register_export(sub: argparse._SubParsersAction) -> None:
    ex = sub.add_parser(
        "export",
        help="write an evolve run's prompts as text, a mem0 config or a DSPy program",
        description="Writes the prompts of the cycle selected on validation users (or --cycle) "
        "with where they came from (run, cycle, validation and test score, commit).",
        example="memloop export awi-2-4-complete-reflective --out prompts.txt",
    )
    ex.add_argument(
        "run", metavar="RUN", help="a run folder of `memloop evolve`, or an MLflow run name or id"
    )
    ex.add_argument(
        "--format",
        choices=["text", "mem0", "dspy"],
        default="text",
        help="text: the prompts; mem0: a MemoryConfig with custom_fact_extraction_prompt and "
        "custom_update_memory_prompt (AWE runs); dspy: the policy's program, for "
        "program.load(FILE)",
    )
    ex.add_argument("--cycle", type=int, help="this cycle instead of the one selected")
    ex.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="the file to write; an existing one is replaced only when it is an earlier export "
        "left unchanged (memloop never replaces a file it did not write: it refuses, and writes "
        "nothing)",
    )
    ex.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="the environment variable holding the key of the run's servers: --format mem0 "
        "names it in a placeholder for llm.config.api_key (the file never holds a key; without "
        "it only OpenAI's own host is left to mem0's OPENAI_API_KEY, any other server is given "
        "no key), and --check reads it",
    )
    ex.add_argument(
        "--check",
        action="store_true",
        help="then re-score the export where it runs (text: prompts_from:, dspy: dspy.load, "
        "mem0: mem0's own Memory.from_config) on the run's test users, paired with the run's "
        "own score of the same prompts: prints the gap with its interval, records it in the "
        "export and logs it to MLflow (experiment export-check); RUN must be a run folder",
    )
    ex.add_argument(
        "--env",
        metavar="PATH",
        help="--check of a run on a data file: that file (its sha256 must be the run's; a "
        "procedural run's users are regenerated)",
    )
    add_cache_option(ex, "--check: response cache file (default: the user cache folder)")
    add_progress_option(ex)
    add_tracking_uri_option(
        ex, "where to look for RUN when it is no folder (only read), and where --check logs"
    )
    ex.set_defaults(func=run_export_cmd)


def register_transfer(sub: argparse._SubParsersAction) -> None:
    tr = sub.add_parser(
        "transfer",
        help="a run's selected prompt vs its seed under other writer models (paired)",
        description="Evaluate a run's selected prompts and its seed prompts on the run's test "
        "users under each --writer (the agent model: it writes memory, replies and answers the "
        "probes; the other roles stay the run's), paired user by user: per writer the "
        "difference selected - seed, its t interval, the exact sign-flip p, users up / tied / "
        "down and the gate's verdict. Each cell is an MLflow run (experiment transfer); the "
        "matrix is OUT/transfer.json. A selection that is the seed prints `same prompt`.",
        example="memloop transfer runs/quickstart/complete-edits --writer local-0.5b "
        "--writer local-1.5b --out runs/transfer",
    )
    tr.add_argument("run", metavar="RUN_FOLDER", help="an evolve run's folder")
    tr.add_argument(
        "--writer",
        action="append",
        default=[],
        metavar="ENDPOINT",
        help="an endpoint YAML, or local-0.5b / local-1.5b (the embedded models); repeatable",
    )
    tr.add_argument("--out", required=True, metavar="DIR", help="the cells' folders, transfer.json")
    selected = tr.add_mutually_exclusive_group()
    selected.add_argument(
        "--cycle", type=int, help="transfer this cycle's prompts (default: the run's selection)"
    )
    selected.add_argument(
        "--prompts",
        metavar="FILE",
        help="transfer these prompts instead (a file `memloop export` wrote, or any file "
        "prompts_from: reads), against the run's seed",
    )
    tr.add_argument(
        "--env",
        metavar="PATH",
        help="a run on a data file: that file (its sha256 must be the run's)",
    )
    add_cache_option(tr)
    add_format_option(tr)
    add_progress_option(tr)
    add_tracking_uri_option(tr, "where the cells are logged")
    tr.set_defaults(func=run_transfer_cmd)


def run_transfer_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memloop.optimize.transfer import run_transfer, transfer_table

    rows = run_transfer(
        Path(args.run),
        args.writer,
        Path(args.out),
        tracking_uri=args.tracking_uri,
        env=args.env,
        cycle=args.cycle,
        prompts_file=None if args.prompts is None else Path(args.prompts),
        cache=args.cache or "default",
        progress=not args.no_progress,
    )
    print(
        f"transfer of {args.run}: the selected prompts - the seed's, per writer, on its test "
        "(or confirmation) users"
    )
    print(transfer_table(rows, args.format))
    if all(r.same_prompt for r in rows):
        print(
            "same prompt: the run's selection is its seed (same prompts and settings); no cell ran"
        )
    print(f"wrote {Path(args.out) / 'transfer.json'}")
    return 0


def register_rerun(sub: argparse._SubParsersAction) -> None:
    rr = sub.add_parser(
        "rerun",
        help="run a run's manifest again in a new folder and compare it with the original",
        description="Every run folder holds manifest.json (the command line, commit, spec, "
        "models, cache policy, versions). rerun runs that eval or quickstart command again with "
        "its output (and MLflow store) in --out, from the folder it ran in, then compares: "
        "identical (every user's every score; served from the response cache), or per run the "
        "rerun's mean objective within or outside the original's 95%% t interval. "
        "OUT/rerun.json holds the comparison.",
        example="memloop rerun runs/eval-awi/manifest.json --out runs/eval-awi-again",
    )
    rr.add_argument("manifest", metavar="MANIFEST", help="a manifest.json (or its folder)")
    rr.add_argument("--out", required=True, metavar="DIR", help="the rerun's folder (new)")
    rr.set_defaults(func=run_rerun_cmd)


def run_rerun_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memloop.runs.manifest import rerun, rerun_lines

    result = rerun(Path(args.manifest), Path(args.out))
    print("\n".join(rerun_lines(result)))
    print(f"wrote {Path(args.out) / 'rerun.json'}")
    return 0


def register_ui(sub: argparse._SubParsersAction) -> None:
    ui = sub.add_parser(
        "ui",
        help="open the MLflow UI on 127.0.0.1 (works offline)",
        description="Serve MLflow's web UI for a local store on 127.0.0.1 (Ctrl-C stops it).",
        example="memloop ui --experiment feedback-modes",
    )
    add_tracking_uri_option(ui, "the MLflow store")
    from memloop.core.settings import UI_PORT

    ui.add_argument("--port", type=int, default=UI_PORT, help="the port to listen on")
    ui.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server processes (MLflow's own default of 4 takes longer to start and several GB)",
    )
    ui.add_argument("--experiment", help="print the address of this experiment's runs table")
    ui.add_argument(
        "--study",
        help="also serve this tune study in optuna-dashboard (Optuna's own UI: trials, "
        "parameters, importance, each trial's note linking its MLflow run), beside MLflow",
    )
    ui.add_argument(
        "--storage",
        help="the Optuna store of --study (default: where tune writes it, optuna.db beside a "
        "sqlite tracking store)",
    )
    ui.add_argument("--dashboard-port", type=int, default=8080, help="optuna-dashboard's port")
    ui.set_defaults(func=run_ui_cmd)


def run_compare_cmd(args: argparse.Namespace) -> int:
    import sys

    from memloop.results.compare import compare
    from memloop.results.tables import format_rows

    result = compare(args.tracking_uri, args.experiment, args.run, args.to, args.baseline)
    info = sys.stderr if args.format == "csv" else sys.stdout  # stdout: the CSV alone
    if args.format == "table":
        print(result["table"])
    else:
        print(format_rows(result["rows"], args.format))
    print(file=info)
    print(f"```diff\n{result['diff']}\n```" if args.format == "md" else result["diff"], file=info)
    if args.plot:
        from pathlib import Path

        from memloop.results.compare import run_histories
        from memloop.results.plots import plot_cycles

        written = plot_cycles(run_histories(result["rows"]), Path(args.plot), title=args.experiment)
        print(f"\nplot: {', '.join(str(p) for p in written)}", file=info)
    return 0


def run_export_cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memloop.core.credentials import ENV_NAME
    from memloop.core.errors import UserError
    from memloop.results.export import key_placeholder, load_exported, write_export

    if not args.check:
        for name in ("env", "cache"):
            if getattr(args, name) is not None:
                raise UserError(f"--{name}: only with --check")
    if args.api_key_env is not None:
        if args.format != "mem0" and not args.check:
            raise UserError(
                "--api-key-env: only --format mem0 writes an LLM's settings (and --check reads "
                "the key)"
            )
        if not ENV_NAME.match(args.api_key_env):  # a key pasted here would be written
            raise UserError(
                "--api-key-env: must be the NAME of an environment variable (letters, digits, "
                "_), not a key"
            )
    exported = load_exported(args.run, args.tracking_uri, args.cycle)
    if args.check:  # what the check needs is refused before anything is written
        from memloop.optimize.export_check import prepare_check

        inputs = prepare_check(
            exported, env=args.env, api_key_env=args.api_key_env, cache=args.cache or "default"
        )
    written = write_export(exported, args.format, Path(args.out), args.api_key_env)
    print(
        f"cycle {exported.cycle} of {exported.run} ({exported.rule}) -> "
        + ", ".join(str(p) for p in written)
    )
    if args.format == "mem0":
        from memloop.results.export import MEM0_2X_LOST

        print(
            f"{written[0]}: for mem0 1.x (both evolved prompts); {written[1]}: for mem0 2.x, "
            f"which takes less: lost there is {MEM0_2X_LOST}"
        )
    if args.format == "mem0" and key_placeholder(args.api_key_env or "") in written[0].read_text():
        print(
            f"llm.config.api_key holds {key_placeholder(args.api_key_env)!r}: replace it with "
            "that key when you load the config (the file holds no credential)"
        )
    if args.check:
        from memloop.optimize.export_check import CHECK_EXPERIMENT, check_export

        check = check_export(
            inputs,
            args.format,
            written,
            tracking_uri=args.tracking_uri,
            progress=not args.no_progress,
        )
        exported.check = check.record()
        write_export(exported, args.format, Path(args.out), args.api_key_env)
        print(f"export check: {check.summary()}")
        paired = check.paired
        if paired.t95 is not None and paired.t95[1] < 0:
            print(
                "WARNING: the export scores lower where it runs than in memloop (the whole "
                "interval is below 0)"
            )
        print(
            f"recorded in {written[0]}; folder {check.folder}; MLflow run {check.run_name} in "
            f"experiment {CHECK_EXPERIMENT!r} ({args.tracking_uri})"
        )
    return 0


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Refuse, in one line, a port out of range or one another program already listens on."""
    import socket

    from memloop.core.errors import UserError

    if not 1 <= port <= 65535:
        raise UserError(f"--port {port}: must be 1-65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise UserError(
                f"--port {port}: cannot listen on {host}:{port} ({exc.strerror}); "
                "choose another --port"
            ) from None


def run_ui_cmd(args: argparse.Namespace) -> int:
    import os

    from memloop.core.errors import UserError
    from memloop.core.settings import apply_offline_defaults
    from memloop.runs import tracker

    if args.tracking_uri.startswith(("http://", "https://")):
        # a tracking server serves its own UI: nothing to start
        print(f"{args.tracking_uri} is an MLflow tracking server: its UI is at that address")
        return 0
    at_least_one(args, "workers")
    check_port_free(args.port)
    page = ""
    if args.experiment:
        # the client checks the store as check_store does
        mlc = tracker.client(args.tracking_uri, create=False)
        exp = tracker.find_experiment(mlc, args.experiment)
        if exp is None:
            raise UserError(f"--experiment {args.experiment}: no such experiment in the store")
        page = f"/#/experiments/{exp.experiment_id}/runs"
    else:
        tracker.check_store(args.tracking_uri)
    dashboard = None
    if args.study:
        if args.dashboard_port == args.port:
            raise UserError(f"--dashboard-port {args.port}: the MLflow UI's --port; choose another")
        check_port_free(args.dashboard_port)
        dashboard = study_dashboard(
            args.study, args.storage, args.tracking_uri, args.dashboard_port
        )
    apply_offline_defaults()  # litellm's cost-map fetch deadlocks `mlflow ui` offline
    cmd, env = tracker.ui_command(args.tracking_uri, args.port, args.workers)
    os.environ.update(env)
    print(f"MLflow UI on http://127.0.0.1:{args.port}{page} (Ctrl-C to stop)", flush=True)
    if dashboard is not None:
        import subprocess

        argv, address = dashboard
        # in this process group: the Ctrl-C that stops MLflow's UI stops it too
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        print(f"optuna-dashboard on {address} (study {args.study})", flush=True)
    os.execvp(cmd[0], cmd)
    return 0


def study_dashboard(
    study: str, storage: str | None, tracking_uri: str, port: int
) -> tuple[list[str], str]:
    """(argv, the study's address) of optuna-dashboard on `study`'s store at 127.0.0.1.

    The store as tune wrote it (`--storage`, else tune's default beside the tracking store);
    refused in one line when it holds no such study (nothing is created).
    """
    import sys
    from pathlib import Path

    from memloop.core.errors import UserError
    from memloop.core.files import sqlite_file
    from memloop.optimize.config import default_storage

    storage = storage or default_storage(tracking_uri)
    db = sqlite_file(storage, create_folder=False)
    if db is not None and not db.is_file():
        raise UserError(
            f"--study {study}: no Optuna store at {storage} (run `memloop tune` first, or name "
            "its store with --storage)"
        )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = optuna.storages.get_storage(storage)  # opened once: the names and the study's id
    names = [s.study_name for s in store.get_all_studies()]
    if study not in names:
        raise UserError(
            f"--study {study}: no such study in {storage} (studies: {', '.join(names) or 'none'})"
        )
    program = Path(sys.executable).with_name("optuna-dashboard")
    argv = [str(program), storage, "--host", "127.0.0.1", "--port", str(port)]
    address = f"http://127.0.0.1:{port}/dashboard/studies/{store.get_study_id_from_name(study)}"
    return [*argv, "--quiet"], address


def register(sub: argparse._SubParsersAction) -> None:
    """The commands of this module, in the order `memloop --help` lists them."""
    register_compare(sub)
    register_export(sub)
    register_transfer(sub)
    register_rerun(sub)
    register_ui(sub)
