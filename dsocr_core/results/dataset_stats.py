"""Statistics of a dataset run, as pandas DataFrames for the dashboard and the CLI, with the analytic
prediction for each page beside its measurement.

Entry points (all read the run store; none imports streamlit):
    page_table(store, run_id, hardware=None, prediction=None)
                                                  one row per sample (page x epoch): shape, times, FLOPs, memory,
                                                  tokens, output and detections, analytic_* and predicted_* columns
    stage_summary(pages)                          per stage/metric: n, mean, median, p90, std, min, max, and the
                                                  analytic mean beside the measured one
    distributions(pages, metrics)                 long table (one row per sample and metric) for histograms and
                                                  box plots; TTFT and TPOT by default
    decode_steps(pages)                           long table of every decode step (step, context, seconds)
    page_means(pages)                             one row per page: means over its epochs
    run_summary(store, run_id, pages)             counts, pages/s, tokens per page, output tokens/s
    operator_table(store, run_id, stage, device)  the operator breakdown kept in the run's meta (top N per stage)
    operator_stages(store, run_id)                the stage totals of that breakdown
    load_dataset_run(store, run_id, hardware)     all of the above in one DatasetRunView

Stage columns exist for every model family's stages (registry): a DeepSeek-OCR run has NaN encoder_* columns, a
DeepSeek-OCR 2 run NaN clip_* columns, so two runs of either model line up column for column.

Conventions: statistics are over samples with status `done`; std is the population standard deviation (as
store.stage_stats); p90 is numpy's linear-interpolated 90th percentile. TTFT = the vision stages + prefill
(preprocessing excluded, as Session does); TPOT = the page's median decode step. pages/s = done samples / summed
wall time (preprocess + generation, one page at a time, warm-ups and FLOP passes excluded).

Analytic columns: the same closed-form model the analytic pages use, evaluated for each page's workload (its
mode, tile grid, text tokens, decode steps actually run, batch 1, the run's dtype, attention and logits mode)
with the run's model spec: analytic_<stage>_tensor_flops (FlopCounterMode's convention, comparable to the
measured <stage>_flops) and, given a Hardware (or when the run's GPU matches a preset), the roofline time
analytic_<stage>_s, analytic_ttft_s and analytic_tpot_s (decode time / steps). CPU runs get no time prediction
unless a hardware is passed. Given a `prediction` (a Hardware carrying a calibration profile's Prediction,
analytic.predict.with_profile), also the predicted time predicted_<stage>_s, predicted_ttft_s and predicted_tpot_s
of the same workloads (the time model on the profile's ceilings, in the prediction's session mode).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..hardware import run_ceilings
from ..measure.order_check import failed as order_check_failed, summary as order_summary
from ..registry import stage_names, vision_stage_names
from ..spec import Hardware, ModelSpec
from .analytic_join import run_prediction
from .runs import run_model, run_spec
from .store import RunStore

STAGES = stage_names()  # every family's (registry): a run has NaN in the columns of the other family's stages
ANALYTIC_STAGES = (*STAGES, "total")
PAGE_COLUMNS = (
    "point_id", "key", "label", "page", "pdf_page", "epoch", "source", "status", "message", "mode", "grid", "grid_w", "grid_h",
    "image_w", "image_h", "image_slots", "prompt_tokens", "text_tokens", "generated_tokens", "decode_steps", "eos",
    *(f"{s}_s" for s in STAGES), "ttft_s", "tpot_s", "decode_step_mean_s", "preprocess_s", "generation_s", "wall_s",
    *(f"{s}_flops" for s in STAGES), "total_flops", "flops_source", "peak_memory_bytes", "kv_bytes", "blocks",
    "labels", "text", "updated_at",
)
# (metric column, stage label, unit) rows of stage_summary, in display order
SUMMARY_METRICS = (
    ("preprocess_s", "preprocess", "s"), *((f"{s}_s", s, "s") for s in (*vision_stage_names(), "vision", "prefill")),
    ("ttft_s", "time to first token", "s"), ("decode_s", "decode", "s"), ("tpot_s", "time per output token", "s"),
    ("generation_s", "generation", "s"), ("wall_s", "page wall time", "s"),
    ("generated_tokens", "tokens per page", "tokens"), ("prompt_tokens", "prompt tokens", "tokens"),
    ("image_slots", "image slots", "tokens"),
)
SUMMARY_COLUMNS = ("metric", "stage", "unit", "n", "mean", "median", "p90", "std", "min", "max", "analytic_mean",
                   "measured_over_analytic")


# ---------------------------------------------------------------------------------------------- per page
def page_table(store: RunStore, run_id: str, hardware: Hardware | None = None, analytic: bool = True,
               prediction: Hardware | None = None) -> pd.DataFrame:
    """One row per sample of a dataset run (PAGE_COLUMNS, then analytic_* and, with a `prediction`, predicted_*
    columns). Times in seconds, FLOPs counted (<NA> where not counted), memory in bytes (CUDA only). Raises
    RunNotFound."""
    run = store.get_run(run_id)
    pts = store.points(run_id)
    base = pts.drop_duplicates("point_id").set_index("point_id")
    frame = pd.DataFrame(index=base.index)
    keys = [json.loads(k) for k in base["key"]]
    extras = [e or {} for e in base["extra"]]
    frame["point_id"] = base.index.astype("int64")
    frame["key"] = base["key"]
    for col in ("page", "pdf_page", "epoch"):
        frame[col] = [k.get(col) for k in keys]
    frame["label"] = [e.get("label") or k.get("page") for e, k in zip(extras, keys)]
    frame["source"] = [e.get("source") for e in extras]  # the page's file when measured (uploads: content-addressed)
    for col in ("status", "message", "updated_at", "mode", "grid_w", "grid_h", "image_w", "image_h", "image_slots",
                "text_tokens", "decode_steps", "kv_bytes"):
        frame[col] = base[col]
    frame["prompt_tokens"] = base["sequence"]
    frame["grid"] = [None if pd.isna(w) or pd.isna(h) else f"{w}x{h}" for w, h in zip(base["grid_w"], base["grid_h"])]
    staged = pts[pts["stage"].notna()]
    seconds = staged.pivot(index="point_id", columns="stage", values="median_s")
    flops = staged.pivot(index="point_id", columns="stage", values="flops")
    for s in STAGES:
        frame[f"{s}_s"] = seconds[s].reindex(frame.index) if s in seconds else np.nan
        frame[f"{s}_flops"] = flops[s].reindex(frame.index) if s in flops else pd.NA
    for col in ("generated_tokens", "eos", "ttft_s", "tpot_s", "decode_step_mean_s", "preprocess_s",
                "generation_s", "wall_s", "peak_memory_bytes", "text", "flops_source"):
        frame[col] = [e.get(col) for e in extras]
    dets = [e.get("detections") or {} for e in extras]
    frame["blocks"] = [d.get("blocks") for d in dets]
    frame["labels"] = [", ".join(f"{k} {v}" for k, v in sorted((d.get("labels") or {}).items())) or None
                       for d in dets]
    for col in ("grid_w", "grid_h", "image_w", "image_h", "image_slots", "prompt_tokens", "text_tokens",
                "generated_tokens", "decode_steps", "epoch", "pdf_page", "kv_bytes", "peak_memory_bytes", "blocks",
                *(f"{s}_flops" for s in STAGES)):
        frame[col] = pd.array([None if pd.isna(v) else int(v) for v in frame[col]], dtype="Int64")
    for col in (*(f"{s}_s" for s in STAGES), "ttft_s", "tpot_s", "decode_step_mean_s", "preprocess_s",
                "generation_s", "wall_s"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    no_decode = (frame["status"] == "done") & (frame["decode_steps"] == 0).fillna(False)
    frame.loc[no_decode, "decode_s"] = 0.0  # no decode step ran: zero, not unknown
    frame.loc[no_decode, "decode_flops"] = 0
    frame["total_flops"] = frame[[f"{s}_flops" for s in ("vision", "prefill", "decode")]].sum(axis=1, min_count=3)
    frame["total_flops"] = frame["total_flops"].astype("Int64")
    frame = frame[list(PAGE_COLUMNS)].reset_index(drop=True)
    if analytic:
        spec = run_spec(run)
        hw = hardware if hardware is not None else run_ceilings(run)[0]  # the datasheet preset
        how = dict(dtype=run.get("dtype") or "bfloat16", attn=run.get("attn") or "sdpa",
                   logits=(run["meta"].get("settings") or {}).get("logits", "all"))
        parts = [frame, analytic_columns(frame, spec, hw, **how)]
        if prediction is not None:  # the run's own engine and the routing it observed
            parts.append(predicted_columns(frame, spec, run_prediction(run, pts, prediction, spec), **how))
        frame = pd.concat(parts, axis=1)
    frame.attrs["run_id"] = run_id
    frame.attrs["model"] = run_model(run)
    frame.attrs["label"] = run.get("label")
    return frame


def analytic_columns(pages: pd.DataFrame, spec: ModelSpec, hardware: Hardware | None = None,
                     dtype: str = "bfloat16", attn: str = "sdpa", logits: str = "all") -> pd.DataFrame:
    """analytic_* columns aligned with `pages` (NaN for samples that did not finish): one vectorised
    evaluation per mode over all the run's page workloads."""
    cols = [f"analytic_{s}_tensor_flops" for s in ANALYTIC_STAGES]
    if hardware is not None:
        cols += [f"analytic_{s}_s" for s in ANALYTIC_STAGES] + ["analytic_ttft_s", "analytic_tpot_s"]
    out = pd.DataFrame(np.nan, index=pages.index, columns=cols, dtype="float64")
    for group, steps, ev in _evaluated(pages, spec, hardware, dtype, attn, logits):
        for s in (s for s in ANALYTIC_STAGES if s in ev):  # the run's model's stages
            out.loc[group.index, f"analytic_{s}_tensor_flops"] = ev[s]["tensor_flops"].astype("float64")
            if hardware is not None:
                out.loc[group.index, f"analytic_{s}_s"] = ev[s]["time_s"].astype("float64")
        if hardware is not None:
            out.loc[group.index, "analytic_ttft_s"] = (ev["vision"]["time_s"] + ev["prefill"]["time_s"]).astype(float)
            with np.errstate(divide="ignore", invalid="ignore"):
                tpot = np.where(steps > 0, ev["decode"]["time_s"] / np.maximum(steps, 1), np.nan)
            out.loc[group.index, "analytic_tpot_s"] = tpot
    return out


