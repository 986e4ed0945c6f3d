"""Pure scoring, diagnosis and summaries over hand-built records: every edge case of the
issue, plus a property test of the partition identity write + read + utilization = 1 - overall."""

from __future__ import annotations

import json
import math
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memloop.feedback.records import PeriodRecall, QuestionRecord, RecallClaim
from memloop.feedback.scoring import (
    MemoryScoreUndefined,
    classify_failure,
    factual_recall,
    index_records,
    score,
    score_by_period,
)
from memloop.feedback.summary import summarize


def rec(
    period=0,
    q=0,
    user="u",
    *,
    chosen=0,
    gold=0,
    ub=0,
    n=4,
    truth=None,
    believed=None,
    write_periods=None,
    json_error=None,
    memories=(),
):
    truth = truth or {"city": "lisbon"}
    believed = believed if believed is not None else dict(truth)
    return QuestionRecord(
        user_id=user,
        period=period,
        question_index=q,
        question=f"question {q}?",
        choices=[f"answer {i}" for i in range(n)],
        required_info=list(truth),
        gold_index=gold,
        true_values=truth,
        write_periods=write_periods or {v: 0 for v in truth},
        chosen_index=None if json_error else chosen,
        json_error=json_error,
        retrieved_memories=list(memories),
        state_answers=believed,
        ub_chosen_index=ub,
    )


def test_all_right_no_failures():
    s = score([rec(), rec(q=1)])
    assert s.overall == 1.0 and s.upper_bound == 1.0 and s.random == 0.25
    assert s.memory_score == 1.0
    assert s.diagnosis.model_dump() == {"write": 0.0, "read": 0.0, "utilization": 0.0}


def test_upper_bound_equal_to_random_gives_null_memory_score_with_warning():
    # 2 questions x 2 choices: random 0.5; UB right on one of two -> 0.5 = random
    records = [rec(n=2, ub=0), rec(q=1, n=2, ub=1)]
    with pytest.warns(MemoryScoreUndefined):
        s = score(records)
    assert s.memory_score is None and s.memory_score_undefined == 1
    assert not math.isinf(s.overall)


def test_memory_score_averaged_over_defined_cells_only():
    good = [rec(user="a"), rec(user="a", q=1, chosen=1)]  # overall .5, ub 1
    degenerate = [rec(user="b", n=2, ub=1), rec(user="b", q=1, n=2, ub=0)]  # ub .5 = random
    with pytest.warns(MemoryScoreUndefined):
        s = score(good + degenerate)
    assert s.memory_score == pytest.approx((0.5 - 0.25) / (1 - 0.25))
    assert s.memory_score_undefined == 1


def test_json_error_is_wrong_and_counted_never_random():
    r = rec(json_error="not JSON: Expecting value at char 0", believed={"city": "lisbon"})
    s = score([r, rec(q=1)])
    assert r.chosen_index is None and not r.correct
    assert s.json_errors == 1 and s.overall == 0.5
    assert classify_failure(r, index_records([r])) == "utilization"


def test_utilization_failure_when_state_known():
    r = rec(chosen=2)
    assert classify_failure(r, index_records([r])) == "utilization"


def test_error_in_same_period_as_write_is_write_failure():
    r = rec(
        period=2,
        chosen=1,
        truth={"city": "oslo"},
        believed={"city": "lisbon"},
        write_periods={"city": 2},
    )
    assert classify_failure(r, index_records([r])) == "write"


def test_read_failure_when_right_at_write_time():
    at_write = rec(period=1, truth={"city": "oslo"}, write_periods={"city": 1})
    later = rec(
        period=3,
        chosen=1,
        truth={"city": "oslo"},
        believed={"city": "lisbon"},
        write_periods={"city": 1},
    )
    lookup = index_records([at_write, later])
    assert classify_failure(later, lookup) == "read"
    assert classify_failure(at_write, lookup) is None


def test_several_wrong_variables_one_failure_each_answer():
    truth = {"city": "oslo", "diet": "vegan"}
    at_write = rec(
        period=1,
        truth=truth,
        believed={"city": "oslo", "diet": "omnivore"},
        write_periods={"city": 1, "diet": 1},
    )
    later = rec(
        period=2,
        chosen=3,
        truth=truth,
        believed={"city": "rome", "diet": "omnivore"},
        write_periods={"city": 1, "diet": 1},
    )
    # city was right at write time (read), diet wrong at write time (write): write wins, once
    assert classify_failure(later, index_records([at_write, later])) == "write"
    s = score([at_write, later])
    assert s.diagnosis.write + s.diagnosis.read + s.diagnosis.utilization == pytest.approx(
        1 - s.overall
    )


