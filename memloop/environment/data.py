"""Pydantic models of one simulated user's trajectory in the published AMemGym data.json format.

The models also give the lookups later code needs (state at a period, gold answer, changes,
exposures).

Field names are the published JSON keys. Models keep unknown keys (``extra="allow"``) and are dumped
with ``exclude_unset`` so a loaded item is written back with exactly the keys it was read with.
Validation is strict (no "34" -> 34 coercion), so wrong JSON types are reported, not silently fixed.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memloop.core.leaks import proper_nouns
from memloop.environment.errors import EnvDataError

PROFILE_FIELD_ORDER = (
    "name",
    "age",
    "gender",
    "marital_status",
    "education_level",
    "occupation",
    "hobbies_and_interests",
    "skills_and_expertise",
    "complementary_info",
)
"""The published order of the profile fields in `formatted_str`."""

PRIVATE_PROFILE_FIELDS = (
    "name",
    "occupation",
    "education_level",
    "hobbies_and_interests",
    "skills_and_expertise",
)
"""Profile fields that tell one user apart (age, gender and marital status are categories every
prompt may name)."""
NOT_NAMING_FIELDS = ("uuid", "formatted_str", "gender", "marital_status")
"""Profile fields that name no place, person or organisation of the user's (`formatted_str`
repeats the others). Every other text field's names are private (`core.leaks.proper_nouns`),
`complementary_info` and fields the published format does not define included."""


class _Record(BaseModel):
    """Shared configuration: strict types, unknown published fields kept, models mutable."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)


class UserProfile(_Record):
    """Static persona facts; `formatted_str` is the text every prompt uses as the profile."""

    uuid: str | None = None
    name: str | None = None
    age: int | None = None
    gender: str | None = None
    marital_status: str | None = None
    education_level: str | None = None
    occupation: str | None = None
    hobbies_and_interests: str | None = None
    skills_and_expertise: str | None = None
    complementary_info: str | None = None
    formatted_str: str | None = None

    def text(self) -> str:
        """The profile as prompt text: `formatted_str`, or `key: value` lines from the fields."""
        if self.formatted_str:
            return self.formatted_str
        lines = [
            f"{key}: {getattr(self, key)}"
            for key in PROFILE_FIELD_ORDER
            if getattr(self, key) is not None
        ]
        return "\n".join(lines)


class StateUpdate(_Record):
    """One variable's change within a period (`old` is null for the initial assignment)."""

    old: str | None
    new: str


class Session(_Record):
    """One conversation: the opening `query` is written to reveal exactly `exposed_states`."""

    event: str | None = None
    exposed_states: dict[str, str]
    query: str
    messages: list[Any] = Field(default_factory=list)
    session_time: str


class Period(_Record):
    """One period: its sessions and the full user state at its end (index 0 = initial state)."""

    period_start: str | None = None
    period_end: str
    period_summary: str | None = None
    sessions: list[Session]
    state: dict[str, str]
    updates: dict[str, StateUpdate]
    update_cnts: dict[str, int] | None = None


class AnswerChoice(_Record):
    """A personalised answer for one state variant.

    `state` is a list aligned with the question's `required_info` (published form) or a {variable:
    value} object.
    """

    state: list[str] | dict[str, str]
    answer: str
    type: str | None = None

    @field_validator("state", mode="wrap")
    @classmethod
    def _one_clear_error(cls, value: Any, handler: Any) -> Any:
        # The union would otherwise report one error per member, with internal type tags in the
        # path.
        try:
            return handler(value)
        except ValidationError:
            if isinstance(value, (list, dict)):
                entries = enumerate(value) if isinstance(value, list) else value.items()
                for where, entry in entries:
                    if not isinstance(entry, str):
                        kind = "entry" if isinstance(value, list) else "variable"
                        raise ValueError(f"{kind} {where!r} must be a string value") from None
            raise ValueError(
                "expected a list of strings aligned with required_info, or an object of strings"
            ) from None

    def values(self, required_info: list[str]) -> tuple[str | None, ...]:
        """The variant's values in `required_info` order.

        None where a dict form lacks a variable.
        """
        if isinstance(self.state, dict):
            return tuple(self.state.get(var) for var in required_info)
        return tuple(self.state)


class QuestionAnswer(_Record):
    """An advice question asked after every period, with one answer choice per state variant."""

    query: str
    required_info: list[str]
    answer_choices: list[AnswerChoice]

    def matching_choices(self, values: tuple[str | None, ...]) -> list[int]:
        """Indexes of the choices whose variant equals `values` (aligned with `required_info`)."""
        return [
            i
            for i, choice in enumerate(self.answer_choices)
            if choice.values(self.required_info) == tuple(values)
        ]


