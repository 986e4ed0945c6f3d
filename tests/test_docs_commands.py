"""Every command in the bash blocks of README.md and docs/*.md is one the program takes, names
files that exist, and, where it needs no network and no model server of its own, succeeds.

Each command is parsed by memloop's own parser (a stale option or sub-command fails here); a
path into the checkout (memloop/..., examples/...) must exist. The ones that run offline are
run in a folder holding the checkout's memloop/ and examples/, in the order the page gives them,
against the fake endpoint (`--endpoint`, added where the command takes one): `env procedural`,
`env validate` of a file, `eval` (whose files an earlier command made), `power`, `policy check`.
Left parsed only: what starts a model server or runs for minutes (`quickstart`, `evolve`,
`tune`, `env generate`, `env check`, `ui`), what reads the network (`hf://...`), and commands
naming files only the reader has (`my-awi.yaml`, an AMemGym output folder, an evolve run).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from memloop.experiments.cli import build_parser, main
from memloop.testing import FakeOpenAIServer, schema_valid_reply
from memloop.testing.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROGRAM = ("$M", "memloop", ".venv/bin/memloop")
RUN = {("env", "procedural"), ("env", "validate"), ("eval",), ("power",), ("policy", "check")}
TAKES_ENDPOINT = {("eval",), ("policy", "check")}


def commands(page: Path) -> list[list[str]]:
    """The memloop commands of the page's bash blocks, continuation lines joined."""
    text = page.read_text(encoding="utf-8")
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if not line or line.startswith("#"):
                continue
            words = shlex.split(line)
            if words and words[0] in PROGRAM:
                out.append(words[1:])
    return out


ALL = [(page.relative_to(REPO), argv) for page in PAGES for argv in commands(page)]


def test_the_pages_hold_commands():
    pages = {str(page) for page, _ in ALL}
    assert {"README.md", "docs/experiments.md", "docs/memory-system.md"} <= pages
    assert len(ALL) >= 25


def sub_command(argv: list[str]) -> tuple[str, ...]:
    return tuple(argv[:2]) if argv[0] in ("env", "policy", "llm") else (argv[0],)


@pytest.mark.parametrize(("page", "argv"), ALL, ids=[" ".join(a)[:60] for _, a in ALL])
def test_each_command_parses_and_names_files_that_exist(page, argv):
    build_parser().parse_args(argv)  # a stale option or sub-command exits here
    for word in argv:
        if word.startswith(("memloop/", "examples/")):
            assert (REPO / word).exists(), f"{page}: {word} does not exist"


def runnable(argv: list[str], folder: Path) -> bool:
    if sub_command(argv) not in RUN or any(w.startswith("hf://") for w in argv):
        return False
    named = [w for w in argv if re.search(r"\.(json|yaml|txt)$", w) or w.startswith("runs/")]
    outputs = {argv[i + 1] for i, w in enumerate(argv[:-1]) if w == "--out"}
    return all((folder / w).exists() for w in named if w not in outputs)


@pytest.mark.parametrize("page", ["README.md", "docs/memory-system.md"])
def test_the_offline_commands_succeed_in_order_on_the_fake_endpoint(
    page, tmp_path, monkeypatch, capsys
):
    for name in ("memloop", "examples"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    # the pages' commands log to $MLFLOW_TRACKING_URI: this test's own store. mlflow's
    # set_tracking_uri sets the variable for the whole process, so an earlier test on the same
    # worker may have left it naming its store (once: a sqlite file of other tables, refused)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns/mlflow.db")
    ran = []
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        (tmp_path / "fake.yaml").write_text(f"model: fake\nbase_url: {fake.base_url}\n")
        for argv in commands(REPO / page):
            if not runnable(argv, tmp_path):
                continue
            full = argv + (
                ["--endpoint", "fake.yaml"] if sub_command(argv) in TAKES_ENDPOINT else []
            )
            code = main(full)
            assert code == 0, (full, capsys.readouterr())
            ran.append(" ".join(argv[:2]))
    assert ran, "no command ran"
    if page == "README.md":  # the chain the README gives, in its order
        assert ran[:3] == ["env procedural", "env validate", "eval --env"]
        assert sum(r == "eval --env" for r in ran) >= 4 and "power --sd" in ran
