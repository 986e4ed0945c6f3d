"""runs/manifest.py: every run folder's manifest.json, and `memloop rerun` of an eval from it."""

from __future__ import annotations

import json
from pathlib import Path

from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.testing import FakeOpenAIServer, writing_reply
from memloop.testing.commands import eval_argv
from memloop.testing.fake_server import request_schema, schema_valid_reply


def valid_answers(body: dict) -> str:
    """The writer stores the user's words; every other answer fits its schema, so it is cached
    (an answer that breaks its schema is asked again on every run: llm/client.cacheable)."""
    if "edits" in (request_schema(body) or {}).get("properties", {}):
        return writing_reply(body)
    return schema_valid_reply(body)


POLICIES = Path(__file__).resolve().parents[2] / "memloop" / "experiments" / "policies"


def test_an_eval_records_its_manifest_and_reruns_from_it_identically(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_items(generate_procedural(users=2, periods=2, questions=2, seed=3), tmp_path / "env.json")
    with FakeOpenAIServer(reply=valid_answers) as fake:
        Path("fake.yaml").write_text(
            f"model: fake\nbase_url: {fake.base_url}\napi_key_env: FAKE_KEY\n"
        )
        monkeypatch.setenv("FAKE_KEY", "sk-canary-123")
        argv = eval_argv("env.json", POLICIES / "awi.yaml", "fake.yaml", "c.db", "first")
        argv += ["--tracking-uri", f"sqlite:///{tmp_path}/m1/mlflow.db", "--no-progress"]
        assert main(argv) == 0
        manifest = json.loads((tmp_path / "first" / "manifest.json").read_text())
        # the command as typed, from where; the commit; the spec; the cache; versions; no key
        assert manifest["command"] == ["memloop", *argv]
        assert manifest["cwd"] == str(tmp_path)
        spec = json.loads((tmp_path / "first" / "spec.json").read_text())
        assert manifest["spec"]["key"] == spec["key"] and manifest["spec"]["spec"] == spec["spec"]
        assert manifest["cache"]["cache_option"] == "c.db"
        assert manifest["packages"]["memloop"] and manifest["python"].startswith("3.")
        assert manifest["models"] == {}  # no embedded model
        assert "sk-canary-123" not in (tmp_path / "first" / "manifest.json").read_text()
        sent = len(fake.requests)
        capfd.readouterr()
        assert main(["rerun", "first/manifest.json", "--out", str(tmp_path / "again")]) == 0
        assert len(fake.requests) == sent  # served from the response cache
    printed = capfd.readouterr().out
    assert "eval: identical (every user's every score)" in printed
    assert f"rerun of {tmp_path / 'first'} in {tmp_path / 'again'}: identical" in printed
    result = json.loads((tmp_path / "again" / "rerun.json").read_text())
    command = result["command"]
    assert result["identical"] and command[command.index("--out") + 1] == str(tmp_path / "again")
    store = command[command.index("--tracking-uri") + 1]
    assert store == f"sqlite:///{tmp_path / 'again'}/mlruns/mlflow.db"
    first, again = (
        json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("first", "again")
    )
    # metrics.json is the original's but for the tokens the cache served (all of them now)
    assert {k: v for k, v in again.items() if k != "usage_cached"} == {
        k: v for k, v in first.items() if k != "usage_cached"
    }
    assert again["usage_cached"] == again["usage"] and result["metrics_json_differs"] == []


def test_rerun_refuses_what_it_cannot_rerun(tmp_path, capsys):
    (tmp_path / "m.json").write_text(
        json.dumps({"format": 1, "command": ["memloop", "evolve", "x.yaml"], "cwd": "/"})
    )
    assert main(["rerun", str(tmp_path / "m.json"), "--out", str(tmp_path / "o")]) == 2
    assert (
        "rerun knows eval and quickstart; run `memloop evolve x.yaml` again by hand"
        in capsys.readouterr().err
    )
    (tmp_path / "bad.json").write_text("[]")
    assert main(["rerun", str(tmp_path / "bad.json"), "--out", str(tmp_path / "o")]) == 2
    assert "not a memloop manifest" in capsys.readouterr().err
