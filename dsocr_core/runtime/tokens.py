"""Token id rows: trim at EOS, first difference, first divergence. Plain Python (no torch), so the grounding
comparison can use the same functions without loading torch."""
from __future__ import annotations

from typing import Sequence


def trim_at_eos(row: Sequence[int], eos: int) -> list[int]:
    """A row's tokens up to and including its first EOS."""
    row = list(row)
    return row[: row.index(eos) + 1] if eos in row else row


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """First index where two sequences differ (a shorter one differs where it ends), or None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def first_divergence(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict | None:
    """First (row, index) where two batches of token rows differ, with both tokens there; None when equal."""
    for r, (x, y) in enumerate(zip(a, b)):
        i = first_difference(x, y)
        if i is not None:
            return {"row": r, "index": i, "a": x[i] if i < len(x) else None, "b": y[i] if i < len(y) else None}
    if len(a) != len(b):
        return {"row": min(len(a), len(b)), "index": 0, "a": None, "b": None}
    return None
