"""Single-workload entry points (a single workload is a sweep of one point) for the dashboard, the CLI and the
measurement code."""
from __future__ import annotations

import pandas as pd

from ..spec import Hardware, ModelSpec, Workload
from ..tiling import workload_tokens
from .capacity import capacity
from .points import Points
from .stages import aggregate, all_rows, decode_step_rows, evaluate
from .table import rows_table


def _scalar(v):
    v = v.reshape(-1)[0] if hasattr(v, "reshape") else v
    return v.item() if hasattr(v, "item") else v


def _scalars(stages: dict) -> dict[str, dict[str, float | str]]:
    return {s: {m: _scalar(v) for m, v in d.items()} for s, d in stages.items()}


def tokens_summary(spec: ModelSpec, workload: Workload) -> dict:
    """Token counts of a workload: image slots, prompt length, crop grid, context after decoding."""
    tc = workload_tokens(workload)
    seq = tc.image_slots + workload.text_tokens
    final = seq + workload.decode_steps
    return {"mode": workload.mode, "crops": list(tc.grid), "n_tiles": tc.n_tiles,
            "vision_features": tc.vision_features, "image_slots": tc.image_slots, "text_tokens": workload.text_tokens,
            "sequence": seq, "batch": workload.batch, "decode_steps": workload.decode_steps,
            "final_context": final, "max_position_embeddings": spec.max_position_embeddings,
            "within_context": final <= spec.max_position_embeddings}


def stage_totals(spec: ModelSpec, workload: Workload, hardware: Hardware | None = None) -> dict[str, dict]:
    """{stage: {metric: number}} for sam, clip, projector, vision, prefill, decode (summed over the steps), total.
    Metrics: flops (= tensor_flops + other_flops), tensor_flops (FlopCounterMode's count), tensor_flops_causal,
    other_flops, bytes, weight_bytes, activation_bytes (+ _read/_write), kv_bytes (+ _read/_write),
    weight_memory, peak_activation_memory, kv_cache_memory, intensity; with hardware compute_s, memory_s, time_s,
    bound."""
    return _scalars(evaluate(spec, Points.from_workload(workload), hardware))


def decode_step_totals(spec: ModelSpec, workload: Workload, context: int,
                       hardware: Hardware | None = None) -> dict[str, float | str]:
    """The LM cost of ONE decode step with `context` tokens already cached per row (batch from the workload)."""
    pts = Points.from_workload(workload)
    stages = aggregate(decode_step_rows(spec, pts, float(context)), (1,), hardware)
    return {m: _scalar(v) for m, v in stages["decode"].items()}


def module_table(spec: ModelSpec, workload: Workload, hardware: Hardware | None = None) -> pd.DataFrame:
    """One row per (stage, module path): vision modules sum over all views of the batch's images, prefill is the
    whole prompt, decode is summed over the workload's steps. Columns: stage, module, kind, the stage metrics."""
    return rows_table(all_rows(spec, Points.from_workload(workload)), hardware)


def decode_step_table(spec: ModelSpec, workload: Workload, context: int,
                      hardware: Hardware | None = None) -> pd.DataFrame:
    """Per-module table of one decode step at `context` cached tokens per row."""
    pts = Points.from_workload(workload)
    return rows_table(decode_step_rows(spec, pts, float(context)), hardware)


def capacity_summary(spec: ModelSpec, workload: Workload, hardware: Hardware) -> dict:
    """TTFT, TPOT, pages/s, pages/day, memory and fit for one workload (output tokens per page = decode_steps)."""
    pts = Points.from_workload(workload)
    return {k: _scalar(v) for k, v in capacity(spec, pts, hardware).items()}


def analyze(spec: ModelSpec, workload: Workload, hardware: Hardware | None = None,
            per_module: bool = False) -> dict:
    """Everything the CLI prints as JSON: tokens, stages, capacity (with hardware), modules (optional)."""
    pts = Points.from_workload(workload)
    rows = all_rows(spec, pts)
    out = {"workload": workload.model_dump(mode="json"), "tokens": tokens_summary(spec, workload),
           "stages": _scalars(aggregate(rows, (1,), hardware))}
    if hardware is not None:
        out["hardware"] = hardware.model_dump(mode="json")
        out["capacity"] = capacity_summary(spec, workload, hardware)
        pred = getattr(hardware, "prediction", None)
        if pred is not None:  # which profile predicted the times, measured or derived, and any table fallback
            out["prediction"] = pred.summary()
    if per_module:
        out["modules"] = rows_table(rows, hardware).to_dict(orient="records")
    return out
