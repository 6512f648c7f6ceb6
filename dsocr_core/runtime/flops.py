"""FLOP counting with torch.utils.flop_counter, kept apart from timing (counting slows every op down).

Counting goes through `model.flop_formulas.flop_counter()`, which adds the formula torch lacks for CPU SDPA.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..model.flop_formulas import flop_counter
from ..registry import get_family


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


VISION_STAGES = get_family().vision_stages  # the default model's; a model's own: model.model.VISION_STAGES


@torch.no_grad()
def count_stage_flops(model: torch.nn.Module, inputs, logits: str = "all", decode_steps: int = 1) -> dict:
    """FLOPs of the vision stages (sam, clip or encoder, projector), prefill and `decode_steps` decode steps of the
    reference model, each counted
    by FlopCounterMode in its own pass (never while timing). FLOPs are the model's work whatever engine is timed:
    a fast engine's extra work (padding, fused recomputation) is not model work. Returns {stage: {"flops",
    "modules"}}, and for decode also "per_step"."""
    m = model.model
    out: dict[str, dict] = {}
    counters: dict[str, list] = {}

    def stage(name: str):
        # a fresh counter per entry: a FlopCounterMode clears its counts when entered again
        counters.setdefault(name, []).append(model_counter(model))
        return counters[name][-1]

    embeds = m.vision_embeddings(inputs.images, inputs.images_spatial_crop, stage=stage)
    for name in m.VISION_STAGES:
        total, mods = module_flops(counters.get(name, []), model)
        out[name] = {"flops": total, "modules": mods}
    x = m.embed(inputs.input_ids, inputs.images_seq_mask, embeds)
    (logits_out, cache), total, mods = count_flops(lambda: model.forward_lm(x, cache=None, logits=logits), model)
    out["prefill"] = {"flops": total, "modules": mods}
    token = logits_out[:, -1].argmax(-1)
    step_flops, step_mods = [], {}
    for _ in range(decode_steps):
        (step_logits, cache), total, mods = count_flops(
            lambda: model(input_ids=token.view(-1, 1), cache=cache, logits="last"), model)
        token = step_logits[:, -1].argmax(-1)
        step_flops.append(total)
        for k, v in mods.items():
            step_mods[k] = step_mods.get(k, 0) + v
    out["decode"] = {"flops": sum(step_flops), "per_step": step_flops, "modules": step_mods}
    return out


def decode_flops_total(first: int, second: int, steps: int) -> int:
    """FLOPs of `steps` decode steps from a prompt whose first two steps cost `first` and `second`. A step's
    FLOPs are affine in the context length (attention grows by a constant per cached token; the top-k experts do
    the same work whatever they are), so the sum is exact: steps * first + (second - first) * steps(steps-1)/2."""
    if steps <= 0:
        return 0
    return int(steps * first + (second - first) * steps * (steps - 1) // 2)
