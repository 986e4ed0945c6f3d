"""Options several commands share, each defined once, and the one check of a count.

`--format`, `--cache`, `--no-progress`, `--cycles`, `--objective`, `--tracking-uri`, the endpoint
options (`--endpoint FILE`, or `--model NAME [--base-url URL] [--api-key-env VAR]` without a file),
and `at_least_one` for options that count something.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from memloop.core.credentials import DEFAULT_KEY_ENV, OPENAI_HOST
from memloop.core.errors import UserError
from memloop.core.settings import DEFAULT_TRACKING_URI
from memloop.core.tables import FORMATS


def add_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="how result tables are printed: aligned text (fits 100 columns), CSV (the tables "
        "only, other lines go to stderr) or Markdown",
    )


class CommandGroup(NamedTuple):
    """A command made of subcommands (`memloop NAME SUBCOMMAND`): its name and its help texts."""

    name: str
    help: str
    description: str
    example: str


def add_group(sub: argparse._SubParsersAction, group: CommandGroup) -> argparse._SubParsersAction:
    """The command `group` describes, added to `sub`; its subcommands' subparsers."""
    parser = sub.add_parser(
        group.name, help=group.help, description=group.description, example=group.example
    )
    return parser.add_subparsers(dest=f"{group.name}_command", metavar="SUBCOMMAND", required=True)


def add_cache_option(
    parser: argparse.ArgumentParser,
    help: str = "response cache file (default: the user cache folder)",
) -> None:
    """`--cache PATH`: the response cache (read as `args.cache or "default"`)."""
    parser.add_argument("--cache", metavar="PATH", help=help)


def add_objective_option(parser: argparse.ArgumentParser, what: str) -> None:
    """`--objective NAME`: the measure `what` (overrides the YAML's `objective:`)."""
    from memloop.feedback.objective import Objective

    parser.add_argument(
        "--objective",
        choices=[o.value for o in Objective],
        help=f"{what} (default: the YAML's objective, else state_prob when the agent's endpoint "
        "returns log-probabilities, state_accuracy on the embedded model, memory_score otherwise)",
    )


def add_progress_option(parser: argparse.ArgumentParser, help: str = "no progress bars") -> None:
    parser.add_argument("--no-progress", action="store_true", help=help)


def add_cycles_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cycles", type=int, help="override the number of cycles")


def add_tracking_uri_option(
    parser: argparse.ArgumentParser,
    help: str,
    default: str | None = DEFAULT_TRACKING_URI,
    metavar: str | None = None,
) -> None:
    """`--tracking-uri` (default: memloop's own store; None: the command decides)."""
    parser.add_argument("--tracking-uri", metavar=metavar, default=default, help=help)


def at_least_one(args: argparse.Namespace, *names: str) -> None:
    """Refuse, in one line, an option among `names` (attribute names) given below 1."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")


def add_endpoint_options(parser: argparse.ArgumentParser, endpoint_help: str) -> None:
    """`--endpoint FILE` (help: `endpoint_help`) and the options that replace the file."""
    parser.add_argument("--endpoint", metavar="FILE", help=endpoint_help)
    parser.add_argument(
        "--model",
        metavar="NAME",
        help="try a model without an endpoint file: the same as an endpoint YAML holding "
        "`model: NAME` and `base_url: URL` (without --base-url, the embedded model: local-1.5b "
        "or local-0.5b); not with --endpoint",
    )
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="the OpenAI-compatible server of --model, e.g. https://api.openai.com/v1 or "
        "http://127.0.0.1:8000/v1; never with a key in it (user:KEY@ or ?api_key=: refused), "
        "the key goes in the variable --api-key-env names",
    )
    parser.add_argument(
        "--api-key-env",
        metavar="VAR",
        help=f"the environment variable holding --model's API key (default: {DEFAULT_KEY_ENV} "
        f"when it is set and --base-url is {OPENAI_HOST}'s, else no key); the key itself is "
        "never printed or stored",
    )
    parser.add_argument(
        "--logprobs",
        action="store_true",
        help="--model's server returns log-probabilities (an endpoint file's `logprobs: true`): "
        "the state reads then use the letter read (state_prob); the embedded model always does",
    )


def endpoint_ref(args: argparse.Namespace) -> Any:
    """What `add_endpoint_options` asked for: --endpoint's file, --model's Endpoint, or None.

    --model's Endpoint is the one the endpoint YAML with those fields gives; None is the
    command's default. One-line errors for --model with --endpoint, and for --base-url or
    --api-key-env without --model.
    """
    model, base_url, key_env = args.model, args.base_url, args.api_key_env
    logprobs = getattr(args, "logprobs", False)
    if model is None:
        flags = (("--base-url", base_url), ("--api-key-env", key_env))
        for flag, value in (*flags, ("--logprobs", logprobs or None)):
            if value is not None:
                raise UserError(f"{flag} goes with --model: give --model NAME too")
        return args.endpoint
    if args.endpoint:
        raise UserError(
            "--model and --endpoint: give one (--endpoint FILE names the model in a file; "
            "--model NAME [--base-url URL] is the same endpoint without one)"
        )
    return model_endpoint(model, base_url, key_env, logprobs=logprobs)


def model_endpoint(
    model: str, base_url: str | None, key_env: str | None, *, logprobs: bool = False
) -> Any:
    """The Endpoint of `--model/--base-url/--api-key-env`.

    An endpoint YAML's fields, validated as one (llm.endpoint.Endpoint.from_mapping), so the
    run's identity is that file's.
    """
    from memloop.llm.endpoint import LOCAL, Endpoint
    from memloop.llm.model_files import MODEL_ALIASES

    if base_url in (None, LOCAL) and model not in MODEL_ALIASES:
        known = ", ".join(sorted(MODEL_ALIASES))
        raise UserError(
            f"--model {model}: not a model of the embedded server ({known}); give --base-url URL "
            "for a model served elsewhere (e.g. https://api.openai.com/v1)"
        )
    fields: dict[str, Any] = {"model": model}
    if base_url is not None and base_url != LOCAL:
        fields["base_url"] = base_url
        # the default key goes to OpenAI's own host only; elsewhere a key is sent only when
        # --api-key-env names one (a stand-in server must not receive the user's OpenAI key)
        host = (urlsplit(base_url).hostname or "").lower()
        if key_env is None and host == OPENAI_HOST and os.environ.get(DEFAULT_KEY_ENV):
            key_env = DEFAULT_KEY_ENV
    if key_env is not None:
        fields["api_key_env"] = key_env
    if logprobs:
        fields["logprobs"] = True
    return Endpoint.from_mapping(fields, "--model/--base-url/--api-key-env")
