"""FLOP counting with torch.utils.flop_counter, kept apart from timing (counting slows every op down).

Counting goes through `model.flops.flop_counter()`, which adds the formula torch lacks for CPU SDPA.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..model.flop_formulas import flop_counter


def model_counter(model: torch.nn.Module | None = None) -> FlopCounterMode:
    """A FLOP counter that names modules by their path inside `model` (e.g. `model.layers.3.mlp.experts`),
    whichever submodule is called first. The tracker otherwise names each first-called module by its class
    alone, which merges all decoder layers into one entry."""
    counter = flop_counter()
    if model is not None:
        try:  # private API of torch's ModuleTracker: pre-register the whole tree under the root's name
            counter.mod_tracker._get_mod_name(model)
        except AttributeError:  # older/newer torch: per-module names fall back to class-based ones
            pass
    return counter


def count_flops(fn: Callable[[], Any], model: torch.nn.Module | None = None) -> tuple[Any, int, dict[str, int]]:
    """Run `fn` under a FLOP counter. Returns (fn's result, total FLOPs, FLOPs per module path of `model`)."""
    counter = model_counter(model)
    with torch.no_grad(), counter:
        result = fn()
    total, per_module = module_flops([counter], model)
    return result, total, per_module


def module_flops(counters: list[FlopCounterMode], model: torch.nn.Module | None) -> tuple[int, dict[str, int]]:
    """(total, FLOPs per module path) summed over finished counters. Parents include their children."""
    root = type(model).__name__ if model is not None else None
    total, per_module = 0, {}
    for counter in counters:
        total += int(counter.get_total_flops())
        for name, ops in counter.get_flop_counts().items():
            if name == "Global":
                continue
            head, _, rest = name.partition(".")
            if head == root:
                name = rest or "<root>"
            per_module[name] = per_module.get(name, 0) + int(sum(ops.values()))
    return total, per_module


def flops_at(per_module: dict[str, int], path: str) -> int:
    """FLOPs of the module at `path`. A container that is never called itself (the experts ModuleList) has no
    entry of its own: its FLOPs are the sum of its direct children (`<path>.0`, `<path>.1`, ...)."""
    if path in per_module:
        return per_module[path]
    prefix = path + "."
    return sum(v for k, v in per_module.items() if k.startswith(prefix) and "." not in k[len(prefix):])
