"""The `none` evolver: keeps the prompts (the no-evolution baseline)."""

from __future__ import annotations

from memloop.llm.client import ChatClient
from memloop.optimize.contract import EvolveInput, EvolveStep, NoSettings


class NoEvolver:
    """Keeps the prompts: the no-evolution baseline."""

    name = "none"
    Settings = NoSettings

    def __init__(self, client: ChatClient | None = None, settings: NoSettings | None = None):
        self.settings = settings or NoSettings()

    def propose(self, inputs: EvolveInput) -> EvolveStep:
        return EvolveStep(prompts=dict(inputs.prompts))
