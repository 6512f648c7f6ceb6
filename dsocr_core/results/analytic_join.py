"""Analytic vs measured, per point and per stage: FLOP difference, roofline time error, MFU and MBU.

MFU = analytic FLOPs / (peak FLOP/s x measured time): the share of the GPU's math the stage used.
MBU = analytic bytes / (bandwidth x measured time): the share of the GPU's memory bandwidth it used.
Both are given against the datasheet ceilings and against the ceilings calibrated in the same run.
With a `prediction` (a Hardware carrying a calibration profile, analytic.predict.with_profile) each row also gets
the time model's predicted time (`predicted_s`; the `predicted_<ceilings>_s` columns are roofline times, bounds)
and its error against the measurement, labelled with the profile (measured or DERIVED, GPU or CPU).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..analytic import Points, evaluate
from ..analytic.predict import at_clocks, at_host_speed
from ..analytic.routing import Routing, calls_of_record, routing_from_calls
from ..engines import run_engine
from ..hardware import run_ceilings
from ..measure.environment import full_sm_clock_mhz
from ..registry import mode_info
from ..spec import Hardware, ModelSpec, Workload
from .runs import run_spec
from .schema import STAGES
from .store import RunStore

FLAG_THRESHOLD = 0.10  # differences above 10% are flagged
COMPARED_STAGES = STAGES  # every model family's stages (registry), decode_step included


def point_workload(row: pd.Series) -> Workload:
    """The Workload a stored point measured (its key columns)."""
    mode = row["mode"]  # item access: Series.mode / Series.dtype are methods/attributes of pandas itself
    crops = (int(row["grid_w"]), int(row["grid_h"])) if mode_info(mode).crop_mode else None
    return Workload(mode=mode, crops=crops, text_tokens=int(row["text_tokens"]), batch=int(row["batch"]),
                    decode_steps=int(row["decode_steps"]), dtype=row["dtype"], attn=row["attn"],
                    logits=row["logits"])


def _per_point(stages: dict, n: int, i: int) -> dict[str, dict]:
    """Point i of evaluate()'s {stage: {metric: array over n points}} as plain numbers (like stage_totals)."""
    def scalar(v):
        a = np.asarray(v)
        x = a.reshape(n, *a.shape[1:])[i] if a.size == n else a.reshape(-1)[0]
        return x.item() if hasattr(x, "item") else x

    return {s: {m: scalar(v) for m, v in d.items()} for s, d in stages.items()}


def workload_stage_totals(spec: ModelSpec, workloads: list[Workload], hw: Hardware | None) -> list[dict]:
    """stage_totals of every workload, evaluated vectorised: one Points (and one evaluate call) per group of
    workloads sharing mode, dtype, attention, logits and crop range; the same numbers as stage_totals per
    workload, plus "decode_step" (the decode total spread evenly over the steps)."""
    out: list[dict | None] = [None] * len(workloads)
    groups: dict[tuple, list[int]] = {}
    for i, w in enumerate(workloads):
        key = (w.mode, w.dtype, w.attn, w.logits, w.min_crops, w.max_crops, w.crops is not None,
               w.crops is None and w.image_size is not None)
        groups.setdefault(key, []).append(i)
    for (mode, dtype, attn, logits, lo, hi, has_crops, has_image), idx in groups.items():
        ws = [workloads[i] for i in idx]
        pts = Points.build(mode=mode, crops=np.array([w.crops for w in ws]) if has_crops else None,
                           image=np.array([w.image_size for w in ws]) if has_image else None,
                           text_tokens=np.array([w.text_tokens for w in ws]), batch=np.array([w.batch for w in ws]),
                           decode_steps=np.array([w.decode_steps for w in ws]), min_crops=lo, max_crops=hi,
                           dtype=dtype, attn=attn, logits=logits)
        stages = evaluate(spec, pts, hw)
        for j, i in enumerate(idx):
            totals = _per_point(stages, len(ws), j)
            k = max(ws[j].decode_steps, 1)
            totals["decode_step"] = {m: (v / k if isinstance(v, (int, float)) and m != "intensity" else v)
                                     for m, v in totals["decode"].items()}
            out[i] = totals
    return out


def _rel(a: float | None, b: float | None) -> float | None:
    """(a - b) / b, or None when either is missing or b is zero."""
    if a is None or b is None or not b or (isinstance(a, float) and math.isnan(a)):
        return None
    return (a - b) / b