class UserItem(_Record):
    """One simulated user: profile, state schema, the period-by-period trajectory and questions."""

    id: str
    start_time: str
    user_profile: UserProfile
    state_schema: dict[str, list[str]]
    periods: list[Period]
    qas: list[QuestionAnswer]

    @property
    def num_periods(self) -> int:
        """Number of periods including the initial one (published: update periods + 1)."""
        return len(self.periods)

    def _period(self, period: int) -> Period:
        if not 0 <= period < len(self.periods):
            raise IndexError(f"item {self.id}: no period {period} (it has {len(self.periods)})")
        return self.periods[period]

    def state_at(self, period: int) -> dict[str, str]:
        """The user's full state at the end of `period` (a copy)."""
        return dict(self._period(period).state)

    def changed_variables(self, period: int) -> set[str]:
        """Variables whose value was set in `period`.

        Every variable in period 0, otherwise those whose value differs from the previous period's
        state.
        """
        current = self._period(period).state
        if period == 0:
            return set(current)
        previous = self.periods[period - 1].state
        return {var for var, value in current.items() if previous.get(var) != value}

    def last_set_period(self, variable: str, period: int) -> int:
        """The latest period <= `period` in which `variable` got its current value (0 = initial)."""
        for p in range(period, 0, -1):
            if variable in self.changed_variables(p):
                return p
        return 0

    def private_values(self) -> set[str]:
        """What is this user's own; no prompt shared by every user may name one of them.

        Every state value of every period (superseded ones too), the values the sessions reveal,
        the name (whole and each part of 4 letters or more), the profile's identifying fields
        (whole, and each item of a comma-separated list) and the names (places, people,
        organisations) its other text fields give, `complementary_info` included.
        """
        found = {str(v) for p in self.periods for v in p.state.values() if v is not None}
        found |= {
            v for p in range(len(self.periods)) for e in self.exposed_values(p) for v in e.values()
        }
        profile = self.user_profile
        for key in PRIVATE_PROFILE_FIELDS:
            value = getattr(profile, key)
            if isinstance(value, str) and value.strip():
                found.add(value.strip())  # and each item of a list ("astronomy, knitting")
                found.update(part.strip() for part in value.split(",") if part.strip())
        if profile.name:
            found.update(part for part in profile.name.split() if len(part) >= 4)
        # the places, people and organisations any other text field names ("grew up in Bergen")
        fields = profile.model_dump(exclude=set(NOT_NAMING_FIELDS))  # undefined fields too
        for key, value in fields.items():
            if key not in PRIVATE_PROFILE_FIELDS and isinstance(value, str):
                found |= proper_nouns(value)
        return found

    def placeholders(self) -> dict[str, str]:
        """Each private value (`private_values`) -> the typed placeholder an optimizer sees.

        A state value: `[variable #k]`, k its option's place in the state schema (`[variable]`
        when the schema does not list it); a profile field's value: `[field]`; a part of the
        name: `[name]`; a name the profile's other text gives: `[profile name]`. The kind, never
        the value or a spelling of it (feedback/summary.py redacts the optimizer's feedback).
        """
        kinds: dict[str, str] = {}
        for variable, options in self.state_schema.items():
            for k, value in enumerate(options, 1):
                kinds.setdefault(str(value), f"[{variable} #{k}]")
        for p in range(len(self.periods)):
            for variable, value in self._period(p).state.items():
                if value is not None:
                    kinds.setdefault(str(value), f"[{variable}]")
            for exposed in self.exposed_values(p):
                for variable, value in exposed.items():
                    kinds.setdefault(value, f"[{variable}]")
        profile = self.user_profile
        for key in PRIVATE_PROFILE_FIELDS:
            value = getattr(profile, key)
            if isinstance(value, str) and value.strip():
                kinds.setdefault(value.strip(), f"[{key}]")
                for part in value.split(","):
                    if part.strip():
                        kinds.setdefault(part.strip(), f"[{key}]")
        if profile.name:
            for part in profile.name.split():
                kinds.setdefault(part, "[name]")
        return {v: kinds.get(v, "[profile name]") for v in self.private_values()}

    def exposed_values(self, period: int) -> list[dict[str, str]]:
        """Per session of `period`, the {variable: value} its opening query is meant to reveal."""
        return [dict(session.exposed_states) for session in self._period(period).sessions]

    def required_state(self, question: int, period: int) -> tuple[str | None, ...]:
        """The true values of question `question`'s required variables at `period`."""
        state = self._period(period).state
        return tuple(state.get(var) for var in self.qas[question].required_info)

    def gold_choice_index(self, question: int, period: int) -> int:
        """Index of the answer choice whose variant equals the user's state at `period`."""
        qa = self.qas[question]
        gold = self.required_state(question, period)
        matches = qa.matching_choices(gold)
        if len(matches) != 1:
            found = "no choice" if not matches else f"{len(matches)} choices"
            raise EnvDataError(
                f"item {self.id}: question {question} has {found} matching the period-{period} "
                f"state {list(gold)} of {qa.required_info}; run `memloop env validate` on the file"
            )
        return matches[0]

    def to_json(self) -> dict[str, Any]:
        """The item as a plain JSON object in the published format (only the keys that were set)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)
