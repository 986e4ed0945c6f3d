"""One way a run reaches MLflow: open it, log to it, close it.

Every command that leaves an MLflow run (evolve, eval, tune's study and trials, import) opens it
with `recording(...)`, in one `with` block, as Optuna's `_run_trial` asks, runs and tells in one
try/finally:

- open: the run tagged with the spec's key, created or resumed (`tracker.log_run`: its params
  logged before the run can be found by its key, a resumed run given the params it lacks);
- log: the `Recorder` the block receives (metrics, texts, figures, traces, tags, params, prompt
  versions), and for evolve `EvolveRecord.log_cycle` (one cycle's curves, metrics, artifacts,
  traces and registry version);
- close: FINISHED when the block ends; KILLED when it ends by Ctrl-C, FAILED by any other
  exception (that exception is the one the user sees). For evolve, `EvolveRecord.close` first
  writes the selection, headline, description, verdict, the alias `best` and the gate log.

No other module opens or finishes an MLflow run (tests/test_architecture.py keeps it so).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memloop.core import interrupt
from memloop.core.stats import Paired
from memloop.core.tables import PAIRED_COLUMNS, format_table
from memloop.feedback.metrics import (
    cycle_metrics,
    headline_metrics,
    metric_column,
    paired_metrics,
)
from memloop.feedback.objective import Objective
from memloop.llm.usage import add_costs
from memloop.runs import gate_log, tracker
from memloop.runs.cycles import (
    CONFIRM_ARTIFACT,
    CONFIRM_DECISION,
    Confirmation,
    CycleRecord,
    Selection,
    best_alias_cycle,
    headline_values,
    objective_curves,
    per_user_values,
    val_per_user,
)
from memloop.runs.spec import RunSpec
from memloop.runs.store import CycleStore
from memloop.runs.traces import SessionTrace, episode_traces


@dataclass
class Recorder:
    """An open MLflow run and what a command logs to it."""

    mlc: Any
    experiment_id: str
    run_id: str
    resumed: bool

    def metrics(self, values: dict[str, float | None], step: int) -> None:
        tracker.log_metrics(self.mlc, self.run_id, values, step=step)

    def text(self, text: str, artifact_file: str) -> None:
        tracker.log_text(self.mlc, self.run_id, text, artifact_file)

    def figures(self, paths: list[Path]) -> None:
        tracker.log_figure(self.mlc, self.run_id, paths)

    def traces(self, traces: list[SessionTrace]) -> int:
        return tracker.log_traces(self.mlc, self.run_id, traces)

    def tags(self, tags: dict[str, str]) -> None:
        tracker.set_tags(self.mlc, self.run_id, tags)

    def params(self, params: dict[str, str]) -> None:
        """Params not logged yet (a resumed run keeps the ones it has)."""
        tracker.log_params_once(self.mlc, self.run_id, params)

    def rename(self, name: str, tags: dict[str, str] | None = None) -> None:
        tracker.name_run(self.mlc, self.run_id, name, tags)


def end_status(error: BaseException) -> str:
    """The status of a run its block left by `error`: KILLED or FAILED.

    KILLED when the user stopped it (`interrupt.by_user`), FAILED on any other error.
    """
    return "KILLED" if interrupt.by_user(error) else "FAILED"


@contextmanager
def recording(
    tracking_uri: str,
    experiment: str,
    spec: RunSpec,
    name: str,
    *,
    tags: dict[str, str] | None = None,
    parent: Recorder | None = None,
) -> Iterator[Recorder]:
    """The run of `spec` in `experiment`, open for the block; closed with the block's outcome."""
    mlc = parent.mlc if parent is not None else tracker.client(tracking_uri)
    exp = (
        parent.experiment_id
        if parent is not None
        else tracker.experiment_id(mlc, experiment, tracking_uri)
    )
    run_id, resumed = tracker.log_run(
        mlc, exp, spec, name, tags=tags, parent_run_id=parent.run_id if parent else None
    )
    try:
        yield Recorder(mlc, exp, run_id, resumed)
    except BaseException as e:
        tracker.finish_run(mlc, run_id, end_status(e))
        raise
    tracker.finish_run(mlc, run_id)


# ------------------------------------------------------------------------------ evolve


