"""``check_evolver``: the conformance suite of the Evolver contract, beside its Protocol.

An :class:`memloop.optimize.contract.Evolver` turns an
:class:`~memloop.optimize.contract.EvolveInput` (prompts, feedback summary, cycle, history,
screen) into an :class:`~memloop.optimize.contract.EvolveStep`. The suite checks its promises on
a small scripted summary: every member of the contract is present and its settings are a
`Settings` that builds from defaults; the inputs are not mutated; the step holds the same prompt
names as the input, each a non-empty text; and two evolvers from the same factory (sharing a
response cache, for LLM-backed ones) propose the same step from the same inputs.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from memloop.core.checks import CheckReport, ContractError
from memloop.feedback.summary import FeedbackSummary
from memloop.optimize.contract import (
    EVOLVER_MEMBERS,
    EvolveInput,
    EvolveStep,
    check_declaration,
)

DEFAULT_PROMPTS = {
    "writer": "Write down the facts the user states about themselves, one per line.",
    "update": "When a new fact contradicts a stored one, replace the stored one.",
}
DEFAULT_SUMMARY: dict[str, Any] = {
    "users": [
        {
            "user": "u1",
            "questions": [
                {
                    "question": "Which gym schedule suits me now?",
                    "retrieved_memories": ["works night shifts"],
                    "chosen": 2,
                    "correct": 1,
                }
            ],
            "state_updates": {"work_schedule": "day shifts"},
        }
    ]
}


class EvolverCheckError(ContractError):
    """One or more promises of the Evolver contract are broken; the message lists them."""


def check_evolver(
    evolver_factory: Callable[[], Any],
    *,
    prompts: Mapping[str, str] = DEFAULT_PROMPTS,
    summary: Mapping[str, Any] | FeedbackSummary = DEFAULT_SUMMARY,
    cycle: int = 0,
    raise_on_problem: bool = True,
) -> CheckReport:
    """Check the evolvers ``evolver_factory()`` builds.

    Two evolvers are built and each proposes once from the same inputs; an LLM-backed factory
    must give both the same response cache, so that the contract's determinism can hold.

    Raises:
        EvolverCheckError: listing every problem, unless ``raise_on_problem`` is False.
    """
    first = evolver_factory()
    report = CheckReport(name=str(getattr(first, "name", type(first).__name__)))

    expect = report.expect

    if not check_declaration(report, first, EVOLVER_MEMBERS, "Evolver"):
        return _finish(report, raise_on_problem)

    def inputs() -> EvolveInput:
        given = (
            summary.model_copy(deep=True)
            if isinstance(summary, FeedbackSummary)
            else FeedbackSummary.from_data(copy.deepcopy(dict(summary)))
        )
        return EvolveInput(prompts=dict(prompts), summary=given, cycle=cycle)

    given = inputs()
    before = copy.deepcopy(given)
    step = first.propose(given)
    expect(
        given.prompts == before.prompts and given.summary == before.summary,
        "propose() leaves its inputs unchanged",
        "propose() mutated the prompts or the summary it was given",
    )
    if not expect(
        isinstance(step, EvolveStep),
        "propose() returns an EvolveStep",
        f"propose() returned {type(step).__name__}",
    ):
        return _finish(report, raise_on_problem)
    expect(
        set(step.prompts) == set(given.prompts),
        "the step holds the same prompt names as the input",
        f"prompt names in {sorted(given.prompts)}, out {sorted(step.prompts)}",
    )
    empty = [k for k, v in step.prompts.items() if not isinstance(v, str) or not v.strip()]
    expect(not empty, "every proposed prompt is non-empty text", f"empty prompts: {empty}")

    again = evolver_factory().propose(inputs())
    expect(
        isinstance(again, EvolveStep) and again.prompts == step.prompts,
        "the same inputs give the same proposal (deterministic under the response cache)",
        "a second evolver from the same factory proposed different prompts",
    )
    return _finish(report, raise_on_problem)


def _finish(report: CheckReport, raise_on_problem: bool) -> CheckReport:
    return report.finish(EvolverCheckError, "Evolver", raise_on_problem)