def predicted_columns(pages: pd.DataFrame, spec: ModelSpec, prediction: Hardware, dtype: str = "bfloat16",
                      attn: str = "sdpa", logits: str = "all") -> pd.DataFrame:
    """predicted_<stage>_s, predicted_ttft_s and predicted_tpot_s aligned with `pages` (NaN for samples that did
    not finish): the time model of `prediction` (a Hardware carrying a Prediction) for each page's workload."""
    cols = [f"predicted_{s}_s" for s in ANALYTIC_STAGES] + ["predicted_ttft_s", "predicted_tpot_s"]
    out = pd.DataFrame(np.nan, index=pages.index, columns=cols, dtype="float64")
    if getattr(prediction, "prediction", None) is None:
        raise ValueError("predicted_columns needs a Hardware carrying a prediction (analytic.predict.with_profile)")
    for group, steps, ev in _evaluated(pages, spec, prediction, dtype, attn, logits):
        for s in (s for s in ANALYTIC_STAGES if s in ev):
            out.loc[group.index, f"predicted_{s}_s"] = ev[s]["predicted_s"].astype("float64")
        out.loc[group.index, "predicted_ttft_s"] = (ev["vision"]["predicted_s"]
                                                    + ev["prefill"]["predicted_s"]).astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            out.loc[group.index, "predicted_tpot_s"] = np.where(
                steps > 0, ev["decode"]["predicted_s"] / np.maximum(steps, 1), np.nan)
    return out


