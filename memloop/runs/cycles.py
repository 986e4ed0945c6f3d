"""A cycle as data: `CycleRecord`, what every search yields, and the one selection rule.

A cycle evaluates one set of prompts on up to three user splits:
- `train`: the users whose episodes make the feedback (in the period cadence: the period's
  online records, the prompt changing under them);
- `val`: the users every selection is made on;
- `test`: users that are only evaluated; nothing is ever chosen on them.

`select_cycle` is the only place a run picks a cycle (the registry alias `best`, compare's
headline): it reads validation metrics and nothing else, so a test user's result cannot change a
selection (tests/optimize/test_optimize_splits.py poisons the test users to show it). It keeps the
seed (cycle 0) unless the gate (core/stats.py) says the best validation cycle `improved` on it,
or, in a run with confirmation users, unless their one decision does (optimize/confirm.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from memloop.feedback.metrics import cycle_metrics
from memloop.feedback.objective import LEGACY_OBJECTIVE, Objective
from memloop.feedback.records import SCORER_VERSION
from memloop.feedback.summary import SummaryReport

if TYPE_CHECKING:
    from memloop.feedback.evaluate import EvaluationResult


OBJECTIVE_SECTION = "Objective"
"""The objective's curves are logged again as `Objective/<split>_<objective>`: MLflow's UI orders
chart sections by name, and a capital letter sorts before every memloop section."""


def objective_curves(record: CycleRecord, objective: str) -> dict[str, float | None]:
    """`Objective/val_<objective>` and `Objective/test_<objective>` of one cycle.

    The splits it has; the same numbers as `val/<objective>` and `test/<objective>`, drawn first.
    """
    return {
        f"{OBJECTIVE_SECTION}/{split}_{objective}": record.score(split, objective)
        for split in ("val", "test")
        if split in record.splits
    }


def headline_values(values: dict[str, float | None]) -> dict[str, str]:
    """`headline.test_<metric>` -> its text (4 significant digits, `n/a` where undefined).

    A run's test numbers as MLflow params or tags (evolve, eval and tune write them alike).
    """
    return {f"headline.test_{k}": "n/a" if v is None else f"{v:.4g}" for k, v in values.items()}


Split = Literal["train", "val", "test"]
SELECTION_SPLIT: Split = "val"


class SplitResult(BaseModel):
    """One split's numbers in one cycle (the catalogue's cycle metrics plus per-user scores).

    Fields added with scorer version 2 default to None / 0, so cycle records of version-1 runs
    still load (compare labels them). A cycle metric of the catalogue (feedback/metrics.py)
    without a field of its own is kept in `more`; `value(name)` reads either.
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
    state_prob: float | None = None  # the letter read's mean P(true value); None: no read
    state_chance: float | None = None
    no_memory: float | None = None
    memory_gain: float | None = None
    memory_score_undefined_periods: int = 0
    json_errors: int = 0
    per_user: dict[str, dict[str, Any]] = Field(default_factory=dict)
    more: dict[str, float | None] = Field(default_factory=dict)
    # memory health (feedback/health.py): its MLflow metrics, and each user's alarms
    health: dict[str, float] = Field(default_factory=dict)
    alarms: dict[str, list[str]] = Field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """The split's value of metric `name` (None: not measured here)."""
        if name in type(self).model_fields and name not in ("per_user", "more", "health", "alarms"):
            value = getattr(self, name)
            return None if value is None else float(value)
        return self.more.get(name)

    @classmethod
    def from_metrics(cls, metrics: dict[str, Any]) -> SplitResult:
        """From a metrics.json dict (feedback.report.build_metrics)."""
        return cls(
            users=metrics["users"],
            memory_score=metrics["memory_score"],
            overall=metrics["overall"],
            factual_recall=metrics["factual_recall"],
            state_accuracy=metrics["state_accuracy"],
            state_prob=metrics.get("state_prob"),
            state_chance=metrics["state_chance"],
            no_memory=metrics["no_memory"],
            memory_gain=metrics["memory_gain"],
            memory_score_undefined_periods=metrics["memory_score_undefined_periods"],
            json_errors=metrics.get("json_errors", 0),
            per_user=metrics.get("per_user", {}),
            more={
                name: metrics.get(name)
                for name in cycle_metrics()
                if name not in cls.model_fields and name not in metrics["diagnosis"]
            },
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
            for name in cycle_metrics():
                out[f"{split}/{name}"] = result.value(name)
            out.update({f"{split}/{name}": value for name, value in result.health.items()})
        out.update({f"tokens/{c}": float(v) for c, v in self.tokens.items()})
        out.update(cost_metrics(self.cost_usd))
        out.update({f"optimizer/{k}": v for k, v in self.extra.items()})
        out["optimizer/leaks_rejected"] = float(self.leaks_rejected)
        if self.feedback is not None:
            out["optimizer/feedback_omitted_questions"] = float(len(self.feedback.omitted))
        return out

    @classmethod
    def of(
        cls,
        cycle: int,
        results: dict[str, EvaluationResult],
        *,
        train: dict[str, Any] | None = None,
        feedback: SummaryReport | None = None,
        extra: dict[str, float] | None = None,
        leaks_rejected: int = 0,
        seconds: float = 0.0,
    ) -> CycleRecord:
        """The record of cycle `cycle` from its evaluations (`results`, one per split).

        `train`: the training split's metrics when they come from elsewhere (the period search's
        online records): their split goes first and their tokens and dollars are counted too.
        Every search builds its records here, so each counts its work the same way.
        """
        splits = {} if train is None else {"train": SplitResult.from_metrics(train)}
        splits.update(split_results(results))
        metrics = [r.metrics for r in results.values()] + ([] if train is None else [train])
        return cls(
            cycle=cycle,
            splits=splits,
            tokens=_tokens(metrics),
            cost_usd=_per_component(metrics, "cost_usd"),
            seconds=seconds,
            feedback=feedback,
            leaks_rejected=leaks_rejected,
            extra=extra or {},
        )

    def add_step(self, step: EvolveStep) -> None:
        """Count the proposal that follows this cycle: its tokens, dollars and refused leaks."""
        self.record_work("optimizer", step.tokens, step.cost_usd)
        self.leaks_rejected = step.leaks_rejected

    def record_work(self, component: str, tokens: int, cost_usd: float | None) -> None:
        """`component`'s tokens (replacing any count of it) and dollars for this cycle."""
        self.tokens[component] = tokens
        self.add_cost(component, cost_usd)

    def add_cost(self, component: str, cost_usd: float | None) -> None:
        """Count `cost_usd` dollars under `component` (nothing when it is None: no price)."""
        if cost_usd is not None:
            self.cost_usd[component] = self.cost_usd.get(component, 0.0) + cost_usd

    def score(self, split: str, metric: str = "memory_score") -> float | None:
        result = self.splits.get(split)  # type: ignore[call-overload]
        return None if result is None else result.value(metric)


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


SEED_CYCLE = 0  # every search's cycle 0 evaluates the seed prompts


class Selection(BaseModel):
    """Which cycle's prompts a run stands for, and on what grounds.

    `candidate`: the cycle with the best validation objective, tested against the seed by the
    gate (core/stats.py) when it is not the seed; `gate`: that decision (`GateResult.to_dict()`);
    `verdict`: its verdict. The selection is the candidate only when the verdict is `improved`.
    """

    cycle: int
    rule: str  # e.g. "kept the seed: the gate says inconclusive for cycle 2 on val_state_accuracy"
    val_memory_score: float | None = None
    objective: Objective = LEGACY_OBJECTIVE  # what the cycles were ranked on
    val_objective: float | None = None  # its value on the validation users
    candidate: int | None = None
    verdict: str | None = None
    gate: dict[str, Any] | None = None

    @property
    def kept_seed(self) -> bool:
        return self.cycle == SEED_CYCLE

    @property
    def gate_users(self) -> str:
        """Whose users the gate decided on: `confirmation` or `validation`."""
        split = (self.gate or {}).get("split")
        return "confirmation" if split == CONFIRM_SPLIT else "validation"


def per_user_values(per_user: dict[str, dict[str, Any]], metric: str) -> dict[str, float]:
    """{user: `metric`} of a per-user table, for the users where it is defined.

    The table is metrics.json's `per_user` or a split's (`SplitResult.per_user`).
    """
    return {u: row[metric] for u, row in per_user.items() if row.get(metric) is not None}


def val_per_user(record: CycleRecord, objective: str) -> dict[str, float]:
    """{validation user: value of `objective`} of one cycle (users without a value left out)."""
    result = record.splits.get(SELECTION_SPLIT)
    return {} if result is None else per_user_values(result.per_user, objective)


CONFIRM_SPLIT = "confirm"  # fresh users the loop never reads: one decision at the end
CONFIRM_FOLDER = "confirm"  # in the run folder: declared.json, look_<n>/, decision.json
CONFIRM_ARTIFACT = "confirmation"  # the MLflow run's artifact folder: decision.json
CONFIRM_DECISION = "decision.json"


class Confirmation(BaseModel):
    """The one decision on fresh confirmation users (optimize/confirm.py).

    Stored as confirm/decision.json in the run folder and as the run's MLflow artifact
    `confirmation/decision.json`.

    `candidate`: the cycle the run pre-declared (`rule` says how); `seed` / `scores`: each
    confirmation user's objective under the seed and the candidate (the users evaluated: half of
    them when look 1 decided); `gate`: the decision (`GateResult.to_dict()`, two looks or one);
    `verdict`: its verdict, or `identical to the seed` when the candidate's prompts are the seed's
    (nothing is evaluated then).
    """

    model_config = ConfigDict(extra="forbid")

    candidate: int
    rule: str
    objective: Objective
    users: list[str]  # every confirmation user, in order (look 1 takes the first half)
    looks: int
    verdict: str
    seed: dict[str, float] = Field(default_factory=dict)
    scores: dict[str, float] = Field(default_factory=dict)
    gate: dict[str, Any] | None = None
    # the null control (`null_control: true`): {what, verdict, seed, scores, gate}
    null: dict[str, Any] | None = None

    IDENTICAL: ClassVar[str] = "identical to the seed"

    @property
    def improved(self) -> bool:
        return self.verdict == "improved"


def load_confirmation(run_dir: Path) -> Confirmation | None:
    """A run folder's stored confirmation decision, or None."""
    path = Path(run_dir) / CONFIRM_FOLDER / CONFIRM_DECISION
    return Confirmation.model_validate_json(path.read_text()) if path.is_file() else None


def select_cycle(
    records: list[CycleRecord], objective: str, confirmation: Confirmation | None = None
) -> Selection | None:
    """The cycle a run stands for: the seed unless the gate says a cycle `improved` on it.

    With a `confirmation` (a run with confirmation users), its decision is the run's: the
    pre-declared candidate when it `improved` on the seed on the fresh users, else the seed.
    Otherwise the candidate is the cycle with the best validation `objective` (the earliest on a
    tie). It replaces the seed (cycle 0) only when the gate, on the validation users' paired
    differences candidate - seed, says `improved` at ALPHA / (the number of cycles it was chosen
    among). Without a validation value no choice is made: the seed. Reads nothing but the `val`
    split (and the confirmation's own decision).
    """
    from memloop.core.stats import gate_of

    if not records:
        return None
    by_cycle = {r.cycle: r for r in records}
    seed = by_cycle.get(SEED_CYCLE, records[0])
    if confirmation is not None and confirmation.candidate in by_cycle:
        return confirmed_selection(by_cycle[confirmation.candidate], seed, confirmation)

    def selection(record: CycleRecord, rule: str, **extra: Any) -> Selection:
        return Selection(
            cycle=record.cycle,
            rule=rule,
            val_memory_score=record.score(SELECTION_SPLIT),
            objective=objective,
            val_objective=record.score(SELECTION_SPLIT, objective),
            **extra,
        )

    scored = [(r, r.score(SELECTION_SPLIT, objective)) for r in records]
    defined = [(r, s) for r, s in scored if s is not None]
    if not defined:
        return selection(seed, f"the seed (no val_{objective}: nothing to choose on)")
    best, _ = max(defined, key=lambda rs: (rs[1], -rs[0].cycle))
    if best.cycle == seed.cycle:
        return selection(seed, f"the seed (no cycle beat it on val_{objective})")
    chosen_among = sum(1 for r, _ in defined if r.cycle != seed.cycle)
    decision = gate_of(
        val_per_user(best, objective), val_per_user(seed, objective), comparisons=chosen_among
    )
    extra = {"candidate": best.cycle, "verdict": decision.verdict.value, "gate": decision.to_dict()}
    if decision.improved:
        return selection(best, f"cycle {best.cycle}: improved on val_{objective}", **extra)
    return selection(
        seed,
        f"kept the seed: the gate says {decision.verdict.value} for cycle {best.cycle} on "
        f"val_{objective}",
        **extra,
    )


def confirmed_selection(
    candidate: CycleRecord, seed: CycleRecord, confirmation: Confirmation
) -> Selection:
    """The selection a confirmation decided: the candidate when it improved, else the seed."""
    k, n = confirmation.candidate, len(confirmation.scores)
    metric = confirmation.objective.value
    if confirmation.verdict == Confirmation.IDENTICAL:
        rule = f"kept the seed: the pre-declared cycle {k} ({confirmation.rule}) is the seed"
    elif confirmation.improved:
        rule = f"cycle {k}: improved on {n} confirmation users' {metric}"
    else:
        rule = (
            f"kept the seed: the confirmation says {confirmation.verdict} for cycle {k} "
            f"on {n} fresh users' {metric}"
        )
    chosen = candidate if confirmation.improved else seed
    return Selection(
        cycle=chosen.cycle,
        rule=rule,
        val_memory_score=chosen.score(SELECTION_SPLIT),
        objective=confirmation.objective,
        val_objective=chosen.score(SELECTION_SPLIT, metric),
        candidate=k,
        verdict=confirmation.verdict,
        gate=None if confirmation.gate is None else {**confirmation.gate, "split": CONFIRM_SPLIT},
    )


def best_alias_cycle(selection: Selection) -> int:
    """The cycle whose prompt version the registry alias `best` names.

    The selected cycle when the gate called it `improved` on the seed, else the seed: the alias
    never names a prompt the gate did not accept (a selection made without a gate decision is
    the seed's by construction).
    """
    return selection.cycle if selection.verdict == "improved" else SEED_CYCLE


class EvolveStep(BaseModel):
    """One proposal: the next prompts, what changed, what was kept and why, and its cost."""

    prompts: dict[str, str]
    changes: dict[str, list[str]] = Field(default_factory=dict)  # per predictor
    errors: dict[str, str] = Field(default_factory=dict)  # per predictor, kept old text
    tokens: int = Field(0, ge=0)  # tokens this proposal used (0 when served from the cache)
    # dollars of those tokens (its calls and replay screening); None: no call had a price
    cost_usd: float | None = Field(None, ge=0.0)
    leaks_rejected: int = Field(0, ge=0)  # candidates the leak check refused (set by `propose`)
    # the gate's decisions this step made (runs/gate_log.py entries: the replay screen's)
    decisions: list[dict[str, Any]] = Field(default_factory=list)
    # edits refused this step, each {predictor, edit, text (its sha256), stage, reason}: the
    # tabu memory later steps read (EvolveInput.rejected) so that none is proposed twice
    rejected: list[dict[str, Any]] = Field(default_factory=list)


def split_results(results: dict[str, EvaluationResult]) -> dict[str, SplitResult]:
    """Each split's numbers, with its users' memory health where their episodes are on disk."""
    out = {}
    for split, r in results.items():
        result = SplitResult.from_metrics(r.metrics)
        if r.episodes:
            result.health = r.health.metrics()
            result.alarms = {u: [a.name for a in found] for u, found in r.health.fired.items()}
        out[split] = result
    return out


def alarm_line(result: SplitResult, users: str) -> str | None:
    """`memory health: ...` of a split's recorded alarms (None: no health was recorded)."""
    from memloop.feedback.health import alarm_summary

    if not result.health:
        return None
    return alarm_summary(result.alarms, users)


def usage_tokens(results: Iterable[EvaluationResult]) -> dict[str, int]:
    """Tokens per component summed over evaluations."""
    return _tokens(r.metrics for r in results)


def usage_cost(results: Iterable[EvaluationResult]) -> dict[str, float]:
    """Dollars per priced component summed over evaluations (empty: nothing had a price)."""
    return _per_component((r.metrics for r in results), "cost_usd")


def _tokens(metrics: Iterable[dict[str, Any]]) -> dict[str, int]:
    return {k: int(v) for k, v in _per_component(metrics, "usage").items()}


def _per_component(metrics: Iterable[dict[str, Any]], key: str) -> dict[str, float]:
    """metrics.json dicts' `key` (usage or cost_usd) summed per component, in order seen."""
    out: dict[str, float] = {}
    for m in metrics:
        for k, v in m.get(key, {}).items():
            out[k] = out.get(k, 0) + v
    return out
