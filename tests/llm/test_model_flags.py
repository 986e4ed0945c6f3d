"""`--model NAME [--base-url URL] [--api-key-env VAR]`: trying a model needs no endpoint file.

The endpoint they make is the one an endpoint YAML with those fields gives: the same run
identity (spec, key, MLflow params), the same requests; and the options combine in one way only.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memloop
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.runs.spec import RunSpec
from memloop.testing import FakeOpenAIServer, schema_valid_reply

NATIVE = Path(memloop.__file__).parent / "experiments" / "policies" / "native.yaml"
CANARY = "sk-memloop-model-flag-canary-0123456789"


@pytest.fixture(autouse=True)
def no_key_in_the_environment(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


@pytest.fixture(scope="module")
def fake():
    with FakeOpenAIServer(reply=schema_valid_reply) as server:
        yield server


@pytest.fixture
def env_file(tmp_path) -> Path:
    path = tmp_path / "env.json"
    save_items(generate_procedural(users=2, periods=1, questions=1, seed=0), path)
    return path


def eval_argv(env: Path, out: Path, cache: Path, *endpoint: str) -> list[str]:
    return [
        "eval",
        "--env",
        str(env),
        "--policy",
        str(NATIVE),
        "--out",
        str(out),
        "--cache",
        str(cache),
        "--no-progress",
        *endpoint,
    ]


def spec_of(out: Path) -> RunSpec:
    spec = RunSpec.from_document(json.loads((out / "spec.json").read_text()))
    assert spec is not None
    return spec


def test_eval_with_model_and_base_url_runs_and_records_that_model(tmp_path, env_file, fake, capsys):
    before = len(fake.requests)
    flags = ("--model", "fake-model", "--base-url", fake.base_url)
    assert main(eval_argv(env_file, tmp_path / "flags", tmp_path / "c.sqlite", *flags)) == 0
    assert "wrote" in capsys.readouterr().out
    sent = fake.requests[before:]
    assert sent and {body["model"] for body in sent} == {"fake-model"}
    spec = spec_of(tmp_path / "flags")
    for role in ("agent", "user_sim", "checker", "optimizer"):  # every role: the agent's
        assert spec.endpoints[role]["model"] == "fake-model"
        assert spec.endpoints[role]["base_url"] == fake.base_url

    # the equivalent endpoint file: the same run (spec, key, MLflow params), on a fresh cache
    yaml_file = tmp_path / "endpoint.yaml"
    yaml_file.write_text(f"model: fake-model\nbase_url: {fake.base_url}\n")
    out = tmp_path / "file"
    assert main(eval_argv(env_file, out, tmp_path / "c2.sqlite", "--endpoint", str(yaml_file))) == 0
    assert spec_of(out) == spec
    assert spec_of(out).key() == spec.key() and spec_of(out).params() == spec.params()
    # so the folder made with --model is resumed by the file, with no model call
    before = len(fake.requests)
    argv = eval_argv(env_file, tmp_path / "flags", tmp_path / "c.sqlite")
    assert main([*argv, "--endpoint", str(yaml_file)]) == 0
    assert len(fake.requests) == before


def test_the_key_is_read_from_the_named_variable_and_never_written(
    tmp_path, env_file, fake, monkeypatch, capsys
):
    monkeypatch.setenv("MEMLOOP_FLAG_KEY", CANARY)
    before = len(fake.auth_headers)
    argv = eval_argv(env_file, tmp_path / "out", tmp_path / "c.sqlite")
    flags = ["--model", "fake-model", "--base-url", fake.base_url]
    assert main([*argv, *flags, "--api-key-env", "MEMLOOP_FLAG_KEY"]) == 0
    assert set(fake.auth_headers[before:]) == {f"Bearer {CANARY}"}
    captured = capsys.readouterr()
    assert CANARY not in captured.out + captured.err
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):
        assert CANARY.encode() not in path.read_bytes(), path
    # OPENAI_API_KEY goes to OpenAI's own host only: another host gets no key unless
    # --api-key-env names one (issue 57: 29 of 29 requests to a stand-in carried it)
    monkeypatch.setenv("OPENAI_API_KEY", CANARY)
    before = len(fake.auth_headers)
    assert main(["llm", "check", "--model", "fake-model", "--base-url", fake.base_url]) in (0, 1)
    sent = fake.auth_headers[before:]
    assert sent and not any(CANARY in h for h in sent)
    assert CANARY not in capsys.readouterr().out


def test_the_default_key_variable_is_named_for_openais_host_only(monkeypatch):
    import argparse

    from memloop.experiments.commands.options import endpoint_ref

    monkeypatch.setenv("OPENAI_API_KEY", CANARY)

    def ref(url: str, key_env: str | None = None):
        args = argparse.Namespace(endpoint=None, model="gpt-x", base_url=url, api_key_env=key_env)
        return endpoint_ref(args)

    assert ref("https://api.openai.com/v1").api_key_env == "OPENAI_API_KEY"
    assert ref("https://API.OpenAI.com/v1").api_key_env == "OPENAI_API_KEY"
    for elsewhere in ("http://127.0.0.1:9/v1", "https://api.openai.com.evil.example/v1"):
        assert ref(elsewhere).api_key_env is None, elsewhere
    assert ref("http://127.0.0.1:9/v1", "MY_KEY").api_key_env == "MY_KEY"


def test_a_variable_named_but_unset_is_one_line(tmp_path, fake, capsys, monkeypatch):
    monkeypatch.delenv("MEMLOOP_FLAG_UNSET", raising=False)
    argv = ["llm", "check", "--model", "m", "--base-url", fake.base_url]
    assert main([*argv, "--api-key-env", "MEMLOOP_FLAG_UNSET"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "MEMLOOP_FLAG_UNSET" in err[0]


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--model", "m", "--endpoint", "ep.yaml"], "--model and --endpoint: give one"),
        (["--base-url", "http://127.0.0.1:9/v1"], "--base-url goes with --model"),
        (["--api-key-env", "MY_KEY"], "--api-key-env goes with --model"),
        (["--model", "gpt-4o-mini"], "not a model of the embedded server"),
        (["--model", "m", "--base-url", "127.0.0.1:9/v1"], "key 'base_url': '127.0.0.1:9/v1'"),
        (["--model", "m", "--base-url", "http://x/v1", "--api-key-env", "sk-abc.def"], "NAME"),
    ],
)
def test_options_that_do_not_go_together_are_one_line(tmp_path, env_file, capsys, flags, needle):
    argv = eval_argv(env_file, tmp_path / "out", tmp_path / "c.sqlite", *flags)
    for command in (argv, ["llm", "check", *flags], ["policy", "check", str(NATIVE), *flags]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("memloop: error: ") and needle in err[0]
        assert "sk-abc" not in err[0]
    assert not (tmp_path / "out").exists()


def test_every_command_with_endpoint_takes_model(fake):
    """`--model` and `--base-url` wherever `--endpoint` is (the one helper adds them)."""
    from memloop.experiments.cli import build_parser
    from memloop.experiments.commands.options import endpoint_ref
    from memloop.llm.endpoint import Endpoint
    from memloop.testing.commands import all_parsers

    with_endpoint = [
        (path, p)
        for path, p in all_parsers(build_parser())
        if any("--endpoint" in a.option_strings for a in p._actions)
    ]
    assert {" ".join(path[1:]) for path, _ in with_endpoint} == {
        "quickstart",
        "evolve",
        "tune",
        "llm check",
        "env generate",
        "env check",
        "policy check",
        "eval",
    }
    for _, parser in with_endpoint:
        options = {o for a in parser._actions for o in a.option_strings}
        assert {"--model", "--base-url", "--api-key-env"} <= options
    args = build_parser().parse_args(["llm", "check", "--model", "m", "--base-url", fake.base_url])
    made = endpoint_ref(args)
    assert made == Endpoint.from_mapping({"model": "m", "base_url": fake.base_url}, "file")
    args = build_parser().parse_args(["llm", "check", "--model", "local-0.5b"])
    assert endpoint_ref(args) == Endpoint(model="local-0.5b")  # base_url: local


def test_evolve_and_tune_put_every_role_on_the_model_given(tmp_path, capsys):
    """Trying another model on evolve or tune needs no copied YAML (issue 44)."""
    from memloop.testing import evolve_loop_reply
    from memloop.testing.commands import write_small_evolve, write_small_tune

    with FakeOpenAIServer(reply=evolve_loop_reply) as server:
        flags = ["--model", "fake-model", "--base-url", server.base_url, "--no-progress"]
        path = write_small_evolve(tmp_path / "ev", "flags", (1, 1, 1), periods=1, questions=1)
        assert main(["evolve", str(path), *flags]) == 0
        sent = len(server.requests)
        assert sent and {body["model"] for body in server.requests} == {"fake-model"}
        (run_dir,) = (tmp_path / "ev" / "runs").iterdir()
        spec = spec_of(run_dir)
        for role in ("agent", "user_sim", "checker", "optimizer"):
            assert spec.endpoints[role]["model"] == "fake-model"
        # the same endpoint as a file: the same run, resumed, no model call
        endpoint = tmp_path / "endpoint.yaml"
        endpoint.write_text(f"model: fake-model\nbase_url: {server.base_url}\n")
        assert main(["evolve", str(path), "--endpoint", str(endpoint), "--no-progress"]) == 0
        assert len(server.requests) == sent
        assert [p.name for p in (tmp_path / "ev" / "runs").iterdir()] == [run_dir.name]

        tune = write_small_tune(
            tmp_path / "tu",
            "flags",
            tracking_uri=f"sqlite:///{tmp_path}/tune-mlruns/mlflow.db",
            out_dir=str(tmp_path / "tune"),
        )
        before = len(server.requests)
        assert main(["tune", str(tune), *flags]) == 0
        assert {body["model"] for body in server.requests[before:]} == {"fake-model"}
    assert "1 finished trials" in capsys.readouterr().out
    # the study sits beside the MLflow store tracking_uri names
    assert (tmp_path / "tune-mlruns" / "optuna.db").is_file()
