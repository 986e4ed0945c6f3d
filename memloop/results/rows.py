"""Runs read back from MLflow as rows, grouped by their settings and paired with a baseline.

`experiment_rows` reads an experiment's runs: each run's cycles as `CycleRecord`s (the `cycle/`
artifacts, through the tracker), its prompt selected on validation users with
`cycles.select_cycle` (the rule the run itself used), and its numbers that prompt's on the test
users. Runs are paired only within a group sharing the `memloop.like` tag (`group_rows`,
`label_groups`); each group's rows are paired with its own baseline (`pick_baseline`,
`pair_with_baseline`); repeats of a condition are summarised by `repeat_summaries`. compare.py
says what the tables show.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import json_sha256
from memloop.core.stats import Paired
from memloop.feedback.metrics import metric, paired_metrics
from memloop.feedback.objective import LEGACY_OBJECTIVE, Objective
from memloop.feedback.records import SCORER_VERSION
from memloop.llm.usage import add_costs
from memloop.runs import tracker
from memloop.runs.cycles import (
    CONFIRM_ARTIFACT,
    CONFIRM_DECISION,
    Confirmation,
    CycleRecord,
    Selection,
    per_user_values,
    select_cycle,
)
from memloop.runs.spec import CHOSEN, LIKE_TAG, RunSpec, differences, spec_from_params

HEADLINE_SPLIT = "test"


def shown_metrics(rows: list[RunRow]) -> tuple[str, ...]:
    """The paired metrics compare's tables show: a probability only when a run of `rows` has it."""
    return tuple(
        m
        for m in paired_metrics()
        if not metric(m).probability or any(r.per_user.get(m) for r in rows)
    )


@dataclass
class RunRow:
    run_id: str
    name: str
    feedback_mode: str
    evolver: str
    search: str
    records: list[CycleRecord]
    selection: Selection | None
    split: str  # the split the numbers below are on ("test"; "val" or "train" without one)
    n_users: int
    first: float | None  # memory score of cycle 0
    vs_first: Paired  # selected - cycle 0 per user, on the run's objective
    tokens: int
    scorer_version: str
    cost_usd: float | None = None  # dollars of every cycle's tokens; None: nothing had a price
    # the selected cycle's per-user numbers on `split`: {metric: {user: value}}
    per_user: dict[str, dict[str, float]] = field(default_factory=dict)
    vs_baseline: dict[str, Paired] = field(default_factory=dict)  # metric -> paired difference
    repeat: int = 0  # which draw of its condition (evolve's `repeats:`)
    baseline: RunRow | None = None  # the baseline run `vs_baseline` was paired with
    # sha256 of the logged prompts of cycle 0 and of the selected cycle (None: none logged)
    first_prompts: str | None = None
    selected_prompts: str | None = None
    like: str | None = None  # the `memloop.like` tag: runs paired must share it (None: older)
    spec: dict[str, str] = field(default_factory=dict)  # the run's `spec.*` params, unprefixed
    settings: str = ""  # what sets its group apart ("runs with ..."; "" for a lone group)
    settings_short: str = ""  # the same, values only (plot legends)
    is_baseline: bool = False  # a run of its group's baseline condition
    objective: str = LEGACY_OBJECTIVE.value  # what its cycle was selected on (validation users)
    # the selected cycle's value of each paired metric of the catalogue on `split` (None: not
    # measured; state_prob: no letter read)
    values: dict[str, float | None] = field(default_factory=dict)

    @property
    def selected(self) -> float | None:
        """The memory score of the selected cycle."""
        return self.values.get("memory_score")

    @property
    def state_accuracy(self) -> float | None:
        return self.values.get("state_accuracy")

    @property
    def memory_gain(self) -> float | None:
        return self.values.get("memory_gain")

    @property
    def factual_recall(self) -> float | None:
        return self.values.get("factual_recall")

    @property
    def state_prob(self) -> float | None:
        return self.values.get("state_prob")

    @property
    def same_prompt_as_first(self) -> bool:
        """The selected cycle's prompts are cycle 0's: `vs_first` compares a prompt with itself."""
        return self.selected_prompts is not None and self.selected_prompts == self.first_prompts

    @property
    def policy_settings(self) -> dict[str, str]:
        """The policy's options as the run's spec logged them (`policy.*`, unprefixed)."""
        return {k[7:]: v for k, v in self.spec.items() if k.startswith("policy.")}

    def settings_vs_baseline(self) -> list[str]:
        """Each policy option that differs from the baseline run's: `update_freq 4 vs 2`."""
        if self.baseline is None:
            return []
        mine, theirs = self.policy_settings, self.baseline.policy_settings
        return [
            f"{key} {mine.get(key, '-')} vs {theirs.get(key, '-')}"
            for key in sorted(set(mine) | set(theirs))
            if mine.get(key) != theirs.get(key)
        ]

    @property
    def same_prompt_as_baseline(self) -> bool:
        """This run's selected prompts and policy settings are its baseline run's.

        Evals of one prompt under different memory settings are the main use of evals: their
        difference is the settings', and is shown, labelled by them (`settings_vs_baseline`).
        """
        return (
            self.baseline is not None
            and self.selected_prompts is not None
            and self.selected_prompts == self.baseline.selected_prompts
            and not self.settings_vs_baseline()
        )

    @property
    def cycles(self) -> int:
        return len(self.records)

    @property
    def condition(self) -> str:
        return f"{self.feedback_mode}/{self.evolver}"

    @property
    def group(self) -> tuple[str, str, str]:
        """What makes the condition (its repeats share it)."""
        return (self.feedback_mode, self.evolver, self.search)

    @property
    def delta(self) -> float | None:
        return self.vs_first.diff


