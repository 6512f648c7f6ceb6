"""Capacity planning on one GPU: latency, throughput and memory of a workload, and the inverse (what GPU a
latency target needs). Works on stage totals from `stages.evaluate`, so it is vectorised over sweep points.

Definitions (batch B rows, N = decode steps = output tokens per page):
  ttft_s        vision + prefill time of the batch (every row gets its first token then)
  tpot_s        mean decode step time over the N steps (each step yields one token for each of the B rows);
                with N = 0, one step at the prompt length
  request_s     ttft_s + N * tpot_s: one batch of B pages from pixels to the last token
  pages_per_s   B / request_s per GPU, batches back to back (no overlap of prefill and decode)
  memory_bytes  all weights + final KV cache + the peak activation set; fits = memory_bytes <= GPU memory

The memory is the model's as written, whatever the session mode (MEMORY_SCOPE says so wherever it is shown).
"""
from __future__ import annotations

import numpy as np

from ..spec import Hardware, ModelSpec, SpecError
from .points import Points
from .stages import aggregate, decode_step_rows, evaluate

SECONDS_PER_DAY = 86_400
# what memory_bytes and fits describe, in words for the pages and the CLI: the analytic memory is the reference
# model's (its dense SAM bias: 53.6 GiB of SAM activations at 54 Large pages), not the fast engine's, whose footprint
# was measured at 36 GiB in all for that batch on an H100 (docs/accuracy.md)
MEMORY_SCOPE = ("memory and fits: the weights, the final KV cache and the largest activation set of the model as "
                "written (the reference session mode: SAM's dense attention bias included); the fast engine's "
                "footprint differs (no dense bias, a static cache with room for 1,024 more tokens, its CUDA graphs' "
                "pools): its measured peaks per stage are on the Measured sweep page")


def _tpot_parts(spec: ModelSpec, pts: Points, stages: dict, hw: Hardware | None, key: str = "time_s"):
    """(time, flops, bytes) of one mean decode step per point; `key` names the time (time_s, or predicted_s
    when the hardware carries a calibration profile)."""
    steps = pts.decode_steps.astype(float)
    dec = stages["decode"]
    single = aggregate(decode_step_rows(spec, pts, pts.sequence.astype(float)), (pts.size,), hw)["decode"]
    live = steps > 0
    per = lambda k: np.where(live, dec[k] / np.maximum(steps, 1), single[k])  # noqa: E731
    return (per(key) if hw is not None else None), per("flops"), per("bytes")


def capacity(spec: ModelSpec, pts: Points, hardware: Hardware, stages: dict | None = None) -> dict[str, np.ndarray]:
    """Latency, throughput and memory per point on `hardware` (see the module docstring)."""
    stages = stages if stages is not None and "time_s" in stages["total"] else evaluate(spec, pts, hardware)
    b = pts.batch.astype(float)
    steps = pts.decode_steps.astype(float)
    ttft = stages["vision"]["time_s"] + stages["prefill"]["time_s"]  # vision encoders + LM prefill
    tpot, _, _ = _tpot_parts(spec, pts, stages, hardware)
    request = ttft + steps * tpot  # first token, then N steps
    tot = stages["total"]
    memory = tot["weight_memory"] + tot["kv_cache_memory"] + tot["peak_activation_memory"]  # resident at the peak
    out = {
        "ttft_s": ttft, "tpot_s": tpot, "request_s": request,
        "pages_per_s": b / request,  # B pages per request time, one GPU
        "pages_per_day": b / request * SECONDS_PER_DAY,
        "output_tokens_per_s": np.where(request > 0, b * steps / request, 0.0),
        "memory_bytes": memory, "fits": memory <= hardware.memory_gb * 1e9,
    }
    if "predicted_s" in stages["decode"]:  # the time model's figures beside the roofline's bounds
        p_ttft = stages["vision"]["predicted_s"] + stages["prefill"]["predicted_s"]
        p_tpot, _, _ = _tpot_parts(spec, pts, stages, hardware, "predicted_s")
        p_request = p_ttft + steps * p_tpot
        out |= {"predicted_ttft_s": p_ttft, "predicted_tpot_s": p_tpot, "predicted_request_s": p_request,
                "predicted_pages_per_s": b / p_request, "predicted_pages_per_day": b / p_request * SECONDS_PER_DAY,
                "predicted_output_tokens_per_s": np.where(p_request > 0, b * steps / p_request, 0.0)}
    return out


def required_hardware(spec: ModelSpec, pts: Points, *, ttft_s: float | None = None, tpot_s: float | None = None,
                      reference: Hardware | None = None) -> dict[str, dict[str, np.ndarray]]:
    """What a GPU needs to meet a time-to-first-token and/or time-per-output-token target.

    For each target: `min_tflops` = FLOPs / target (the compute floor, with unlimited bandwidth) and `min_tbs` =
    bytes / target (the bandwidth floor, with unlimited compute); both are necessary, neither alone sufficient.
    With a `reference` GPU: `scale` = its time / target, and `scaled_tflops`/`scaled_tbs` = the reference's
    ceilings times that scale: a GPU of the same balance that meets the target exactly."""
    if ttft_s is None and tpot_s is None:
        raise SpecError("give a ttft or tpot target")
    for name, v in (("ttft", ttft_s), ("tpot", tpot_s)):
        if v is not None and not v > 0:
            raise SpecError(f"{name} target must be positive, got {v}")
    stages = evaluate(spec, pts, reference)
    out = {}
    targets = {}
    if ttft_s is not None:
        flops = stages["vision"]["flops"] + stages["prefill"]["flops"]
        nbytes = stages["vision"]["bytes"] + stages["prefill"]["bytes"]
        time = (stages["vision"]["time_s"] + stages["prefill"]["time_s"]) if reference is not None else None
        targets["ttft"] = (ttft_s, flops, nbytes, time)
    if tpot_s is not None:
        time, flops, nbytes = _tpot_parts(spec, pts, stages, reference)
        targets["tpot"] = (tpot_s, flops, nbytes, time)
    for name, (target, flops, nbytes, time) in targets.items():
        res = {"target_s": np.full(pts.size, float(target)), "flops": flops, "bytes": nbytes,
               "min_tflops": flops / target / 1e12,  # compute floor
               "min_tbs": nbytes / target / 1e12}  # bandwidth floor
        if reference is not None:
            scale = time / target  # how much faster than the reference the GPU must be
            res.update(reference_time_s=time, scale=scale, meets=time <= target,
                       scaled_tflops=reference.peak_tflops * scale, scaled_tbs=reference.bandwidth_tbs * scale)
        out[name] = res
    return out
