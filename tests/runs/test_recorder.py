"""runs/recorder.py on a real sqlite MLflow store: a run is opened, logged to and closed in one
`with` block, with the status its block's end gives it."""

from __future__ import annotations

import pytest

from memloop.core import interrupt
from memloop.runs import tracker
from memloop.runs.recorder import end_status, recording
from memloop.runs.spec import RunSpec


def spec(seed: int = 0) -> RunSpec:
    return RunSpec(
        kind="import",
        experiment="rec",
        environment={"amemgym_run": "r", "format": "f"},
        users={"imported": ["u1"]},
        policy={},
        endpoints={},
        evaluation={"periods": 1},
        seed=seed,
    )


@pytest.fixture
def uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/mlflow.db"


def status(uri: str, run_id: str) -> str:
    return tracker.client(uri).get_run(run_id).info.status


def test_a_block_that_ends_finishes_its_run_and_a_second_block_resumes_it(uri):
    with recording(uri, "rec", spec(), "first", tags={"memloop.x": "1"}) as rec:
        assert status(uri, rec.run_id) == "RUNNING"
        rec.metrics({"val/score": 0.25}, step=0)
        rec.params({"headline.n": "3"})
        rec.text("hello", "notes/a.txt")
    assert status(uri, rec.run_id) == "FINISHED"
    with recording(uri, "rec", spec(), "first") as again:
        assert (again.run_id, again.resumed, rec.resumed) == (rec.run_id, True, False)
        again.params({"headline.n": "4"})  # logged once: the first value stays
        again.metrics({"val/score": 0.5}, step=1)
    run = tracker.client(uri).get_run(rec.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["headline.n"] == "3"
    assert run.data.tags["memloop.x"] == "1"
    assert run.data.metrics["val/score"] == 0.5
    assert tracker.artifact_text(tracker.client(uri), rec.run_id, "notes/a.txt") == "hello"


def test_an_error_fails_the_run_and_a_ctrl_c_kills_it(uri):
    with pytest.raises(ValueError, match="broken"):
        with recording(uri, "rec", spec(1), "broken") as failed:
            raise ValueError("broken")
    with pytest.raises(KeyboardInterrupt):
        with recording(uri, "rec", spec(2), "stopped") as killed:
            raise KeyboardInterrupt
    assert (status(uri, failed.run_id), status(uri, killed.run_id)) == ("FAILED", "KILLED")


def test_a_ctrl_c_wrapped_in_a_worker_threads_error_still_kills(monkeypatch):
    assert end_status(RuntimeError("x")) == "FAILED"
    monkeypatch.setattr(interrupt, "_STOP", type(interrupt._STOP)())
    interrupt.interrupt()
    assert end_status(RuntimeError("x")) == "KILLED"


def test_a_child_run_names_its_parent_and_ends_on_its_own(uri):
    with recording(uri, "rec", spec(3), "study") as parent:
        with recording(uri, "rec", spec(4), "trial", parent=parent) as child:
            pass
        assert (status(uri, child.run_id), status(uri, parent.run_id)) == ("FINISHED", "RUNNING")
    run = tracker.client(uri).get_run(child.run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent.run_id
    assert run.info.experiment_id == parent.experiment_id
