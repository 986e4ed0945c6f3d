"""Bad input through the command line: each is one line on stderr naming the file, folder, URL,
key or option at fault and what to do, exit code 2 (non-zero for a busy port), and no output
presented as complete.

Not tested here: read-only files and folders (the tests run as root, who may write anywhere).
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest

import memloop
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import FakeOpenAIServer, schema_valid_reply
from memloop.testing.commands import eval_argv as memloop_eval_argv

POLICIES = Path(memloop.__file__).parent / "experiments" / "policies"
NATIVE = POLICIES / "native.yaml"


@pytest.fixture(autouse=True)
def _quiet(no_progress_bars):
    """Every test here reads stderr line by line: progress bars off (conftest.py)."""


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        yield fake


@pytest.fixture(scope="module")
def shared(tmp_path_factory, server) -> Path:
    """A folder holding the environment, the endpoint file and the response cache of the evals."""
    root = tmp_path_factory.mktemp("shared")
    save_items(generate_procedural(users=2, periods=1, questions=1, seed=0), root / "env.json")
    (root / "endpoint.yaml").write_text(f"model: fake\nbase_url: {server.base_url}\n")
    return root


def eval_argv(shared: Path, out: Path, *extra: str, policy: Path = NATIVE) -> list[str]:
    files = (shared / "env.json", policy, shared / "endpoint.yaml", shared / "cache.sqlite", out)
    return [*memloop_eval_argv(*files), *extra]


def one_error_line(capsys, *words: str) -> str:
    """The single stderr line (asserted to be the only one), checked for `words`."""
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    line = lines[0]
    assert line.startswith("memloop: error: "), line
    for word in words:
        assert word in line, (word, line)
    assert "wrote " not in captured.out, captured.out  # nothing announced as written
    return line


def refused_before_any_output(out: Path) -> None:
    assert not (out / "metrics.json").exists()
    assert not (out / "records.jsonl").exists()


# -- 1. the response cache ---------------------------------------------------------------------


def test_a_corrupt_cache_file_is_one_line_naming_it(shared, tmp_path, capsys):
    bad = tmp_path / "cache.sqlite"
    bad.write_bytes(b"\x00garbage, not sqlite\xff" * 200)
    argv = eval_argv(shared, tmp_path / "out")
    argv[argv.index("--cache") + 1] = str(bad)
    assert main(argv) == 2
    one_error_line(capsys, str(bad), "not a memloop response cache (sqlite)", "--cache")
    assert not (tmp_path / "out").exists()
    assert bad.read_bytes().startswith(b"\x00garbage")  # left as it was


def test_a_sqlite_file_of_something_else_is_not_taken_as_a_cache(shared, tmp_path, capsys):
    import sqlite3

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE responses (id INTEGER, body BLOB)")
    argv = eval_argv(shared, tmp_path / "out")
    argv[argv.index("--cache") + 1] = str(other)
    assert main(argv) == 2
    one_error_line(capsys, str(other), "not a memloop response cache")
    assert not (tmp_path / "out").exists()


def test_a_folder_as_cache_is_one_line(shared, tmp_path, capsys):
    folder = tmp_path / "cachedir"
    folder.mkdir()
    argv = eval_argv(shared, tmp_path / "out")
    argv[argv.index("--cache") + 1] = str(folder)
    assert main(argv) == 2
    one_error_line(capsys, f"{folder}: is a folder", "--cache")
    assert not (tmp_path / "out").exists()


def test_memloop_cache_dir_naming_a_file_is_one_line(shared, tmp_path, capsys, monkeypatch):
    afile = tmp_path / "not-a-folder"
    afile.write_text("x")
    monkeypatch.setenv("MEMLOOP_CACHE_DIR", str(afile))
    argv = eval_argv(shared, tmp_path / "out")
    i = argv.index("--cache")
    del argv[i : i + 2]  # the default cache, under MEMLOOP_CACHE_DIR
    assert main(argv) == 2
    one_error_line(capsys, f"{afile}: is a file, not a folder", "MEMLOOP_CACHE_DIR")
    assert not (tmp_path / "out").exists()


# -- 2. damaged checkpoints in an eval's --out -------------------------------------------------


@pytest.fixture(scope="module")
def finished_run(shared, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(eval_argv(shared, out)) == 0
    return out


def cut_short(finished_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the finished run as a killed one leaves it: no results, the last period of the
    first user unfinished. Returns (the copy, the first user's folder)."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    for name in ("metrics.json", "records.jsonl", "per_period.png"):
        (out / name).unlink()
    user = sorted((out / "episodes").iterdir())[0]
    shutil.rmtree(user / "period_01")
    return out, user


def test_a_cut_period_record_is_one_line_naming_it(shared, finished_run, tmp_path, capsys, server):
    out, user = cut_short(finished_run, tmp_path)
    record = user / "period_00" / "record.json"
    record.write_text(record.read_text()[: len(record.read_text()) // 2])
    sent = len(server.requests)
    assert main(eval_argv(shared, out)) == 2
    one_error_line(capsys, f"{record}: damaged checkpoint", "delete period_00", "--force")
    refused_before_any_output(out)
    assert len(server.requests) == sent  # refused before any user started
    # the advice works: without that period folder the run resumes and finishes
    shutil.rmtree(user / "period_00")
    assert main(eval_argv(shared, out)) == 0
    assert (out / "metrics.json").is_file()
    # and so does the other: --force starts over on a damaged run
    record = next((out / "episodes").glob("*/period_00/record.json"))
    record.write_text(record.read_text()[:10])
    assert main([*eval_argv(shared, out), "--force"]) == 0
    assert (out / "metrics.json").is_file()


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],  # cut
        lambda text: "[1, 2]",  # JSON, but not a policy state
        lambda text: '{"format": 1, "type": "native"}',  # keys missing
    ],
    ids=["cut", "not-an-object", "keys-missing"],
)
def test_a_damaged_policy_state_is_one_line_naming_it(
    shared, finished_run, tmp_path, capsys, damage
):
    out, user = cut_short(finished_run, tmp_path)
    state = user / "period_00" / "policy" / "policy.json"
    state.write_text(damage(state.read_text()))
    assert main(eval_argv(shared, out)) == 2
    one_error_line(capsys, str(state), "delete period_00", "--force")
    refused_before_any_output(out)


# -- 3. compare on a file that is not a database -----------------------------------------------


@pytest.mark.parametrize("kind", ["text file", "folder"])
def test_compare_on_a_file_that_is_not_a_database_is_one_line(tmp_path, capsys, kind):
    target = tmp_path / "mlflow.db"
    if kind == "folder":
        target.mkdir()
    else:
        target.write_text("experiment,score\nx,1\n" * 50)
    argv = ["compare", "--experiment", "x", "--tracking-uri", f"sqlite:///{target}"]
    assert main(argv) == 2
    one_error_line(capsys, str(target), "not an MLflow tracking database", "tracking URI")
    assert capsys.readouterr().out == ""


# -- 4. ui: the port -----------------------------------------------------------------------------


@pytest.fixture
def no_exec(monkeypatch):
    """`ui` replaces the process with the MLflow server: here that must never happen."""
    import os

    def refuse(*args):
        raise AssertionError(f"ui started a server: {args}")

    monkeypatch.setattr(os, "execvp", refuse)


@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_ui_on_a_port_out_of_range_is_one_line(tmp_path, capsys, no_exec, port):
    argv = ["ui", "--port", port, "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    assert main(argv) == 2
    one_error_line(capsys, f"--port {port}", "1-65535")
    assert "MLflow UI on" not in capsys.readouterr().out


def test_ui_on_a_port_in_use_fails_without_announcing_its_url(tmp_path, capsys, no_exec):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["ui", "--port", str(port), "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
        code = main(argv)
        captured = capsys.readouterr()
    assert code != 0
    lines = captured.err.splitlines()
    assert len(lines) == 1 and f"--port {port}" in lines[0] and "in use" in lines[0], lines
    assert "MLflow UI on" not in captured.out


def test_ui_on_a_file_that_is_not_a_database_is_one_line(tmp_path, capsys, no_exec):
    target = tmp_path / "notes.txt"
    target.write_text("not a database\n")
    assert main(["ui", "--port", "5999", "--tracking-uri", f"sqlite:///{target}"]) == 2
    one_error_line(capsys, str(target), "not an MLflow tracking database")


def test_ui_starts_one_worker_and_names_the_experiments_runs_table(tmp_path, capsys, monkeypatch):
    import os

    from memloop.runs import tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlc = tracker.client(uri)
    exp_id = tracker.experiment_id(mlc, "unit-ui", uri)
    tags = mlc.get_experiment(exp_id).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"  # runs, not traces
    started: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda program, argv: started.append(argv))
    # ui sets these for the MLflow server it becomes: undone after the test, so that a later test
    # in this process (and its subprocesses) does not inherit them (monkeypatch records a
    # variable's absence only through setenv, so each is set, then removed)
    for name in ("PYTHONWARNINGS", "MLFLOW_LOGGING_LEVEL", "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert main(["ui", "--tracking-uri", uri, "--port", "5998", "--experiment", "unit-ui"]) == 0
    (argv,) = started
    assert argv[argv.index("--workers") + 1] == "1"
    assert f"http://127.0.0.1:5998/#/experiments/{exp_id}/runs" in capsys.readouterr().out
    assert main(["ui", "--tracking-uri", uri, "--experiment", "nope"]) == 2


# -- 5. endpoint files -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content", ["", "# only a comment\n\n# and another\n", "endpoint: {}\n"], ids=str.strip
)
def test_an_empty_endpoint_file_is_refused_not_taken_as_the_embedded_model(
    shared, tmp_path, capsys, content
):
    ep = tmp_path / "endpoint.yaml"
    ep.write_text(content)
    argv = eval_argv(shared, tmp_path / "out")
    argv[argv.index("--endpoint") + 1] = str(ep)
    assert main(argv) == 2
    one_error_line(capsys, f"{ep}: empty endpoint file", "base_url")
    assert not (tmp_path / "out").exists()


def test_a_base_url_without_scheme_is_refused_at_load_time(shared, tmp_path, capsys, server):
    ep = tmp_path / "endpoint.yaml"
    hostport = server.base_url.removeprefix("http://")
    ep.write_text(f"model: fake\nbase_url: {hostport}\n")
    argv = eval_argv(shared, tmp_path / "out")
    argv[argv.index("--endpoint") + 1] = str(ep)
    sent = len(server.requests)
    assert main(argv) == 2
    line = one_error_line(capsys, str(ep), "base_url", "http://", hostport)
    assert "cannot reach" not in line
    assert len(server.requests) == sent
    assert not (tmp_path / "out").exists()


def test_a_server_that_answers_is_never_called_unreachable(tmp_path, capsys):
    with FakeOpenAIServer(failures=[404]) as fake:
        ep = tmp_path / "endpoint.yaml"
        ep.write_text(f"model: fake\nbase_url: {fake.base_url}\nmax_retries: 0\n")
        argv = ["llm", "check", "--endpoint", str(ep), "--cache", str(tmp_path / "c.sqlite")]
        assert main(argv) == 2
    line = one_error_line(capsys, fake.base_url, "HTTP 404")
    assert "cannot reach" not in line


def test_https_to_a_plain_http_server_is_not_called_unreachable(tmp_path, capsys):
    with FakeOpenAIServer(reply=schema_valid_reply) as fake:
        ep = tmp_path / "endpoint.yaml"
        url = fake.base_url.replace("http://", "https://")
        ep.write_text(f"model: fake\nbase_url: {url}\nmax_retries: 0\n")
        argv = ["llm", "check", "--endpoint", str(ep), "--cache", str(tmp_path / "c.sqlite")]
        assert main(argv) == 2
    line = one_error_line(capsys, url)
    assert "cannot reach" not in line and "TLS handshake failed" in line and "http://" in line


# -- 6. strict whole numbers in policy files ------------------------------------------------------


@pytest.mark.parametrize(
    "body,key",
    [
        ("type: awi\nupdate_freq: true\n", "update_freq"),
        ("type: awi\nshort_term_len: 2.5\n", "short_term_len"),
        ("type: rag\ntop_k: '30'\n", "top_k"),
        ("type: native\nreply_max_tokens: yes\n", "reply_max_tokens"),
    ],
)
def test_a_policy_count_that_is_not_a_whole_number_is_refused(shared, tmp_path, capsys, body, key):
    policy = tmp_path / "policy.yaml"
    policy.write_text(body)
    out = tmp_path / "out"
    assert main(eval_argv(shared, out, policy=policy)) == 2
    one_error_line(capsys, str(policy), f"key '{key}'", "whole number")
    assert not out.exists()


# -- 7. YAML mistakes ------------------------------------------------------------------------------


def test_a_tab_in_the_indentation_names_its_line_and_column(shared, tmp_path, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text("type: awi\n\tupdate_freq: 2\n")
    assert main(eval_argv(shared, tmp_path / "out", policy=policy)) == 2
    one_error_line(capsys, str(policy), "not valid YAML", "line 2, column 1", "tab")
    assert not (tmp_path / "out").exists()


def test_a_tab_in_an_endpoint_file_names_its_line_and_column(tmp_path, capsys):
    ep = tmp_path / "endpoint.yaml"
    ep.write_text("model: fake\nbase_url: http://127.0.0.1:9/v1\n\tmax_retries: 0\n")
    assert main(["llm", "check", "--endpoint", str(ep)]) == 2
    one_error_line(capsys, str(ep), "line 3, column 1", "tab")


@pytest.mark.parametrize(
    "value,read_as", [("2024", "a number"), ("yes", "a boolean"), ("1.10", "a number")]
)
def test_an_unquoted_value_read_as_no_text_hints_quote_it(shared, tmp_path, capsys, value, read_as):
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"type: native\nname: {value}\n")
    assert main(eval_argv(shared, tmp_path / "out", policy=policy)) == 2
    one_error_line(capsys, str(policy), "key 'name'", read_as, "quote it")
    assert not (tmp_path / "out").exists()


def test_an_unquoted_date_stays_the_text_written(tmp_path):
    from memloop.policies.config import load_policy_config

    policy = tmp_path / "policy.yaml"
    policy.write_text("type: native\nname: 2024-01-01\n")
    assert load_policy_config(policy).display_name == "2024-01-01"


# -- 8. counts out of range --------------------------------------------------------------------


@pytest.mark.parametrize(
    "option,value",
    [
        ("--users", "0"),
        ("--users", "-1"),
        ("--questions", "0"),
        ("--questions", "-3"),
        ("--periods", "-1"),
    ],
)
def test_env_procedural_refuses_counts_out_of_range(tmp_path, capsys, option, value):
    out = tmp_path / "data.json"
    assert main(["env", "procedural", option, value, "--out", str(out)]) == 2
    one_error_line(capsys, f"{option} must be between", f"got {value}")
    assert not out.exists()


def test_env_procedural_with_no_update_period_is_a_valid_environment(tmp_path, capsys):
    """--periods counts the periods AFTER the initial one: 0 leaves the initial period alone."""
    out = tmp_path / "data.json"
    argv = ["env", "procedural", "--users", "1", "--periods", "0", "--questions", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "(1 period," in capsys.readouterr().out
    assert main(["env", "validate", str(out)]) == 0


@pytest.mark.parametrize(
    "option,value", [("--users", "0"), ("--users", "-2"), ("--periods", "0"), ("--periods", "-1")]
)
def test_eval_refuses_counts_out_of_range(shared, tmp_path, capsys, option, value):
    out = tmp_path / "out"
    assert main(eval_argv(shared, out, option, value)) == 2
    one_error_line(capsys, f"{option} must be at least 1", f"got {value}")
    assert not out.exists()


# -- 9. --force deletes only memloop's own eval run -------------------------------------------


def listing(folder: Path) -> dict[str, bytes | None]:
    """Every file and folder under `folder`, with the files' bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