def run_records(mlc, run_id: str) -> list[CycleRecord]:
    """The run's CycleRecords, in cycle order, from its `cycle/` artifacts."""
    paths = sorted(tracker.artifact_paths(mlc, run_id, "cycle"))
    return [CycleRecord.from_json(tracker.artifact_text(mlc, run_id, p)) for p in paths]


def run_confirmation(mlc, run_id: str) -> Confirmation | None:
    """The run's decision on its confirmation users (`confirmation/decision.json`), or None."""
    path = f"{CONFIRM_ARTIFACT}/{CONFIRM_DECISION}"
    if path not in tracker.artifact_paths(mlc, run_id, CONFIRM_ARTIFACT):
        return None
    text = tracker.artifact_text(mlc, run_id, path)
    return Confirmation.model_validate_json(text)


def logged_prompts(mlc, run_id: str, cycle: int) -> dict[str, str]:
    """The prompts a run logged for `cycle` (`prompts/cycle_NN.json`)."""
    return json.loads(tracker.artifact_text(mlc, run_id, f"prompts/cycle_{cycle:02d}.json"))


def prompt_hashes(mlc, run_id: str, cycles: set[int]) -> dict[int, str]:
    """{cycle: sha256 of its prompts} for each of `cycles` with a `prompts/cycle_NN.json`."""
    logged = {p.rsplit("/", 1)[-1] for p in tracker.artifact_paths(mlc, run_id, "prompts")}
    return {
        k: json_sha256(logged_prompts(mlc, run_id, k))
        for k in sorted(cycles)
        if f"cycle_{k:02d}.json" in logged
    }


def user_scores(record: CycleRecord, split: str, metric: str = "memory_score") -> dict[str, float]:
    """{user: `metric`} on `split` for the users where it is defined."""
    result = record.splits.get(split)  # type: ignore[call-overload]
    return {} if result is None else per_user_values(result.per_user, metric)


def headline_split(records: list[CycleRecord]) -> str:
    present = set(records[0].splits) if records else set()
    return next((s for s in (HEADLINE_SPLIT, "val", "train") if s in present), HEADLINE_SPLIT)