def _evaluated(pages: pd.DataFrame, spec: ModelSpec, hardware, dtype: str, attn: str, logits: str):
    """(group of done pages of one mode, their decode steps, analytic.evaluate of their workloads), per mode."""
    from ..analytic import Points, evaluate

    ok = (pages["status"] == "done") & pages[["grid_w", "grid_h", "text_tokens", "decode_steps"]].notna().all(axis=1)
    for mode, group in pages[ok].groupby("mode"):
        crops = np.stack([group["grid_w"].astype("int64").to_numpy(), group["grid_h"].astype("int64").to_numpy()], -1)
        steps = group["decode_steps"].astype("int64").to_numpy()
        pts = Points.build(mode=str(mode), crops=crops, text_tokens=group["text_tokens"].astype("int64").to_numpy(),
                           decode_steps=steps, batch=1, dtype=dtype, attn=attn, logits=logits)
        yield group, steps, evaluate(spec, pts, hardware)


# ---------------------------------------------------------------------------------------------- statistics
def _done(pages: pd.DataFrame) -> pd.DataFrame:
    return pages[pages["status"] == "done"]


def _describe(values: pd.Series) -> dict[str, float]:
    v = pd.to_numeric(values, errors="coerce").dropna().to_numpy(dtype=np.float64)
    if v.size == 0:
        return {"n": 0, "mean": np.nan, "median": np.nan, "p90": np.nan, "std": np.nan, "min": np.nan, "max": np.nan}
    return {"n": int(v.size), "mean": float(v.mean()), "median": float(np.median(v)),
            "p90": float(np.percentile(v, 90)), "std": float(v.std()), "min": float(v.min()), "max": float(v.max())}