NOT_MEMLOOPS = {
    "no-spec": None,
    "other-json": '{"name": "my own notes", "components": "none"}',
    "no-scorer-version": '{"components": {"command": "eval"}}',
    "not-json": "spec: yes\n",
}


@pytest.mark.parametrize("spec", list(NOT_MEMLOOPS), ids=list(NOT_MEMLOOPS))
@pytest.mark.parametrize("force", [True, False], ids=["force", "no-force"])
def test_force_never_deletes_files_memloop_did_not_write(
    shared, tmp_path, capsys, server, spec, force
):
    out = tmp_path / "mine"
    (out / "episodes" / "alice").mkdir(parents=True)
    (out / "episodes" / "alice" / "notes.txt").write_text("my own work\n")
    (out / "metrics.json").write_text('{"mine": 1}\n')
    (out / "records.jsonl").write_text("{}\n")
    if NOT_MEMLOOPS[spec] is not None:
        (out / "spec.json").write_text(NOT_MEMLOOPS[spec])
    before = listing(out)
    sent = len(server.requests)
    assert main(eval_argv(shared, out, *(["--force"] if force else []))) == 2
    line = one_error_line(capsys)
    if spec == "no-spec":
        assert line == (
            f"memloop: error: --out {out}: holds files memloop did not write (no spec.json); "
            "choose another --out or remove them yourself"
        )
    else:
        assert line.startswith(
            f"memloop: error: --out {out}: holds files memloop did not write (spec.json "
        ), line
        assert line.endswith("); choose another --out or remove them yourself"), line
    assert listing(out) == before  # nothing deleted, nothing written (not even a lock file)
    assert len(server.requests) == sent


