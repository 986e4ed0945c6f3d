"""Episodic feedback summaries handed to an evolver, in four modes (pure, deterministic).

- none:          {} (no evolution)
- question_only: each question without choices, with the memories retrieved to answer it
- complete:      each question with lettered choices, the assistant's pick, the ground truth and
                 the retrieved memories, plus the user-state updates revealed in the period(s)
                 (the paper's Appendix C.7 format; the assistant's letter is not off by one)
- diagnostic:    complete + each question's failure class and the state-query answers against
                 the truth
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from memloop.feedback.records import QuestionRecord
from memloop.feedback.scoring import classify_failure, index_records

FeedbackMode = Literal["none", "question_only", "complete", "diagnostic"]
MODES: tuple[str, ...] = ("none", "question_only", "complete", "diagnostic")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _letter(index: int | None) -> str | None:
    return None if index is None else LETTERS[index]


def _question_text(r: QuestionRecord, with_choices: bool) -> str:
    text = f"Question: {r.question};"
    if with_choices:
        text += "".join(f"\n({LETTERS[i]}) {c};" for i, c in enumerate(r.choices))
    return text


def summarize(
    records: Iterable[QuestionRecord],
    mode: str,
    updates: dict[str, str] | None = None,
    all_records: Iterable[QuestionRecord] | None = None,
) -> dict[str, Any]:
    """The feedback summary of `records` (typically one period's, or one cycle's) in `mode`.

    `updates` = {variable: new value} revealed in the same span; `all_records` supplies earlier
    periods for the diagnosis (defaults to `records`).
    """
    if mode not in MODES:
        raise ValueError(f"unknown feedback mode {mode!r}; use one of {', '.join(MODES)}")
    records = sorted(records, key=lambda r: (r.user_id, r.period, r.question_index))
    if mode == "none":
        return {}
    if mode == "question_only":
        return {
            "question_answer_history": [
                {
                    "question": _question_text(r, with_choices=False),
                    "retrieved_memories": list(r.retrieved_memories),
                }
                for r in records
            ]
        }
    lookup = index_records(all_records if all_records is not None else records)
    history = []
    for r in records:
        entry: dict[str, Any] = {
            "question": _question_text(r, with_choices=True),
            "assistant_response": _letter(r.chosen_index) or f"(unparseable: {r.json_error})",
            "ground_truth": _letter(r.gold_index),
            "retrieved_memories": list(r.retrieved_memories),
        }
        if mode == "diagnostic":
            entry["failure"] = classify_failure(r, lookup) or "none"
            entry["state_query"] = {
                v: {"believed": r.state_answers.get(v), "actual": r.true_values[v]}
                for v in r.required_info
            }
        history.append(entry)
    return {
        "question_answer_history": history,
        "user_information_updates": dict(sorted((updates or {}).items())),
    }
