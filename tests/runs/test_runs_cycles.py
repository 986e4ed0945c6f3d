"""`CycleRecord.of` and `add_step`: the one way every search builds a cycle's record."""

from __future__ import annotations

from typing import Any

from memloop.feedback.evaluate import EvaluationResult
from memloop.runs.cycles import CycleRecord, EvolveStep


def metrics(users: int, score: float, usage: dict[str, int], cost: dict[str, float]) -> dict:
    return {
        "users": users,
        "memory_score": score,
        "overall": 0.5,
        "factual_recall": None,
        "state_accuracy": score,
        "state_chance": 0.25,
        "no_memory": 0.2,
        "memory_gain": 0.3,
        "memory_score_undefined_periods": 0,
        "diagnosis": {"write": 0.1, "read": 0.2, "utilization": 0.3, "format": 0.0},
        "usage": usage,
        "cost_usd": cost,
    }


def evaluated(*args: Any) -> EvaluationResult:
    return EvaluationResult(metrics=metrics(*args), episodes=[])


def test_a_record_counts_every_split_s_tokens_and_dollars_per_component():
    results = {
        "val": evaluated(2, 0.5, {"agent": 100, "user_sim": 40}, {"agent": 0.25}),
        "test": evaluated(3, 0.75, {"agent": 30}, {}),
    }
    record = CycleRecord.of(4, results, seconds=1.5, extra={"x": 2.0})
    assert list(record.splits) == ["val", "test"]
    assert record.splits["test"].users == 3 and record.splits["val"].memory_score == 0.5
    assert record.tokens == {"agent": 130, "user_sim": 40}
    assert record.cost_usd == {"agent": 0.25}
    assert (record.cycle, record.seconds, record.extra, record.leaks_rejected) == (
        4,
        1.5,
        {"x": 2.0},
        0,
    )


def test_training_metrics_from_elsewhere_go_first_and_add_their_work():
    held = {"val": evaluated(1, 0.5, {"agent": 10}, {"agent": 0.5})}
    train = metrics(2, 0.25, {"agent": 5, "checker": 7}, {"agent": 0.125, "checker": 1.0})
    record = CycleRecord.of(0, held, train=train)
    assert list(record.splits) == ["train", "val"]
    assert record.splits["train"].memory_score == 0.25
    assert record.tokens == {"agent": 15, "checker": 7}
    assert record.cost_usd == {"agent": 0.625, "checker": 1.0}


def test_a_step_adds_the_optimizer_s_work_and_its_refused_leaks():
    record = CycleRecord.of(0, {"val": evaluated(1, 0.5, {"agent": 10}, {"agent": 0.5})})
    record.add_step(EvolveStep(prompts={}, tokens=12, cost_usd=0.25, leaks_rejected=3))
    assert record.tokens == {"agent": 10, "optimizer": 12}
    assert record.cost_usd == {"agent": 0.5, "optimizer": 0.25}
    assert record.leaks_rejected == 3
    unpriced = CycleRecord.of(0, {"val": evaluated(1, 0.5, {}, {})})
    unpriced.add_step(EvolveStep(prompts={}, tokens=4))
    assert unpriced.tokens == {"optimizer": 4} and unpriced.cost_usd == {}
