"""Tables for the terminal, CSV or Markdown: one formatter for every table memloop prints.

The paired comparison's column names (`PAIRED_COLUMNS`) are here; a metric's header is its row
of the metric catalogue (feedback/metrics.py `metric_column`): the same quantity has the same
header in every command, and a run's objective is named as such in its header.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any, Literal

Format = Literal["table", "csv", "md"]
FORMATS: tuple[str, ...] = ("table", "csv", "md")
WIDTH = 100  # a text table wider than this is split into parts (the key columns repeated)


def wrap_prose(text: str, indent: str = "  ", width: int = WIDTH) -> str:
    """A line of prose within `width` columns, later lines indented by `indent`.

    The indent comes after the line's own leading spaces. A path, a file name or a command is
    never broken: not at a hyphen, not inside a word longer than the line.
    """
    import textwrap

    lead = len(text) - len(text.lstrip(" "))
    return textwrap.fill(
        text,
        width,
        subsequent_indent=" " * lead + indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


# the columns of a paired comparison (core.stats.Paired): users, mean difference, Student t
# interval, sign-flip permutation p, users whose difference is > 0 / = 0 / < 0
PAIRED_COLUMNS = ("n", "mean diff", "95% CI", "p (sign-flip)", "up/tied/down")


def printable(text: Any) -> str:
    r"""`text` as the terminal shows it: each control or format character escaped, Python's way.

    An ANSI escape (``\x1b``), a right-to-left override (``\u202e``), a newline, a tab or a
    carriage return in a name memloop did not choose (an experiment, policy or condition name, a
    user id) would otherwise recolour, reorder or rewrite what the terminal shows. The one helper
    for it: tables (`format_table`), progress bars, the evolve summary and error lines
    (`core.errors`) go through it.
    """
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def format_cost(value: float | None) -> str:
    """A cell for US dollars: cents from a dollar up, 4 decimals below, `n/a` without a price."""
    if value is None:
        return "n/a"
    if value >= 1:
        return f"{value:,.2f}"
    if value == 0 or value >= 1e-4:
        return f"{value:.4f}"
    return f"{value:.1e}"


def format_number(value: Any, digits: int = 3) -> str:
    """A cell for a number: fixed ``digits`` decimals for floats, ``n/a`` for None/NaN."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        if value != value:  # NaN
            return "n/a"
        return f"{value:.{digits}f}"
    return str(value)


def format_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    align: str | None = None,
    digits: int = 3,
    gap: int = 2,
    fmt: str = "table",
    width: int | None = WIDTH,
) -> str:
    """The table as aligned text (``fmt="table"``), CSV (``"csv"``) or Markdown (``"md"``).

    ``align`` holds one letter per column, ``l`` or ``r``; by default the first column is left
    aligned and the others right aligned. Cells that are not strings go through
    :func:`format_number`, in every format. A text table wider than ``width`` characters is split
    into parts, one under the other (a blank line between), each repeating the leading
    left-aligned columns (the row's name); ``width=None`` never splits. CSV and Markdown tables
    are never split. Every cell and header is shown through :func:`printable` (control characters
    escaped), in every format. Returns the lines joined by newlines, without a trailing newline.
    """
    ncols = len(headers)
    for i, row in enumerate(rows):
        if len(row) != ncols:
            raise ValueError(f"row {i} has {len(row)} cells, expected {ncols}")
    spec = align if align is not None else "l" + "r" * (ncols - 1)
    if len(spec) != ncols or set(spec) - {"l", "r"}:
        raise ValueError(f"align must be {ncols} letters from 'l'/'r', not {spec!r}")
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)}, not {fmt!r}")
    cells = [
        [printable(c) if isinstance(c, str) else format_number(c, digits) for c in row]
        for row in rows
    ]
    head = [printable(h) for h in headers]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(head)
        writer.writerows(cells)
        return out.getvalue().rstrip("\n")
    if fmt == "md":
        return _markdown(head, cells, spec)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]
    parts = _parts(widths, spec, gap, width)
    blocks = []
    for columns in parts:

        def line(values: Sequence[str], columns: list[int] = columns) -> str:
            shown = [
                values[i].ljust(widths[i]) if spec[i] == "l" else values[i].rjust(widths[i])
                for i in columns
            ]
            return (" " * gap).join(shown).rstrip()

        blocks.append("\n".join([line(head)] + [line(r) for r in cells]))
    return "\n\n".join(blocks)


def _parts(widths: list[int], spec: str, gap: int, width: int | None) -> list[list[int]]:
    """The columns of each part of a text table: all of them when the table fits `width`.

    Each part holds the key columns (the leading left-aligned ones, at least the first, as many
    as fit in half the width) and as many of the others, in order, as fit.
    """
    everything = list(range(len(widths)))

    def span(columns: list[int]) -> int:
        return sum(widths[i] for i in columns) + gap * max(0, len(columns) - 1)

    if width is None or span(everything) <= width:
        return [everything]
    keys = [0]
    for i in everything[1:]:
        if spec[i] != "l" or span([*keys, i]) > width // 2:
            break
        keys.append(i)
    parts: list[list[int]] = []
    current = list(keys)
    for i in everything[len(keys) :]:
        if len(current) > len(keys) and span([*current, i]) > width:
            parts.append(current)
            current = list(keys)
        current.append(i)
    parts.append(current)
    return parts


def _markdown(head: list[str], cells: list[list[str]], spec: str) -> str:
    """A pipe table: the header, a separator row (``---:`` for right-aligned columns), the rows."""

    def escape(text: str) -> str:
        return text.replace("|", "\\|")

    head = [escape(h) for h in head]
    cells = [[escape(c) for c in row] for row in cells]
    widths = [max([3, len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(head)]

    def line(values: Sequence[str]) -> str:
        shown = [
            v.ljust(w) if a == "l" else v.rjust(w)
            for v, w, a in zip(values, widths, spec, strict=True)
        ]
        return "| " + " | ".join(shown) + " |"

    rule = ["-" * w if a == "l" else "-" * (w - 1) + ":" for w, a in zip(widths, spec, strict=True)]
    return "\n".join([line(head), "| " + " | ".join(rule) + " |"] + [line(r) for r in cells])
