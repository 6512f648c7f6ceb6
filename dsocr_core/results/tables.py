"""Plain-text tables for the command line: each column as wide as its widest cell, columns always apart.

Fixed-width format strings ("{:12,.1f}") let a value wider than its column run into the next one
("6,155,817,687.672,013,609.0"); here widths come from the cells themselves, so no value can.
"""
from __future__ import annotations

from typing import Any, Sequence


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None,
                 gap: int = 2) -> str:
    """The table as text (no trailing newline). `align` holds one letter per column, "l" or "r" (default: the
    first column left, the others right); cells are str()-ed; columns are `gap` spaces apart."""
    n = len(header)
    cells = [[str(c) for c in header]] + [[("" if c is None else str(c)) for c in row] for row in rows]
    if any(len(row) != n for row in cells):
        raise ValueError(f"every row needs {n} cells")
    align = align or ("l" + "r" * (n - 1))
    if len(align) != n or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one 'l' or 'r' per column, got {align!r}")
    widths = [max(len(row[i]) for row in cells) for i in range(n)]
    lines = []
    for row in cells:
        parts = [c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(row, widths, align)]
        lines.append((" " * gap).join(parts).rstrip())
    return "\n".join(lines)