def make_row(
    run: Any, records: list[CycleRecord], confirmation: Confirmation | None = None
) -> RunRow:
    tags = run.data.tags
    objective = Objective(tags.get("memloop.objective", LEGACY_OBJECTIVE))
    selection = select_cycle(records, objective, confirmation)
    split = headline_split(records)
    first_rec = records[0] if records else None
    chosen = records[selection.cycle] if selection else None
    result = chosen.splits.get(split) if chosen else None  # type: ignore[call-overload]
    return RunRow(
        run_id=run.info.run_id,
        name=tags.get("mlflow.runName", run.info.run_id),
        feedback_mode=tags["memloop.feedback_mode"],
        evolver=tags.get("memloop.evolver", "?"),
        search=tags.get("memloop.search", "episode"),
        records=records,
        selection=selection,
        split=split,
        n_users=result.users if result else 0,
        first=first_rec.score(split) if first_rec else None,
        vs_first=Paired.of(
            user_scores(chosen, split, objective.value) if chosen else {},
            user_scores(first_rec, split, objective.value) if first_rec else {},
        ),
        tokens=sum(sum(r.tokens.values()) for r in records),
        cost_usd=add_costs(*(sum(r.cost_usd.values()) for r in records if r.cost_usd)),
        scorer_version=chosen.scorer_version if chosen else SCORER_VERSION,
        per_user={m: user_scores(chosen, split, m) for m in paired_metrics()} if chosen else {},
        values={m: result.value(m) if result else None for m in paired_metrics()},
        repeat=int(tags.get("memloop.repeat", "0")),
        like=tags.get(LIKE_TAG),
        spec=spec_from_params(run.data.params),
        objective=objective.value,
    )


def pick_baseline(rows: list[RunRow], baseline: str = "none") -> list[RunRow]:
    """The baseline condition's rows (one per repeat).

    `none` = the runs without evolution; else a run id, name, condition or evolver naming one of
    the condition's runs.
    """
    for r in rows:
        if (baseline == "none" and "none" in (r.feedback_mode, r.evolver)) or baseline in (
            r.run_id,
            r.name,
            r.condition,
            r.evolver,
        ):
            return [b for b in rows if b.group == r.group]
    return []


def pair_with_baseline(rows: list[RunRow], baselines: list[RunRow]) -> None:
    """Fill every other condition's `vs_baseline`: per-user differences on the users both saw.

    A run is paired with the baseline run of its own repeat (same draw index), or the baseline's
    first repeat when the baseline has no such repeat.
    """
    by_repeat: dict[int, RunRow] = {}
    for b in baselines:
        by_repeat.setdefault(b.repeat, b)  # the earliest run of a repeat, as for one baseline
    for r in rows:
        if any(r is b for b in baselines):
            continue
        base = by_repeat.get(r.repeat) or by_repeat[min(by_repeat)]
        r.baseline = base
        r.vs_baseline = {
            m: Paired.of(r.per_user.get(m, {}), base.per_user.get(m, {})) for m in paired_metrics()
        }


OLDER_HEADING = "runs logged by an older memloop (no run spec)"
OLDER_NOTE = (
    "logged by an older memloop: not paired (without a run spec, nothing says these runs share "
    "their environment, users, models or policy settings)"
)
NO_BASELINE_NOTE = "no baseline run of its own settings: not paired"
HEADING_SETTINGS = 3  # settings named in a group's heading; more are counted
SETTING_CHARS = 40  # a longer value is cut


@dataclass
class RunGroup:
    """The runs of one `memloop.like` (None: runs without one), in the order first seen."""

    like: str | None
    rows: list[RunRow]

    @property
    def heading(self) -> str:
        return self.rows[0].settings

    @property
    def older(self) -> bool:
        return self.like is None

    @property
    def has_baseline(self) -> bool:
        return any(r.is_baseline for r in self.rows)

    @property
    def note(self) -> str | None:
        """Why the group is shown unpaired, if it is."""
        if self.older:
            return OLDER_NOTE
        return None if self.has_baseline else NO_BASELINE_NOTE


def group_rows(rows: list[RunRow]) -> list[RunGroup]:
    """The rows by `memloop.like`, groups and rows in first-seen order."""
    groups: dict[str | None, RunGroup] = {}
    for r in rows:
        groups.setdefault(r.like, RunGroup(r.like, [])).rows.append(r)
    return list(groups.values())