def run_stages(pages: pd.DataFrame) -> tuple[str, ...]:
    """The stage columns of a page table that belong to its run's model (page_table records the model in
    `attrs`; without it, every stage)."""
    from ..registry import get_family

    model = pages.attrs.get("model")
    return tuple(s for s in STAGES if s in get_family(model).all_stages) if model else STAGES


def stage_summary(pages: pd.DataFrame) -> pd.DataFrame:
    """SUMMARY_COLUMNS: one row per metric of SUMMARY_METRICS over the done samples, with the analytic mean
    (where the page table has the matching analytic column) and measured mean / analytic mean. Stages of the
    other model family are left out."""
    done = _done(pages)
    other = set(STAGES) - set(run_stages(pages))
    rows = []
    for metric, stage, unit in SUMMARY_METRICS:
        if metric not in done or stage in other:
            continue
        row = {"metric": metric, "stage": stage, "unit": unit, **_describe(done[metric])}
        acol = f"analytic_{metric}"
        amean = float(pd.to_numeric(done[acol], errors="coerce").mean()) if acol in done and len(done) else np.nan
        row["analytic_mean"] = amean
        row["measured_over_analytic"] = row["mean"] / amean if amean and np.isfinite(amean) else np.nan
        rows.append(row)
    flops = [(f"{s}_flops", s) for s in STAGES] + [("total_flops", "total")]
    for metric, stage in flops:
        if metric not in done or stage in other:
            continue
        row = {"metric": metric, "stage": stage, "unit": "FLOP", **_describe(done[metric].astype("float64"))}
        acol = f"analytic_{stage}_tensor_flops"
        amean = float(pd.to_numeric(done[acol], errors="coerce").mean()) if acol in done and len(done) else np.nan
        row["analytic_mean"] = amean
        row["measured_over_analytic"] = row["mean"] / amean if amean and np.isfinite(amean) else np.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def distributions(pages: pd.DataFrame, metrics: Sequence[str] = ("ttft_s", "tpot_s")) -> pd.DataFrame:
    """Long table for histograms / box plots: columns key, label, epoch, mode, grid, metric, value (done samples;
    missing values dropped). Pass e.g. [f"{s}_s" for s in stats.STAGES] for per-stage box plots."""
    done = _done(pages)
    keep = [m for m in metrics if m in done]
    long = done.melt(id_vars=["key", "label", "epoch", "mode", "grid"], value_vars=keep, var_name="metric",
                     value_name="value")
    long["value"] = pd.to_numeric(long["value"], errors="coerce").astype("float64")
    return long.dropna(subset=["value"]).reset_index(drop=True)


