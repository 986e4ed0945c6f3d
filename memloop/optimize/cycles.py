"""A cycle as data: `CycleRecord`, what every search yields, and the one selection rule.

A cycle evaluates one set of prompts on up to three user splits:
- `train`: the users whose episodes make the feedback (in the period cadence: the period's
  online records, the prompt changing under them);
- `val`: the users every selection is made on;
- `test`: users that are only evaluated; nothing is ever chosen on them.

`select_cycle` is the only place a run picks a cycle (the registry alias `best`, compare's
headline): it reads validation metrics and nothing else, so a test user's result cannot change a
selection (tests/test_optimize_splits.py poisons the test users to show it).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memloop.feedback.objective import LEGACY_OBJECTIVE, Objective
from memloop.feedback.records import SCORER_VERSION
from memloop.feedback.summary import SummaryReport

CYCLE_METRICS = (
    "memory_score",
    "state_accuracy",
    "memory_gain",
    "overall",
    "no_memory",
    "factual_recall",
    "format",
    "write",
    "read",
    "utilization",
    "memory_score_undefined_periods",
)
Split = Literal["train", "val", "test"]
SELECTION_SPLIT: Split = "val"


class SplitResult(BaseModel):
    """One split's numbers in one cycle (CYCLE_METRICS plus the per-user scores).

    Fields added with scorer version 2 default to None / 0, so cycle records of version-1 runs
    still load (compare labels them).
    """

    model_config = ConfigDict(extra="forbid")

    users: int
    memory_score: float | None
    overall: float
    factual_recall: float | None
    write: float
    read: float
    utilization: float
    format: float = 0.0
    state_accuracy: float | None = None
    state_chance: float | None = None
    no_memory: float | None = None
    memory_gain: float | None = None
    memory_score_undefined_periods: int = 0
    json_errors: int = 0
    per_user: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any]) -> SplitResult:
        """From a metrics.json dict (feedback.report.build_metrics)."""
        return cls(
            users=metrics["users"],
            memory_score=metrics["memory_score"],
            overall=metrics["overall"],
            factual_recall=metrics["factual_recall"],
            state_accuracy=metrics["state_accuracy"],
            state_chance=metrics["state_chance"],
            no_memory=metrics["no_memory"],
            memory_gain=metrics["memory_gain"],
            memory_score_undefined_periods=metrics["memory_score_undefined_periods"],
            json_errors=metrics.get("json_errors", 0),
            per_user=metrics.get("per_user", {}),
            **metrics["diagnosis"],
        )


class CycleRecord(BaseModel):
    """Everything one cycle produced; written once as cycle_NN/cycle.json."""

    model_config = ConfigDict(extra="forbid")

    cycle: int = Field(ge=0)
    scorer_version: str = SCORER_VERSION  # the definitions the numbers below follow
    splits: dict[Split, SplitResult]
    tokens: dict[str, int] = Field(default_factory=dict)  # per component, this cycle's work
    # US dollars of those tokens, per priced component (empty: no endpoint had a price)
    cost_usd: dict[str, float] = Field(default_factory=dict)
    seconds: float = 0.0
    feedback: SummaryReport | None = None  # the summary the next prompts were evolved from
    leaks_rejected: int = Field(0, ge=0)  # candidates the leak check refused (core/leaks.py)
    extra: dict[str, float] = Field(default_factory=dict)  # search-specific numbers

    @classmethod
    def from_json(cls, text: str) -> CycleRecord:
        """A stored cycle.json; one written before scorer versions were recorded is version 1."""
        data = json.loads(text)
        data.setdefault("scorer_version", "1")
        return cls.model_validate(data)

    def metrics(self) -> dict[str, float | None]:
        """MLflow metrics: `<split>/<metric>` per split and metric, `tokens/<component>`, extras.

        With a price: `cost_usd/<component>` and `cost_usd/total` (this cycle's dollars).

        The slash makes MLflow's UI group the charts by split.
        """
        out: dict[str, float | None] = {}
        for split, result in self.splits.items():
            for name in CYCLE_METRICS:
                value = getattr(result, name)
                out[f"{split}/{name}"] = None if value is None else float(value)
        out.update({f"tokens/{c}": float(v) for c, v in self.tokens.items()})
        out.update(cost_metrics(self.cost_usd))
        out.update({f"optimizer/{k}": v for k, v in self.extra.items()})
        out["optimizer/leaks_rejected"] = float(self.leaks_rejected)
        if self.feedback is not None:
            out["optimizer/feedback_omitted_questions"] = float(len(self.feedback.omitted))
        return out

    def add_cost(self, component: str, cost_usd: float | None) -> None:
        """Count `cost_usd` dollars under `component` (nothing when it is None: no price)."""
        if cost_usd is not None:
            self.cost_usd[component] = self.cost_usd.get(component, 0.0) + cost_usd

    def score(self, split: str, metric: str = "memory_score") -> float | None:
        result = self.splits.get(split)  # type: ignore[call-overload]
        return None if result is None else getattr(result, metric)


def cost_metrics(cost_usd: dict[str, float]) -> dict[str, float]:
    """MLflow metrics of dollars per component: `cost_usd/<component>`, `cost_usd/total`.

    Empty when nothing had a price (an empty `cost_usd`): an unpriced run logs no cost at all.
    """
    if not cost_usd:
        return {}
    return {
        **{f"cost_usd/{c}": v for c, v in cost_usd.items()},
        "cost_usd/total": sum(cost_usd.values()),
    }


OBJECTIVES: tuple[str, ...] = tuple(o.value for o in Objective)


class Selection(BaseModel):
    """Which cycle's prompts a run stands for, and on what grounds."""

    cycle: int
    rule: str  # "best val_state_accuracy" or "last cycle (no validation score)"
    val_memory_score: float | None = None
    objective: Objective = LEGACY_OBJECTIVE  # what the cycles were ranked on
    val_objective: float | None = None  # its value on the validation users


def select_cycle(records: list[CycleRecord], objective: str) -> Selection | None:
    """The cycle with the best validation `objective` (the earliest on a tie).

    Without validation users (or while no validation value is defined) the last cycle: no choice
    is made, so none can be biased. Reads nothing but the `val` split.
    """
    if not records:
        return None
    scored = [(r.cycle, r.score(SELECTION_SPLIT, objective)) for r in records]
    defined = [(k, s) for k, s in scored if s is not None]
    if defined:
        k, s = max(defined, key=lambda ks: (ks[1], -ks[0]))
        return Selection(
            cycle=k,
            rule=f"best val_{objective}",
            val_memory_score=records[k].score(SELECTION_SPLIT),
            objective=objective,
            val_objective=s,
        )
    return Selection(
        cycle=records[-1].cycle, rule="last cycle (no validation score)", objective=objective
    )