def test_unparsed_state_query_counts_as_wrong_belief():
    r = rec(chosen=1, believed={"city": None})
    assert classify_failure(r, index_records([r])) == "write"


def test_score_by_period_and_recall():
    records = [rec(period=0), rec(period=1, chosen=1)]
    by_p = score_by_period(records)
    assert by_p[0].overall == 1.0 and by_p[1].overall == 0.0
    recalls = [
        PeriodRecall(
            user_id="u",
            period=0,
            claims=[
                RecallClaim(variable="a", value="x", supported=True),
                RecallClaim(variable="b", value="y", supported=False),
                RecallClaim(variable="c", value="z", supported=None),
            ],
        )
    ]
    assert factual_recall(recalls) == pytest.approx(1 / 3)
    assert factual_recall([]) is None


def test_empty_records_raise():
    with pytest.raises(ValueError):
        score([])


# ---------------------------------------------------------------- summaries


def test_summaries_in_every_mode_are_deterministic_json():
    records = [rec(chosen=1, gold=0, memories=["city: lisbon"]), rec(q=1)]
    updates = {"city": "lisbon"}
    assert summarize(records, "none") == {}
    qo = summarize(records, "question_only", updates)
    assert qo == {
        "question_answer_history": [
            {"question": "Question: question 0?;", "retrieved_memories": ["city: lisbon"]},
            {"question": "Question: question 1?;", "retrieved_memories": []},
        ]
    }
    complete = summarize(records, "complete", updates)
    first = complete["question_answer_history"][0]
    assert first["assistant_response"] == "B" and first["ground_truth"] == "A"  # 0-based, no shift
    assert first["question"].startswith("Question: question 0?;\n(A) answer 0;\n(B) answer 1;")
    assert complete["user_information_updates"] == updates
    diag = summarize(records, "diagnostic", updates)
    assert diag["question_answer_history"][0]["failure"] == "utilization"
    assert diag["question_answer_history"][1]["failure"] == "none"
    assert diag["question_answer_history"][0]["state_query"] == {
        "city": {"believed": "lisbon", "actual": "lisbon"}
    }
    assert json.dumps(summarize(list(reversed(records)), "diagnostic", updates)) == json.dumps(diag)
    with pytest.raises(ValueError, match="unknown feedback mode"):
        summarize(records, "everything")


def test_summary_shows_unparseable_pick():
    s = summarize([rec(json_error="not JSON")], "complete")
    assert s["question_answer_history"][0]["assistant_response"].startswith("(unparseable")


# ---------------------------------------------------------------- property: the partition

VALUES = ["a", "b", "c"]


@st.composite
def episodes(draw):
    n_periods = draw(st.integers(1, 4))
    n_questions = draw(st.integers(1, 3))
    variables = ["x", "y"]
    # a trajectory of true values and the period each value was set
    truth, set_at = [], []
    current = {v: draw(st.sampled_from(VALUES)) for v in variables}
    since = {v: 0 for v in variables}
    for p in range(n_periods):
        if p:
            for v in variables:
                if draw(st.booleans()):
                    current[v] = draw(st.sampled_from([x for x in VALUES if x != current[v]]))
                    since[v] = p
        truth.append(dict(current))
        set_at.append(dict(since))
    required = [variables[: draw(st.integers(1, 2))] for _ in range(n_questions)]
    sizes = [draw(st.integers(2, 5)) for _ in range(n_questions)]
    records = []
    for p in range(n_periods):
        for q in range(n_questions):
            req, n = required[q], sizes[q]
            json_error = draw(st.booleans()) and draw(st.booleans())
            believed = {v: draw(st.sampled_from(VALUES + [None])) for v in req}
            records.append(
                rec(
                    period=p,
                    q=q,
                    n=n,
                    gold=draw(st.integers(0, n - 1)),
                    chosen=draw(st.integers(0, n - 1)),
                    ub=draw(st.integers(0, n - 1)),
                    truth={v: truth[p][v] for v in req},
                    believed=believed,
                    write_periods={v: set_at[p][v] for v in req},
                    json_error="bad" if json_error else None,
                )
            )
    return records


@settings(max_examples=200, deadline=None)
@given(episodes())
def test_partition_identity(records):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemoryScoreUndefined)
        s = score(records)
        per_period = score_by_period(records)
    d = s.diagnosis
    assert d.write + d.read + d.utilization == pytest.approx(1 - s.overall, abs=1e-12)
    assert min(d.write, d.read, d.utilization) >= 0
    for ps in per_period.values():
        pd = ps.diagnosis
        assert pd.write + pd.read + pd.utilization == pytest.approx(1 - ps.overall, abs=1e-12)
    lookup = index_records(records)
    for r in records:
        assert (classify_failure(r, lookup) is None) == r.correct
