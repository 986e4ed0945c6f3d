"""Faults that must not give a wrong result: junk answers never cached nor passed off as a run,
and token counts that describe the work, not the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import memloop
from memloop.core.errors import UserError
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import FakeOpenAIServer, request_schema, schema_valid_reply
from memloop.testing.commands import eval_argv

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
    return eval_argv(env, NATIVE, endpoint, tmp_path / "cache.sqlite", tmp_path / out)


def test_an_endpoint_answering_prose_fails_loudly_and_leaves_nothing_cached(tmp_path, capsys):
    with FakeOpenAIServer(reply=prose) as server:
        assert main(eval_args(tmp_path, server, "junk")) == 2
        err = capsys.readouterr().err
        assert (
            "memloop: error: every answer failed: 8 of 8 answers (100%) were not valid JSON" in err
        )
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


def test_an_edited_default_write_prompt_is_another_eval(tmp_path, capsys, monkeypatch):
    from memloop.policies.programs import AWIProgram

    with FakeOpenAIServer(reply=valid) as server:
        args = eval_args(tmp_path, server, "awi")
        args[args.index("--policy") + 1] = str(NATIVE.parent / "awi.yaml")
        assert main([*args, "--periods", "1", "--users", "1"]) == 0
        sent = len(server.requests)
        capsys.readouterr()
        monkeypatch.setattr(AWIProgram.__init__, "__defaults__", ("Write down nothing.",))
        assert main([*args, "--periods", "1", "--users", "1"]) == 2
        assert "(changed: prompts_sha256)" in capsys.readouterr().err
        assert len(server.requests) == sent


def test_a_rerun_with_other_settings_is_refused_before_anything_is_written(tmp_path, capsys):
    with FakeOpenAIServer(reply=valid) as server:
        args = eval_args(tmp_path, server, "run")
        assert main(args) == 0
        out = tmp_path / "run"
        before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
        sent = len(server.requests)
        awi = str(NATIVE.parent / "awi.yaml")
        changed = {
            "policy, prompts_sha256": [*args[:4], awi, *args[5:]],  # AWI has write prompts
            "evaluation.rounds": [*args, "--rounds-update", "3"],
            "evaluation.periods": [*args, "--periods", "1"],
            "users": [*args, "--users", "1"],
        }
        env = tmp_path / "env.json"
        for key, argv in changed.items():
            capsys.readouterr()
            assert main(argv) == 2, key
            err = capsys.readouterr().err.strip()
            assert err.splitlines() == [
                f"memloop: error: --out {out}: holds a run with other settings (changed: {key}); "
                "choose "
                "another --out, or --force to start over there"
            ], err
        # the same user ids with changed questions: the data hash differs
        data = json.loads(env.read_text())
        data[0]["qas"][0]["query"] += " (edited)"
        env.write_text(json.dumps(data))
        assert main(args) == 2
        assert "(changed: environment.sha256)" in capsys.readouterr().err
        assert len(server.requests) == sent  # nothing was asked
        assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
        # --force starts over: the new settings' run, spec.json naming them
        assert main([*changed["evaluation.rounds"], "--force"]) == 0
        spec = json.loads((out / "spec.json").read_text())["spec"]
        assert spec["evaluation"]["rounds"] == {"init": 1, "update": 3}
        assert len(server.requests) > sent


def test_counts_beyond_the_environment_and_a_file_as_out_are_one_line(tmp_path, capsys):
    with FakeOpenAIServer(reply=valid) as server:
        args = eval_args(tmp_path, server, "x")
        (tmp_path / "afile").write_text("")
        cases = {
            "--users 100: ": [*args, "--users", "100"],
            "--periods 100: ": [*args, "--periods", "100"],
            "is a file, not a folder": [*args[:-1], str(tmp_path / "afile")],
        }
        for needle, argv in cases.items():
            capsys.readouterr()
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and needle in err, err
        assert server.requests == []
    assert not (tmp_path / "x").exists()


HOLD = """
import sys, time
from memloop.core.files import run_folder_lock
with run_folder_lock(sys.argv[1], "memloop eval"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_live_process_holds_its_run_folder_and_a_killed_one_lets_go(tmp_path, capsys):
    import signal
    import subprocess
    import sys

    from memloop.core.files import run_folder_lock

    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with FakeOpenAIServer(reply=valid) as server:
            args = eval_args(tmp_path, server, "run")
            assert main(args) == 2
            err = capsys.readouterr().err.strip()
            assert err == (
                f"memloop: error: {out}: in use by process {holder.pid} (memloop eval); "
                "wait for it to finish, or use another folder"
            )
            assert server.requests == [] and not (out / "spec.json").exists()
            holder.send_signal(signal.SIGKILL)  # the lock dies with its process
            holder.wait(timeout=10)
            assert main(args) == 0
            assert (out / "metrics.json").is_file()
    finally:
        holder.kill()
        holder.wait(timeout=10)
    # evolve's run folders use the same lock
    with run_folder_lock(out, "memloop evolve"):
        with pytest.raises(UserError, match=r"in use by process \d+ \(memloop evolve\)"):
            with run_folder_lock(out, "memloop evolve"):
                pass


def error_lines(stderr: str) -> list[str]:
    """The error lines of stderr (progress bars are not errors)."""
    return [line for line in stderr.splitlines() if line.startswith("memloop:")]


def fault_args(tmp_path: Path, server: FakeOpenAIServer, out: str, **endpoint) -> list[str]:
    """eval_args with an endpoint file carrying `endpoint` settings (retries, timeout)."""
    args = eval_args(tmp_path, server, out)
    path = tmp_path / f"{out}-endpoint.yaml"
    lines = ["model: fake", f"base_url: {server.base_url}"]
    lines += [f"{k}: {v}" for k, v in endpoint.items()]
    path.write_text("\n".join(lines) + "\n")
    args[args.index("--endpoint") + 1] = str(path)
    return [*args, "--parallel-users", "1"]  # one request at a time: faults hit them in order


@pytest.mark.parametrize(
    ("fault", "needle"),
    [
        ("html", "a body that is not a chat completion: '<html><body><h1>502 Bad Gateway"),
        ("cut", 'a body that is not a chat completion: \'{"id": "fake-1", "object"'),
        ("empty_choices", 'a completion with no choices: \'{"id": "fake-1"'),
    ],
)
def test_a_body_that_is_not_a_completion_is_retried_then_one_line(
    tmp_path, capsys, fault, needle, transport
):
    with FakeOpenAIServer(reply=valid, failures=[fault] * 3) as server:
        args = fault_args(tmp_path, server, "run", max_retries=2)
        assert main(args) == 2
        assert server.served[:3] == [fault] * 3  # retried like a 5xx: 1 + max_retries requests
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "answered 3 times for model 'fake' with " in err[0]
    assert needle in err[0], err
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_an_answer_broken_off_mid_body_is_not_called_unreachable(tmp_path, capsys, transport):
    """HTTP 200 with half the announced body, then a closed connection: the server was reached."""
    with FakeOpenAIServer(reply=valid, failures=["short"] * 3) as server:
        args = fault_args(tmp_path, server, "run", max_retries=2)
        assert main(args) == 2
        assert server.served[:3] == ["short"] * 3  # retried: 1 + max_retries requests
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "was reached but broke off its answer 3 times" in err[0], err
    assert "cannot reach" not in err[0] and "start the server" not in err[0]
    assert not (tmp_path / "run" / "metrics.json").exists()


def test_transient_faults_are_retried_and_the_run_is_the_clean_run(tmp_path, transport):
    with FakeOpenAIServer(reply=valid) as server:
        assert main(fault_args(tmp_path, server, "clean")) == 0
    clean = json.loads((tmp_path / "clean" / "metrics.json").read_text())
    # each fault hits a request whose retry then succeeds (one short backoff each)
    faults = [f for fault in (429, 500, "html", "cut", "empty_choices", 503) for f in (fault, "ok")]
    with FakeOpenAIServer(reply=valid, failures=faults, retry_after_s=0.1) as server:
        args = fault_args(tmp_path, server, "faulty", max_retries=1)
        args[args.index("--cache") + 1] = str(tmp_path / "other-cache.sqlite")
        assert main(args) == 0
        assert server.served[: len(faults)] == faults
    faulty = json.loads((tmp_path / "faulty" / "metrics.json").read_text())
    for key in ("overall", "state_accuracy", "json_errors", "questions", "diagnosis", "usage"):
        assert faulty[key] == clean[key], key


def test_a_rejected_key_is_one_line(tmp_path, capsys, transport):
    with FakeOpenAIServer(reply=valid, failures=[401]) as server:
        assert main(fault_args(tmp_path, server, "run")) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "rejected the API key (HTTP 401)" in err[0]


CTRL_C = """
import sys
from memloop.experiments.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_against_a_hanging_endpoint_stops_within_two_seconds(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    with FakeOpenAIServer(reply=valid, failures=["hang"] * 50, hang_s=60) as server:
        args = fault_args(tmp_path, server, "run", timeout_s=30)
        proc = subprocess.Popen(
            [sys.executable, "-c", CTRL_C, *args],
            stderr=subprocess.PIPE,
            text=True,
            # a child of a background job would inherit an ignored SIGINT; restore the default
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            deadline = time.monotonic() + 60
            while not server.requests and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.requests, "the run never asked the endpoint"
            time.sleep(0.5)  # the request is hanging now
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)
            took = time.monotonic() - sent
        finally:
            proc.kill()
            proc.wait()
    err = proc.stderr.read()
    assert code == 130, err
    assert took < 2.0, took
    assert "memloop: interrupted (finished work is checkpointed: rerun to resume)" in err
    assert "Traceback" not in err


def test_user_ids_get_distinct_folders_inside_the_run_and_validate_warns(tmp_path, capsys):
    from memloop.core.files import safe_name

    items = generate_procedural(users=4, periods=1, questions=1, seed=0)
    for item, uid in zip(items, ["alice/1", "alice_1", "..", "plain-id"], strict=True):
        item.id = uid
    env = tmp_path / "ids.json"
    save_items(items, env)
    assert main(["env", "validate", str(env)]) == 0
    err = capsys.readouterr().err
    for uid in ("alice/1", ".."):
        assert f"warning: user id {uid!r} is not a plain file name" in err
    assert "'alice_1'" not in err and "'plain-id'" not in err
    folders = [safe_name(i.id) for i in items]
    assert len(set(folders)) == 4
    assert all("/" not in f and f not in (".", "..") for f in folders)
    with FakeOpenAIServer(reply=valid) as server:
        args = eval_args(tmp_path, server, "ids")
        args[args.index("--env") + 1] = str(env)
        assert main(args) == 0
    made = sorted(p.name for p in (tmp_path / "ids" / "episodes").iterdir())
    assert made == sorted(folders)
    metrics = json.loads((tmp_path / "ids" / "metrics.json").read_text())
    assert sorted(metrics["per_user"]) == sorted(i.id for i in items)


def test_settings_that_do_not_change_a_response_resume_the_same_eval(tmp_path, capsys):
    """Concurrency, timeouts and retries change how a response is fetched, not what it says;
    --periods equal to the longest episode is every period: each resumes the finished run."""
    with FakeOpenAIServer(reply=valid) as server:
        args = eval_args(tmp_path, server, "run")
        assert main(args) == 0
        out = tmp_path / "run"
        metrics = (out / "metrics.json").read_text()
        sent = len(server.requests)
        endpoint = Path(args[args.index("--endpoint") + 1])
        endpoint.write_text(
            endpoint.read_text() + "max_concurrency: 1\ntimeout_s: 7\nmax_retries: 0\n"
        )
        most = max(len(u["periods"]) for u in json.loads((tmp_path / "env.json").read_text()))
        assert main(args) == 0
        assert main([*args, "--periods", str(most)]) == 0
        assert len(server.requests) == sent  # resumed from checkpoints: nothing asked again
        assert (out / "metrics.json").read_text() == metrics
        # a setting that changes responses is still another run
        endpoint.write_text(endpoint.read_text() + "max_tokens: 64\n")
        capsys.readouterr()
        assert main(args) == 2
        assert "(changed: endpoints)" in capsys.readouterr().err