def observed_routing(run: dict, points: pd.DataFrame, spec: ModelSpec | None = None) -> Routing | None:
    """The routing a run observed (the `routing` records of its finished points' prefill and decode_step
    results, measure/routing_record.py), as one Routing: per tokens per call, the mean distinct experts per layer.
    None for runs that recorded none (measured before routing was recorded, or a model without MoE)."""
    spec = spec or run_spec(run)
    calls = []
    if "stage_extra" in points:
        done = points[(points.status == "done") & points.stage.isin(("prefill", "decode_step"))]
        for extra in done["stage_extra"]:
            record = extra.get("routing") if isinstance(extra, dict) else None
            if record:
                calls += calls_of_record(record)
    name = str(run.get("name") or "")
    return routing_from_calls(calls, spec.n_routed_experts, spec.num_experts_per_tok,
                              f"run {str(run.get('id', ''))[:8]}" + (f" ({name})" if name else ""))


def run_prediction(run: dict, points: pd.DataFrame, prediction: Hardware, spec: ModelSpec | None = None):
    """`prediction` (a ProfiledHardware) made for the run: its profile, work and overlap, with the run's own
    engine (its stored description; for runs stored before descriptions, its session mode's engine of that time)
    and the routing it observed (uniform, labelled assumed, where it recorded none)."""
    from ..analytic.predict import with_profile

    pred = prediction.prediction
    engine, _ = run_engine(run)
    routing = observed_routing(run, points, spec)
    base = Hardware(**prediction.model_dump())
    return with_profile(base, pred.profile, engine, pred.work, pred.overlap, routing,  # a derived profile's tables
                        gpu_clock_mhz=full_sm_clock_mhz(run.get("environment")))  # stand for that GPU's full clock


def stage_totals_as_measured(spec: ModelSpec, workloads: list[Workload], hw: Hardware,
                             probes: list[float | None], clocks: list[dict | None] | None = None,
                             ) -> tuple[list[dict], list[str], list[str]]:
    """workload_stage_totals under `hw` (a ProfiledHardware) with each workload at the host speed it was measured
    at (`probes`, runtime/host_speed.py; None: the calibration's) and at the SM clocks its stages ran at (`clocks`,
    runtime/gpu_clocks.py, {stage: {mhz, samples}}; None: the calibration's), one evaluation per distinct pair
    (analytic.predict.at_host_speed, at_clocks), and each workload's host-speed and clock labels."""
    clocks = clocks or [None] * len(workloads)
    at = [at_clocks(at_host_speed(hw, p), c) for p, c in zip(probes, clocks)]
    totals: list = [None] * len(workloads)
    host_labels: list = [None] * len(workloads)
    clock_labels: list = [None] * len(workloads)
    key = lambda a: (a.prediction.host_probe_op_s, a.prediction.clocks)  # noqa: E731
    for k in dict.fromkeys(key(a) for a in at):
        idx = [i for i, a in enumerate(at) if key(a) == k]
        pred = at[idx[0]].prediction
        for i, t in zip(idx, workload_stage_totals(spec, [workloads[i] for i in idx], at[idx[0]])):
            totals[i], host_labels[i], clock_labels[i] = t, pred.host_label(), pred.clock_label()
    return totals, host_labels, clock_labels


def point_stage_clocks(point) -> dict | None:
    """The SM clock each stage of a stored point ran at (its extra's stage_clocks, runtime/gpu_clocks.py); None for
    points stored before it was recorded, or measured where NVML could not be read (a CPU)."""
    extra = point.get("extra") if hasattr(point, "get") else None
    v = (extra or {}).get("stage_clocks") if isinstance(extra, dict) else None
    return v if isinstance(v, dict) and v else None


def point_host_probe(point) -> float | None:
    """The host's speed a stored point was measured at (its extra's host_probe_op_s); None for points stored
    before it was recorded, or measured on a CPU."""
    extra = point.get("extra") if hasattr(point, "get") else None
    v = (extra or {}).get("host_probe_op_s") if isinstance(extra, dict) else None
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