@dataclass
class EvolveRecord:
    """What an evolve run's record says about its condition, and how it logs cycles and closes.

    `users`: the user ids of each split; `store`: the run folder's cycle files; `seeded`: the
    run started from prompts of its own (the alias `best` is then kept).
    """

    name: str
    mode: str
    evolver: str
    search: str
    policy: str
    objective: Objective
    users: dict[str, list[str]]
    store: CycleStore
    prompt_name: str
    seeded: bool
    run_dir: Path

    def log_cycle(self, rec: Recorder, record: CycleRecord) -> int | None:
        """Metrics, artifacts, traces and the registry version of one cycle.

        Returns the version, or None when the search recorded no prompts for the cycle.
        """
        k = record.cycle
        rec.metrics({**objective_curves(record, self.objective), **record.metrics()}, step=k)
        for folder, text in self.store.artifacts(k).items():
            rec.text(text, f"{folder}/cycle_{k:02d}.json")
        episodes = self.store.cycle_dir(k) / "episodes"
        if episodes.is_dir():  # each user's sessions of the cycle's evaluation, as traces
            splits = {u: s for s, ids in self.users.items() for u in ids}
            rec.traces(episode_traces(episodes, run_label=self.name, cycle=k, splits=splits))
        prompts = self.store.saved_prompts(k)
        if prompts is None:
            return None
        return tracker.register_prompt(
            rec.mlc,
            self.prompt_name,
            prompts,
            cycle=k,
            run_id=rec.run_id,
            score=record.score("val", self.objective),
            objective=self.objective,
        )

    def close(
        self,
        rec: Recorder,
        cycles: list[CycleRecord],
        confirmation: Confirmation | None,
        chosen: Selection | None,
        versions: dict[int, int | None],
    ) -> None:
        """Log the confirmation's decision, the selected cycle and the description.

        The selected cycle: alias `best`, `selection.*` / `headline.*` params, verdict, gate log.

        The tag `memloop.cost_usd` sums every cycle's `cost_usd` (present when an endpoint had a
        price).
        """
        if confirmation is not None:
            rec.text(
                confirmation.model_dump_json(indent=1), f"{CONFIRM_ARTIFACT}/{CONFIRM_DECISION}"
            )
        cost = add_costs(*(sum(c.cost_usd.values()) for c in cycles if c.cost_usd))
        tags: dict[str, str] = {}
        if cost is not None:  # the run's dollars so far, every cycle's work
            tags["memloop.cost_usd"] = f"{cost:.6f}"
        if chosen is None:
            rec.tags(tags)
            return
        self.log_gate(cycles, confirmation, chosen)
        rec.text(comparison_text(cycles, chosen, confirmation, self.objective), COMPARISON)
        rec.text(prompt_diff(self.store, chosen.cycle), PROMPT_DIFF)
        # `best` follows the gate: the seed unless a cycle `improved` on it
        version = versions.get(best_alias_cycle(chosen))
        if self.seeded and version is not None:
            tracker.set_best(rec.mlc, self.prompt_name, version)
        record = cycles[chosen.cycle]
        # run-level numbers are params, not one-point charts: MLflow's run page and runs table
        # show them; the per-cycle curves are the metrics
        params: dict[str, str] = {"selection.cycle": str(chosen.cycle)}
        if "test" in record.splits:
            params.update(
                headline_values({m: record.score("test", m) for m in (*cycle_metrics(), "users")})
            )
        gate = chosen.gate or {}
        if gate:
            params["selection.gate_n"] = str(gate["n"])
            if gate.get("detectable") is not None:
                params["selection.detectable_effect"] = f"{gate['detectable']:.4g}"
        if confirmation is not None and confirmation.null is not None:
            null = confirmation.null
            tags["memloop.null_control"] = f"{null['what']}: {null['verdict']}"
        if confirmation is not None:
            params["confirmation.candidate"] = str(confirmation.candidate)
            params["confirmation.users"] = str(len(confirmation.users))
        rec.params(params)
        tags.update(
            {
                "memloop.selection": f"cycle {chosen.cycle}: {chosen.rule}",
                "memloop.verdict": chosen.verdict
                or "no candidate (the seed is best on validation)",
            }
        )
        if gate:
            detectable = gate.get("detectable")
            tags["memloop.gate"] = (
                f"cycle {chosen.candidate} vs seed on {gate['n']} {chosen.gate_users} users: "
                f"{gate['verdict']}, mean {gate['mean']:+.3f}, p {gate['sign_flip_p']:.3g}, "
                f"level {gate['level']:.3g}, detectable effect "
                + ("n/a" if detectable is None else f"{detectable:.3f}")
            )
        tags[tracker.DESCRIPTION_TAG] = self.description(len(cycles), params, tags)
        rec.tags(tags)

    def description(self, cycles: int, params: dict[str, str], tags: dict[str, str]) -> str:
        """The run's MLflow description: what ran, what was selected, the verdict, the headline."""
        users = {s: len(ids) for s, ids in self.users.items()}
        lines = [
            f"**{self.name}**: {self.policy} under feedback `{self.mode}`, "
            f"evolver `{self.evolver}`, search `{self.search}`; "
            f"{cycles} cycles; users: {users.get('train', 0)} training, "
            f"{users.get('val', 0)} validation, {users.get('test', 0)} test; "
            f"objective `{self.objective}`.",
            "",
            f"Selected: {tags['memloop.selection']}. Verdict: {tags['memloop.verdict']}.",
        ]
        if "memloop.gate" in tags:
            lines.append(f"Gate: {tags['memloop.gate']}.")
        if f"headline.test_{self.objective}" in params:
            lines += [
                "",
                f"Headline (selected cycle, {params['headline.test_users']} test users): "
                f"{self.objective} {params[f'headline.test_{self.objective}']}"
                + "".join(
                    f", {m} {params[f'headline.test_{m}']}"
                    for m in headline_metrics()
                    if m != self.objective
                )
                + ".",
            ]
        lines += [
            "",
            f"Against the seed (Artifacts): the paired comparison `{COMPARISON}`, the prompt "
            f"diff `{PROMPT_DIFF}`. Traces: each user's sessions of every cycle (Traces tab; "
            "group by session).",
        ]
        return "\n".join(lines)

    def log_gate(
        self, cycles: list[CycleRecord], confirmation: Confirmation | None, chosen: Selection
    ) -> None:
        """The run's gate log (runs/gate_log.py): each cycle's screen decisions, the selection."""
        entries = []
        for record in cycles:
            step = self.store.step(record.cycle)
            entries.extend(step.decisions if step is not None else [])
        if confirmation is not None and confirmation.gate is not None:
            entries.append(
                gate_log.entry(
                    "confirmation",
                    f"cycle {confirmation.candidate} vs cycle 0 on confirm_"
                    f"{confirmation.objective.value}",
                    sorted(set(confirmation.scores) & set(confirmation.seed)),
                    confirmation.gate,
                )
            )
        elif chosen.gate is not None:
            objective = chosen.objective.value
            pair = [cycles[k] for k in (chosen.candidate or 0, 0)]
            users = sorted(set.intersection(*(set(val_per_user(r, objective)) for r in pair)))
            entries.append(
                gate_log.entry(
                    "selection",
                    f"cycle {chosen.candidate} vs cycle 0 on val_{chosen.objective.value}",
                    users,
                    chosen.gate,
                )
            )
        if entries:
            gate_log.record(self.run_dir, *entries)


