"""Procedural environment generator (no LLM): builds users in the published data.json format from
the hand-written catalogue, for tests, smoke runs and controlled experiments.

Everything random comes from one `random.Random` per user, seeded from (seed, user index), and all
iteration is over sorted or catalogue-ordered sequences, so the same arguments give the same bytes.
"""

from __future__ import annotations

import calendar
import random
import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from memloop.environment import catalogue
from memloop.environment.catalogue import Variable
from memloop.environment.data import (
    PROFILE_FIELD_ORDER,
    AnswerChoice,
    Period,
    QuestionAnswer,
    Session,
    StateUpdate,
    UserItem,
    UserProfile,
)
from memloop.environment.errors import ProceduralArgumentError

MIN_ANSWER_CHOICES = 4
"""Every question offers at least this many answer choices (as in the published data)."""

MAX_USERS = 10_000
MAX_PERIODS = 1_000
MAX_QUESTIONS = 200
MAX_MONTHS_PER_PERIOD = 24


@dataclass(frozen=True)
class ProceduralSpec:
    """The generator's arguments; `check()` raises ProceduralArgumentError naming the bad option."""

    users: int = 3
    periods: int = 4
    questions: int = 4
    states_per_question: int = 2
    choices_per_state: int = 2
    changes_per_period: int = 2
    seed: int = 0
    start_date: str = "2020-10-01"
    months_per_period: int = 3

    @property
    def pool(self) -> list[Variable]:
        """The catalogue variables that can offer `choices_per_state` values, sorted by name."""
        return catalogue.variables_with_values(self.choices_per_state)

    @property
    def variables_per_user(self) -> int:
        """Schema size: questions x states-per-question, capped by the pool (questions then share)."""
        return min(self.questions * self.states_per_question, len(self.pool))

    def check(self) -> None:
        """Raise ProceduralArgumentError with one clear line if these options cannot work."""
        _in_range("--users", self.users, 1, MAX_USERS)
        _in_range("--periods", self.periods, 0, MAX_PERIODS)
        _in_range("--questions", self.questions, 1, MAX_QUESTIONS)
        _in_range(
            "--choices-per-state", self.choices_per_state, 2, catalogue.max_values_per_variable()
        )
        _in_range("--states-per-question", self.states_per_question, 1, len(self.pool))
        _in_range("--months-per-period", self.months_per_period, 1, MAX_MONTHS_PER_PERIOD)
        variants = self.choices_per_state**self.states_per_question
        if variants < MIN_ANSWER_CHOICES:
            raise ProceduralArgumentError(
                f"--states-per-question {self.states_per_question} with --choices-per-state "
                f"{self.choices_per_state} allows only {variants} distinct answers per question; "
                f"at least {MIN_ANSWER_CHOICES} are needed, so raise one of them"
            )
        m = self.variables_per_user
        if not 1 <= self.changes_per_period <= m:
            raise ProceduralArgumentError(
                f"--changes-per-period must be between 1 and the {m} state variables each user has "
                f"(questions x states-per-question, at most {len(self.pool)}); got {self.changes_per_period}"
            )
        try:
            start = datetime.strptime(self.start_date, "%Y-%m-%d").date()
        except ValueError:
            raise ProceduralArgumentError(
                f"--start-date must be a date YYYY-MM-DD; got {self.start_date!r}"
            ) from None
        if (
            start.year < 1900
            or start.year + (self.periods * self.months_per_period) // 12 + 1 > 9999
        ):
            raise ProceduralArgumentError(
                f"--start-date {self.start_date} with {self.periods} periods of {self.months_per_period} months "
                "falls outside the years 1900-9999"
            )