def test_force_still_starts_over_on_memloops_own_run(shared, finished_run, tmp_path):
    out, user = cut_short(finished_run, tmp_path)
    (user / "period_00" / "record.json").write_text("{cut")
    (out / "my-notes.txt").write_text("kept\n")
    assert main([*eval_argv(shared, out), "--force"]) == 0
    assert (out / "metrics.json").is_file()
    assert (out / "my-notes.txt").read_text() == "kept\n"  # not a run file: left alone


# -- 10. compare and ui only read a tracking store: a missing one is refused, never created ------


@pytest.mark.parametrize(
    "uri,named",
    [
        ("sqlite:///{tmp}/mlruns/mlflow.db", "{tmp}/mlruns/mlflow.db"),  # folder missing too
        ("sqlite:///{tmp}/mlflow.db", "{tmp}/mlflow.db"),  # folder there, file missing
        ("{tmp}/mlruns", "{tmp}/mlruns"),  # a file store's folder
        ("file://{tmp}/mlruns", "{tmp}/mlruns"),
        (None, "mlruns/mlflow.db"),  # the default, relative to the working folder
    ],
    ids=["sqlite-no-folder", "sqlite-no-file", "folder", "file-uri", "default"],
)
@pytest.mark.parametrize("command", ["compare", "ui"])
def test_reading_a_missing_tracking_store_creates_nothing(
    tmp_path, capsys, monkeypatch, no_exec, uri, named, command
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    argv = ["compare", "--experiment", "x"] if command == "compare" else ["ui", "--port", "5999"]
    if uri is not None:
        argv += ["--tracking-uri", uri.format(tmp=tmp_path)]
    before = listing(tmp_path)
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line == (
        f"memloop: error: no MLflow store at {named.format(tmp=tmp_path)}: run memloop evolve "
        "first (or give --tracking-uri)"
    )
    assert capsys.readouterr().out == ""
    assert listing(tmp_path) == before  # no mlruns/, no mlflow.db, no lock file


def test_compare_on_an_empty_sqlite_file_leaves_it_empty(tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    db.touch()
    argv = ["compare", "--experiment", "x", "--tracking-uri", f"sqlite:///{db}"]
    assert main(argv) == 2
    one_error_line(capsys, f"no MLflow store at {db}: run memloop evolve first")
    assert listing(tmp_path) == {"mlflow.db": b""}


def test_version_names_the_package_and_its_commit(capsys):
    from memloop import __version__
    from memloop.experiments.cli import main
    from memloop.runs.spec import git_revision

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out.strip()
    commit = git_revision()
    expected = f"memloop {__version__}" + (f" (commit {commit[:12]})" if commit else "")
    assert out == expected


# -- issue 57: an experiment name MLflow would refuse, before any work -------------------------


@pytest.mark.parametrize(
    ("name", "words"),
    [("", ["is empty"]), ("   ", ["is empty"]), ("x" * 501, ["501 characters", "at most 500"])],
    ids=["empty", "blank", "501-characters"],
)
def test_an_experiment_name_mlflow_refuses_is_one_line_before_the_eval(
    shared, tmp_path, capsys, server, name, words
):
    out = tmp_path / "run"
    before = len(server.requests)
    assert main(eval_argv(shared, out, "--experiment", name)) == 2
    one_error_line(capsys, "--experiment", *words)
    assert len(server.requests) == before  # refused before the first request
    assert not out.exists()


def test_a_500_character_experiment_name_is_taken(shared, tmp_path):
    assert main(eval_argv(shared, tmp_path / "ok", "--experiment", "y" * 500)) == 0


def test_an_import_with_an_empty_experiment_name_is_one_line(tmp_path, capsys):
    argv = ["import-amemgym", str(tmp_path), "--out", str(tmp_path / "o"), "--tracking-uri"]
    argv += [f"sqlite:///{tmp_path}/m.db", "--experiment", ""]
    assert main(argv) == 2
    one_error_line(capsys, "--experiment", "is empty")


@pytest.mark.parametrize("where", ["missing-folder", "a-folder"])
def test_a_request_log_that_cannot_be_written_is_one_line_before_any_work(
    shared, tmp_path, capsys, server, monkeypatch, where
):
    """`MEMLOOP_REQUEST_LOG` in a missing folder was a 74-line traceback at the first request."""
    path = tmp_path / "no" / "log.jsonl" if where == "missing-folder" else tmp_path
    monkeypatch.setenv("MEMLOOP_REQUEST_LOG", str(path))
    before = len(server.requests)
    assert main(eval_argv(shared, tmp_path / "run")) == 2
    one_error_line(
        capsys, "MEMLOOP_REQUEST_LOG", "does not exist" if "missing" in where else "folder"
    )
    assert len(server.requests) == before and not (tmp_path / "run").exists()


def test_a_request_log_in_an_existing_folder_is_appended_to(shared, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLOOP_REQUEST_LOG", str(tmp_path / "log.jsonl"))
    assert main(eval_argv(shared, tmp_path / "run")) == 0
    assert (tmp_path / "log.jsonl").read_text().count("\n") >= 1