COMPARISON = "comparison/vs_seed.md"  # the run's paired result against its baseline, the seed
PROMPT_DIFF = "comparison/prompts_vs_seed.diff"


def comparison_text(
    cycles: list[CycleRecord],
    chosen: Selection,
    confirmation: Confirmation | None,
    objective: Objective,
) -> str:
    """The selected cycle against the seed (cycle 0), paired user by user, as `compare` shows it.

    On the test users when the run has them, else the validation users (where it was chosen:
    said so); each paired metric of the catalogue; then the confirmation's own comparison on its
    fresh users, and the verdict. A selection of the seed itself is said to be one.
    """
    selected, seed = cycles[chosen.cycle], cycles[0]
    split = "test" if "test" in selected.splits else "val"
    lines = [
        f"# cycle {chosen.cycle} (selected: {chosen.rule}) vs cycle 0 (the seed)",
        "",
    ]
    if chosen.cycle == 0:
        lines.append("The selection is the seed itself: the comparison is of the seed with itself.")
        lines.append("")
    rows = []
    for name in paired_metrics():
        mine = per_user_values(selected.splits[split].per_user, name)  # type: ignore[index]
        base = per_user_values(seed.splits[split].per_user, name)  # type: ignore[index]
        if mine or base:
            rows.append(
                [metric_column(name, objective=name == objective), *Paired.of(mine, base).cells()]
            )
    where = "test users" if split == "test" else "validation users (the cycle was chosen on them)"
    lines += [f"On the {where}:", "", format_table(["metric", *PAIRED_COLUMNS], rows, fmt="md")]
    if confirmation is not None and confirmation.scores:
        paired = Paired.of(confirmation.scores, confirmation.seed)
        lines += [
            "",
            f"Confirmation, cycle {confirmation.candidate} vs the seed on "
            f"{len(confirmation.users)} fresh users ({confirmation.objective.value}):",
            "",
            format_table(
                ["metric", *PAIRED_COLUMNS],
                [[confirmation.objective.value, *paired.cells()]],
                fmt="md",
            ),
        ]
    lines += ["", f"Verdict: {chosen.verdict or 'no candidate (the seed is best on validation)'}."]
    return "\n".join(lines) + "\n"


def prompt_diff(store: CycleStore, cycle: int) -> str:
    """The unified diff of each prompt from the seed (cycle 0) to `cycle`; identical ones say so."""
    import difflib

    seed, mine = store.saved_prompts(0) or {}, store.saved_prompts(cycle) or {}
    if seed == mine:
        return f"cycle {cycle}'s prompts are the seed's, character for character\n"
    out = []
    for name in sorted(set(seed) | set(mine)):
        before, after = seed.get(name, ""), mine.get(name, "")
        if before == after:
            out.append(f"=== {name}: unchanged\n")
            continue
        out.append(f"=== {name}\n")
        out += difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=f"cycle 0/{name}",
            tofile=f"cycle {cycle}/{name}",
        )
        if not out[-1].endswith("\n"):
            out[-1] += "\n"
    return "".join(out)