def _in_range(option: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ProceduralArgumentError(f"{option} must be between {low} and {high}; got {value}")


def generate_procedural(
    users: int = 3,
    periods: int = 4,
    questions: int = 4,
    states_per_question: int = 2,
    choices_per_state: int = 2,
    changes_per_period: int = 2,
    seed: int = 0,
    *,
    start_date: str = "2020-10-01",
    months_per_period: int = 3,
) -> list[UserItem]:
    """Generate `users` users, each with `periods` update periods after the initial one (so
    periods + 1 entries, as published), `questions` questions over `states_per_question` variables,
    `choices_per_state` values per variable and exactly `changes_per_period` changes per period.
    """
    spec = ProceduralSpec(
        users,
        periods,
        questions,
        states_per_question,
        choices_per_state,
        changes_per_period,
        seed,
        start_date,
        months_per_period,
    )
    return generate_from_spec(spec)


def generate_from_spec(spec: ProceduralSpec) -> list[UserItem]:
    """Generate the users described by a checked `ProceduralSpec`."""
    spec.check()
    return [_UserBuilder(spec, index).build() for index in range(spec.users)]


# --- text pieces ---------------------------------------------------------------------------------

_FIRST_NAMES = (
    ("Amara", "Female"),
    ("Bruno", "Male"),
    ("Chen", "Male"),
    ("Dalia", "Female"),
    ("Elif", "Female"),
    ("Farid", "Male"),
    ("Greta", "Female"),
    ("Hiroshi", "Male"),
    ("Ines", "Female"),
    ("Jonas", "Male"),
    ("Kavya", "Female"),
    ("Luca", "Male"),
    ("Maren", "Female"),
    ("Nikolai", "Male"),
    ("Olufemi", "Male"),
    ("Priya", "Female"),
    ("Quinn", "Non-binary"),
    ("Rosa", "Female"),
    ("Samir", "Male"),
    ("Tove", "Female"),
)
_LAST_NAMES = (
    "Abara",
    "Bergström",
    "Castillo",
    "Dubois",
    "Eriksen",
    "Fontaine",
    "Gallagher",
    "Haddad",
    "Ivanova",
    "Jensen",
    "Kowalski",
    "Lindqvist",
    "Moreau",
    "Nakamura",
    "Okonkwo",
    "Pereira",
    "Rossi",
    "Schmidt",
)
_MARITAL = ("never_married", "married", "divorced", "widowed", "separated")
_EDUCATION = (
    "high_school",
    "bachelors (history)",
    "bachelors (nursing)",
    "bachelors (economics)",
    "masters (chemistry)",
    "associates (accounting)",
    "doctorate (linguistics)",
    "vocational (carpentry)",
)
_OCCUPATIONS = (
    "accountant",
    "pharmacist",
    "electrician",
    "primary_school_teacher",
    "data_analyst",
    "chef",
    "librarian",
    "civil_engineer",
    "nurse",
    "graphic_designer",
    "logistics_coordinator",
    "paralegal",
)
_INTERESTS = (
    "crosswords",
    "local history",
    "birdwatching",
    "chess",
    "photography",
    "astronomy",
    "board games",
    "documentaries",
    "knitting",
    "jigsaw puzzles",
    "stand-up comedy",
    "origami",
)
_SKILLS = (
    "spreadsheets",
    "public speaking",
    "negotiation",
    "first aid",
    "project planning",
    "technical writing",
    "customer service",
    "bookkeeping",
    "translation",
    "scheduling",
)
_TOWNS = (
    "Porto",
    "Leeds",
    "Tampere",
    "Graz",
    "Kraków",
    "Lyon",
    "Ghent",
    "Bergen",
    "Bologna",
    "Cork",
)

_QUESTION_FRAMES = (
    "I'm trying to plan the next few months sensibly. Taking into account {topics}, what should I focus on?",
    "Could you suggest a weekly routine that suits {topics}?",
    "What practical changes would make my days easier, considering {topics}?",
    "I want to set one realistic goal for this season. Given {topics}, what would you recommend?",
    "How should I divide my time and energy this month, bearing in mind {topics}?",
    "What small habits would improve my life right now, given {topics}?",
    "If you were planning a typical week for me, how would you fit it around {topics}?",
    "What should I prioritise over the coming weeks, taking {topics} into account?",
)
_INITIAL_OPENERS = ("Hi!", "Hello.", "Hey there.", "Good evening.", "Hi, quick question.", "")
_UPDATE_OPENERS = (
    "Some news from my side.",
    "Things have changed a bit for me lately.",
    "Quick update about my life.",
    "A few things are different now.",
    "Here's what's new with me.",
)
_CLOSERS = (
    "Could you keep that in mind when you help me?",
    "What would you suggest I pay attention to?",
    "Any advice on adjusting my routine?",
    "How should I plan around that?",
    "Can you help me think this through?",
)


def _topics(variables: list[Variable]) -> str:
    names = [var.topic for var in variables]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def add_months(day: date, months: int) -> date:
    """`day` moved by whole calendar months, clamped to the month's last day (Jan 31 + 1 -> Feb 28/29)."""
    year, month = divmod(day.year * 12 + (day.month - 1) + months, 12)
    return date(year, month + 1, min(day.day, calendar.monthrange(year, month + 1)[1]))


# --- one user ------------------------------------------------------------------------------------


class _UserBuilder:
    """Builds one user; each step draws from the same per-user random stream in a fixed order."""

    def __init__(self, spec: ProceduralSpec, index: int) -> None:
        self.spec = spec
        self.rng = random.Random(f"memloop-procedural:{spec.seed}:{index}")

    def build(self) -> UserItem:
        rng, spec = self.rng, self.spec
        user_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        profile = self._profile(user_id)
        order = rng.sample(spec.pool, spec.variables_per_user)  # also fixes question assignment
        variables = sorted(order, key=lambda var: var.name)
        schema = {var.name: self._choices(var) for var in variables}
        states, changes = self._trajectory(variables, schema)
        ends = [
            add_months(self._start, k * spec.months_per_period) for k in range(spec.periods + 1)
        ]
        # Published convention: every period carries the final totals; the initial assignment is not a change.
        totals = {
            var.name: sum(var.name in changed for changed in changes[1:]) for var in variables
        }
        periods = [
            self._period(k, variables, states, changes, ends, totals, profile.name or "")
            for k in range(spec.periods + 1)
        ]
        self.frame_offset = rng.randrange(len(_QUESTION_FRAMES))  # users differ in question wording
        qas = [self._question(q, order, schema, states) for q in range(spec.questions)]
        return UserItem(
            id=user_id,
            start_time=self._start.isoformat(),
            user_profile=profile,
            state_schema=schema,
            periods=periods,
            qas=qas,
        )

    @property
    def _start(self) -> date:
        return datetime.strptime(self.spec.start_date, "%Y-%m-%d").date()

    def _profile(self, user_id: str) -> UserProfile:
        rng = self.rng
        first, gender = rng.choice(_FIRST_NAMES)
        fields = {
            "name": f"{first} {rng.choice(_LAST_NAMES)}",
            "age": rng.randint(24, 67),
            "gender": gender,
            "marital_status": rng.choice(_MARITAL),
            "education_level": rng.choice(_EDUCATION),
            "occupation": rng.choice(_OCCUPATIONS),
            "hobbies_and_interests": ", ".join(rng.sample(_INTERESTS, 2)),
            "skills_and_expertise": ", ".join(rng.sample(_SKILLS, 2)),
            "complementary_info": (
                f"{first} grew up in {rng.choice(_TOWNS)}, enjoys a good conversation and likes "
                "practical, concrete suggestions."
            ),
        }
        formatted = "\n".join(f"{key}: {fields[key]}" for key in PROFILE_FIELD_ORDER)
        return UserProfile(uuid=user_id, **fields, formatted_str=formatted)

    def _choices(self, var: Variable) -> list[str]:
        """`choices_per_state` of the variable's values, kept in catalogue order."""
        picked = set(self.rng.sample(var.value_names, self.spec.choices_per_state))
        return [name for name in var.value_names if name in picked]

    def _trajectory(
        self, variables: list[Variable], schema: dict[str, list[str]]
    ) -> tuple[list[dict[str, str]], list[list[str]]]:
        """States for periods 0..P and, per period, the variables changed (all of them in period 0).
        Variables changed fewer times so far are more likely to change next.
        """
        rng, spec = self.rng, self.spec
        names = [var.name for var in variables]
        state = {name: rng.choice(schema[name]) for name in names}
        states, changes = [dict(state)], [list(names)]
        counts = dict.fromkeys(names, 0)
        for _ in range(spec.periods):
            candidates = list(names)
            changed: list[str] = []
            for _ in range(spec.changes_per_period):
                weights = [1.0 / (1 + counts[name]) for name in candidates]
                pick = rng.choices(candidates, weights=weights)[0]
                candidates.remove(pick)
                changed.append(pick)
            for name in sorted(changed):
                state[name] = rng.choice([c for c in schema[name] if c != state[name]])
                counts[name] += 1
            states.append(dict(state))
            changes.append(sorted(changed))
        return states, changes

    def _period(
        self,
        k: int,
        variables: list[Variable],
        states: list[dict[str, str]],
        changes: list[list[str]],
        ends: list[date],
        totals: dict[str, int],
        name: str,
    ) -> Period:
        rng = self.rng
        by_name = {var.name: var for var in variables}
        changed = list(changes[k])
        rng.shuffle(changed)
        max_group = 3 if k == 0 else 2
        groups: list[list[str]] = []
        while changed:
            size = rng.randint(1, min(max_group, len(changed)))
            groups.append(sorted(changed[:size]))
            changed = changed[size:]
        times = self._session_times(k, len(groups), ends)
        first_name = name.split(" ")[0] or "The user"
        sessions = []
        for group, when in zip(groups, times):
            exposed = {var: states[k][var] for var in group}
            event = None
            if k > 0:
                event = " ".join(
                    f"{first_name}'s {by_name[var].label} changed from "
                    f"{by_name[var].value(states[k - 1][var]).label} to {by_name[var].value(states[k][var]).label}."
                    for var in group
                )
            sessions.append(
                Session(
                    event=event,
                    exposed_states=exposed,
                    query=self._utterance(k, group, states[k], by_name),
                    messages=[],
                    session_time=when,
                )
            )
        if k == 0:
            updates = {var: StateUpdate(old=None, new=states[0][var]) for var in sorted(states[0])}
            summary = None
        else:
            updates = {
                var: StateUpdate(old=states[k - 1][var], new=states[k][var]) for var in changes[k]
            }
            summary = (
                f"{first_name}'s changes this period: "
                + "; ".join(
                    f"{by_name[var].label} from {by_name[var].value(states[k - 1][var]).label} "
                    f"to {by_name[var].value(states[k][var]).label}"
                    for var in changes[k]
                )
                + "."
            )
        return Period(
            period_start=ends[k - 1].isoformat() if k > 0 else None,
            period_end=ends[k].isoformat(),
            period_summary=summary,
            sessions=sessions,
            state=dict(states[k]),
            updates=updates,
            update_cnts=dict(totals),
        )

    def _session_times(self, k: int, n: int, ends: list[date]) -> list[str]:
        """Period 0: the n days ending on the start date; later periods: n distinct days spread over
        the period (after its start, up to its end). Each at a random evening time.
        """
        rng = self.rng
        if k == 0:
            days = [ends[0] - timedelta(days=n - 1 - i) for i in range(n)]
        else:
            span = (ends[k] - ends[k - 1]).days
            offsets = sorted(rng.sample(range(1, span + 1), n))
            days = [ends[k - 1] + timedelta(days=offset) for offset in offsets]
        return [
            f"{day.isoformat()} {rng.randint(19, 21):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
            for day in days
        ]

    def _utterance(
        self, k: int, group: list[str], state: dict[str, str], by_name: dict[str, Variable]
    ) -> str:
        """An opening message revealing exactly the group's values: one rendering per variable between
        a generic opener and closer that mention no state at all.
        """
        rng = self.rng
        opener = rng.choice(_INITIAL_OPENERS if k == 0 else _UPDATE_OPENERS)
        order = list(group)
        rng.shuffle(order)
        said = [rng.choice(by_name[var].value(state[var]).renderings) for var in order]
        return " ".join(part for part in (opener, *said, rng.choice(_CLOSERS)) if part)

    def _question(
        self,
        q: int,
        order: list[Variable],
        schema: dict[str, list[str]],
        states: list[dict[str, str]],
    ) -> QuestionAnswer:
        rng, spec = self.rng, self.spec
        m, s = len(order), spec.states_per_question
        required = [order[(q * s + j) % m] for j in range(s)]
        names = [var.name for var in required]
        frame = _QUESTION_FRAMES[(q + self.frame_offset) % len(_QUESTION_FRAMES)]
        query = frame.format(topics=_topics(required))

        experienced: list[tuple[str, ...]] = []
        for state in states:
            variant = tuple(state[name] for name in names)
            if variant not in experienced:
                experienced.append(variant)
        product = 1
        for name in names:
            product *= len(schema[name])
        target = min(product, max(MIN_ANSWER_CHOICES, spec.choices_per_state, len(experienced)))
        fillers: list[tuple[str, ...]] = []
        taken = set(experienced)
        while len(experienced) + len(fillers) < target:
            variant = tuple(rng.choice(schema[name]) for name in names)
            if variant not in taken:
                taken.add(variant)
                fillers.append(variant)

        choices = [
            AnswerChoice(state=list(variant), answer=self._answer(required, variant), type=kind)
            for variants, kind in ((experienced, "experience"), (fillers, "random"))
            for variant in variants
        ]
        rng.shuffle(choices)
        return QuestionAnswer(query=query, required_info=names, answer_choices=choices)

    @staticmethod
    def _answer(required: list[Variable], variant: tuple[str, ...]) -> str:
        """The personalised answer: each required value's advice, in required_info order."""
        return " ".join(var.value(value).advice for var, value in zip(required, variant))
