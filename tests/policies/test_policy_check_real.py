"""`memloop policy check` of the README's plug-in example on the default embedded model (1.5B).

The command as the README gives it (examples/keyword_memory/policy.yaml, no endpoint: the embedded
Qwen2.5-Coder-1.5B), on an empty response cache and then on the warm one: both meet the Policy
contract, "the same conversation and probes give the same answers" included (the 1.5B's JSON
probe answers once ran into repetition loops cut at max_tokens that were asked again, and
answered differently, on every repeat), and the warm run asks the model nothing.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from memloop.experiments.cli import main
from memloop.testing.paths import REPO

pytestmark = pytest.mark.real_model

EXAMPLE = REPO / "examples" / "keyword_memory" / "policy.yaml"


def cached_answers(cache: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(cache) as conn:
        return conn.execute("SELECT key, value FROM responses ORDER BY key").fetchall()


def test_the_readme_plugin_example_meets_the_contract_on_the_default_model(tmp_path, capsys):
    cache = tmp_path / "responses.sqlite"
    argv = ["policy", "check", str(EXAMPLE), "--cache", str(cache)]
    assert main(argv) == 0
    cold = capsys.readouterr().out
    assert "model local-1.5b" in cold.splitlines()[0]
    assert "  ok  the same conversation and probes give the same answers" in cold
    assert "FAIL" not in cold
    assert "keyword-memory: meets the Policy contract" in cold
    made = cached_answers(cache)
    # 3 replies, 2 probes x (free text, JSON): every repeat was served from the cache
    assert len(made) == 7

    assert main(argv) == 0  # warm: the same report, the same cache, nothing asked
    assert capsys.readouterr().out == cold
    assert cached_answers(cache) == made
