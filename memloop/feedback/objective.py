"""What a run is ranked on, and the feedback modes an evolver may see: enums, one default each.

`Objective`: the validation measure a run's selection, GEPA's candidate scores, an evolver's
reverts and tuning's trials rank on. One default rule (`Objective.default_for`): state_prob when
the state reads are letter reads (the default where the agent's endpoint returns
log-probabilities: about half the detectable effect of 0/1 state accuracy); else state accuracy
when the agent is the embedded model (its multiple-choice step is too weak for the memory score
to carry a signal), the memory score otherwise.

`Mode`: how much of the feedback an evolver is shown. `none` is no evolution.
"""

from __future__ import annotations

from enum import StrEnum


class Objective(StrEnum):
    MEMORY_SCORE = "memory_score"
    STATE_ACCURACY = "state_accuracy"
    MEMORY_GAIN = "memory_gain"
    STATE_PROB = "state_prob"  # the letter read's mean P(true value) (probes.state_read: letters)

    @classmethod
    def default_for(cls, agent_is_local: bool, letters: bool = False) -> Objective:
        if letters:
            return cls.STATE_PROB
        return cls.STATE_ACCURACY if agent_is_local else cls.MEMORY_SCORE

    @classmethod
    def of(cls, value: str | None, agent_is_local: bool, letters: bool = False) -> Objective:
        """`value` as an Objective; the default rule when it is None."""
        return cls.default_for(agent_is_local, letters) if value is None else cls(value)

    @property
    def label(self) -> str:
        """The measure's name in tables ("state accuracy")."""
        return self.value.replace("_", " ")

    def of_scores(self, scores: object) -> float | None:
        """This measure of a `feedback.scoring` Scores object (None where undefined)."""
        if self is Objective.STATE_ACCURACY:
            return scores.state.accuracy  # type: ignore[attr-defined]
        if self is Objective.STATE_PROB:
            return scores.state.prob  # type: ignore[attr-defined]
        return getattr(scores, self.value)


# runs logged before the objective was recorded were all ranked on the memory score
LEGACY_OBJECTIVE = Objective.MEMORY_SCORE


class Mode(StrEnum):
    NONE = "none"
    QUESTION_ONLY = "question_only"
    COMPLETE = "complete"
    DIAGNOSTIC = "diagnostic"

    @property
    def evolves(self) -> bool:
        return self is not Mode.NONE


DEFAULT_MODE = Mode.COMPLETE
