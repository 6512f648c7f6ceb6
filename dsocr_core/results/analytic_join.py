"""Analytic vs measured, per point and per stage: FLOP difference, roofline time error, MFU and MBU.

MFU = analytic FLOPs / (peak FLOP/s x measured time): the share of the GPU's math the stage used.
MBU = analytic bytes / (bandwidth x measured time): the share of the GPU's memory bandwidth it used.
Both are given against the datasheet ceilings and against the ceilings calibrated in the same run.
"""
from __future__ import annotations

import json
import math

import pandas as pd

from ..analytic import stage_totals
from ..hardware import run_ceilings
from ..spec import Hardware, ModelSpec, Workload
from .store import RunStore

FLAG_THRESHOLD = 0.10  # differences above 10% are flagged
COMPARED_STAGES = ("sam", "clip", "projector", "vision", "prefill", "decode", "decode_step")


def point_workload(row: pd.Series) -> Workload:
    """The Workload a stored point measured (its key columns)."""
    mode = row["mode"]  # item access: Series.mode / Series.dtype are methods/attributes of pandas itself
    crops = (int(row["grid_w"]), int(row["grid_h"])) if mode in ("gundam", "gundam-m") else None
    return Workload(mode=mode, crops=crops, text_tokens=int(row["text_tokens"]), batch=int(row["batch"]),
                    decode_steps=int(row["decode_steps"]), dtype=row["dtype"], attn=row["attn"],
                    logits=row["logits"])


def _analytic_stage(spec: ModelSpec, w: Workload, stage: str, hw: Hardware | None) -> dict:
    """Analytic figures of one stage; decode_step is the decode total spread evenly over the steps."""
    totals = stage_totals(spec, w, hw)
    if stage != "decode_step":
        return totals[stage]
    k = max(w.decode_steps, 1)
    return {m: (v / k if isinstance(v, (int, float)) and m not in ("intensity",) else v)
            for m, v in totals["decode"].items()}


def _rel(a: float | None, b: float | None) -> float | None:
    """(a - b) / b, or None when either is missing or b is zero."""
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)):
        return None
    return (a - b) / b


def compare_run(store: RunStore, run_id: str, spec: ModelSpec | None = None,
                datasheet: Hardware | None = None, calibrated: Hardware | None = None) -> pd.DataFrame:
    """One row per finished point x stage with measured and analytic figures side by side."""
    run = store.get_run(run_id)
    stored_spec = (run.get("meta") or {}).get("spec")
    spec = spec or (ModelSpec(**stored_spec) if stored_spec else ModelSpec())
    ds_default, cal_default = run_ceilings(run)
    datasheet, calibrated = datasheet or ds_default, calibrated or cal_default
    pts = store.points(run_id)
    pts = pts[(pts.status == "done") & pts.stage.isin(COMPARED_STAGES)]
    rows, cache = [], {}
    for _, p in pts.iterrows():
        w = point_workload(p)
        key = (p["key"], p["stage"])
        if key not in cache:
            cache[key] = (_analytic_stage(spec, w, p["stage"], datasheet),
                          _analytic_stage(spec, w, p["stage"], calibrated) if calibrated else None)
        a_ds, a_cal = cache[key]
        t = float(p.median_s)
        measured_flops = None if pd.isna(p.flops) else float(p.flops)
        row = {
            "point": p["key"], "mode": w.mode, "grid": "x".join(map(str, w.crops or (1, 1))),
            "text_tokens": w.text_tokens, "batch": w.batch, "decode_steps": w.decode_steps,
            "sequence": p["sequence"], "stage": p["stage"],
            "measured_s": t, "spread_s": float(p.p90_s - p.p10_s) if not pd.isna(p.p90_s) else None,
            "measured_tensor_flops": measured_flops, "analytic_tensor_flops": a_ds["tensor_flops"],
            "analytic_flops": a_ds["flops"], "analytic_bytes": a_ds["bytes"],
            "flop_rel_diff": _rel(a_ds["tensor_flops"], measured_flops),
        }
        for name, hw, a in (("datasheet", datasheet, a_ds), ("calibrated", calibrated, a_cal)):
            if hw is None or a is None or t <= 0:
                row.update({f"predicted_{name}_s": None, f"time_err_{name}": None, f"mfu_{name}": None,
                            f"mbu_{name}": None, f"bound_{name}": None, f"limit_{name}_s": None})
                continue
            row[f"predicted_{name}_s"] = a["time_s"]
            row[f"time_err_{name}"] = _rel(a["time_s"], t)
            row[f"mfu_{name}"] = a["flops"] / (hw.peak_flops * t)
            row[f"mbu_{name}"] = a["bytes"] / (hw.bandwidth * t)
            row[f"bound_{name}"] = a["bound"]
            row[f"limit_{name}_s"] = a["time_s"]  # the stage's time at the hardware limit (roofline)
        row["flagged"] = any(v is not None and abs(v) > FLAG_THRESHOLD
                             for v in (row["flop_rel_diff"], row.get("time_err_calibrated")))
        rows.append(row)
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> dict:
    """Per stage: points, max |FLOP diff|, median and max |calibrated time error|, median MFU/MBU, flags."""
    out = {}
    if df.empty:
        return out
    for stage, g in df.groupby("stage", sort=False):
        def col(name):
            return g[name].dropna().astype(float) if name in g else pd.Series(dtype=float)

        fd, te, ted = col("flop_rel_diff").abs(), col("time_err_calibrated").abs(), col("time_err_datasheet").abs()
        out[stage] = {
            "points": int(len(g)),
            "flop_diff_max": float(fd.max()) if len(fd) else None,
            "time_err_calibrated_median": float(te.median()) if len(te) else None,
            "time_err_calibrated_max": float(te.max()) if len(te) else None,
            "time_err_datasheet_median": float(ted.median()) if len(ted) else None,
            "mfu_calibrated_median": float(col("mfu_calibrated").median()) if len(col("mfu_calibrated")) else None,
            "mbu_calibrated_median": float(col("mbu_calibrated").median()) if len(col("mbu_calibrated")) else None,
            "mfu_datasheet_median": float(col("mfu_datasheet").median()) if len(col("mfu_datasheet")) else None,
            "mbu_datasheet_median": float(col("mbu_datasheet").median()) if len(col("mbu_datasheet")) else None,
            "flagged": int(g["flagged"].sum()),
        }
    return out


def summary_markdown(summary: dict, title: str = "Analytic vs measured") -> str:
    """The summary as a markdown table."""
    def pct(v):
        return "n/a" if v is None else f"{100 * v:.1f}%"

    lines = [f"### {title}", "",
             "| stage | points | max FLOP diff | median / max time error (calibrated) | median time error "
             "(datasheet) | median MFU | median MBU | flagged > 10% |",
             "|---|---|---|---|---|---|---|---|"]
    for stage, s in summary.items():
        lines.append(f"| {stage} | {s['points']} | {pct(s['flop_diff_max'])} | "
                     f"{pct(s['time_err_calibrated_median'])} / {pct(s['time_err_calibrated_max'])} | "
                     f"{pct(s['time_err_datasheet_median'])} | {pct(s['mfu_calibrated_median'])} | "
                     f"{pct(s['mbu_calibrated_median'])} | {s['flagged']} |")
    return "\n".join(lines) + "\n"


def summary_json(summary: dict) -> str:
    return json.dumps(summary, indent=2)
