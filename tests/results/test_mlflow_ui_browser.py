"""The MLflow UI as a user opens it, in headless Chromium (Debian's; `make test` installs it).

An evolve run on the fake endpoint whose writer stores what the user said (`writing_reply`);
`memloop ui` on its store; the pages Chromium renders:
- the Traces page, on one session's trace: the user's own words and a memory line the writer
  stored in that session are on the page;
- on a probed session's trace, clicked as a user clicks: the writer call's span shows its raw
  output, and the questions' results are assessments shown on the trace;
- the experiment's Prompts page lists the run's registered prompt, MLflow's Default one does not.
"""

from __future__ import annotations

import html
import re
import time

import pytest

from memloop.optimize.evolve import run_evolve
from memloop.runs import tracker
from memloop.testing import FakeOpenAIServer, fake_roles, writing_reply
from memloop.testing.browser import driven, memloop_ui, rendered
from memloop.testing.commands import small_evolve

pytestmark = pytest.mark.usefixtures("traces_on")  # the suite logs none (conftest)


def test_the_ui_shows_a_users_session_with_its_stored_edit_and_the_experiments_prompt(tmp_path):
    config = small_evolve(
        tmp_path, "ui-traces", (1, 1, 1), cycles=1, feedback_modes=["none"], evolvers=["none"]
    )
    with FakeOpenAIServer(reply=writing_reply) as fake:
        (outcome,) = run_evolve(config, progress=False, clients=fake_roles(fake.base_url, None))
    mlc = tracker.client(config.tracking_uri)
    exp = mlc.get_experiment_by_name("ui-traces").experiment_id
    traces = mlc.search_traces(locations=[exp], run_id=outcome.run_id, max_results=500)
    stored = [
        t
        for t in traces
        if t.info.tags["memloop.session"] == "0" and t.data.spans[0].outputs["memory lines added"]
    ]
    assert stored, "no session stored a memory line"
    trace = stored[0]
    root = trace.data.spans[0]
    opening = re.sub(r"\[Current Time:[^\]]*\]\s*", "", root.inputs["messages"][0]["content"])
    said = " ".join(opening.split()[:6])  # the user's own words
    label = root.outputs["memory lines added"][0].split(":")[0]  # e.g. said_about_work
    assert label.startswith("said_about_")
    # the writer's model calls are spans of the session, their raw output and tokens kept
    writes = [s for s in trace.data.spans if s.get_attribute("component") == "memory"]
    assert writes and all(w.get_attribute("prompt_tokens") > 0 for w in writes)
    assert all(w.outputs["choices"][0]["message"]["content"] for w in writes)
    prompt = mlc.get_run(outcome.run_id).data.tags["memloop.prompt_name"]
    # a session with probes: its questions' results are assessments on its trace
    probed = mlc.get_trace(
        next(t for t in traces if mlc.get_trace(t.info.trace_id).info.assessments).info.trace_id
    )
    (write, *_) = (s for s in probed.data.spans if s.get_attribute("component") == "memory")
    raw = write.outputs["choices"][0]["message"]["content"]
    results = {a.value for a in probed.info.assessments if a.name == "result"}
    assert results <= {"right", "write", "read", "utilization", "format"} and results
    with memloop_ui(config.tracking_uri, "ui-traces") as ui:
        base = ui.address.split("#")[0]
        page = rendered(
            f"{base}#/experiments/{exp}/traces?selectedEvaluationId={trace.info.trace_id}"
        )
        with driven(
            f"{base}#/experiments/{exp}/traces?selectedEvaluationId={probed.info.trace_id}"
        ) as trace_page:
            span_name = f"memory · {write.get_attribute('model')}"
            trace_page.wait_for_text(span_name)
            # the table's result column (assessments load after the spans)
            assessed = trace_page.wait_for_text("\nresult\n")
            trace_page.click_text(span_name)  # the writer's call, as a user selects it
            # its raw output, as the span panel shows it (pretty-printed: compared without spaces)
            raw_shown = "".join(trace_page.wait_for_text("Outputs").split())
            deadline = 30
            while "".join(raw.split()) not in raw_shown and deadline > 0:
                time.sleep(0.5)
                deadline -= 0.5
                raw_shown = "".join(trace_page.text().split())
        prompts_page = rendered(f"{base}#/experiments/{exp}/prompts")
        default_prompts = rendered(f"{base}#/experiments/0/prompts")  # MLflow's Default
    text = html.unescape(page)
    # the trace itself is open, not only the list (whose columns preview the same words): its
    # span tree names the turns and the writes
    assert "turn 1" in text and "memory write" in text, "the trace's spans are not shown"
    assert said in text
    assert label in text
    # the writer's model calls are in the trace's span tree (their raw output: the API, above)
    assert f"memory · {writes[0].get_attribute('model')}" in text
    shown = html.unescape(assessed)
    # the questions' results are assessments: the Traces table has a column for them, to
    # filter and compare by
    assert "\nresult\n" in shown  # the column's header
    assert "question 1 · " in shown  # the probed trace is open: its questions are spans
    assert "".join(raw.split()) in raw_shown, "the writer call's raw output is not shown"
    # each question's result is in the trace's row of the result column
    assert any(f"\n{value}\n" in shown for value in results)
    assert prompt in html.unescape(prompts_page)
    # listed under its own experiment only (MLflow alone linked it to Default)
    assert "Prompts" in default_prompts and prompt not in html.unescape(default_prompts)
