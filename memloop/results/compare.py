"""`memloop compare`: the runs of an MLflow experiment side by side, and a prompt diff.

Each run's cycles are read back as `CycleRecord`s (the `cycle/` artifacts), the run's prompt is
selected on validation users with `cycles.select_cycle` (the rule the run itself used), and its
numbers are that prompt's on the test users, never a maximum over test cycles.

Two tables:
- marginal: each condition's own numbers (memory score, state accuracy, memory gain, recall,
  tokens), labelled as marginal: they carry no interval, since conditions are compared paired;
- paired: each condition minus the baseline condition (default: the run without evolution) on the
  same test users, one row per metric (`core.stats.Paired`): n, the mean per-user difference,
  its Student t 95% interval (or why there is none: one user, or every difference equal), the
  two-sided sign-flip permutation p and the users up/tied/down; a warning below 10 users. Also
  within each run: the selected prompt minus cycle 0 on the same users.

Runs are paired only within a group of runs sharing their settings: the `memloop.like` tag
(`RunSpec.like_key`: environment, users, models and endpoint settings, policy settings, starting
prompts, evaluation settings, scorer version; everything but what the optimizer chooses). An
experiment holding runs of several settings is shown group by group, each headed by the `spec.*`
params that differ between the groups and paired with its own baseline; a group without a
baseline run is shown unpaired, with a note. Runs logged before run specs existed (no
`memloop.like` tag) cannot be known to share anything: they form a group of their own, shown
but never paired.

Where the two prompts a row compares are identical (the sha256 of the logged
`prompts/cycle_NN.json` of the selected cycles, or of cycle 0 and the selected cycle), the row says
`same prompt` instead of numbers: any difference there comes from the draws, not the prompt.
"""

from __future__ import annotations

import difflib
import json
import statistics
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import json_sha256
from memloop.core.stats import EXACT_MAX, SMALL_N, Paired, format_p
from memloop.core.tables import (
    FORMATS,
    PAIRED_COLUMNS,
    WIDTH,
    format_cost,
    format_number,
    format_table,
    metric_column,
    objective_first,
    printable,
)
from memloop.feedback.objective import LEGACY_OBJECTIVE, Objective
from memloop.feedback.records import SCORER_VERSION
from memloop.llm.usage import add_costs
from memloop.runs import tracker
from memloop.runs.cycles import CycleRecord, Selection, select_cycle
from memloop.runs.spec import CHOSEN, LIKE_TAG, RunSpec, differences, spec_from_params

HEADLINE_SPLIT = "test"
PAIRED_METRICS = ("memory_score", "state_accuracy", "memory_gain", "factual_recall")
# with the letter read (probes.state_read: letters) also state_prob, after state accuracy
PROB_METRICS = ("memory_score", "state_accuracy", "state_prob", "memory_gain", "factual_recall")


