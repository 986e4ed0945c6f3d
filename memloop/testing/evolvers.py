"""A scripted evolver: deterministic, model-free proposals for tests of the optimizer loop."""

from __future__ import annotations

from typing import Any

from memloop.optimize.evolvers import EvolveStep


class ScriptedEvolver:
    """Appends ``rule`` (with the cycle number) to every prompt; passes ``check_evolver``."""

    name = "scripted"

    def __init__(self, rule: str = "Keep each stored fact current.") -> None:
        self.rule = rule

    def propose(
        self, prompts: dict[str, str], summary: dict[str, Any], *, cycle: int
    ) -> EvolveStep:
        line = f"{self.rule} (cycle {cycle})"
        return EvolveStep(
            prompts={k: f"{v}\n{line}" for k, v in prompts.items()},
            changes={k: [f"added: {line}"] for k in prompts},
        )