def compare_run(store: RunStore, run_id: str, spec: ModelSpec | None = None,
                datasheet: Hardware | None = None, calibrated: Hardware | None = None,
                prediction: Hardware | None = None) -> pd.DataFrame:
    """One row per finished point x stage with measured and analytic figures side by side; with `prediction`
    (a ProfiledHardware) the predicted time beside them, made for the run (run_prediction: its own engine and
    the routing it observed)."""
    run = store.get_run(run_id)
    spec = spec or run_spec(run)
    ds_default, cal_default = run_ceilings(run)
    datasheet, calibrated = datasheet or ds_default, calibrated or cal_default
    pts = store.points(run_id)
    if getattr(prediction, "prediction", None) is not None:
        prediction = run_prediction(run, pts, prediction, spec)
    pts = pts[(pts.status == "done") & pts.stage.isin(COMPARED_STAGES)]
    firsts = pts.drop_duplicates("key")
    workloads = {k: point_workload(p) for k, (_, p) in zip(firsts["key"], firsts.iterrows())}
    keys = list(workloads)
    ws = [workloads[k] for k in keys]
    on_ds = dict(zip(keys, workload_stage_totals(spec, ws, datasheet)))
    on_cal = dict(zip(keys, workload_stage_totals(spec, ws, calibrated))) if calibrated else {}
    pred = getattr(prediction, "prediction", None)
    on_pred, host_labels, clock_labels = {}, {}, {}
    if pred is not None:  # each point at the host speed and the clocks it was measured at
        probes = [point_host_probe(p) for _, p in firsts.iterrows()]
        clocks = [point_stage_clocks(p) for _, p in firsts.iterrows()]
        totals, labels, cl = stage_totals_as_measured(spec, ws, prediction, probes, clocks)
        on_pred, host_labels, clock_labels = dict(zip(keys, totals)), dict(zip(keys, labels)), dict(zip(keys, cl))
    pred_info = {} if pred is None else {  # every row names the profile: measured or DERIVED, GPU or CPU
        "predicted_profile": pred.profile.label(), "predicted_derived": pred.profile.derived,
        "predicted_device_kind": pred.profile.device.get("kind"), "predicted_session_mode": pred.session_mode,
        "predicted_engine": pred.engine.label(), "predicted_routing": pred.routing_label()}
    rows = []
    for _, p in pts.iterrows():
        w = workloads[p["key"]]
        a_ds = on_ds[p["key"]][p["stage"]]
        a_cal = on_cal[p["key"]][p["stage"]] if calibrated else None
        t = float(p.median_s)
        measured_flops = None if pd.isna(p.flops) else float(p.flops)
        p10 = None if pd.isna(p.p10_s) else float(p.p10_s)
        p90 = None if pd.isna(p.p90_s) else float(p.p90_s)
        row = {
            "point": p["key"], "mode": w.mode, "grid": "x".join(map(str, w.crops or (1, 1))),
            "text_tokens": w.text_tokens, "batch": w.batch, "decode_steps": w.decode_steps,
            "sequence": p["sequence"], "stage": p["stage"],
            "measured_s": t, "p10_s": p10, "p90_s": p90,
            "spread_s": p90 - p10 if p10 is not None and p90 is not None else None,
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
        if pred is not None:
            p_s = on_pred[p["key"]][p["stage"]]["predicted_s"]
            row.update(predicted_s=p_s, time_err_predicted=_rel(p_s, t) if t > 0 else None, **pred_info,
                       predicted_host_speed=host_labels[p["key"]], predicted_clocks=clock_labels[p["key"]])
        # flagged: the FLOP count or the time error against the run's main ceilings (calibrated, else datasheet)
        main = row["time_err_calibrated"] if row["time_err_calibrated"] is not None else row["time_err_datasheet"]
        row["flagged"] = any(v is not None and abs(v) > FLAG_THRESHOLD for v in (row["flop_rel_diff"], main))
        rows.append(row)
    return pd.DataFrame(rows)


PEAKS = ("datasheet", "calibrated")


def summarize(df: pd.DataFrame) -> dict:
    """Per stage: points, max |FLOP diff|, and for each ceiling (datasheet, calibrated): median and max |time
    error|, median MFU and MBU (the numbers the MFU chart draws: medians over the points) and how many points are
    flagged (|FLOP diff| or |time error| against that ceiling over 10%). A ceiling the frame has no figures for
    gives None. `flagged` repeats the count of the run's main ceilings (calibrated, else datasheet)."""
    out = {}
    if df.empty:
        return out
    for stage, g in df.groupby("stage", sort=False):
        def col(name):
            return pd.to_numeric(g[name], errors="coerce").dropna() if name in g else pd.Series(dtype=float)

        def med(name):
            v = col(name)
            return float(v.median()) if len(v) else None

        fd = col("flop_rel_diff").abs()
        flop_bad = (pd.to_numeric(g["flop_rel_diff"], errors="coerce").abs() > FLAG_THRESHOLD
                    if "flop_rel_diff" in g else pd.Series(False, index=g.index))
        s = {"points": int(len(g)), "flop_diff_max": float(fd.max()) if len(fd) else None}
        for peak in PEAKS:
            te = col(f"time_err_{peak}").abs()
            s[f"time_err_{peak}_median"] = float(te.median()) if len(te) else None
            s[f"time_err_{peak}_max"] = float(te.max()) if len(te) else None
            s[f"mfu_{peak}_median"] = med(f"mfu_{peak}")
            s[f"mbu_{peak}_median"] = med(f"mbu_{peak}")
            if len(te):
                err = pd.to_numeric(g[f"time_err_{peak}"], errors="coerce").abs()
                s[f"flagged_{peak}"] = int(((err > FLAG_THRESHOLD) | flop_bad).sum())
            else:
                s[f"flagged_{peak}"] = None
        te = col("time_err_predicted").abs()  # the time model's error (only when the frame has a prediction)
        if len(te):
            s["time_err_predicted_median"], s["time_err_predicted_max"] = float(te.median()), float(te.max())
        main = "calibrated" if s["flagged_calibrated"] is not None else "datasheet"
        s["flagged"] = s[f"flagged_{main}"] if s[f"flagged_{main}"] is not None else int(flop_bad.sum())
        out[stage] = s
    return out


def pct(v: float | None) -> str:
    """A share as a percentage with the digits small values need: 0.5 -> '50.0%', 0.00012 -> '0.012%'."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    x = 100 * v
    if x == 0:
        return "0%"
    return f"{x:.1f}%" if abs(x) >= 1 else f"{x:.2g}%"


def summary_peaks(summary: dict) -> list[str]:
    """The ceilings (datasheet, calibrated) the summary has figures for."""
    return [p for p in PEAKS if any(s.get(f"time_err_{p}_median") is not None for s in summary.values())]


def summary_frame(summary: dict) -> pd.DataFrame:
    """The summary as a table of formatted cells: one group of columns (time error, MFU, MBU, flagged) per ceiling
    that has figures, so a run compared only against datasheet ceilings shows those, never 'n/a' columns."""
    peaks = summary_peaks(summary)
    rows = []
    for stage, s in summary.items():
        row = {"stage": stage, "points": str(s["points"]), "max FLOP diff": pct(s["flop_diff_max"])}
        for p in peaks:
            flagged = s.get(f"flagged_{p}")
            row[f"time error, median / max ({p})"] = f"{pct(s[f'time_err_{p}_median'])} / {pct(s[f'time_err_{p}_max'])}"
            row[f"median MFU ({p})"] = pct(s[f"mfu_{p}_median"])
            row[f"median MBU ({p})"] = pct(s[f"mbu_{p}_median"])
            row[f"flagged > 10% ({p})"] = "n/a" if flagged is None else str(flagged)
        if not peaks:
            row["flagged > 10% (FLOPs)"] = str(s["flagged"])
        if s.get("time_err_predicted_median") is not None:
            row["predicted time error, median / max"] = (f"{pct(s['time_err_predicted_median'])} / "
                                                         f"{pct(s['time_err_predicted_max'])}")
        rows.append(row)
    return pd.DataFrame(rows)


FLAG_NOTE = (f"Flagged: points where the FLOP count or the roofline time differs from the measurement by more than "
             f"{FLAG_THRESHOLD:.0%}, counted against each ceiling.")


def summary_markdown(summary: dict, title: str = "Analytic vs measured") -> str:
    """The summary (summary_frame) as a markdown table."""
    frame = summary_frame(summary)
    cols = list(frame.columns) or ["stage", "points", "max FLOP diff"]
    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    if summary_peaks(summary):
        lines += ["", FLAG_NOTE]
    return "\n".join(lines) + "\n"


def summary_json(summary: dict) -> str:
    return json.dumps(summary, indent=2)
