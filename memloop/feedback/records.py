"""The evaluation records: one per (user, period, question).

They are built by the probes and consumed by the pure scoring, diagnosis and summary functions.
SCORER_VERSION changes whenever a definition does, so MLflow runs stay comparable.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

SCORER_VERSION = "3"
# 2: state accuracy, the no-memory control, the memory score as one ratio over all questions,
#    the `format` failure class, factual recall on written memory over the whole episode so far.
# 3: the state query reads written memory only (no raw buffer, no recent turns); the share of
#    state pairs still raw only at probe time and the factual-recall ceiling.


LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # an option's letter: the probes', summaries' and traces'


def option_text(index: int, text: str) -> str:
    """Option `index` as the summaries and traces show it: `(C) text`.

    Never `3. text`: Markdown (MLflow's trace view) renumbers such a line `1. text`.
    """
    return f"({LETTERS[index]}) {text}"


class QuestionRecord(BaseModel):
    """What the policy answered to one evaluation question after one period, and the truth."""

    user_id: str
    period: int
    question_index: int
    question: str
    choices: list[str]  # answer texts, in the order shown (1-based in prompts)
    required_info: list[str]
    gold_index: int  # 0-based index of the right choice
    true_values: dict[str, str]  # the required variables' values at this period
    write_periods: dict[str, int]  # per required variable: period its value was set
    # the multiple-choice answer through policy.answer
    chosen_index: int | None = None  # 0-based; None when the answer did not parse
    json_error: str | None = None
    raw_response: str = ""
    retrieved_memories: list[str] = Field(default_factory=list)
    # the state query: the policy's belief of each required variable's current value
    state_answers: dict[str, str | None] = Field(default_factory=dict)
    state_json_error: str | None = None
    # with the letter read: P(true value) per required variable (None: no probability)
    state_probs: dict[str, float | None] = Field(default_factory=dict)
    # the upper bound: the policy's LLM handed the true required values, for this question
    ub_chosen_index: int | None = None
    ub_json_error: str | None = None
    # number of possible values of each required variable (the state query's chance level)
    state_choices: dict[str, int] = Field(default_factory=dict)
    # the no-memory control: the policy's LLM with no conversation, no memory and no facts
    nm_chosen_index: int | None = None
    nm_json_error: str | None = None

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """The record's fields; `state_probs` only when set (the letter read).

        So the records of the JSON read stay the ones older runs wrote
        (tests/feedback/test_same_records.py).
        """
        data = super().model_dump(**kwargs)
        if not self.state_probs:
            data.pop("state_probs", None)
        return data

    @property
    def n_choices(self) -> int:
        return len(self.choices)

    @property
    def correct(self) -> bool:
        return self.chosen_index is not None and self.chosen_index == self.gold_index

    @property
    def ub_correct(self) -> bool:
        return self.ub_chosen_index is not None and self.ub_chosen_index == self.gold_index

    @property
    def nm_correct(self) -> bool:
        return self.nm_chosen_index is not None and self.nm_chosen_index == self.gold_index

    @property
    def unparsed(self) -> bool:
        """The multiple-choice answer did not parse (a `format` failure, never a memory one)."""
        return self.chosen_index is None

    def variable_right(self, variable: str) -> bool:
        return self.state_answers.get(variable) == self.true_values[variable]


class StateRead(BaseModel):
    """One state variable read from written memory by the letter read (`state_read: letters`).

    The policy answered one token to a question listing the variable's values as lettered
    options; `probs` are the option letters' probabilities among that token's top alternatives,
    renormalized over the letters (feedback/probes.py `option_probabilities`), in the order of
    `choices`. `picked` is the most probable option (or, without probabilities, the letter the
    text starts with); `prob_true` the probability of the true value. `error` says why a field
    is None.
    """

    user_id: str
    period: int
    variable: str
    true_value: str
    choices: list[str]
    write_period: int  # the period the true value was set in
    picked: str | None = None
    probs: list[float] | None = None
    prob_true: float | None = None
    letter_mass: float | None = None  # the top alternatives' probability on option letters
    text: str = ""
    error: str | None = None

    @property
    def right(self) -> bool:
        return self.picked is not None and self.picked == self.true_value


def state_reads(probes: dict[str, Any]) -> list[StateRead]:
    """The letter reads of one period's probes ([] for the JSON state query)."""
    return [StateRead.model_validate(r) for r in probes.get("state_reads", [])]


class RecallClaim(BaseModel):
    variable: str
    value: str
    supported: bool | None  # None: the checker's answer did not parse
    period: int = 0  # the period the user last revealed this value in


class PeriodRecall(BaseModel):
    """Factual recall for one (user, period), judged on the written memory at the period's end.

    The claims are every state the user revealed so far (each variable's latest revealed value),
    judged against `memory_view()` (written memory only, never the raw message buffer). The
    claims revealed in this period give the per-period figure; those of a user's last period give
    the episode's factual recall (paper App. E: the new states of the episode against the memory
    at its end).
    """

    user_id: str
    period: int
    claims: list[RecallClaim] = Field(default_factory=list)
    json_error: str | None = None

    def new_claims(self) -> list[RecallClaim]:
        """The claims revealed in this period."""
        return [c for c in self.claims if c.period == self.period]

    @property
    def supported(self) -> int:
        return sum(1 for c in self.claims if c.supported)


def question_records(probes: dict[str, Any]) -> list[QuestionRecord]:
    return [QuestionRecord.model_validate(q) for q in probes.get("questions", [])]


def period_recall(probes: dict[str, Any]) -> PeriodRecall | None:
    data = probes.get("recall")
    return None if data is None else PeriodRecall.model_validate(data)