def like_params(spec: dict[str, str]) -> dict[str, str]:
    """The `spec.*` params a group's runs share: all but the optimizer's choices and the key."""
    return {k: v for k, v in spec.items() if k != "key" and k.split(".", 1)[0] not in CHOSEN}


def _cut(value: str | None) -> str:
    if value is None:
        return "unset"
    return value if len(value) <= SETTING_CHARS else value[: SETTING_CHARS - 3] + "..."


def _settings(values: dict[str, str | None], roles: set[str]) -> list[tuple[str, str]]:
    """(name, value) per setting, endpoint roles sharing a value named once.

    `endpoints.*.model` when every role has that model, else `endpoints.agent,checker.model`.
    """
    order: list[tuple[str, str | None]] = []  # (name or endpoint setting, value)
    merged: dict[tuple[str, str | None], list[str]] = {}
    for key, value in values.items():
        parts = key.split(".", 2)
        if parts[0] == "endpoints" and len(parts) == 3:
            slot = (parts[2], value)
            if slot not in merged:
                merged[slot] = []
                order.append(("endpoints." + parts[2], value))
            merged[slot].append(parts[1])
        else:
            order.append((key, value))
    out = []
    for name, value in order:
        if name.startswith("endpoints."):
            setting = name.split(".", 1)[1]
            who = merged[(setting, value)]
            role = "*" if len(who) > 1 and set(who) >= roles else ",".join(who)
            name = f"endpoints.{role}.{setting}"
        out.append((name, _cut(value)))
    return out


def label_groups(groups: list[RunGroup]) -> None:
    """Head each group by the `spec.*` params that differ between the groups (rows' `settings`).

    Nothing for a lone group. A group's params are its first run's (a group shares them all).
    """
    if len(groups) < 2:
        return
    specced = [g for g in groups if not g.older]
    shared = [like_params(g.rows[0].spec) for g in specced]
    varying = list(dict.fromkeys(k for other in shared[1:] for k in differences(shared[0], other)))
    fields = list(RunSpec.model_fields)  # named in the spec's order: environment, users, ...
    varying.sort(key=lambda k: fields.index(k.split(".")[0]) if k.split(".")[0] in fields else 99)
    headings: dict[int, tuple[str, str]] = {}
    for i, (group, params) in enumerate(zip(specced, shared, strict=True)):
        roles = {k.split(".")[1] for k in params if k.startswith("endpoints.")}
        named = _settings({k: params.get(k) for k in varying}, roles)
        if not named:  # one group with a run spec beside older runs
            named = [("memloop.like", group.like or "")]
        shown = [f"{k} = {v}" for k, v in named[:HEADING_SETTINGS]]
        more = len(named) - HEADING_SETTINGS
        heading = (
            "runs with " + ", ".join(shown) + (f" and {more} more settings" if more > 0 else "")
        )
        short = ", ".join(v for _, v in named[:HEADING_SETTINGS])
        headings[i] = (heading, short)
    texts = [h for h, _ in headings.values()]
    for i, group in enumerate(specced):
        heading, short = headings[i]
        if texts.count(heading) > 1:  # cut values alike: tell the groups apart by their tag
            heading += f" (memloop.like {group.like})"
            short += f" ({group.like})"
        for r in group.rows:
            r.settings, r.settings_short = heading, _cut(short)
    for group in groups:
        if group.older:
            for r in group.rows:
                r.settings, r.settings_short = OLDER_HEADING, "older memloop"


@dataclass
class RepeatSummary:
    """One condition over its repeats: the spread across draws and the pooled paired difference.

    `mean`/`sd`: of the selected prompt's number on the headline users, across repeats.
    `pooled`: each user's difference from the baseline averaged over the repeats both ran, then
    `Paired` over users (users are the independent unit). `diff_sd`: the SD of the per-repeat
    mean differences (how much one repeat's comparison moves with the draw). `same_prompt`: every
    paired repeat's selected prompt is its baseline repeat's.
    """

    group: tuple[str, str, str]
    repeats: int
    users: int
    mean: dict[str, float | None]
    sd: dict[str, float | None]
    pooled: dict[str, Paired] = field(default_factory=dict)
    diff_sd: dict[str, float | None] = field(default_factory=dict)
    same_prompt: bool = False


