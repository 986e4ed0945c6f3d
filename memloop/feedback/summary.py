"""Episodic feedback summaries handed to an evolver, in four modes (pure, deterministic).

- none:          {} (no evolution)
- question_only: each question without choices, with the memories retrieved to answer it
- complete:      each question with lettered choices, the assistant's pick, the ground truth and
                 the retrieved memories, plus the user-state updates revealed in the period(s)
                 (the paper's Appendix C.7 format; the assistant's letter is not off by one)
- diagnostic:    complete + each question's failure class and the state-query answers against
                 the truth, and (several users) the state accuracy over all of their questions

With the episodes' period records, complete and diagnostic summaries also show the state reads
(what the objective scores): per variable kind believed vs true and each wrong pair's named write
failure, with counts (feedback/write_failures.py).

An optimizer gets the summary of several users within a size budget as a `FeedbackSummary`
(`budgeted_summary`): whole users and whole questions enter in a fixed priority until the next
would not fit; what is left out is listed, never a cut JSON. A smaller budget later
(`FeedbackSummary.fit`) drops whole questions again, the last to enter first. The summary also
holds the private values of the users it summarizes (every state value of every period, their
names and profile fields), the values no evolved prompt may carry.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memloop.core.leaks import Redactor
from memloop.environment.data import UserItem
from memloop.feedback.objective import Mode
from memloop.feedback.records import LETTERS, QuestionRecord, option_text
from memloop.feedback.scoring import classify_failure, index_records, state_accuracy

FeedbackMode = Mode  # the name configs use
MODES: tuple[str, ...] = tuple(m.value for m in Mode)


def _letter(index: int | None) -> str | None:
    return None if index is None else LETTERS[index]


def _question_text(r: QuestionRecord, with_choices: bool) -> str:
    text = f"Question: {r.question};"
    if with_choices:
        text += "".join(f"\n{option_text(i, c)};" for i, c in enumerate(r.choices))
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
    if not Mode(mode).evolves:
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


def revealed_values(summary: Any) -> set[str]:
    """The users' own state values in a feedback summary, at any depth.

    These are complete mode's `user_information_updates` and diagnostic mode's `actual` values.
    """
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "user_information_updates" and isinstance(value, dict):
                    found.update(str(v) for v in value.values() if v is not None)
                elif key == "actual" and isinstance(value, (str, int, float)):
                    found.add(str(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(summary)
    return found


# ---------------------------------------------------------------- several users, within a budget


def render_summary(summary: dict[str, Any]) -> str:
    """The text an evolver reads; the budget is measured on exactly this."""
    return json.dumps(summary, ensure_ascii=False, indent=1)


def select_questions(records: Iterable[QuestionRecord], mode: str) -> list[QuestionRecord]:
    """`records` in the order they enter a summary.

    Wrong answers first when the mode reveals correctness anyway, otherwise the latest periods
    first (so the order leaks nothing); then latest period, user, question.
    """
    reveals = mode in ("complete", "diagnostic")
    return sorted(
        records,
        key=lambda r: (r.correct if reveals else False, -r.period, r.user_id, r.question_index),
    )


def latest_updates(item: UserItem, periods: int) -> dict[str, str]:
    """{variable: its value at the end} for every variable revealed in the first `periods`."""
    revealed = {v for p in range(periods) for exposed in item.exposed_values(p) for v in exposed}
    state = item.state_at(periods - 1)
    return {v: state[v] for v in sorted(revealed)}


class Omitted(BaseModel):
    """A question the summary left out, and why."""

    user: str
    period: int
    question: int
    reason: Literal["max_questions", "max_chars"]


class SummaryReport(BaseModel):
    """What a budgeted summary holds and what it left out."""

    max_chars: int
    max_questions: int
    chars: int = 0
    questions: int = 0
    users: int = 0
    omitted: list[Omitted] = Field(default_factory=list)


class Entered(BaseModel):
    """A question of a summary: whose, which period, which question."""

    model_config = ConfigDict(frozen=True)

    user: str
    period: int
    question: int


class FeedbackSummary(BaseModel):
    """The feedback an optimizer reads, the budget it was made under, and what it must not leak.

    `header` and `users` are the summary an evolver reads (`data()`, rendered by `render()`);
    `entered` lists its questions in the order they entered (the budget's priority), so that
    `fit` can drop the last ones first; `private` are the values of the summarized users that no
    evolved prompt may name (feedback mode none and question_only included: the retrieved
    memories a summary shows hold them too).
    """

    model_config = ConfigDict(extra="forbid")

    mode: Mode
    header: dict[str, Any] = Field(default_factory=dict)
    users: list[dict[str, Any]] = Field(default_factory=list)
    entered: list[Entered] = Field(default_factory=list)
    report: SummaryReport | None = None
    private: list[str] = Field(default_factory=list)  # sorted, unique

    @classmethod
    def from_data(
        cls, data: dict[str, Any], mode: str = "complete", private: Iterable[str] = ()
    ) -> FeedbackSummary:
        """A summary from its plain form (a summary.json written before this model, a test's).

        Without an entry order, `fit` drops the last question of the last user first.
        """
        rest = {k: v for k, v in data.items() if k != "users"}
        users = list(data.get("users", []))
        if "question_answer_history" in rest:  # a single user's summary, as `summarize` gives it
            users, rest = [dict(data)], {}
        private = set(private) | revealed_values(data)
        return cls(mode=Mode(mode), header=rest, users=users, private=sorted(private))

    @classmethod
    def load(cls, text: str) -> FeedbackSummary:
        """A stored summary.json: this model's dump, or the plain form of older runs."""
        data = json.loads(text)
        if isinstance(data, dict) and "mode" in data and "users" in data and "entered" in data:
            return cls.model_validate(data)
        return cls.from_data(data)

    @classmethod
    def join(
        cls, parts: Iterable[tuple[FeedbackSummary, dict[str, Any]]], mode: Mode
    ) -> FeedbackSummary:
        """One summary of several (per-user) summaries, in order.

        Each part's users, with the part's header and the given notes moved into every block.
        """
        users: list[dict[str, Any]] = []
        entered: list[Entered] = []
        private: set[str] = set()
        omitted: list[Omitted] = []
        for part, notes in parts:
            users += [{**part.header, **block, **notes} for block in part.users]
            entered += part.entered
            private |= set(part.private)
            omitted += part.report.omitted if part.report else []
        report = SummaryReport(
            max_chars=0, max_questions=0, users=len(users), questions=len(entered), omitted=omitted
        )
        joined = cls(
            mode=mode, users=users, entered=entered, report=report, private=sorted(private)
        )
        joined.report.chars = len(joined.render())  # type: ignore[union-attr]
        return joined

    def data(self) -> dict[str, Any]:
        """The summary as the optimizer reads it ({} when the mode shows nothing)."""
        if not Mode(self.mode).evolves:
            return {}
        return {**self.header, "users": self.users}

    def render(self) -> str:
        """The text an optimizer reads; budgets are measured on exactly this."""
        return render_summary(self.data())

    def questions(self) -> int:
        return sum(len(u.get("question_answer_history", [])) for u in self.users)

    def fit(self, max_chars: int) -> FeedbackSummary:
        """This summary within `max_chars` rendered characters, whole questions dropped.

        The last questions to enter go first (recorded in the report as `max_chars`); a user
        left without questions goes too. Never a cut text: when even no question fits, the
        result holds no user.
        """
        if len(self.render()) <= max_chars:
            return self
        users = [dict(u) for u in self.users]
        for u in users:
            u["question_answer_history"] = list(u.get("question_answer_history", []))
        order = list(self.entered) or [
            Entered(user=u.get("user", ""), period=0, question=i)
            for u in users
            for i in range(len(u["question_answer_history"]))
        ]
        report = (self.report or SummaryReport(max_chars=max_chars, max_questions=0)).model_copy(
            deep=True
        )
        report.max_chars = max_chars
        header = dict(self.header)
        if "state_reads" in header:  # at most half the budget, as budgeted_summary leaves it
            from memloop.feedback.write_failures import fit_block

            fitted = fit_block(header.pop("state_reads"), max_chars // 2)
            if fitted is not None:
                header["state_reads"] = fitted
        out = self.model_copy(
            update={"users": users, "entered": order, "report": report, "header": header}
        )
        while out.entered and len(out.render()) > max_chars:
            last = out.entered.pop()
            mine = sorted(
                (e.period, e.question) for e in out.entered + [last] if e.user == last.user
            )
            block = next(u for u in users if u.get("user", "") == last.user)
            del block["question_answer_history"][mine.index((last.period, last.question))]
            if not block["question_answer_history"]:
                users.remove(block)
            report.omitted.append(Omitted(**last.model_dump(), reason="max_chars"))
        if len(out.render()) > max_chars:
            users.clear()
        report.questions, report.users = out.questions(), len(users)
        report.chars = len(out.render())
        return out


def budgeted_summary(
    records: Iterable[QuestionRecord],
    mode: str,
    updates: dict[str, dict[str, str]],
    *,
    max_questions: int,
    max_chars: int,
    history: Iterable[QuestionRecord] | None = None,
    private: Iterable[str] = (),
    failures: dict[str, Any] | None = None,
    redactor: Redactor | None = None,
) -> FeedbackSummary:
    """The feedback summary of several users within `max_questions` and `max_chars`.

    Its data is {"users": [{"user": id, **summarize(...)}, ...]} (plus "state_accuracy" in
    diagnostic mode); its rendering is at most `max_chars` characters. `private`: the values of
    these users no evolved prompt may name (`UserItem.private_values`); the values the summary
    shows are added to them. Questions are taken in
    `select_questions` order; each enters whole, together with its user's block (id and
    `updates[user]`) the first time one of that user's questions enters, if the result still
    fits. A question that does not fit is skipped (a later, smaller one may fit) and recorded in
    the report. `history` (default: `records`) supplies the earlier periods for the diagnosis.
    `failures` (feedback/write_failures.py `failure_block`): the state reads, believed vs true,
    with each wrong pair's named write failure, grouped by kind and failure; shown in the header
    in every mode that shows answers (complete, diagnostic). `redactor` (core/leaks.py): every
    private value the summary would show becomes its typed placeholder before the budget is
    measured; the optimizer reads only that.
    """
    records = list(records)
    report = SummaryReport(max_chars=max_chars, max_questions=max_questions)
    private = set(private) | {v for u in updates.values() for v in u.values() if v is not None}
    private |= {str(v) for r in records for v in r.true_values.values() if v is not None}
    if not Mode(mode).evolves:
        return FeedbackSummary(mode=Mode(mode), report=report, private=sorted(private))
    history = list(history) if history is not None else records
    chosen: dict[str, list[QuestionRecord]] = {}

    header: dict[str, Any] = {}
    if mode == "diagnostic" and records:
        state = state_accuracy(records)
        chance = "unknown" if state.chance is None else f"{state.chance:.2f}"
        header["state_accuracy"] = (
            f"{state.accuracy:.2f} of {state.pairs} believed values right (chance {chance})"
        )
    if failures is not None and mode in ("complete", "diagnostic"):
        from memloop.feedback.write_failures import fit_block

        fitted = fit_block(failures, max_chars // 2)  # at most half the budget: questions too
        if fitted is not None:
            header["state_reads"] = fitted
    if failures is not None:
        from memloop.feedback.write_failures import block_values

        private |= block_values(failures)

    def build(selection: dict[str, list[QuestionRecord]]) -> dict[str, Any]:
        data = {
            **header,
            "users": [
                {
                    "user": uid,
                    **summarize(mine, mode, updates.get(uid, {}), all_records=history),
                }
                for uid, mine in sorted(selection.items())
            ],
        }
        return redactor.data(data) if redactor else data

    summary = build(chosen)
    entered: list[Entered] = []
    for r in select_questions(records, mode):
        where = Entered(user=r.user_id, period=r.period, question=r.question_index)
        if report.questions >= max_questions:
            report.omitted.append(Omitted(**where.model_dump(), reason="max_questions"))
            continue
        trial = {**chosen, r.user_id: [*chosen.get(r.user_id, []), r]}
        candidate = build(trial)
        if len(render_summary(candidate)) > max_chars:
            report.omitted.append(Omitted(**where.model_dump(), reason="max_chars"))
            continue
        chosen, summary = trial, candidate
        entered.append(where)
        report.questions += 1
    report.chars = len(render_summary(summary))
    report.users = len(chosen)
    return FeedbackSummary(
        mode=Mode(mode),
        header={k: v for k, v in summary.items() if k != "users"},
        users=summary["users"],
        entered=entered,
        report=report,
        private=sorted(private),
    )


def episode_summary(
    items: list[UserItem],
    records: Iterable[QuestionRecord],
    mode: str,
    *,
    max_questions: int,
    max_chars: int,
    periods: int | None = None,
    private: Iterable[str] = (),
    failures: dict[str, Any] | None = None,
    redactor: Redactor | None = None,
) -> FeedbackSummary:
    """The budgeted summary of whole episodes (the first `periods` of each) of `items`.

    Its private values are `items`' own (`UserItem.private_values`) and `private` (other users');
    each is shown as its typed placeholder (`UserItem.placeholders`, and `redactor`'s for the
    other users), never as written.
    """
    updates = {
        item.id: latest_updates(item, min(periods or item.num_periods, item.num_periods))
        for item in items
    }
    return budgeted_summary(
        records,
        mode,
        updates,
        max_questions=max_questions,
        max_chars=max_chars,
        private=[*private, *(v for item in items for v in item.private_values())],
        failures=failures,
        redactor=redactor or placeholders_of(items),
    )


def placeholders_of(items: Iterable[UserItem]) -> Redactor:
    """The redactor of `items`' private values (`UserItem.placeholders`)."""
    placeholders: dict[str, str] = {}
    for item in items:
        for value, placeholder in item.placeholders().items():
            placeholders.setdefault(value, placeholder)
    return Redactor(placeholders)
