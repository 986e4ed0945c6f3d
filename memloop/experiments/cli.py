"""The `memloop` command line: one sub-command group per module in experiments/commands."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

from memloop.core.errors import INTERRUPTED_EXIT, UserError, exit_on_user_error
from memloop.core.settings import apply_offline_defaults, quiet_third_party_warnings


class _Version(argparse.Action):
    """`--version`: the package version and the checkout's commit.

    The commit is looked up only when asked: a `git` call at every command's start is wasted.
    """

    def __call__(self, parser, namespace, values, option_string=None):
        from memloop import __version__
        from memloop.runs.spec import git_revision

        commit = git_revision()
        print(f"memloop {__version__}" + (f" (commit {commit[:12]})" if commit else ""))
        parser.exit()


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help screens: each option's default, text written in lines kept as written.

    No "(default: None)" for an option without a default, nor "(default: False)" for a flag, and
    none where the help names its default itself. A description or epilog holding line breaks
    (an example, a written-out explanation) keeps them; a one-line text is wrapped.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            action.default in (None, False, argparse.SUPPRESS)
            or "%(default)" in text
            or "(default" in text
            or not (action.option_strings or action.nargs in (argparse.OPTIONAL, "*"))
        ):
            return action.help
        return text + " (default: %(default)s)"

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text.strip("\n"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """Every parser of the command line: help screens with defaults, ending with an example.

    Sub-commands too: argparse makes each one with its parent's class. `example` is one command
    line that works as written, shown as "example:" after the epilog (`HelpFormatter`).
    """

    def __init__(self, *args: Any, example: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        if example is not None:
            epilog = (kwargs.get("epilog") or "").rstrip("\n")
            kwargs["epilog"] = (epilog + "\n\n" if epilog else "") + f"example:\n  {example}\n"
        super().__init__(*args, **kwargs)
        self.example = example


def build_parser() -> argparse.ArgumentParser:
    from memloop.experiments.commands import (
        env_cmd,
        eval_cmd,
        import_cmd,
        llm_cmd,
        optimize_cmd,
        policy_cmd,
        power_cmd,
        quickstart_cmd,
        results_cmd,
    )

    parser = Parser(
        prog="memloop",
        description="Evaluate and self-evolve the memory policies of LLM assistants.",
        example="memloop quickstart",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    sub = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    modules = (
        quickstart_cmd,
        llm_cmd,
        env_cmd,
        policy_cmd,
        eval_cmd,
        optimize_cmd,
        results_cmd,
        power_cmd,
        import_cmd,
    )
    for module in modules:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C is handled from the first line: a command spends its first second importing (the
    # parser's modules, the chat client's SDK), and Ctrl-C then is exit 130 too, not a traceback
    with stop_requests_on_ctrl_c():
        return exit_on_user_error(lambda: _run(argv))


def _run(argv: list[str] | None) -> int | None:
    apply_offline_defaults()
    quiet_third_party_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    from memloop.llm import embedded_server, request_log

    if logging_problem := request_log.problem():
        raise UserError(logging_problem)

    # the line saying the embedded model is starting is progress too
    embedded_server.START_NOTICE = not getattr(args, "no_progress", False)
    from memloop.runs import manifest

    manifest.set_command(list(sys.argv[1:] if argv is None else argv))  # each run's manifest
    try:
        return args.func(args)
    finally:
        manifest.set_command(None)


def entry() -> NoReturn:
    """The `memloop` program (and `python -m memloop`): `main`, then exit with its code.

    After Ctrl-C the process ends at once, without the interpreter's teardown: everything
    finished is already on disk (atomic writes, the MLflow run marked KILLED), and unloading
    MLflow's and the other libraries' modules, and waiting for worker threads still inside a
    model request, took 1.5 to 2.7 s.
    """
    from memloop.core.settings import program_gc

    program_gc()
    code = main()
    if code == INTERRUPTED_EXIT:
        _exit_now(code)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        # the work is done: a Ctrl-C during the interpreter's teardown ends it at once with 130,
        # without a KeyboardInterrupt traceback from inside some library's exit handler
        signal.signal(signal.SIGINT, lambda signum, frame: _exit_now(INTERRUPTED_EXIT))
    sys.exit(code)


def _exit_now(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@contextlib.contextmanager
def stop_requests_on_ctrl_c() -> Iterator[None]:
    """Ctrl-C also stops every model request in flight (core.interrupt).

    The command then ends within a second instead of after its requests' timeouts; finished work
    stays checkpointed. Only where Ctrl-C has Python's default handler (a background job that
    ignores SIGINT keeps ignoring it) and on the main thread.
    """
    from memloop.core import interrupt

    interrupt.clear()
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return

    def on_ctrl_c(signum: int, frame: Any) -> None:
        interrupt.interrupt()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


if __name__ == "__main__":
    entry()
