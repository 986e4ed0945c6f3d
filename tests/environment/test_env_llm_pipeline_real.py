"""The LLM generation pipeline on the embedded 0.5B model: 1 user x 1 period x 1 question ends
with either a valid item or a per-step failure report, and no user is silently dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memloop.environment.datafile import load_items
from memloop.environment.llm_pipeline import PipelineConfig, run_pipeline, steps_per_user

pytestmark = pytest.mark.real_model


def test_pipeline_on_embedded_model_gives_valid_item_or_clear_report(local_client, tmp_path: Path):
    config = PipelineConfig(
        users=1, periods=1, questions=1, changes_per_period=2, refine_budget=1, seed=42
    )
    result = run_pipeline(config, tmp_path / "out", local_client)
    report = json.loads(result.report_path.read_text())
    outcome = (
        "valid item"
        if result.items
        else f"failed at {result.failures[0].step}: {result.failures[0].reason}"
    )
    print(
        f"\n[llm pipeline, 0.5B] {outcome}; {result.elapsed_s:.0f}s, {result.usage['total']}, "
        f"failed attempts {result.refinements}, notes {result.notes}"
    )

    assert len(result.items) + len(result.failures) == config.users  # nobody silently dropped
    assert (
        len(report["succeeded"]) + len(report["failed"]) == config.users
        and not report["not_finished"]
    )
    assert result.steps_run + result.steps_skipped <= steps_per_user(config)
    if result.items:
        assert report["status"] == "complete"
        [item] = load_items(result.data_path)  # raises on any validation problem
        assert len(item.periods) == 2 and len(item.qas) == 1
        assert all(s.query.strip() for p in item.periods for s in p.sessions)
    else:
        [failure] = result.failures
        assert report["status"] == "incomplete" and result.data_path is None
        assert not (tmp_path / "out" / "data.json").exists()
        assert failure.step and failure.reason and report["failed"][0]["step"] == failure.step
        finished = {p.stem for p in (tmp_path / "out" / "raw").glob("*/*.json")}
        assert failure.step not in finished  # the failed step left no file, so a rerun redoes it
    assert result.usage["total"]["calls"] > 0
