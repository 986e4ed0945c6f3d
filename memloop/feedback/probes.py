"""The probes run after each period (as the episode runner's probe hook).

They are: every evaluation question as a multiple-choice prompt through `policy.answer` (the
paper's full context: memory and recent raw turns), a state query for its required variables
answered from written memory only (`memory_only=True`: no raw buffer, no recent turns), the upper
bound (the policy's LLM handed the true values), the no-memory control (the policy's LLM with the
question alone: no conversation, memory or facts), and the factual-recall check of every state
revealed so far against `memory_view()` (the written memory).

The upper bound and the no-memory control do not depend on the policy under test, only on its
endpoint, so the response cache shares them across policies; the no-memory prompt does not even
depend on the period, so each question costs one such call per user.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from memloop.core.plugins import accepts_keyword
from memloop.environment.data import UserItem
from memloop.environment.episode import PeriodRecord
from memloop.environment.policy import Policy
from memloop.feedback.records import (
    LETTERS,
    PeriodRecall,
    QuestionRecord,
    RecallClaim,
    StateRead,
)
from memloop.llm.client import ChatClient
from memloop.llm.usage import UsageTracker

MC_PROMPT = (
    "I need your advice: {question}\n"
    "\n"
    "Thinking about what you know of me and my situation as it is right now, "
    "which of these answers fits me best?\n"
    "{options}\n"
    "\n"
    'Reply with a JSON object {{"answer": <number of the best option>}}.'
)

STATE_PROMPT = (
    "From everything I have told you so far, what is my current situation on each of the points "
    "below? For each one, pick the option that is closest to how things are for me now.\n"
    "{points}\n"
    "\n"
    "Reply with a JSON object mapping each point to the option you picked."
)

UB_SYSTEM = "You are a helpful assistant giving personalised advice."
UB_PROMPT = """Here is my current situation:
{facts}

I need your advice: {question}

Which of these answers fits me best?
{options}

Reply with a JSON object {{"answer": <number of the best option>}}."""

NM_PROMPT = """I need your advice: {question}

Which of these answers fits me best?
{options}

Reply with a JSON object {{"answer": <number of the best option>}}."""

STATE_LETTER_PROMPT = (
    "From everything I have told you so far, which option is closest to my current {point} "
    "as things are now?\n"
    "{options}\n"
    "\n"
    "Answer with the letter of one option only."
)
TOP_LOGPROBS = 20  # alternatives asked for the letter token (OpenAI's maximum)


class ProbeSettings(BaseModel):
    """How the state queries read memory (`probes:` in an eval, evolve or tune YAML).

    - `state_read: json` (the default): one query per question for its required variables, a
      JSON object of values; 0/1 scores only.
    - `state_read: letters`: one query per variable, its values as lettered options, answered
      with one token whose top alternatives' log-probabilities give each option's probability
      (renormalized over the option letters): `state_prob` (the mean P(true value)) beside the
      0/1 `state_accuracy` (the most probable option).
    - `state_probes: all` (letters only): every variable of the user's state is read each period,
      not only those the period's questions need: more pairs per user for one call each.

    Unset, `state_read` follows the agent's endpoint in eval, evolve and tune (`probes_for`):
    letters where it returns log-probabilities, else json.
    """

    model_config = ConfigDict(extra="forbid")

    state_read: Literal["json", "letters"] = "json"
    state_probes: Literal["questions", "all"] = "questions"

    @model_validator(mode="after")
    def _all_needs_letters(self) -> ProbeSettings:
        if self.state_probes == "all" and self.state_read != "letters":
            raise ValueError("state_probes: all needs state_read: letters")
        return self

    def spec(self) -> dict[str, str] | None:
        """What a run's identity records: None for the defaults (the keys of older runs stay)."""
        return None if self == ProbeSettings() else self.model_dump()


def probes_for(settings: ProbeSettings, returns_logprobs: bool) -> tuple[ProbeSettings, str | None]:
    """The probe settings a run uses, and why the JSON read when it is chosen by default.

    A `state_read` the run sets is kept. Unset, it is the letter read (state_prob) where the
    agent's endpoint returns log-probabilities (`Endpoint.returns_logprobs`: the embedded model,
    or an endpoint file with `logprobs: true`), else the JSON read with its one-line reason.
    """
    if "state_read" in settings.model_fields_set:
        return settings, None
    if returns_logprobs:
        return settings.model_copy(update={"state_read": "letters"}), None
    return settings, (
        "state reads use the JSON read (0/1 scores, no state_prob): the agent's endpoint does "
        "not declare `logprobs: true`; if the server returns them, set it in the endpoint file "
        "(or give --logprobs with --model)"
    )


