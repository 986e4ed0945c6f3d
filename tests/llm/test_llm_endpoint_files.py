"""Every shipped endpoint file validates, and none holds a key (docs/architecture.md's
contracts table: the Endpoint contract is run over every shipped endpoint file)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import memloop
from memloop.llm.endpoint import Endpoint

ENDPOINTS = sorted((Path(memloop.__file__).parent / "experiments" / "endpoints").glob("*.yaml"))


def test_the_shipped_endpoint_files_are_found():
    assert {p.stem for p in ENDPOINTS} >= {"local", "local-0.5b", "openai", "ollama", "vllm"}


@pytest.mark.parametrize("path", ENDPOINTS, ids=lambda p: p.stem)
def test_a_shipped_endpoint_file_validates_and_names_its_key_by_variable(path):
    endpoint = Endpoint.from_yaml(path)
    assert endpoint.model
    if endpoint.api_key_env is not None:
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", endpoint.api_key_env)
    text = path.read_text()
    assert not re.search(r"sk-[A-Za-z0-9]{8,}|api_key\s*:", text)  # a key is never in the file