def decode_steps(store: RunStore, run_id: str, pages: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every decode step of every done sample: key, label, step (1-based), context (tokens cached before the
    step: prompt + step - 1), seconds."""
    pages = page_table(store, run_id, analytic=False) if pages is None else pages
    pts = store.points(run_id).drop_duplicates("point_id").set_index("point_id")
    rows = []
    for _, p in _done(pages).iterrows():
        times = (pts.loc[p["point_id"], "extra"] or {}).get("decode_steps_s") or []
        prompt = int(p["prompt_tokens"]) if p["prompt_tokens"] is not pd.NA else None
        for i, t in enumerate(times, 1):
            rows.append({"key": p["key"], "label": p["label"], "step": i,
                         "context": None if prompt is None else prompt + i - 1, "seconds": float(t)})
    out = pd.DataFrame(rows, columns=["key", "label", "step", "context", "seconds"])
    out["context"] = out["context"].astype("Int64")
    return out


def page_means(pages: pd.DataFrame) -> pd.DataFrame:
    """One row per page (over its epochs): epochs measured and mean times / tokens; the shape columns kept."""
    done = _done(pages)
    times = [c for c in (*(f"{s}_s" for s in STAGES), "ttft_s", "tpot_s", "wall_s") if c in done]
    g = done.groupby(["page", "pdf_page"], dropna=False, sort=False)
    out = g[times].mean()
    out["generated_tokens"] = g["generated_tokens"].mean()
    out["epochs"] = g.size()
    for col in ("label", "mode", "grid", "image_slots", "prompt_tokens"):
        out[col] = g[col].first()
    return out.reset_index()


def run_summary(store: RunStore, run_id: str, pages: pd.DataFrame | None = None) -> dict[str, Any]:
    """Counts and throughput of a dataset run (JSON-friendly)."""
    run = store.get_run(run_id)
    pages = page_table(store, run_id, analytic=False) if pages is None else pages
    done = _done(pages)
    wall = float(done["wall_s"].sum()) if len(done) else 0.0
    gen = float(done["generation_s"].sum()) if len(done) else 0.0
    tokens = int(done["generated_tokens"].sum()) if len(done) else 0
    meta = run["meta"]
    return {
        "run_id": run_id, "label": run["label"], "flags": run["flags"], "device": run["environment"].get("device"),
        "gpu_name": run["environment"].get("gpu_name"), "dataset": meta.get("dataset"), "sampling": meta.get("sampling"),
        "settings": meta.get("settings"), "samples": int(len(pages)),
        "done": int((pages["status"] == "done").sum()), "error": int((pages["status"] == "error").sum()),
        "oom": int((pages["status"] == "oom").sum()),
        "errors": [{"label": r["label"], "message": r["message"]} for _, r in pages[pages["status"] != "done"].iterrows()],
        "wall_s": wall, "pages_per_s": len(done) / wall if wall > 0 else None,
        "generated_tokens": tokens, "tokens_per_page": tokens / len(done) if len(done) else None,
        "output_tokens_per_s": tokens / gen if gen > 0 else None,
        "eos_share": float(done["eos"].astype(bool).mean()) if len(done) else None,
        "operators": bool(meta.get("operators")),
        "order_check": order_summary(meta.get("order_check")),
        "order_check_failed": order_check_failed(meta.get("order_check")),
    }


# ---------------------------------------------------------------------------------------------- operators
def operator_table(store: RunStore, run_id: str, stage: str | None = None, device: str | None = None) -> pd.DataFrame:
    """The operator breakdown stored with the run (operators.OPERATOR_COLUMNS; the top operators per stage and
    device, the rest folded into one row); empty when the run has none. Filter by stage and/or device."""
    from ..measure.operators import OPERATOR_COLUMNS, OperatorProfile

    meta = store.get_run(run_id)["meta"].get("operators")
    if not meta:
        return pd.DataFrame(columns=list(OPERATOR_COLUMNS))
    ops = OperatorProfile.from_meta(meta).operators
    if stage is not None:
        ops = ops[ops["stage"] == stage]
    if device is not None:
        ops = ops[ops["device"] == device]
    return ops.reset_index(drop=True)


def operator_stages(store: RunStore, run_id: str) -> pd.DataFrame:
    """Stage totals of the stored operator breakdown (operators.STAGE_COLUMNS); empty when none."""
    from ..measure.operators import STAGE_COLUMNS, OperatorProfile

    meta = store.get_run(run_id)["meta"].get("operators")
    if not meta:
        return pd.DataFrame(columns=list(STAGE_COLUMNS))
    return OperatorProfile.from_meta(meta).stages


# ---------------------------------------------------------------------------------------------- one call
@dataclass
class DatasetRunView:
    run: dict
    pages: pd.DataFrame
    stages: pd.DataFrame
    latency: pd.DataFrame  # distributions(pages): ttft_s and tpot_s
    stage_times: pd.DataFrame  # distributions(pages) of every stage's seconds
    steps: pd.DataFrame
    summary: dict
    operators: pd.DataFrame
    operator_stages: pd.DataFrame
    files: dict = field(default_factory=dict)  # operator CSV / trace paths, when recorded


def load_dataset_run(store: RunStore, run_id: str, hardware: Hardware | None = None,
                     prediction: Hardware | None = None) -> DatasetRunView:
    """Everything the dataset-run section shows, from one call (`hardware`: the roofline's ceilings, default the
    run's GPU preset; `prediction`: a Hardware carrying a calibration profile's prediction, or None)."""
    run = store.get_run(run_id)
    pages = page_table(store, run_id, hardware, prediction=prediction)
    ops_meta = run["meta"].get("operators") or {}
    return DatasetRunView(
        run=run, pages=pages, stages=stage_summary(pages), latency=distributions(pages),
        stage_times=distributions(pages, [f"{s}_s" for s in STAGES]), steps=decode_steps(store, run_id, pages),
        summary=run_summary(store, run_id, pages), operators=operator_table(store, run_id),
        operator_stages=operator_stages(store, run_id), files=dict(ops_meta.get("files") or {}))