def option_probabilities(
    top: list[tuple[str, float]] | None, n: int
) -> tuple[list[float] | None, float | None, str | None]:
    """(P of each of the `n` option letters, the letters' share of the top mass, why None).

    From one token's top alternatives [(token, logprob)]: a token that is an option letter
    (after stripping spaces, e.g. "B" or " B") adds its probability to that option; the sum is
    renormalized over the letters. A letter not among the alternatives gets 0.
    """
    if top is None:
        return None, None, "the endpoint returned no log-probabilities"
    letters = LETTERS[:n]
    mass = [0.0] * n
    total = 0.0
    for token, logprob in top:
        p = math.exp(logprob)
        total += p
        key = token.strip()
        if len(key) == 1 and key in letters:
            mass[letters.index(key)] += p
    found = sum(mass)
    if found <= 0:
        return None, 0.0, f"no option letter among the top {len(top)} tokens"
    return [m / found for m in mass], (found / total if total > 0 else None), None


def read_variable(item: UserItem, period: int, variable: str, policy: Policy) -> StateRead:
    """The letter read of one variable from written memory (`state_read: letters`)."""
    choices = list(item.state_schema[variable])
    options = "\n".join(f"{LETTERS[i]}. {words(c)}" for i, c in enumerate(choices))
    prompt = STATE_LETTER_PROMPT.format(point=words(variable), options=options)
    read = StateRead(
        user_id=item.id,
        period=period,
        variable=variable,
        true_value=item.state_at(period)[variable],
        choices=choices,
        write_period=item.last_set_period(variable, period),
    )
    if accepts_keyword(policy.answer, "top_logprobs"):
        # an optional keyword of the contract (environment/policy.py): passed when taken
        answer = policy.answer(prompt, memory_only=True, top_logprobs=TOP_LOGPROBS)  # type: ignore[call-arg]
        top = getattr(answer, "top_logprobs", None)
        probs, read.letter_mass, read.error = option_probabilities(top, len(choices))
    else:
        answer = policy.answer(prompt, memory_only=True)
        probs, read.error = None, f"policy {policy.name}'s answer takes no top_logprobs"
    read.text = answer.text[:40]
    if probs is not None:
        read.probs = probs
        best = max(range(len(choices)), key=lambda i: (probs[i], -i))
        read.picked = choices[best]
        read.prob_true = probs[choices.index(read.true_value)]
    else:
        first = answer.text.strip()[:1]
        if first and first in LETTERS[: len(choices)]:
            read.picked = choices[LETTERS.index(first)]
    return read


def read_state(
    item: UserItem, period: int, policy: Policy, settings: ProbeSettings
) -> list[StateRead]:
    """The period's letter reads: the questions' variables, or every variable (`all`)."""
    if settings.state_probes == "all":
        variables = sorted(item.state_schema)
    else:
        variables = list(dict.fromkeys(v for qa in item.qas for v in qa.required_info))
    return [read_variable(item, period, v, policy) for v in variables]


def fill_from_reads(record: QuestionRecord, reads: list[StateRead]) -> None:
    """A question's state answers and probabilities from the period's letter reads."""
    by_variable = {r.variable: r for r in reads}
    record.state_answers = {v: by_variable[v].picked for v in record.required_info}
    record.state_probs = {v: by_variable[v].prob_true for v in record.required_info}
    errors = [by_variable[v].error for v in record.required_info if by_variable[v].picked is None]
    record.state_json_error = next((e for e in errors if e), None) if errors else None


RECALL_SYSTEM = "You check claims about a person against notes kept about them."
RECALL_PROMPT = (
    "Notes kept about the user:\n"
    "<notes>\n"
    "{document}\n"
    "</notes>\n"
    "\n"
    "Claims about the user's current situation:\n"
    "{claims}\n"
    "\n"
    'For each numbered claim, answer "yes" if the notes support it (they state or clearly imply '
    'it) and "no" if they do not mention it or say something different. Reply with a JSON object '
    'mapping each claim number to "yes" or "no".'
)


def revealed_states(item: UserItem, period: int) -> dict[str, tuple[str, int]]:
    """{variable: (latest revealed value, period it was revealed in)} up to `period`."""
    latest: dict[str, tuple[str, int]] = {}
    for p in range(period + 1):
        for exposed in item.exposed_values(p):
            for variable, value in exposed.items():
                latest[variable] = (value, p)
    return latest


def words(token: str) -> str:
    return token.replace("_", " ")


def choice_schema(n: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"answer": {"type": "integer", "enum": list(range(1, n + 1))}},
        "required": ["answer"],
        "additionalProperties": False,
    }


def state_schema(variables: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {v: {"type": "string", "enum": list(c)} for v, c in variables.items()},
        "required": list(variables),
        "additionalProperties": False,
    }


