"""Faults that must not give a wrong result: junk answers never cached nor passed off as a run,
and token counts that describe the work, not the cache."""

from __future__ import annotations

import json
from pathlib import Path

import memloop
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import FakeOpenAIServer, request_schema, schema_valid_reply

NATIVE = Path(memloop.__file__).parent / "experiments" / "policies" / "native.yaml"


valid = schema_valid_reply


def prose(body):
    return "Sure! I think the second option sounds best for you."


def eval_args(tmp_path: Path, server: FakeOpenAIServer, out: str) -> list[str]:
    env = tmp_path / "env.json"
    if not env.exists():
        save_items(generate_procedural(users=2, periods=1, questions=2, seed=4), env)
    endpoint = tmp_path / f"fake-{server.base_url.rsplit(':', 1)[1].split('/')[0]}.yaml"
    endpoint.write_text(f"model: fake\nbase_url: {server.base_url}\n")
    return [
        "eval",
        "--env",
        str(env),
        "--policy",
        str(NATIVE),
        "--endpoint",
        str(endpoint),
        "--cache",
        str(tmp_path / "cache.sqlite"),
        "--out",
        str(tmp_path / out),
    ]


def test_an_endpoint_answering_prose_fails_loudly_and_leaves_nothing_cached(tmp_path, capsys):
    with FakeOpenAIServer(reply=prose) as server:
        assert main(eval_args(tmp_path, server, "junk")) == 2
        err = capsys.readouterr().err
        assert "error: every answer failed: 8 of 8 answers (100%) were not valid JSON" in err
        metrics = json.loads((tmp_path / "junk" / "metrics.json").read_text())
        assert metrics["json_errors"] == metrics["questions"] == 8
        # unparsed answers are format failures, never memory failures
        assert metrics["diagnosis"]["format"] == 1.0
        assert metrics["diagnosis"]["write"] == metrics["diagnosis"]["read"] == 0.0
    # the endpoint is fixed: a fresh eval on the same cache asks again, and no junk comes back
    # from the cache (a cached junk answer would be a json error here)
    with FakeOpenAIServer(reply=valid) as fixed:
        assert main(eval_args(tmp_path, fixed, "fixed")) == 0
        assert any(request_schema(b) for b in fixed.requests)
    metrics = json.loads((tmp_path / "fixed" / "metrics.json").read_text())
    assert metrics["json_errors"] == 0 and metrics["questions"] == 8


def test_a_mostly_junk_run_warns_but_a_clean_one_does_not(tmp_path, capsys):
    calls = {"n": 0}

    def every_other_answer_junk(body):
        schema = request_schema(body)
        if schema and "answer" in schema["properties"]:
            calls["n"] += 1
            if calls["n"] % 2:
                return "The first one."
        return valid(body)

    with FakeOpenAIServer(reply=every_other_answer_junk) as server:
        assert main(eval_args(tmp_path, server, "half")) == 0
    err = capsys.readouterr().err
    metrics = json.loads((tmp_path / "half" / "metrics.json").read_text())
    junk, asked = metrics["json_errors"], metrics["questions"]
    assert 0 < junk < asked
    assert f"WARNING: {junk} of {asked} answers ({junk / asked:.0%}) were not valid JSON" in err
    with FakeOpenAIServer(reply=valid) as server:
        assert main(eval_args(tmp_path, server, "clean")) == 0
    assert "WARNING" not in capsys.readouterr().err


def test_a_rerun_served_from_the_cache_reports_the_same_tokens(tmp_path, capsys):
    with FakeOpenAIServer(reply=valid) as server:
        assert main(eval_args(tmp_path, server, "first")) == 0
        sent = len(server.requests)
        assert main(eval_args(tmp_path, server, "second")) == 0  # a fresh --out, same cache
        assert len(server.requests) == sent  # every answer came from the cache
    first = json.loads((tmp_path / "first" / "metrics.json").read_text())
    second = json.loads((tmp_path / "second" / "metrics.json").read_text())
    assert second["usage"] == first["usage"] and sum(first["usage"].values()) > 0
    # the first run sent most of its work (identical probes of two users share one answer)
    assert sum(first["usage_cached"].values()) < sum(first["usage"].values()) / 2
    assert second["usage_cached"] == second["usage"]  # all of the work served from the cache
    out = capsys.readouterr().out
    total = sum(second["usage"].values())
    assert f"({total} of {total} served from the response cache)" in out
