"""FLOP counting with torch.utils.flop_counter, kept apart from timing (counting slows every op down)."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def count_flops(fn: Callable[[], Any], module: torch.nn.Module | None = None,
                prefix: str = "") -> tuple[Any, int, dict[str, int]]:
    """Run `fn` under FlopCounterMode. Returns (fn's result, total FLOPs, FLOPs per module path).

    FlopCounterMode names modules `<RootClass>.<child path>`; the root class name is replaced by `prefix`
    (the called module's path inside the full model, e.g. `model.sam_model`) so the keys are the same module
    paths as the analytic rows. Parents include their children's FLOPs.
    """
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        result = fn()
    per_module: dict[str, int] = {}
    root = type(module).__name__ if module is not None else None
    for name, ops in counter.get_flop_counts().items():
        if name == "Global":
            continue
        head, _, rest = name.partition(".")
        if root is not None and head == root:
            name = ".".join(p for p in (prefix, rest) if p)
        per_module[name] = int(sum(ops.values()))
    return result, int(counter.get_total_flops()), per_module
