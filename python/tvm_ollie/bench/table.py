"""Markdown tables for the benchmarks' printed results.

A benchmark measures a set of rows (workloads) against a set of columns (systems,
implementations) where not every row has every column; :func:`pivot_table` lays such results
out with ``-`` for the missing cells, so every benchmark prints a table the docs can quote as is.
"""

from __future__ import annotations

from typing import List, Mapping, Sequence, Tuple


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``header`` and ``rows`` (lists of cell texts) as a Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def pivot_table(corner: str, table: Sequence[Tuple[str, Mapping[str, object]]],
                fmt: str = "{}") -> str:
    """Rows ``(label, {column: value})`` as a Markdown table.

    The columns are every key of every row, in order of first appearance; a row without a
    column shows ``-``. ``fmt`` formats each value (``"{:.3f}"``).
    """
    cols: List[str] = []
    for _, row in table:
        cols += [c for c in row if c not in cols]
    rows = [[label] + [fmt.format(row[c]) if c in row else "-" for c in cols]
            for label, row in table]
    return markdown_table([corner] + cols, rows)
