"""compare's tables: marginal and paired rows per group of like runs, the repeats, the notes.

`compare_blocks` turns rows (rows.py) into blocks of headings and tables, `render` prints them as
aligned text, CSV or Markdown; `format_rows` does both; `format_repeats` summarises repeated
conditions. compare.py says what the tables show.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memloop.core.stats import EXACT_MAX, SMALL_N, Paired
from memloop.core.tables import (
    FORMATS,
    PAIRED_COLUMNS,
    format_cost,
    format_number,
    format_table,
    wrap_prose,
)
from memloop.feedback.metrics import (
    metric_column,
    objective_first,
    paired_metrics,
)
from memloop.feedback.records import SCORER_VERSION
from memloop.results.rows import (
    HEADLINE_SPLIT,
    RepeatSummary,
    RunGroup,
    RunRow,
    group_rows,
    repeat_summaries,
    shown_metrics,
)

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

    @property
    def name(self) -> str:
        """Its title up to the first parenthesis or colon (`marginal`, `within each run`)."""
        return self.title.split(" (")[0].split(":")[0].strip()


def csv_parts(blocks: list[Block]) -> list[tuple[str, int | None, str]]:
    """The tables of `blocks` as `one_csv` takes them."""
    return [
        (b.name, b.group, format_table(b.headers, b.rows, align=b.align, fmt="csv"))
        for b in blocks
        if isinstance(b, Table)
    ]


def one_csv(tables: list[tuple[str, int | None, str]]) -> str:
    """Several CSV tables, each (name, group of runs or None, its own CSV text), as one table.

    A first column `table` (the name), `group` when any table has one, then every table's
    columns in the order they first appear; a row leaves the columns of other tables empty.
    One header, so `pandas.read_csv` and spreadsheets read the whole output.
    """
    import csv
    import io

    several = any(group is not None for _, group, _ in tables)
    columns: list[str] = []
    parsed = []
    for name, group, text in tables:
        head, *rows = list(csv.reader(io.StringIO(text)))
        columns += [c for c in head if c not in columns]
        parsed.append((name, group, head, rows))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["table", *(["group"] if several else []), *columns])
    for name, group, head, rows in parsed:
        for row in rows:
            cells = dict(zip(head, row, strict=True))
            lead = [name, *([group if group is not None else ""] if several else [])]
            writer.writerow([*lead, *(cells.get(c, "") for c in columns)])
    return out.getvalue().rstrip("\n")


@dataclass
class Heading:
    """A group's heading (`=== group k: ... ===` as text, a section heading in Markdown)."""

    text: str


Block = str | Table | Heading  # a line of text ("" a blank line), a table or a heading


def _same_prompt_columns() -> list[str]:
    return ["-", SAME_PROMPT, "-", "-", "-"]


def _metric_rows(
    lead: list[Any], paired: dict[str, Paired], same: bool, objective: str | None = None
) -> list[list[Any]]:
    """One row per metric (the objective's first) after the `lead` cells, or one `same prompt`."""
    if same:
        return [[*lead, "all", *_same_prompt_columns()]]
    return [
        [*lead, metric_column(m), *paired[m].cells()]
        for m in objective_first(paired_metrics(), objective)
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
    one CSV table (`csv`: `one_csv`, a first column `table`, then `group` when there are several).
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
    if fmt == "csv":
        return one_csv(csv_parts(blocks))
    lines: list[str] = []
    for b in blocks:
        if isinstance(b, Table):
            table = format_table(b.headers, b.rows, align=b.align, fmt=fmt)
            lines += [wrap_prose(b.title), table] if fmt == "table" else [b.title, "", table, ""]
        elif isinstance(b, Heading):
            lines.append(wrap_prose(f"=== {b.text} ===") if fmt == "table" else f"### {b.text}\n")
        elif fmt == "md":
            lines.append(b + "\n" if b else "")
        else:
            lines.append(wrap_prose(b))
    text = "\n".join(lines)
    return text.replace("\n\n\n", "\n\n").strip("\n") if fmt == "md" else text


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
                [format_number(r.values.get(r.objective)), metric_column(r.objective)]
                if objective is None
                else []
            ),
            *(format_number(r.values.get(m)) for m in metrics),
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
                    *(_same_prompt_columns() if r.same_prompt_as_first else r.vs_first.cells()),
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
            label = name(r, r.condition) + _settings_label(r)
            table += _metric_rows([label], r.vs_baseline, r.same_prompt_as_baseline, objective)
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


def _settings_label(r: RunRow) -> str:
    """` [update_freq 1 vs 2]`: what sets apart a run whose prompts are its baseline's.

    Only then: with different prompts the prompts are what is compared. Two settings at most are
    named, and how many more differ.
    """
    base = r.baseline
    if base is None or r.selected_prompts is None or r.selected_prompts != base.selected_prompts:
        return ""
    differs = r.settings_vs_baseline()
    if not differs:
        return ""
    more = f", +{len(differs) - 2} more" if len(differs) > 2 else ""
    return f" [{', '.join(differs[:2])}{more}]"


def _notes(rows: list[RunRow]) -> list[str]:
    """What the tables' columns mean, and warnings about the numbers."""
    lines = [
        "mean diff: the mean per-user difference; 95% CI: Student t interval over users (none "
        "for one user or when every difference is equal)",
        "p (sign-flip): two-sided permutation test of the differences (exact up to "
        f"{EXACT_MAX} non-zero ones); up/tied/down: users whose difference is > 0, = 0, < 0",
        f"{SAME_PROMPT}: the two prompts compared and their policy settings are identical, so any "
        "difference there is the draws' noise; [key a vs b]: the policy settings that differ",
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

    metrics = objective_first(paired_metrics(probabilities=False), objective)
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
                        [label(s), metric_column(m), *s.pooled[m].cells()]
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