def _options(choices: list[str]) -> str:
    return "\n".join(f"{i}. {text}" for i, text in enumerate(choices, start=1))


def _picked(parsed: Any, n: int) -> int | None:
    if (
        isinstance(parsed, dict)
        and isinstance(parsed.get("answer"), int)
        and 1 <= parsed["answer"] <= n
    ):
        return parsed["answer"] - 1
    return None


def base_record(item: UserItem, period: int, q: int) -> QuestionRecord:
    """Question `q` of `item` at `period` with its truth, before any answer (no model call)."""
    qa = item.qas[q]
    return QuestionRecord(
        user_id=item.id,
        period=period,
        question_index=q,
        question=qa.query,
        choices=[c.answer for c in qa.answer_choices],
        required_info=list(qa.required_info),
        gold_index=item.gold_choice_index(q, period),
        true_values=dict(zip(qa.required_info, item.required_state(q, period), strict=True)),
        write_periods={v: item.last_set_period(v, period) for v in qa.required_info},
        state_choices={v: len(item.state_schema[v]) for v in qa.required_info},
    )


def query_state(
    item: UserItem, names: list[str], policy: Policy
) -> tuple[dict[str, Any] | None, str | None]:
    """One state query for the variables `names`: (the parsed answers, or None and why not)."""
    variables = {v: item.state_schema[v] for v in names}
    points = "\n".join(f"- {v}: one of {', '.join(c)}" for v, c in variables.items())
    # written memory only: a value still held raw (not yet written) must not answer it
    sq = policy.answer(
        STATE_PROMPT.format(points=points), schema=state_schema(variables), memory_only=True
    )
    if sq.json_error is None and isinstance(sq.parsed, dict):
        return sq.parsed, None
    return None, sq.json_error or "no JSON object"


def fill_state(record: QuestionRecord, answers: dict[str, Any] | None, error: str | None) -> None:
    """A question's state answers (its required variables) from a state query's result."""
    if answers is None:
        record.state_answers = {v: None for v in record.required_info}
        record.state_json_error = error
    else:
        record.state_answers = {v: answers.get(v) for v in record.required_info}


def ask_state(item: UserItem, q: int, policy: Policy, record: QuestionRecord) -> None:
    """The state query of question `q` (its required variables) into `record`."""
    fill_state(record, *query_state(item, list(item.qas[q].required_info), policy))


def period_reads(
    item: UserItem, period: int, policy: Policy, settings: ProbeSettings
) -> list[StateRead] | None:
    """The period's letter reads (`read_state`), or None with the JSON read (asked per question)."""
    return read_state(item, period, policy, settings) if settings.state_read == "letters" else None


def answer_state(
    item: UserItem, q: int, policy: Policy, record: QuestionRecord, reads: list[StateRead] | None
) -> None:
    """Question `q`'s state answers: its JSON query, or (letter read) the period's `reads`."""
    if reads is None:
        ask_state(item, q, policy, record)
    else:
        fill_from_reads(record, reads)


NOT_ASKED = "not asked: a state-only screening"


@dataclass
class StateProber:
    """A probe hook asking the state queries only, for cheap screening by replay.

    No multiple choice, upper bound, no-memory or recall call: each question's state query, as the
    evaluation asks it (optimize/replay_score.py), read as `settings` say. Its records leave the
    multiple-choice fields unanswered (`json_error` says why); they are never scored as an
    evaluation.
    """

    settings: ProbeSettings = field(default_factory=ProbeSettings)

    def __call__(
        self, item: UserItem, period: int, policy: Policy, record: PeriodRecord
    ) -> dict[str, Any]:
        # one query per question, as the evaluation asks it: one query for all of a period's
        # variables costs a third fewer tokens but, on the embedded 0.5B model, answered 0.47
        # where the evaluation's queries answered 0.64 (benchmarks/README.md): a screen that
        # disagrees with the evaluation is no screen
        reads = period_reads(item, period, policy, self.settings)
        questions = []
        for q in range(len(item.qas)):
            rec = base_record(item, period, q)
            rec.json_error = NOT_ASKED
            answer_state(item, q, policy, rec, reads)
            questions.append(rec.model_dump(mode="json"))
        out: dict[str, Any] = {
            "questions": questions,
            "memory_view": policy.memory_view(),
            "unwritten_messages": policy.unwritten_messages(),
        }
        if reads is not None:
            out["state_reads"] = [r.model_dump(mode="json") for r in reads]
        return out


