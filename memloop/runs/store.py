"""`CycleStore`: a run folder's cycles on disk, each file written atomically.

Layout (cycle k):
    cycle_kk/prompts.json   the prompts the cycle evaluates (fixed the first time it starts)
    cycle_kk/cycle.json     its CycleRecord (written last: the cycle is finished)
    cycle_kk/summary.json   the FeedbackSummary the next prompts come from (MLflow gets its text)
    cycle_kk/evolve.json    the evolver's step (the next cycle's prompts)
    cycle_kk/<split>/...    evaluation outputs; episodes/ holds their checkpoints

A search reads back what a killed run finished and redoes nothing that is on disk.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

from memloop.core.files import atomic_write_json, atomic_write_text
from memloop.feedback.summary import FeedbackSummary
from memloop.runs.cycles import CycleRecord, EvolveStep


class CycleStore:
    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def cycle_dir(self, k: int) -> Path:
        return self.run_dir / f"cycle_{k:02d}"

    def prompts(self, k: int, proposed: dict[str, str]) -> dict[str, str]:
        """Cycle k's prompts: those fixed when it first started, else `proposed` (now fixed)."""
        path = self.cycle_dir(k) / "prompts.json"
        if path.is_file():
            return json.loads(path.read_text())
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, proposed)
        return dict(proposed)

    def saved_prompts(self, k: int) -> dict[str, str] | None:
        """Cycle k's fixed prompts, or None when the search did not record any."""
        path = self.cycle_dir(k) / "prompts.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def record_file(self, k: int) -> Path:
        """Where cycle k's CycleRecord is (written last: the cycle is finished)."""
        return self.cycle_dir(k) / "cycle.json"

    def finished(self) -> int:
        """How many cycles, from cycle 0 on, have a saved record (none read)."""
        return next(k for k in itertools.count() if not self.record_file(k).is_file())

    def record(self, k: int) -> CycleRecord | None:
        path = self.record_file(k)
        return CycleRecord.from_json(path.read_text()) if path.is_file() else None

    def save(self, record: CycleRecord) -> None:
        path = self.record_file(record.cycle)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, record.model_dump_json(indent=1))

    def summary(self, k: int) -> FeedbackSummary | None:
        path = self.cycle_dir(k) / "summary.json"
        return FeedbackSummary.load(path.read_text()) if path.is_file() else None

    def save_summary(self, k: int, summary: FeedbackSummary) -> None:
        atomic_write_text(self.cycle_dir(k) / "summary.json", summary.model_dump_json(indent=1))

    def step(self, k: int) -> EvolveStep | None:
        path = self.cycle_dir(k) / "evolve.json"
        return EvolveStep.model_validate_json(path.read_text()) if path.is_file() else None

    def save_step(self, k: int, step: EvolveStep) -> None:
        atomic_write_text(self.cycle_dir(k) / "evolve.json", step.model_dump_json(indent=1))

    def artifacts(self, k: int) -> dict[str, str]:
        """{artifact folder: text} of cycle k's files for MLflow."""
        out = {}
        for name in ("prompts", "cycle", "summary", "evolve"):
            path = self.cycle_dir(k) / f"{name}.json"
            if path.is_file():
                out[name] = path.read_text()
        summary = self.summary(k)
        if summary is not None:  # what the evolver read (the private values stay in the folder)
            out["summary"] = summary.render()
        return out
