"""Size statistics of a set of user items (counts and min/mean/max distributions).

For `memloop env validate` and for recording what an environment looked like.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from memloop.core.tables import format_table
from memloop.environment.data import UserItem


@dataclass(frozen=True)
class Distribution:
    """Min, mean and max of a list of counts (all 0 for an empty list), plus the total."""

    min: int
    mean: float
    max: int
    total: int

    @classmethod
    def of(cls, values: list[int]) -> Distribution:
        if not values:
            return cls(0, 0.0, 0, 0)
        return cls(min(values), sum(values) / len(values), max(values), sum(values))


@dataclass(frozen=True)
class EnvSummary:
    """How big an environment is: users, and per-user / per-period / per-question distributions."""

    users: int
    periods_per_user: Distribution
    sessions_per_period: Distribution
    exposed_per_session: Distribution
    questions_per_user: Distribution
    choices_per_question: Distribution
    required_per_question: Distribution
    variables_per_user: Distribution
    choices_per_variable: Distribution
    changes_per_period: Distribution

    def to_json(self) -> dict:
        """A plain dict for JSON output or experiment logs."""
        return asdict(self)

    def lines(self) -> list[str]:
        """A human-readable table: one line per statistic."""
        rows = [
            ("periods per user (incl. initial)", self.periods_per_user),
            ("sessions per period", self.sessions_per_period),
            ("exposed values per session", self.exposed_per_session),
            ("questions per user", self.questions_per_user),
            ("choices per question", self.choices_per_question),
            ("variables per question", self.required_per_question),
            ("state variables per user", self.variables_per_user),
            ("choices per state variable", self.choices_per_variable),
            ("states changed per period (after 0)", self.changes_per_period),
        ]
        out = [f"users: {self.users}"]
        table = format_table(
            ["statistic", "min", "mean", "max", "total"],
            [[label, d.min, d.mean, d.max, d.total] for label, d in rows],
            digits=2,
        )
        out.extend(table.splitlines())
        return out


def summarize(items: list[UserItem]) -> EnvSummary:
    """Statistics of `items` (assumed structurally valid; consistency is not required)."""
    periods = [period for item in items for period in item.periods]
    sessions = [session for period in periods for session in period.sessions]
    qas = [qa for item in items for qa in item.qas]
    changes = [
        len(item.changed_variables(p)) for item in items for p in range(1, len(item.periods))
    ]
    return EnvSummary(
        users=len(items),
        periods_per_user=Distribution.of([len(item.periods) for item in items]),
        sessions_per_period=Distribution.of([len(period.sessions) for period in periods]),
        exposed_per_session=Distribution.of([len(session.exposed_states) for session in sessions]),
        questions_per_user=Distribution.of([len(item.qas) for item in items]),
        choices_per_question=Distribution.of([len(qa.answer_choices) for qa in qas]),
        required_per_question=Distribution.of([len(qa.required_info) for qa in qas]),
        variables_per_user=Distribution.of([len(item.state_schema) for item in items]),
        choices_per_variable=Distribution.of(
            [len(choices) for item in items for choices in item.state_schema.values()]
        ),
        changes_per_period=Distribution.of(changes),
    )