@dataclass
class Prober:
    """Builds the probe hook.

    `ub_client` is the policy's LLM (its endpoint); `checker_client` judges factual recall
    (None: skip recall).
    """

    ub_client: ChatClient
    checker_client: ChatClient | None = None
    settings: ProbeSettings = field(default_factory=ProbeSettings)

    def for_user(self, usage: UsageTracker) -> Prober:
        """The same prober counting its model calls in `usage` (one user's tracker)."""
        return Prober(
            self.ub_client.fork(usage),
            None if self.checker_client is None else self.checker_client.fork(usage),
            self.settings,
        )

    def __call__(
        self, item: UserItem, period: int, policy: Policy, record: PeriodRecord
    ) -> dict[str, Any]:
        reads = period_reads(item, period, policy, self.settings)
        questions = [
            self.question(item, period, q, policy, reads).model_dump(mode="json")
            for q in range(len(item.qas))
        ]
        memory = policy.memory_view()
        out: dict[str, Any] = {
            "questions": questions,
            "memory_view": memory,
            # which revealed values memory could hold at probe time (feedback.exposure)
            "unwritten_messages": policy.unwritten_messages(),
        }
        if reads is not None:
            out["state_reads"] = [r.model_dump(mode="json") for r in reads]
        if self.checker_client is not None:
            out["recall"] = self.recall(item, period, memory).model_dump(mode="json")
        return out

    def question(
        self,
        item: UserItem,
        period: int,
        q: int,
        policy: Policy,
        reads: list[StateRead] | None = None,
    ) -> QuestionRecord:
        qa = item.qas[q]
        choices = [c.answer for c in qa.answer_choices]
        record = base_record(item, period, q)
        mc = policy.answer(
            MC_PROMPT.format(question=qa.query, options=_options(choices)),
            schema=choice_schema(len(choices)),
        )
        record.raw_response = mc.text
        record.retrieved_memories = list(mc.retrieved_memories)
        record.chosen_index = _picked(mc.parsed, len(choices)) if mc.json_error is None else None
        if record.chosen_index is None:
            record.json_error = mc.json_error or f"answer out of range: {mc.text[:80]!r}"

        answer_state(item, q, policy, record, reads)

        facts = "\n".join(f"- {words(v)}: {words(val)}" for v, val in record.true_values.items())
        options = _options(choices)
        record.ub_chosen_index, record.ub_json_error = self._choose(
            UB_PROMPT.format(facts=facts, question=qa.query, options=options), len(choices)
        )
        record.nm_chosen_index, record.nm_json_error = self._choose(
            NM_PROMPT.format(question=qa.query, options=options), len(choices)
        )
        return record

    def _choose(self, prompt: str, n: int) -> tuple[int | None, str | None]:
        """The policy's LLM answering a multiple-choice `prompt` alone: (0-based pick, error)."""
        reply = self.ub_client.chat_json(
            [{"role": "system", "content": UB_SYSTEM}, {"role": "user", "content": prompt}],
            choice_schema(n),
            component="probe",
        )
        picked = _picked(reply.parsed, n) if reply.ok else None
        if picked is None:
            return None, reply.json_error or f"answer out of range: {reply.text[:80]!r}"
        return picked, None

    def recall(self, item: UserItem, period: int, memory: str) -> PeriodRecall:
        """Judge every state revealed up to `period` (its latest revealed value) against memory."""
        latest = revealed_states(item, period)
        revealed = sorted(latest)
        result = PeriodRecall(user_id=item.id, period=period)
        if not revealed:
            return result
        if not memory.strip():  # nothing remembered supports nothing: no call needed
            result.claims = [
                RecallClaim(variable=v, value=latest[v][0], period=latest[v][1], supported=False)
                for v in revealed
            ]
            return result
        claims = "\n".join(
            f"{i}. The user's {words(v)} is: {words(latest[v][0])}."
            for i, v in enumerate(revealed, start=1)
        )
        keys = [str(i) for i in range(1, len(revealed) + 1)]
        schema = {
            "type": "object",
            "properties": {k: {"type": "string", "enum": ["yes", "no"]} for k in keys},
            "required": keys,
            "additionalProperties": False,
        }
        assert self.checker_client is not None
        reply = self.checker_client.chat_json(
            [
                {"role": "system", "content": RECALL_SYSTEM},
                {
                    "role": "user",
                    "content": RECALL_PROMPT.format(document=memory.strip(), claims=claims),
                },
            ],
            schema,
            component="checker",
        )
        verdicts = reply.parsed if reply.ok else {}
        result.json_error = reply.json_error
        result.claims = [
            RecallClaim(
                variable=v,
                value=latest[v][0],
                period=latest[v][1],
                supported=None if k not in verdicts else verdicts[k] == "yes",
            )
            for k, v in zip(keys, revealed, strict=True)
        ]
        return result
