"""Plain-text tables for the terminal: one formatter for every table memloop prints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
) -> str:
    """Columns sized to their widest cell.

    ``align`` holds one letter per column, ``l`` or ``r``; by default the first column is left
    aligned and the others right aligned. Cells that are not strings go through
    :func:`format_number`. Returns the lines joined by newlines, without a trailing newline.
    """
    ncols = len(headers)
    for i, row in enumerate(rows):
        if len(row) != ncols:
            raise ValueError(f"row {i} has {len(row)} cells, expected {ncols}")
    spec = align if align is not None else "l" + "r" * (ncols - 1)
    if len(spec) != ncols or set(spec) - {"l", "r"}:
        raise ValueError(f"align must be {ncols} letters from 'l'/'r', not {spec!r}")
    cells = [[c if isinstance(c, str) else format_number(c, digits) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.ljust(w) if a == "l" else v.rjust(w)
            for v, w, a in zip(values, widths, spec, strict=True)
        ]
        return (" " * gap).join(parts).rstrip()

    return "\n".join([line(list(headers))] + [line(r) for r in cells])
