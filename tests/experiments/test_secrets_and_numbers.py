"""Issue 45: no key leaves memloop, extra_body cannot replace memloop's own request fields,
endpoint numbers are finite real numbers within bounds, and a run refused before it starts
writes nothing.

Fast: validation happens before any model is asked; the runs use the fake server.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from memloop.core.errors import UserError
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.llm.endpoint import Endpoint
from memloop.llm.roles import RoleClients
from memloop.testing import FakeOpenAIServer, evolve_loop_reply
from memloop.testing.commands import eval_argv, small_evolve
from memloop.testing.paths import REPO

CANARY = "sk-canary-45-d41d8cd98f00b204e980"
KEY_ENV = "MEMLOOP_TEST_45_KEY"
EXPERIMENTS = REPO / "memloop" / "experiments"
NATIVE = EXPERIMENTS / "policies"
ENV_CONFIG = EXPERIMENTS / "env" / "base.yaml"


@pytest.fixture(autouse=True)
def quiet_and_contained(monkeypatch, tmp_path, no_progress_bars):
    """Progress bars off (conftest.py); the response cache and any relative path inside tmp_path."""
    monkeypatch.setenv("MEMLOOP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.chdir(tmp_path)


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def refusal(fields: dict[str, Any]) -> str:
    """The one-line refusal of an endpoint YAML holding `fields` (asserted to be refused)."""
    with pytest.raises(UserError) as err:
        Endpoint.from_mapping({"model": "m", "base_url": "http://127.0.0.1:9/v1", **fields}, "e.y")
    message = str(err.value)
    assert "\n" not in message and message.startswith("e.y: key '")
    return message


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memloop: error: "), captured.err
    assert CANARY not in captured.out + captured.err
    return lines[0]


def files_holding(root: Path, needle: str) -> set[Path]:
    """Every file under `root` whose bytes hold `needle`."""
    return {p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()}


# -- 1. a key in base_url ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "where"),
    [
        (f"http://user:{CANARY}@127.0.0.1:9/v1", "user name or password"),
        (f"https://{CANARY}@api.example.com/v1", "user name or password"),
        (f"{CANARY}@api.example.com/v1", "user name or password"),  # no scheme either
        (f"https://api.example.com/v1?api_key={CANARY}", "query parameter 'api_key'"),
        (f"https://api.example.com/v1?x=1&access_token={CANARY}", "query parameter 'access_token'"),
    ],
)
def test_a_key_in_base_url_is_refused_without_echoing_it(url, where):
    message = refusal({"base_url": url})
    assert message.startswith("e.y: key 'base_url': ") and where in message
    assert "environment variable named by api_key_env" in message
    assert CANARY not in message and "api.example.com" not in message


@pytest.mark.parametrize(
    ("url", "where"),
    [
        (f"https://api.example.com/v1#{CANARY}", "has a fragment"),
        (f"https://api.example.com/v1#key={CANARY}", "has a fragment"),
        (f"https://api.example.com/v1?q={CANARY}", "query parameter 'q'"),  # by its shape
    ],
)
def test_a_fragment_or_a_secret_shaped_query_value_in_base_url_is_refused(url, where):
    message = refusal({"base_url": url})
    assert message.startswith("e.y: key 'base_url': ") and where in message
    assert CANARY not in message and "api.example.com" not in message


def test_a_key_in_base_url_on_the_command_line_is_one_line_exit_2(capsys):
    url = f"http://user:{CANARY}@127.0.0.1:9/v1"
    assert main(["llm", "check", "--model", "m", "--base-url", url]) == 2
    line = one_error_line(capsys)
    assert "key 'base_url'" in line and "api_key_env" in line


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000/v1", "https://x.openai.azure.com/openai?api-version=2024-02-01"],
)
def test_a_base_url_without_credentials_is_kept(url):
    assert Endpoint(model="m", base_url=url).base_url == url


# -- 2. a key in extra_body -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra_body", "path"),
    [
        ({"api_key": CANARY}, "extra_body.api_key"),
        ({"x-api-key": CANARY}, "extra_body.x-api-key"),
        ({"access_token": CANARY}, "extra_body.access_token"),
        ({"Authorization": f"Bearer {CANARY}"}, "extra_body.Authorization"),
        ({"apiKey": CANARY}, "extra_body.apiKey"),
        ({"client_secret": CANARY}, "extra_body.client_secret"),
        ({"PASSWORD": CANARY}, "extra_body.PASSWORD"),
        ({"metadata": {"token": CANARY}}, "extra_body.metadata.token"),
        ({"a": {"b": [{"ok": 1}, {"password": CANARY}]}}, "extra_body.a.b[1].password"),
        ({"metadata": {"api_key": {"value": CANARY}}}, "extra_body.metadata.api_key"),
        # issue 57: names the audit found stored, and credentials by their shape under any name
        ({"api_keys": [CANARY]}, "extra_body.api_keys"),
        ({"tokens": [CANARY]}, "extra_body.tokens"),
        ({"jwt": "x"}, "extra_body.jwt"),
        ({"sig": "x"}, "extra_body.sig"),
        ({"session": "x"}, "extra_body.session"),
        ({"pat": "x"}, "extra_body.pat"),
        ({"metadata": {"user": CANARY}}, "extra_body.metadata.user"),
        ({"headers": ["Bearer abcdefgh12345678"]}, "extra_body.headers[0]"),
        ({"note": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJl"}, "extra_body.note"),
        ({"gh": "ghp_" + "a1" * 18}, "extra_body.gh"),
    ],
)
def test_a_secret_looking_key_in_extra_body_is_refused_at_any_depth(extra_body, path):
    message = refusal({"extra_body": extra_body})
    assert message.startswith(f"e.y: key '{path}': ")
    assert "environment variable named by api_key_env" in message
    assert CANARY not in message


def test_provider_options_that_only_mention_tokens_are_kept():
    body = {
        "reasoning_effort": "low",
        "max_completion_tokens": 2048,
        "stop_token_ids": [7],
        "skip_special_tokens": False,
        "prompt_cache_key": "memloop",
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"user": "tester", "model": "nested is not memloop's"},
    }
    endpoint = Endpoint(model="m", base_url="http://127.0.0.1:9/v1", extra_body=body)
    assert endpoint.result_settings()["extra_body"] == body


# -- 3. extra_body cannot replace memloop's own request fields ---------------------------------


@pytest.mark.parametrize(
    ("field", "instead"),
    [
        ("model", "use the endpoint's `model:` field"),
        ("temperature", "use the endpoint's `temperature:` field"),
        ("max_tokens", "use the endpoint's `max_tokens:` field"),
        ("messages", "set by memloop per request"),
        ("response_format", "set by memloop per request"),
        ("stream", "set by memloop per request"),
        ("n", "set by memloop per request"),
        ("seed", "set by memloop per request"),
        ("stop", "set by memloop per request"),
        # issue 57: the letter read's fields and servers' own structured-output fields
        ("logprobs", "the letter read"),
        ("top_logprobs", "the letter read"),
        ("grammar", "replaces memloop's JSON-schema constraint"),
        ("json_schema", "replaces memloop's JSON-schema constraint"),
        ("guided_json", "replaces memloop's JSON-schema constraint"),
    ],
)
def test_extra_body_cannot_override_memloops_request_fields(field, instead):
    message = refusal({"extra_body": {field: "x", "reasoning_effort": "low"}})
    assert message.startswith(f"e.y: key 'extra_body.{field}': ") and instead in message
    assert "overrides" in message


def test_the_request_carries_the_configured_model_and_schema_beside_extra_body(tmp_path):
    """What the client sends: memloop's fields, and extra_body's other fields beside them."""
    from memloop.llm.client import ChatClient

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    with FakeOpenAIServer() as fake:
        endpoint = Endpoint(
            model="configured", base_url=fake.base_url, extra_body={"reasoning_effort": "low"}
        )
        ChatClient(endpoint, cache=None).chat_json(
            [{"role": "user", "content": "hi"}], schema, component="agent"
        )
    (body,) = fake.requests
    assert body["model"] == "configured" and body["reasoning_effort"] == "low"
    assert body["response_format"]["json_schema"]["schema"] == schema
    assert "stream" not in body and "n" not in body


# -- 4. numbers: finite, real, bounded ---------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "key", "words"),
    [
        ({"timeout_s": math.inf}, "timeout_s", "finite number"),
        ({"timeout_s": math.nan}, "timeout_s", "finite number"),
        ({"timeout_s": True}, "timeout_s", "a number, not a boolean"),
        ({"timeout_s": "30"}, "timeout_s", "a number, not text"),
        ({"timeout_s": 86400.5}, "timeout_s", "less than or equal to 86400"),
        ({"timeout_s": 0}, "timeout_s", "greater than 0"),
        ({"price_per_mtok": {"input": math.inf, "output": 1}}, "price_per_mtok.input", "finite"),
        ({"price_per_mtok": {"input": 1, "output": math.nan}}, "price_per_mtok.output", "finite"),
        ({"price_per_mtok": {"input": 1e308, "output": 1}}, "price_per_mtok.input", "10000"),
        ({"price_per_mtok": {"input": True, "output": 1}}, "price_per_mtok.input", "boolean"),
        ({"price_per_mtok": {"input": 1, "output": "2"}}, "price_per_mtok.output", "not text"),
        ({"price_per_mtok": {"input": -0.5, "output": 2}}, "price_per_mtok.input", "0"),
        ({"temperature": True}, "temperature", "a number, not a boolean"),
        ({"max_tokens": True}, "max_tokens", "expected a whole number, got True"),
        ({"max_retries": "3"}, "max_retries", "expected a whole number"),
    ],
)
def test_endpoint_numbers_are_finite_real_and_bounded(fields, key, words):
    message = refusal(fields)
    assert message.startswith(f"e.y: key '{key}': ") and words in message


def test_endpoint_numbers_within_bounds_are_kept():
    endpoint = Endpoint(
        model="m",
        base_url="http://127.0.0.1:9/v1",
        timeout_s=86400,
        temperature=1,
        price_per_mtok={"input": 10000, "output": 0},
    )
    assert (endpoint.timeout_s, endpoint.temperature) == (86400.0, 1.0)
    assert endpoint.cost_usd(1_000_000, 5) == 10000.0
    assert Endpoint(model="m", timeout_s=0.5).timeout_s == 0.5


def test_an_infinite_timeout_in_yaml_is_one_line_exit_2(tmp_path, capsys):
    ep = tmp_path / "ep.yaml"
    ep.write_text("model: m\nbase_url: http://127.0.0.1:9/v1\ntimeout_s: .inf\n")
    assert main(["llm", "check", "--endpoint", str(ep), "--cache", str(tmp_path / "c.sqlite")]) == 2
    line = one_error_line(capsys)
    assert f"{ep}: key 'timeout_s': must be a finite number" in line


# -- 5. a run refused before it starts writes nothing ------------------------------------------


def small_env(root: Path) -> Path:
    path = root / "inputs" / "env.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_items(generate_procedural(users=2, periods=1, questions=1, seed=0), path)
    return path


def everything_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_an_eval_with_an_unset_key_variable_writes_nothing(tmp_path, capsys):
    env = small_env(tmp_path)
    ep = write_yaml(
        tmp_path / "inputs" / "ep.yaml",
        {"model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV},
    )
    before = everything_under(tmp_path)
    argv = eval_argv(env, NATIVE / "native.yaml", ep, tmp_path / "c.sqlite", tmp_path / "out")
    assert main(argv) == 2
    assert KEY_ENV in one_error_line(capsys)
    assert everything_under(tmp_path) == before  # no out/, spec.json, cache or log


def test_an_evolve_with_an_unset_key_variable_writes_nothing(tmp_path, capsys):
    ep = write_yaml(
        tmp_path / "inputs" / "ep.yaml",
        {"model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key_env": KEY_ENV},
    )
    small_evolve(
        tmp_path, "unset-key", (1, 1, 1), periods=1, questions=1, endpoints={"agent": str(ep)}
    )
    before = everything_under(tmp_path)
    assert main(["evolve", str(tmp_path / "exp.yaml"), "--no-progress"]) == 2
    assert KEY_ENV in one_error_line(capsys)
    assert everything_under(tmp_path) == before  # no runs/, spec.json, mlruns/ or cache


def test_role_clients_read_every_key_before_making_a_client(tmp_path, monkeypatch):
    """The optimizer's unset key is named, though the agent's is set (and nothing is made)."""
    monkeypatch.setenv(KEY_ENV, CANARY)
    ok = Endpoint(model="m", base_url="http://127.0.0.1:9/v1", api_key_env=KEY_ENV)
    unset = Endpoint(
        model="o", base_url="http://127.0.0.1:9/v1", api_key_env="MEMLOOP_TEST_45_NONE"
    )
    monkeypatch.delenv("MEMLOOP_TEST_45_NONE", raising=False)
    with pytest.raises(UserError, match="MEMLOOP_TEST_45_NONE is not set") as err:
        RoleClients.from_files(ok, ok, ok, unset, cache=tmp_path / "c.sqlite")
    assert CANARY not in str(err.value)
    assert not (tmp_path / "c.sqlite").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["llm", "check"],
        ["env", "generate", str(ENV_CONFIG), "--out", "generated", "--users", "1", "--no-progress"],
    ],
)
def test_single_endpoint_commands_with_an_unset_key_variable_write_nothing(tmp_path, capsys, argv):
    """No response cache (MEMLOOP_CACHE_DIR is inside tmp_path), no output folder."""
    flags = ["--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--api-key-env", KEY_ENV]
    assert main([*argv, *flags]) == 2
    assert KEY_ENV in one_error_line(capsys)
    assert everything_under(tmp_path) == set()


def test_an_eval_that_fails_before_writing_leaves_no_run_folder(tmp_path, capsys):
    """An unreachable endpoint: the run had started, but wrote nothing beside spec.json."""
    from memloop.testing.servers import free_port

    env = small_env(tmp_path)
    ep = write_yaml(
        tmp_path / "inputs" / "ep.yaml",
        {"model": "m", "base_url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 0},
    )
    out = tmp_path / "new" / "out"
    argv = eval_argv(env, NATIVE / "native.yaml", ep, tmp_path / "c.sqlite", out)
    assert main([*argv, "--no-progress"]) == 2
    assert "cannot reach" in one_error_line(capsys)
    assert not (tmp_path / "new").exists()  # neither spec.json nor the folders it made


def run_spec() -> Any:
    from memloop.runs.spec import RunSpec

    return RunSpec(kind="eval", environment={}, users={"eval": ["u"]}, policy={}, endpoints={})


def test_a_folder_is_left_as_found_by_a_fresh_run_that_wrote_nothing(tmp_path):
    from memloop.runs.folder import open_run_folder

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's own file")
    for folder in (tmp_path / "mine", tmp_path / "a" / "b"):
        with pytest.raises(UserError, match="refused late"):
            with open_run_folder(folder, run_spec(), "test"):
                assert (folder / "spec.json").is_file()
                raise UserError("refused late")
    assert everything_under(tmp_path) == {"mine", "mine/notes.txt", "mine/.memloop.lock"}


def test_a_run_that_wrote_or_resumed_keeps_its_spec(tmp_path):
    from memloop.runs.folder import open_run_folder

    wrote, resumed = tmp_path / "wrote", tmp_path / "resumed"
    with pytest.raises(UserError):
        with open_run_folder(wrote, run_spec(), "test"):
            (wrote / "records.jsonl").write_text("{}\n")
            raise UserError("failed after writing")
    with open_run_folder(resumed, run_spec(), "test"):
        pass
    with pytest.raises(UserError):
        with open_run_folder(resumed, run_spec(), "test"):
            raise UserError("failed on resume")
    assert {p.name for p in wrote.iterdir()} == {"spec.json", "records.jsonl", ".memloop.lock"}
    assert {p.name for p in resumed.iterdir()} == {"spec.json", ".memloop.lock"}


# -- 6. the canary: a key used for every request and written nowhere ----------------------------


def test_a_canary_key_reaches_the_server_and_no_file_of_an_eval_or_an_evolve(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv(KEY_ENV, CANARY)
    env = small_env(tmp_path)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        ep = write_yaml(
            tmp_path / "inputs" / "ep.yaml",
            {"model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV},
        )
        argv = eval_argv(env, NATIVE / "native.yaml", ep, tmp_path / "c.sqlite", tmp_path / "out")
        assert main([*argv, "--no-progress"]) == 0
        small_evolve(
            tmp_path,
            "canary",
            (1, 1, 1),
            periods=1,
            questions=1,
            cycles=1,
            endpoints={"agent": str(ep)},
        )
        assert main(["evolve", str(tmp_path / "exp.yaml"), "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert CANARY not in captured.out + captured.err
    # the key was sent with every request ...
    assert len(fake.auth_headers) > 10 and set(fake.auth_headers) == {f"Bearer {CANARY}"}
    # ... and the runs wrote their files: spec.json, metrics, the MLflow store, the cache
    written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert {"spec.json", "metrics.json", "mlflow.db", "responses.sqlite"} <= written
    assert len(list(tmp_path.rglob("spec.json"))) == 2
    # ... none of which holds the key
    assert files_holding(tmp_path, CANARY) == set()


@pytest.mark.parametrize(
    "fields",
    [
        {"base_url": "http://user:{canary}@{host}"},
        {"extra_body": {"api_key": "{canary}"}},
        {"extra_body": {"metadata": {"token": "{canary}"}}},
    ],
)
def test_a_canary_in_the_endpoint_file_is_refused_and_written_nowhere(tmp_path, capsys, fields):
    env = small_env(tmp_path)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        host = fake.base_url.removeprefix("http://")
        text = yaml.safe_dump({"model": "m", "base_url": fake.base_url, **fields})
        ep = tmp_path / "inputs" / "ep.yaml"
        ep.write_text(text.replace("{canary}", CANARY).replace("{host}", host))
        argv = eval_argv(env, NATIVE / "native.yaml", ep, tmp_path / "c.sqlite", tmp_path / "out")
        assert main(argv) == 2
        eval_line = one_error_line(capsys)
        small_evolve(
            tmp_path, "canary", (1, 1, 1), periods=1, questions=1, endpoints={"agent": str(ep)}
        )
        assert main(["evolve", str(tmp_path / "exp.yaml"), "--no-progress"]) == 2
        evolve_line = one_error_line(capsys)
    assert fake.requests == []
    assert str(ep) in eval_line and str(ep) in evolve_line
    assert "api_key_env" in eval_line and "api_key_env" in evolve_line
    assert files_holding(tmp_path, CANARY) == {ep}  # the endpoint file the test wrote, only
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


# -- 4. credentials in the other URLs and in a store's settings (issue 57, point 4) ------------


@pytest.mark.parametrize(
    ("key", "url", "why"),
    [
        ("tracking_uri", f"postgresql://memloop:{CANARY}@db.example/mlflow", "a password"),
        ("tracking_uri", f"https://{CANARY}@mlflow.example", "a user name or password"),
        ("tracking_uri", f"https://mlflow.example/#{CANARY}", "a fragment"),
        ("tracking_uri", f"https://mlflow.example/?token={CANARY}", "query parameter 'token'"),
        ("storage", f"postgresql://memloop:{CANARY}@db.example/optuna", "a password"),
        ("storage", f"mysql://db.example/optuna?password={CANARY}", "query parameter 'password'"),
    ],
)
def test_a_credential_in_a_tracking_uri_or_a_storage_url_is_refused(
    tmp_path, capsys, key, url, why
):
    config = {
        "environment": {"path": str(small_env(tmp_path))},
        "policy": str(NATIVE / "native.yaml"),
        "trials": 1,
        "search_space": {"update_freq": [1, 2]},
        key: url,
    }
    path = write_yaml(tmp_path / "tune.yaml", config)
    assert main(["tune", str(path), "--no-progress"]) == 2
    line = one_error_line(capsys)
    assert f"key '{key}'" in line and why in line and "PGPASSWORD" in line
    assert "example" not in line  # the URL is not echoed
    assert files_holding(tmp_path, CANARY) == {path}


def test_a_credential_in_the_tracking_uri_flag_is_one_line_exit_2(capsys):
    url = f"postgresql://memloop:{CANARY}@db.example/mlflow"
    assert main(["compare", "--experiment", "x", "--tracking-uri", url]) == 2
    assert "the tracking URI holds a password" in one_error_line(capsys)


def test_a_database_url_may_name_its_user():
    from memloop.core.credentials import store_url_problem

    # the scale-out tests' form (testing/servers.py): a user name alone is no credential
    assert store_url_problem("postgresql+psycopg2://memloop@127.0.0.1:5432/mlflow") is None
    assert store_url_problem("http://127.0.0.1:5000") is None
    assert store_url_problem("sqlite:///mlruns/mlflow.db") is None


@pytest.mark.parametrize(
    ("config", "where", "why"),
    [
        ({"url": f"http://qdrant:{CANARY}@q.example:6333"}, "config.url", "user name or password"),
        ({"url": f"http://q.example:6333?api_key={CANARY}"}, "config.url", "query parameter"),
        ({"url": f"http://q.example:6333#{CANARY}"}, "config.url", "fragment"),
        ({"on_disk": CANARY}, "config.on_disk", "looks like a secret"),  # by its shape
        ({"api_key": CANARY}, "config.api_key", "api_key_env"),
    ],
)
def test_a_credential_in_a_vector_stores_settings_is_refused(tmp_path, capsys, config, where, why):
    policy = write_yaml(
        tmp_path / "inputs" / "awe.yaml",
        {"type": "awe", "vector_store": {"provider": "qdrant", "config": config}},
    )
    env = small_env(tmp_path)
    with FakeOpenAIServer(reply=evolve_loop_reply) as fake:
        ep = write_yaml(tmp_path / "inputs" / "ep.yaml", {"model": "m", "base_url": fake.base_url})
        assert main(eval_argv(env, policy, ep, tmp_path / "c.sqlite", tmp_path / "out")) == 2
    line = one_error_line(capsys)
    assert f"vector_store.{where}" in line and why in line and "q.example" not in line
    assert fake.requests == [] and files_holding(tmp_path, CANARY) == {policy}


def test_a_store_url_read_from_the_environment_is_kept_out_of_the_settings(monkeypatch, tmp_path):
    from memloop.core.config import KeyProblem
    from memloop.policies.mem0_options import check_vector_store, mem0_vector_store

    option = check_vector_store({"provider": "qdrant", "config": {"url_env": "QDRANT_URL_45"}})
    assert option == {"provider": "qdrant", "config": {"url_env": "QDRANT_URL_45"}}
    monkeypatch.setenv("QDRANT_URL_45", f"http://qdrant:{CANARY}@q.example:6333")
    built = mem0_vector_store(option, dims=384, folder=tmp_path, kind="awe")
    assert built["config"]["url"].endswith("@q.example:6333")  # read at run time only
    # flags, numbers and a credentials file's location are not credentials
    vertex = {"use_azure_credential": True}
    with pytest.raises(KeyProblem, match="not a setting of mem0's qdrant store") as err:
        check_vector_store({"provider": "qdrant", "config": vertex})  # not qdrant's setting...
    assert "looks like a secret" not in str(err.value)  # ...but not refused as a secret
