"""One assembly of a measured point's stage results, for sweeps (several repeats of one workload) and dataset
runs (one generation per page): timed greedy generations in, {stage: statistics, FLOPs, peak memory} out."""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Literal

import torch

from ..results.store import stage_stats
from ..runtime.flops import VISION_STAGES, decode_flops_total
from ..runtime.generate import Greedy, MemoryTracking
from ..runtime.oom import free_memory, out_of_memory
from ..runtime.timing import StageTimer
from .routing_record import merge_parts, record_routing, routing_records


@dataclass
class TimedRun:
    """One timed greedy generation: stage totals (seconds), decode seconds per step, peak memory per stage,
    the generated tokens [B, n] and the cache it left."""

    totals: dict[str, float]
    steps: list[float]
    peaks: dict[str, int]
    tokens: torch.Tensor
    kv_bytes: int
    kv_length: int
    extra: dict = field(default_factory=dict)
    vision: tuple[str, ...] = VISION_STAGES  # the model's vision stages (registry), in running order

    @property
    def timed_stages(self) -> tuple[str, ...]:
        return (*self.vision, "prefill")


@torch.no_grad()
def timed_generation(session, inputs, max_new_tokens: int, no_repeat_ngram_size: int = 20, logits: str = "all",
                     stop_at_eos: bool = True, memory: MemoryTracking = "step",
                     timer: StageTimer | None = None) -> TimedRun:
    """A greedy generation through the session's engine, every stage timed (the one generator)."""
    timer = timer or StageTimer(session.device)
    gen = Greedy(session.engine, inputs, max_new_tokens, no_repeat_ngram_size, timer=timer, logits=logits,
                 stop_at_eos=stop_at_eos, memory=memory)
    tokens = gen.run()
    out = TimedRun(timer.totals(), timer.per_item("decode"), dict(timer.peak_memory), torch.stack(tokens, 1),
                   int(gen.cache.bytes_used), int(gen.cache.length), vision=session.vision_stages)
    del gen
    return out


def counted_flops(session, inputs, logits: str) -> dict[str, int]:
    """{vision stages (sam, clip or encoder, projector), prefill, decode_first, decode_second}: the model's FLOPs in
    a separate counting pass (two decode steps; longer decodes follow exactly from them, see
    flops.decode_flops_total), and "routing": the experts each MoE layer touched in that pass (routing_record.py;
    None without MoE layers).

    The pass runs the reference model, whose SAM writes a dense [views, heads, n, n] bias: at large batches that
    alone outgrows the GPU (54 Large pages ask for 49.44 GiB at once) where the fast engine just measured ran. So a
    pass that runs out of memory is run again over the two halves of the batch, and so on: each row's work and
    routing are its own, so the FLOPs add up exactly and the routing merges expert by expert."""
    parts = _passes_that_fit(session, inputs, logits)
    flops = {k: sum(p[0][k] for p in parts) for k in parts[0][0]}
    calls = merge_parts([p[1] for p in parts])  # one part: its calls as they are
    return {**flops, "routing": routing_records(calls, len(session.spec.moe_layers), parts=len(parts))}


def _passes_that_fit(session, inputs, logits: str) -> list[tuple[dict[str, int], list]]:
    """[(FLOPs, gate calls)] of one counting pass over all rows, or, where that runs out of GPU memory, of passes
    over the halves (recursively; one row that does not fit is an error)."""
    try:
        with record_routing(session.model) as calls:  # the experts each layer touches, recorded on the way
            out = session.count_stage_flops(inputs, logits=logits, decode_steps=2)
        first, second = (int(x) for x in out["decode"]["per_step"])
        flops = {**{s: int(out[s]["flops"]) for s in (*session.vision_stages, "prefill")}, "decode_first": first,
                 "decode_second": second}
        return [(flops, list(calls))]
    except Exception as exc:  # noqa: BLE001 - torch's error, or one that wraps it or says so (runtime/oom.py)
        if inputs.batch == 1 or not out_of_memory(exc):
            raise
    free_memory(session.device)  # out of the except block: the traceback has let go of the failed pass's tensors
    half = (inputs.batch + 1) // 2
    return (_passes_that_fit(session, inputs.rows(0, half), logits)
            + _passes_that_fit(session, inputs.rows(half, inputs.batch), logits))


def assemble_stages(runs: list[TimedRun], flops: dict[str, int] | None,
                    decode_step_over: Literal["repeats", "steps"]) -> dict[str, dict]:
    """Stage results of one point. `decode_step_over` "repeats": decode_step statistics over each run's median
    step (a sweep's repeats; `times_s` keeps the middle run's steps); "steps": over the steps of the (one) run
    (a dataset page). Peak memory: the largest over runs; FLOPs: per stage, decode summed over its steps and
    decode_step the mean step."""
    stages: dict[str, dict] = {}
    vision, timed = runs[0].vision, runs[0].timed_stages
    for s in timed:
        stages[s] = stage_stats([r.totals.get(s, 0.0) for r in runs])
    stages["vision"] = stage_stats([sum(r.totals.get(s, 0.0) for s in vision) for r in runs])
    k = len(runs[0].steps)
    if k:
        stages["decode"] = stage_stats([r.totals.get("decode", 0.0) for r in runs])
        if decode_step_over == "repeats":
            stages["decode_step"] = stage_stats([median(r.steps) for r in runs])
            stages["decode_step"]["times_s"] = runs[len(runs) // 2].steps
        else:
            stages["decode_step"] = stage_stats([s for r in runs for s in r.steps])
    peaks: dict[str, int] = {}
    for r in runs:
        for s, v in r.peaks.items():
            peaks[s] = max(peaks.get(s, 0), v)
    for s, v in peaks.items():
        if s in stages:
            stages[s]["peak_memory_bytes"] = v
    if any(s in peaks for s in vision):
        stages["vision"]["peak_memory_bytes"] = max(peaks.get(s, 0) for s in vision)
    if flops is not None:
        for s in timed:
            stages[s]["flops"] = flops[s]
        stages["vision"]["flops"] = sum(flops[s] for s in vision)
        if k:
            total = decode_flops_total(flops["decode_first"], flops["decode_second"], k)
            stages["decode"]["flops"] = total
            stages["decode_step"]["flops"] = total // k
        routing = flops.get("routing") or {}
        for stage, phase in (("prefill", "prefill"), ("decode_step", "decode")):
            if phase in routing and stage in stages:
                stages[stage]["routing"] = routing[phase]
    return stages
