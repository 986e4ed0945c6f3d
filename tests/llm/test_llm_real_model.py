"""The real embedded model (0.5B, the fast one): schema-constrained answers, DSPy through the
shared client, `memloop llm check`, and no orphan server process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.real_model

CAPITAL_SCHEMA = {
    "type": "object",
    "properties": {"capital": {"type": "string", "enum": ["Berlin", "Madrid", "Paris", "Rome"]}},
    "required": ["capital"],
    "additionalProperties": False,
}


def test_embedded_model_answers_schema_constrained(local_client):
    result = local_client.chat_json(
        [{"role": "user", "content": "What is the capital city of France? Answer in JSON."}],
        CAPITAL_SCHEMA,
        component="probe",
    )
    assert result.ok, result.json_error
    assert result.parsed == {"capital": "Paris"}
    assert result.model.startswith("qwen2.5-coder-0.5b")
    assert local_client.usage.component("probe").completion_tokens > 0
    again = local_client.chat_json(
        [{"role": "user", "content": "What is the capital city of France? Answer in JSON."}],
        CAPITAL_SCHEMA,
        component="probe",
    )
    assert again.cached and again.parsed == result.parsed


def test_dspy_predict_on_embedded_model(local_client):
    import dspy

    from memloop.llm.dspy_lm import make_dspy_lm

    lm = make_dspy_lm(local_client, component="memory")
    extract = dspy.Predict("conversation -> user_city: str")
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        out = extract(
            conversation="User: I just moved to Lisbon for a new job.\nAssistant: Congratulations!"
        )
    assert "lisbo" in out.user_city.lower()  # the model may say Lisboa
    assert local_client.usage.component("memory").calls >= 1


def test_llm_check_cli_on_embedded_model(local_client, tmp_path, capsys):
    from memloop.experiments.cli import main

    ep = tmp_path / "ep.yaml"
    ep.write_text("model: local-0.5b\nbase_url: local\nmax_concurrency: 2\ntimeout_s: 300\n")
    code = main(["llm", "check", "--endpoint", str(ep), "--cache", str(tmp_path / "c.sqlite")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "json_valid=True  served_from=endpoint  new_requests=1" in out
    assert "served_from=cache  new_requests=0" in out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


SCRIPT = """
import signal, sys, time
# Ctrl-C as at a terminal, even when this test runs as a background job (a shell starts those
# with SIGINT ignored, and the child would inherit that)
signal.signal(signal.SIGINT, signal.default_int_handler)
from memloop.llm.embedded_server import EmbeddedServer, ServerSettings
from memloop.llm.model_files import QWEN_0_5B
server = EmbeddedServer(QWEN_0_5B, ServerSettings(slots=1, ctx_per_slot=2048)).start()
print(server.pid, flush=True)
if sys.argv[1] == "raise":
    raise RuntimeError("boom")
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["sigkill", "sigint", "raise"])
def test_no_orphan_server_when_parent_dies(tmp_path, how):
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, how],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    child = int(proc.stdout.readline())
    assert _alive(child)
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    elif how == "sigint":
        proc.send_signal(signal.SIGINT)
    proc.wait(60)
    deadline = time.monotonic() + 15
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child), f"embedded server {child} outlived its parent ({how})"


def test_server_started_from_a_worker_thread_outlives_the_thread(tmp_path):
    import threading

    from memloop.llm.embedded_server import EmbeddedServer, ServerSettings
    from memloop.llm.model_files import QWEN_0_5B

    box = {}
    worker = threading.Thread(
        target=lambda: box.setdefault(
            "s", EmbeddedServer(QWEN_0_5B, ServerSettings(slots=1, ctx_per_slot=2048)).start()
        )
    )
    worker.start()
    worker.join()
    server = box["s"]
    pid = server.pid
    try:
        time.sleep(2)
        assert _alive(pid)
    finally:
        server.stop()
    assert not _alive(pid)