def shown_metrics(rows: list[RunRow]) -> tuple[str, ...]:
    """The metrics compare's tables show: state_prob only when a run of `rows` has it."""
    has_prob = any(r.per_user.get("state_prob") for r in rows)
    return PROB_METRICS if has_prob else PAIRED_METRICS


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
    selected: float | None  # memory score of the selected cycle
    state_accuracy: float | None
    memory_gain: float | None
    vs_first: Paired  # selected - cycle 0 per user, on the run's objective
    factual_recall: float | None
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
    state_prob: float | None = None  # the letter read's mean P(true value); None: no letter read

    @property
    def same_prompt_as_first(self) -> bool:
        """The selected cycle's prompts are cycle 0's: `vs_first` compares a prompt with itself."""
        return self.selected_prompts is not None and self.selected_prompts == self.first_prompts

    @property
    def same_prompt_as_baseline(self) -> bool:
        """This run's selected prompts are its baseline run's selected prompts."""
        return (
            self.baseline is not None
            and self.selected_prompts is not None
            and self.selected_prompts == self.baseline.selected_prompts
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
    if result is None:
        return {}
    return {u: v[metric] for u, v in result.per_user.items() if v.get(metric) is not None}


def headline_split(records: list[CycleRecord]) -> str:
    present = set(records[0].splits) if records else set()
    return next((s for s in (HEADLINE_SPLIT, "val", "train") if s in present), HEADLINE_SPLIT)


def make_row(run: Any, records: list[CycleRecord]) -> RunRow:
    tags = run.data.tags
    objective = Objective(tags.get("memloop.objective", LEGACY_OBJECTIVE))
    selection = select_cycle(records, objective)
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
        selected=chosen.score(split) if chosen else None,
        state_accuracy=result.state_accuracy if result else None,
        memory_gain=result.memory_gain if result else None,
        vs_first=Paired.of(
            user_scores(chosen, split, objective.value) if chosen else {},
            user_scores(first_rec, split, objective.value) if first_rec else {},
        ),
        factual_recall=result.factual_recall if result else None,
        tokens=sum(sum(r.tokens.values()) for r in records),
        cost_usd=add_costs(*(sum(r.cost_usd.values()) for r in records if r.cost_usd)),
        scorer_version=chosen.scorer_version if chosen else SCORER_VERSION,
        per_user={m: user_scores(chosen, split, m) for m in PROB_METRICS} if chosen else {},
        state_prob=result.state_prob if result else None,
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
            m: Paired.of(r.per_user.get(m, {}), base.per_user.get(m, {})) for m in PROB_METRICS
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
        for m in PAIRED_METRICS:
            values = [v for v in (getattr(r, _ROW_FIELD[m]) for r in members) if v is not None]
            mean[m], sd[m] = _mean_sd(values)
        summary = RepeatSummary(
            key, len(members), max((r.n_users for r in members), default=0), mean, sd
        )
        paired = [r for r in members if r.baseline is not None]
        if paired:
            summary.same_prompt = all(r.same_prompt_as_baseline for r in paired)
            for m in PAIRED_METRICS:
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


_ROW_FIELD = {
    "memory_score": "selected",
    "state_accuracy": "state_accuracy",
    "state_prob": "state_prob",
    "memory_gain": "memory_gain",
    "factual_recall": "factual_recall",
}


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
            row = make_row(run, run_records(mlc, run.info.run_id))
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


PAIRED_HEADERS = list(PAIRED_COLUMNS)
SAME_PROMPT = "same prompt"


@dataclass
class Table:
    """One of compare's tables: the line above it, its headers, rows and column alignment."""

    title: str
    headers: list[str]
    rows: list[list[Any]]
    align: str
    group: int | None = None  # its group of runs, when there are several


@dataclass
class Heading:
    """A group's heading (`=== group k: ... ===` as text, a section heading in Markdown)."""

    text: str


Block = str | Table | Heading  # a line of text ("" a blank line), a table or a heading


def _paired_columns(p: Paired) -> list[str]:
    """n, mean difference, t interval (or why none), sign-flip p, users up/tied/down.

    A memory score is undefined where the upper bound does not beat random: n counts the users
    where both sides define the metric.
    """
    if p.mean is None:
        return ["0", "n/a", "-", "-", "-"]
    return [
        str(p.n),
        f"{p.mean:+.3f}",
        p.interval_text(),
        format_p(p.sign_flip_p),
        p.counts_text(),
    ]


def _same_prompt_columns() -> list[str]:
    return ["-", SAME_PROMPT, "-", "-", "-"]


def _metric_rows(
    lead: list[Any], paired: dict[str, Paired], same: bool, objective: str | None = None
) -> list[list[Any]]:
    """One row per metric (the objective's first) after the `lead` cells, or one `same prompt`."""
    if same:
        return [[*lead, "all", *_same_prompt_columns()]]
    return [
        [*lead, metric_column(m), *_paired_columns(paired[m])]
        for m in objective_first(PROB_METRICS, objective)
        if m in paired and (m != "state_prob" or paired[m].n)
    ]


def _spread_cell(mean: float | None, sd: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.3f}" + ("" if sd is None else f" ± {sd:.3f}")


def shared_objective(rows: list[RunRow]) -> str | None:
    """The objective every run of `rows` selected its cycle on (None when they differ)."""
    found = {r.objective for r in rows}
    return found.pop() if len(found) == 1 else None


def _label(r: RunRow) -> str:
    """A run's condition in the marginal table, its search named when it is not `episode`."""
    return r.condition + ("" if r.search == "episode" else f" ({r.search})")


def format_rows(rows: list[RunRow], fmt: str = "table") -> str:
    """The tables, group by group when the runs are of several settings, then the notes.

    `fmt`: aligned text within 100 columns (`table`), Markdown (`md`), or the tables alone as
    CSV blocks separated by a blank line (`csv`; a first column `group` when there are several).
    """
    return render(compare_blocks(rows), fmt)


def compare_blocks(rows: list[RunRow]) -> list[Block]:
    """The tables and lines of `format_rows`, in order."""
    repeated = any(r.repeat for r in rows)
    groups = group_rows(rows)
    blocks: list[Block] = []
    if len(groups) > 1:
        blocks.append(
            f"{len(groups)} groups of runs with different settings: a run is paired only with "
            "a baseline run of its own group (same environment, users, models, policy "
            "settings, starting prompts and evaluation)"
        )
        for i, group in enumerate(groups, 1):
            blocks += ["", Heading(f"group {i}: {group.heading}")]
            blocks += _group_blocks(group, repeated, several=True, number=i)
        blocks.append("")
    elif groups:
        blocks += _group_blocks(groups[0], repeated, several=False)
    return blocks + _notes(rows)


def render(blocks: list[Block], fmt: str = "table") -> str:
    """`blocks` as text (lines wrapped at 100 columns), Markdown, or their tables as CSV."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, not {fmt!r}")
    tables = [b for b in blocks if isinstance(b, Table)]
    if fmt == "csv":
        several = any(t.group is not None for t in tables)
        return "\n\n".join(
            format_table(
                ["group", *t.headers] if several else t.headers,
                [[t.group, *r] for r in t.rows] if several else t.rows,
                align=("r" if several else "") + t.align,
                fmt="csv",
            )
            for t in tables
        )
    lines: list[str] = []
    for b in blocks:
        if isinstance(b, Table):
            table = format_table(b.headers, b.rows, align=b.align, fmt=fmt)
            lines += [_wrap(b.title), table] if fmt == "table" else [b.title, "", table, ""]
        elif isinstance(b, Heading):
            lines.append(_wrap(f"=== {b.text} ===") if fmt == "table" else f"### {b.text}\n")
        elif fmt == "md":
            lines.append(b + "\n" if b else "")
        else:
            lines.append(_wrap(b))
    text = "\n".join(lines)
    return text.replace("\n\n\n", "\n\n").strip("\n") if fmt == "md" else text


def _wrap(line: str) -> str:
    """A line of prose within 100 columns (later lines indented by two spaces)."""
    return textwrap.fill(
        line, WIDTH, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
    )


def _group_blocks(
    group: RunGroup, repeated: bool, several: bool, number: int | None = None
) -> list[Block]:
    """One group's tables: marginal, within each run, paired with its baseline, repeats.

    Then why it is unpaired, if it is (a lone group of runs with a spec and no baseline: nothing).
    The objective's metric comes first and is marked as such in every table.
    """
    rows = group.rows
    objective = shared_objective(rows)
    number = number if several else None
    metrics = objective_first(shown_metrics(rows), objective)
    splits = {r.split for r in rows}
    on = f"the {next(iter(splits))} users" if len(splits) == 1 else "the users shown"

    def n_cell(r: RunRow) -> str:
        return str(r.n_users) if len(splits) == 1 else f"{r.n_users} {r.split}"

    def name(r: RunRow, label: str) -> str:  # with its repeat, when conditions have several
        return f"{label} r{r.repeat}" if repeated else label

    priced = any(r.cost_usd is not None for r in rows)  # a cost column only where one is known
    cost_head = ["cost $"] if priced else []
    if objective is None:  # runs ranked on different measures: each its own, named
        metric_heads = ["objective", "ranked on", *(metric_column(m) for m in metrics)]
    else:
        metric_heads = [metric_column(m, objective=m == objective) for m in metrics]
    marginal = [
        [
            name(r, _label(r)),
            "-" if r.selection is None else f"{r.selection.cycle} of {r.cycles}",
            n_cell(r),
            *(
                [format_number(getattr(r, _ROW_FIELD[r.objective])), metric_column(r.objective)]
                if objective is None
                else []
            ),
            *(format_number(getattr(r, _ROW_FIELD[m])) for m in metrics),
            r.tokens,
            *([format_cost(r.cost_usd)] if priced else []),
        ]
        for r in rows
    ]
    named = metric_column(objective) if objective else "each run's objective"
    blocks: list[Block] = [
        Table(
            f"marginal (each condition alone; the selected cycle's prompt on {on}):",
            ["condition", "selected", "n", *metric_heads, "tokens", *cost_head],
            marginal,
            "lrr" + ("rl" if objective is None else "") + "r" * (len(metrics) + 1 + priced),
            number,
        ),
        *_gate_lines(rows, name),
        "",
        Table(
            f"within each run: the selected prompt minus cycle 0's on the same users ({named}):",
            ["condition", "cycles", *PAIRED_HEADERS],
            [
                [
                    name(r, r.condition),
                    "-" if r.selection is None else f"0 -> {r.selection.cycle}",
                    *(
                        _same_prompt_columns()
                        if r.same_prompt_as_first
                        else _paired_columns(r.vs_first)
                    ),
                ]
                for r in rows
            ],
            "llrrlll",
            number,
        ),
    ]
    paired = [r for r in rows if r.baseline is not None]
    if paired:
        base = paired[0].baseline
        assert base is not None
        table: list[list[Any]] = []
        for r in paired:
            lead = [name(r, r.condition)]
            table += _metric_rows(lead, r.vs_baseline, r.same_prompt_as_baseline, objective)
        verdicts = [
            f"  {name(r, r.condition)}: {_verdict_text(r, objective)}"
            for r in paired
            if not r.same_prompt_as_baseline
        ]
        blocks += [
            "",
            Table(
                f"paired with the baseline {base.condition} on the same users "
                "(condition - baseline per user)"
                + (", each repeat with the baseline's same repeat:" if repeated else ":"),
                ["condition", "metric", *PAIRED_HEADERS],
                table,
                "llrrlll",
                number,
            ),
        ]
        if verdicts:
            blocks += [
                "",
                "the gate on each run's objective, condition - baseline on these users "
                "(core/stats.py: exact sign-flip test, two-sided 0.05):",
                *verdicts,
            ]
    if repeated:
        blocks += ["", *format_repeats(repeat_summaries(rows), objective, number)]
    if group.note and (several or group.older):
        blocks.append(group.note)
    return blocks


def _gate_lines(rows: list[RunRow], name: Callable[[RunRow, str], str]) -> list[str]:
    """The selections' gate decisions: the best validation cycle against the seed (cycle 0)."""
    from memloop.core.stats import decision_text

    lines = [
        f"  {name(r, r.condition)}: cycle {r.selection.candidate} - seed: "
        f"{decision_text(r.selection.gate)}"
        for r in rows
        if r.selection is not None and r.selection.gate is not None
    ]
    if not lines:
        return []
    head = (
        "the gate on the validation users (the best cycle against the seed; only `improved` "
        "replaces the seed):"
    )
    return ["", head, *lines]


def _verdict_text(r: RunRow, objective: str | None) -> str:
    """The gate's verdict on `r`'s paired difference with its baseline, on its objective."""
    from memloop.core.stats import gate_of

    metric = objective or r.objective
    theirs = r.baseline.per_user.get(metric, {}) if r.baseline else {}
    return f"{metric_column(metric)} {gate_of(r.per_user.get(metric, {}), theirs)}"


def _notes(rows: list[RunRow]) -> list[str]:
    """What the tables' columns mean, and warnings about the numbers."""
    lines = [
        "mean diff: the mean per-user difference; 95% CI: Student t interval over users (none "
        "for one user or when every difference is equal)",
        "p (sign-flip): two-sided permutation test of the differences (exact up to "
        f"{EXACT_MAX} non-zero ones); up/tied/down: users whose difference is > 0, = 0, < 0",
        f"{SAME_PROMPT}: the two prompts compared are identical, so any difference there is the "
        "draws' noise, not the prompt's",
        "(objective): the measure each run selected its cycle on, on the validation users; "
        "selected: that cycle, of the run's cycles",
        "the gate: core/stats.py's decision rule (exact sign-flip test, two-sided 0.05 divided "
        "by the number of cycles chosen among); too few users: no outcome could reach that level",
    ]
    small = min((r.n_users for r in rows), default=0)
    if small < SMALL_N:
        lines.append(
            f"only {small} users per condition (fewer than {SMALL_N}): "
            "the intervals are wide (and absent below 2)"
        )
    if any(r.split != HEADLINE_SPLIT for r in rows):
        lines.append("a run without test users shows validation/training numbers: not a headline")
    old = sorted({r.scorer_version for r in rows if r.scorer_version != SCORER_VERSION})
    for version in old:
        names = ", ".join(r.name for r in rows if r.scorer_version == version)
        what = OLD_SCORERS.get(version, "other definitions")
        lines.append(
            f"scored with the older scorer version {version} (now {SCORER_VERSION}; {what}): "
            f"{names}"
        )
    return lines


# what an older scorer version's numbers lack or measure differently
OLD_SCORERS = {
    "1": "no state accuracy or no-memory control, another memory score",
    "2": "its state query also read messages not yet written; recall neither capped by what "
    "memory could hold nor withheld for an uncalibrated checker",
}


def format_repeats(
    summaries: list[RepeatSummary], objective: str | None = None, group: int | None = None
) -> list[Block]:
    """The spread across repeats and the comparison pooled over them (`repeat_summaries`)."""

    def label(s: RepeatSummary) -> str:
        mode, evolver, search = s.group
        return f"{mode}/{evolver}" + ("" if search == "episode" else f" ({search})")

    metrics = objective_first(PAIRED_METRICS, objective)
    blocks: list[Block] = [
        Table(
            "across repeats (each condition's selected prompt; mean ± SD over its repeats):",
            [
                "condition",
                "repeats",
                "n",
                *(metric_column(m, objective=m == objective) for m in metrics),
            ],
            [
                [label(s), s.repeats, s.users, *(_spread_cell(s.mean[m], s.sd[m]) for m in metrics)]
                for s in summaries
            ],
            "lrr" + "l" * len(metrics),
            group,
        ),
    ]
    pooled = [s for s in summaries if s.pooled]
    if pooled:
        table: list[list[Any]] = []
        for s in pooled:
            if s.same_prompt:
                table.append([label(s), "all", *_same_prompt_columns(), "-"])
                continue
            for m in metrics:
                if m in s.pooled:
                    sd = s.diff_sd.get(m)
                    table.append(
                        [label(s), metric_column(m), *_paired_columns(s.pooled[m])]
                        + ["-" if sd is None else f"{sd:.3f}"]
                    )
        blocks += [
            "",
            Table(
                "paired, pooled over repeats (each user's difference averaged over the repeats, "
                "then over users; repeat sd = SD of the per-repeat mean differences):",
                ["condition", "metric", *PAIRED_HEADERS, "repeat sd"],
                table,
                "llrrlllr",
                group,
            ),
        ]
    return blocks


def prompt_diff(tracking_uri: str, rows: list[RunRow], which: str | None, to: str = "best") -> str:
    """Unified diff between the first cycle's prompts and the selected (or last) cycle's.

    The run is `which`, by default the run with the best headline score. `to="best"` is the
    cycle selected on validation users.
    """
    candidates = [r for r in rows if r.cycles]
    if not candidates:
        return "(no cycles logged yet)"
    if which:
        chosen = [r for r in candidates if which in (r.run_id, r.name) or r.name.startswith(which)]
        if not chosen:
            raise UserError(f"no run {which!r}; runs: {', '.join(r.name for r in candidates)}")
        row = chosen[0]
    else:
        row = max(candidates, key=lambda r: -1e9 if r.selected is None else r.selected)
    mlc = tracker.client(tracking_uri, create=False)  # read only: never a new store

    if to == "best" and row.selection is not None:
        target, label = row.selection.cycle, "selected"
    else:
        target, label = row.cycles - 1, "last"
    first, best = logged_prompts(mlc, row.run_id, 0), logged_prompts(mlc, row.run_id, target)
    within = f" ({row.settings})" if row.settings else ""
    out = [f"run {printable(row.name)}{within}: prompts of cycle 0 -> {label} cycle {target}"]
    for name in sorted(set(first) | set(best)):
        diff = difflib.unified_diff(
            first.get(name, "").splitlines(),
            best.get(name, "").splitlines(),
            f"{name} (cycle 0)",
            f"{name} (cycle {target})",
            lineterm="",
        )
        text = "\n".join(diff)
        out.append(
            text
            or f"{name}: the same prompt in cycle 0 and cycle {target} (what each step tried and "
            "why it was refused: the run's cycle_NN/evolve.json, printed by evolve and quickstart)"
        )
    return "\n".join(out)


def curves(
    mode: str,
    evolver: str,
    records: list[CycleRecord],
    split: str,
    *,
    model: str | None = None,
    selection: Selection | None = None,
    objective: str | None = None,
    settings: str = "",
    repeat: int = 0,
) -> Any:
    """One run's numbers per cycle on `split`, what `plots.plot_cycles` draws.

    Each of `cycles` holds the split's own values (`memory_score`, `factual_recall`,
    `state_accuracy`: the pooled numbers of the tables), its `users`, its `state_chance`, and
    `per_user`: {metric: the defined per-user values, in user-id order} of the memory score,
    state accuracy, factual recall and memory gain ({} for a record without per-user values).
    Beside them: the split, the selected cycle (`selected`, None without selection) and its rule,
    the objective (the selection's, else `objective`, else the legacy one) and the legend label
    `mode / evolver / model` (`none (no evolution) / model` for the baseline; `settings`, what sets
    the run's group apart, in brackets when it is not the model; the repeat when above 0).
    """
    from types import SimpleNamespace

    cycles = []
    for r in records:
        result = r.splits.get(split)  # type: ignore[call-overload]
        per_user = {}
        if result is not None and result.per_user:
            for m in (
                "memory_score",
                "state_accuracy",
                "state_prob",
                "factual_recall",
                "memory_gain",
            ):
                values = [float(v) for _, v in sorted(user_scores(r, split, m).items())]
                if values or m != "state_prob":  # state_prob only from the letter read
                    per_user[m] = values
        cycles.append(
            {
                "cycle": r.cycle,
                "memory_score": r.score(split),
                "factual_recall": r.score(split, "factual_recall"),
                "state_accuracy": r.score(split, "state_accuracy"),
                "state_prob": r.score(split, "state_prob"),
                "state_chance": result.state_chance if result is not None else None,
                "users": result.users if result is not None else 0,
                "per_user": per_user,
            }
        )
    label = "none (no evolution)" if mode == "none" else f"{mode} / {evolver}"
    if model:
        label += f" / {model}"
    if settings and settings != model:
        label += f" [{settings}]"
    if repeat:
        label += f", repeat {repeat}"
    return SimpleNamespace(
        mode=mode,
        evolver=evolver,
        model=model,
        label=label,
        split=split,
        objective=str(selection.objective if selection else objective or LEGACY_OBJECTIVE),
        selected=selection.cycle if selection else None,
        selection_rule=selection.rule if selection else "",
        cycles=cycles,
    )


def run_histories(rows: list[RunRow]) -> list[Any]:
    """`curves` of every row on its headline split, labelled with its agent model and group."""
    return [
        curves(
            r.feedback_mode,
            r.evolver,
            r.records,
            r.split,
            model=r.spec.get("endpoints.agent.model"),
            selection=r.selection,
            objective=r.spec.get("objective"),
            settings=r.settings_short,
            repeat=r.repeat,
        )
        for r in rows
    ]


def compare(
    tracking_uri: str,
    experiment: str,
    run: str | None = None,
    to: str = "best",
    baseline: str = "none",
) -> dict[str, Any]:
    rows = experiment_rows(tracking_uri, experiment, baseline)
    if not rows:
        raise UserError(f"experiment {experiment!r} has no evolution runs yet (run memloop evolve)")
    return {
        "rows": rows,
        "groups": group_rows(rows),
        "table": format_rows(rows),
        "diff": prompt_diff(tracking_uri, rows, run, to),
    }
