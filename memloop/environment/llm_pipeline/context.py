"""What every step of one user needs.

The asker, the run's settings, the user's id and profile text, seeded random streams and budgets.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from memloop.environment.llm_pipeline.asking import Asker, Budget, StepStats
from memloop.environment.llm_pipeline.config import PipelineConfig


@dataclass(frozen=True)
class UserContext:
    asker: Asker
    config: PipelineConfig
    user_id: str
    profile_text: str
    name: str

    def rng(self, purpose: str) -> random.Random:
        """An independent random stream per (seed, user, purpose).

        A resumed run, which skips finished steps, draws exactly what an uninterrupted run draws.
        String seeds are hashed with SHA-512 by `random`, so the result does not depend on
        PYTHONHASHSEED.
        """
        return random.Random(f"memloop-llm:{self.config.seed}:{self.user_id}:{purpose}")

    def budget(self, step: str, stats: StepStats, unit: str = "") -> Budget:
        return Budget(step=step, limit=self.config.refine_budget, stats=stats, unit=unit)