def _mean_sd(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and sample SD (None where undefined: no values, or fewer than two for the SD)."""
    if not values:
        return None, None
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else None


def _per_user_mean(maps: list[dict[str, float]]) -> dict[str, float]:
    users = sorted({u for m in maps for u in m})
    out = {}
    for u in users:
        values = [m[u] for m in maps if u in m]
        out[u] = sum(values) / len(values)
    return out


def repeat_summaries(rows: list[RunRow]) -> list[RepeatSummary]:
    """Per condition (in first-seen order), its spread across repeats and pooled comparison."""
    groups: dict[tuple[str | None, tuple[str, str, str]], list[RunRow]] = {}
    for r in rows:  # a condition of other settings is another condition
        groups.setdefault((r.like, r.group), []).append(r)
    out = []
    for (_, key), members in groups.items():
        mean, sd = {}, {}
        for m in paired_metrics(probabilities=False):
            values = [v for v in (r.values.get(m) for r in members) if v is not None]
            mean[m], sd[m] = _mean_sd(values)
        summary = RepeatSummary(
            key, len(members), max((r.n_users for r in members), default=0), mean, sd
        )
        paired = [r for r in members if r.baseline is not None]
        if paired:
            summary.same_prompt = all(r.same_prompt_as_baseline for r in paired)
            for m in paired_metrics(probabilities=False):
                # matched per repeat: a user's condition and baseline values from the same draws
                cond, base = [], []
                for r in paired:
                    assert r.baseline is not None
                    shared = set(r.per_user.get(m, {})) & set(r.baseline.per_user.get(m, {}))
                    cond.append({u: r.per_user[m][u] for u in shared})
                    base.append({u: r.baseline.per_user[m][u] for u in shared})
                summary.pooled[m] = Paired.of(_per_user_mean(cond), _per_user_mean(base))
                diffs = [r.vs_baseline[m].diff for r in paired]
                summary.diff_sd[m] = _mean_sd([d for d in diffs if d is not None])[1]
        out.append(summary)
    return out


def experiment_rows(tracking_uri: str, experiment: str, baseline: str = "none") -> list[RunRow]:
    mlc = tracker.client(tracking_uri, create=False)  # read only: never a new store
    exp = tracker.find_experiment(mlc, experiment)
    if exp is None:
        names = ", ".join(tracker.experiment_names(mlc)) or "none yet"
        raise UserError(
            f"no MLflow experiment {experiment!r} in {tracking_uri} (experiments: {names})"
        )
    rows = []
    for run in tracker.experiment_runs(mlc, exp.experiment_id):
        if "memloop.feedback_mode" in run.data.tags:
            run_id = run.info.run_id
            row = make_row(run, run_records(mlc, run_id), run_confirmation(mlc, run_id))
            if row.records:
                chosen = row.records[-1].cycle if row.selection is None else row.selection.cycle
                hashes = prompt_hashes(mlc, row.run_id, {row.records[0].cycle, chosen})
                row.first_prompts = hashes.get(row.records[0].cycle)
                row.selected_prompts = hashes.get(chosen)
            rows.append(row)
    groups = group_rows(rows)
    label_groups(groups)
    found = older = False
    for group in groups:  # each group with its own baseline, chosen among its own runs
        base = pick_baseline(group.rows, baseline)
        if group.older:
            older = older or bool(base)
            continue
        found = found or bool(base)
        for b in base:
            b.is_baseline = True
        if base:
            pair_with_baseline(group.rows, base)
    if not found and baseline != "none":
        if older:
            raise UserError(
                f"baseline run {baseline!r} in {experiment!r} was logged by an older memloop "
                "(no run spec): nothing says which runs share its settings, so none is paired "
                "with it"
            )
        names = ", ".join(r.condition for r in rows) or "none"
        raise UserError(f"no baseline run {baseline!r} in {experiment!r} (runs: {names})")
    return rows
