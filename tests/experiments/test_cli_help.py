"""Every help screen shows each option's default (once, and no `None` or `False` noise) and ends
with one example that the command line accepts as written."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from memloop.experiments.cli import Parser, build_parser
from memloop.testing.commands import all_parsers

Path_ = tuple[str, ...]


PARSERS = list(all_parsers(build_parser()))
IDS = [" ".join(path) for path, _ in PARSERS]


def help_text(parser: argparse.ArgumentParser, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "100")
    return parser.format_help()


def option_help(text: str) -> dict[str, str]:
    """{option: its help text, lines joined} of a help screen's options section."""
    section = text.split("options:\n", 1)[1].split("\n\n", 1)[0]
    found: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        m = re.match(r"  (-[-\w]+)", line)
        if m:
            current = m.group(1)
            found[current] = line
        elif current:
            found[current] += " " + line.strip()
    return {k: " ".join(v.split()) for k, v in found.items()}


def test_every_parser_is_made_by_the_one_helper():
    assert all(isinstance(p, Parser) for _, p in PARSERS)
    assert len(PARSERS) >= 20


@pytest.mark.parametrize("path,parser", PARSERS, ids=IDS)
def test_help_ends_with_one_example_the_parser_accepts(path, parser, monkeypatch):
    text = help_text(parser, monkeypatch)
    assert text.count("example:") == 1
    example = text.rsplit("example:\n", 1)[1].strip()
    assert "\n" not in example
    words = shlex.split(example)
    while "=" in words[0]:  # an environment setting before the command
        words.pop(0)
    assert words[0] == "memloop"
    # the example runs this command (a group's: one of its sub-commands)
    assert words[: len(path)] == list(path) or path == ("memloop",)
    args = build_parser().parse_args(words[1:])  # SystemExit (exit 2) if it does not parse
    assert callable(getattr(args, "func", None))


@pytest.mark.parametrize("path,parser", PARSERS, ids=IDS)
def test_help_shows_each_default_once_and_no_noise(path, parser, monkeypatch):
    text = help_text(parser, monkeypatch)
    assert "(default: None)" not in text and "(default: False)" not in text
    helps = option_help(text)
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        shown = helps[action.option_strings[0]]
        assert shown.count("(default") <= 1, shown
        if action.default not in (None, False, argparse.SUPPRESS):
            assert "(default: " in shown, shown


def test_defaults_are_shown_where_they_were_written_by_hand_before(monkeypatch):
    screens = {" ".join(path[1:]): help_text(p, monkeypatch) for path, p in PARSERS}
    procedural = option_help(screens["env procedural"])
    assert procedural["--users"].endswith("number of users (default: 3)")
    assert procedural["--start-date"].endswith("YYYY-MM-DD (default: 2020-10-01)")
    assert option_help(screens["eval"])["--rounds-init"].endswith("(default: 1)")
    assert option_help(screens["power"])["--alpha"].endswith("(default: 0.05)")
    assert option_help(screens["quickstart"])["--out"].endswith("(default: runs/quickstart)")
    assert option_help(screens["compare"])["--format"].endswith("(default: table)")
    # a default that is no value is still said in words, once
    assert option_help(screens["eval"])["--endpoint"].endswith("(default: the embedded model)")
