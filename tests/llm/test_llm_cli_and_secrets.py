"""`memloop llm check` exit codes and messages on bad input, and that an API key never lands
in a file the run writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memloop.experiments.cli import main
from memloop.testing.fake_server import FakeOpenAIServer

CANARY = "sk-canary-7f3a9c1e5b2d4f60a8b1"


def write_endpoint(path: Path, **fields) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(fields))
    return path


def test_unreachable_base_url_is_one_line_exit_2(tmp_path, capsys):
    from memloop.testing.servers import free_port

    port = free_port()  # closed again: nothing listens there
    ep = write_endpoint(
        tmp_path / "ep.yaml", model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1
    )
    code = main(["llm", "check", "--endpoint", str(ep), "--cache", str(tmp_path / "c.sqlite")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and f"127.0.0.1:{port}" in err[0] and "base_url" in err[0]


def test_missing_key_variable_names_it_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MEMLOOP_TEST_UNSET_KEY", raising=False)
    ep = write_endpoint(
        tmp_path / "ep.yaml",
        model="m",
        base_url="http://127.0.0.1:9/v1",
        api_key_env="MEMLOOP_TEST_UNSET_KEY",
    )
    code = main(["llm", "check", "--endpoint", str(ep), "--cache", str(tmp_path / "c.sqlite")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "MEMLOOP_TEST_UNSET_KEY" in err[0]


@pytest.mark.parametrize(
    "content,needle",
    [
        ("model: m\nbase_ur1: http://x/v1\n", "unknown key 'base_ur1'"),
        ("model: m\nmax_concurrency: lots\n", "key 'max_concurrency'"),
        ("- a\n- b\n", "mapping"),
        ("model: [unclosed\n", "not valid YAML"),
        ("model: m\napi_key_env: sk-live-abc.def\n", "NAME of an environment variable"),
    ],
)
def test_bad_endpoint_file_is_one_line_exit_2(tmp_path, capsys, content, needle):
    ep = tmp_path / "ep.yaml"
    ep.write_text(content)
    assert main(["llm", "check", "--endpoint", str(ep)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and str(ep) in err[0]
    assert "sk-live" not in err[0]


def test_check_against_fake_endpoint_passes(tmp_path, capsys):
    with FakeOpenAIServer(
        reply='{"city": "Paris", "population_millions": 2.1, "is_capital": true}'
    ) as fake:
        ep = write_endpoint(tmp_path / "ep.yaml", model="m", base_url=fake.base_url)
        code = main(["llm", "check", "--endpoint", str(ep), "--cache", str(tmp_path / "c.sqlite")])
    out = capsys.readouterr().out
    assert code == 0
    assert "served_from=endpoint  new_requests=1" in out
    assert "served_from=cache  new_requests=0" in out
    assert len(fake.requests) == 1


def test_canary_key_is_used_but_never_written(tmp_path):
    """Run the CLI in a subprocess with a canary key; it must reach the server and appear in no
    file the run wrote (cache, logs, outputs) nor in its printed output."""
    work = tmp_path / "work"
    work.mkdir()
    with FakeOpenAIServer(
        reply='{"city": "Paris", "population_millions": 2.1, "is_capital": true}'
    ) as fake:
        ep = write_endpoint(
            work / "ep.yaml", model="m", base_url=fake.base_url, api_key_env="MEMLOOP_CANARY_KEY"
        )
        env = dict(os.environ, MEMLOOP_CANARY_KEY=CANARY, MEMLOOP_CACHE_DIR=str(work / "cache"))
        proc = subprocess.run(
            [sys.executable, "-m", "memloop", "llm", "check", "--endpoint", str(ep)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert fake.auth_headers == [f"Bearer {CANARY}"]
    assert CANARY not in proc.stdout + proc.stderr
    written = [p for p in work.rglob("*") if p.is_file()]
    assert any(p.name == "responses.sqlite" for p in written)
    for path in written:
        assert CANARY.encode() not in path.read_bytes(), path


def test_impossible_date_in_yaml_is_one_line(tmp_path, capsys):
    ep = tmp_path / "ep.yaml"
    ep.write_text("model: m\nwhen: 2020-13-01\n")
    assert main(["llm", "check", "--endpoint", str(ep)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(ep) in err[0] and "unknown key 'when'" in err[0]


def test_the_plain_path_is_for_plain_http_without_a_proxy(monkeypatch):
    from memloop.llm.plain_http import usable

    for key in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(key, raising=False)
    assert usable("http://127.0.0.1:8000/v1")
    assert not usable("https://api.openai.com/v1")  # TLS, certificates: the SDK
    monkeypatch.setenv("http_proxy", "http://proxy:3128")
    assert not usable("http://10.0.0.5:8000/v1")  # a proxy the SDK would honour
    monkeypatch.setenv("no_proxy", "10.0.0.5")
    assert usable("http://10.0.0.5:8000/v1")
