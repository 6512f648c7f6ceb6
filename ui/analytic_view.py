"""The tabs of the analytic page. The page builds the configurations and their sweep frames (`View`); each tab
here draws one view of them. Only the open tab runs (st.tabs with on_change="rerun"), so a page switch or a
changed setting draws one tab's charts, not nine.

Tables on screen are in engineering units (GFLOP, GB, MB, ms, TFLOP/s); the downloads keep SI base units."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import streamlit as st

from dsocr_core.analytic.capacity import MEMORY_SCOPE
from dsocr_core.spec import SpecError

from . import analytic as an
from . import charts, models_view, resources
from .measured import md

TABS = ["FLOPs", "Bytes", "Memory", "Time", "Roofline", "Per module", "Capacity", "Image shapes", "Models compared",
        "Download"]


@dataclass
class View:
    configs: list  # [(SweepRequest, Hardware)]
    frames: list[pd.DataFrame]  # one sweep frame per configuration
    spec_json: str
    spec_label: str
    axis: str
    x: str
    x_title: str
    log_y: bool
    side: bool  # side by side (else overlaid)
    pkey: str | None = None  # the prediction's cache key (ui.prediction.key); None: roofline only
    pred_note: str = ""  # which profile predicts, or how to get a prediction (ui.prediction.note)
    preset: str = "full"  # the dimensions the "Models compared" tab gives both models: full or tiny

    @property
    def both(self) -> pd.DataFrame:
        return pd.concat(self.frames, ignore_index=True)

    def point_labels(self) -> list[str]:
        name = self.x_title.split(" (")[0]
        f = self.frames[0]
        tiles = self.axis in ("crops", "image")
        return [f"{name} = {v}" + (f" ({g})" if tiles else "") for v, g in zip(f[self.x], f["grid"])]

    def point_slider(self, key: str) -> int:
        n = len(self.frames[0])
        labels = self.point_labels()
        return st.select_slider("Sweep point", options=list(range(n)), format_func=labels.__getitem__, key=key,
                                value=min(n - 1, n // 2))


# ------------------------------------------------------------------------------------------- units on screen
def _sig(values: pd.Series, digits: int = 4) -> pd.Series:
    """Rounded to `digits` significant digits (what a reader compares; the downloads keep every digit)."""
    v = pd.to_numeric(values, errors="coerce").astype(float)
    mag = np.floor(np.log10(np.abs(v.where(v != 0, 1.0))))
    return (v / 10 ** (mag - digits + 1)).round() * 10 ** (mag - digits + 1)


def in_units(df: pd.DataFrame, units: dict[str, tuple[str, float]]) -> pd.DataFrame:
    """Columns renamed to carry their unit and scaled to it: {column: (new name, factor)}; others unchanged."""
    out = df.copy()
    for col, (name, factor) in units.items():
        if col in out:
            out[col] = _sig(out[col].astype(float) * factor)
    return out.rename(columns={c: n for c, (n, _) in units.items() if c in out})


ROOFLINE_UNITS = {"intensity": ("intensity (FLOP/byte)", 1.0), "flops_per_s": ("achieved TFLOP/s", 1e-12),
                  "time_s": ("time (ms)", 1e3), "flops": ("GFLOP", 1e-9), "bytes": ("GB", 1e-9)}


def module_units(columns) -> dict[str, tuple[str, float]]:
    """FLOP counts in GFLOP, bytes and memory in MB, seconds in ms, intensity in FLOP/byte."""
    units = {}
    for c in columns:
        if c.endswith("flops") or c.endswith("flops_causal"):
            units[c] = (c.replace("flops", "GFLOP"), 1e-9)
        elif c.endswith("bytes") or c.endswith("memory"):
            units[c] = (f"{c} (MB)", 1e-6)
        elif c.endswith("_s"):
            units[c] = (f"{c[:-2]} (ms)", 1e3)
        elif c == "intensity":
            units[c] = ("intensity (FLOP/byte)", 1.0)
    return units


# ------------------------------------------------------------------------------------------- tabs
def draw(tab: str, v: View) -> None:
    {"FLOPs": _flops, "Bytes": _bytes, "Memory": _memory, "Time": _time, "Roofline": _roofline,
     "Per module": _modules, "Capacity": _capacity, "Image shapes": _shapes, "Models compared": models_view.draw,
     "Download": _download}[tab](v)


def _flops(v: View) -> None:
    st.altair_chart(charts.lines(an.stage_long(v.both, "flops", v.x), v.x, v.x_title, "FLOPs", "FLOPs per stage",
                                 log_y=v.log_y, side_by_side=v.side), width="stretch")
    st.caption("Decode is summed over all decode steps; vision stages over the global view and every tile.")


def _bytes(v: View) -> None:
    st.altair_chart(charts.lines(an.stage_long(v.both, "bytes", v.x), v.x, v.x_title, "bytes",
                                 "DRAM traffic per stage", log_y=v.log_y, side_by_side=v.side), width="stretch")
    st.altair_chart(charts.lines(an.component_long(v.both, an.TRAFFIC, v.x), v.x, v.x_title, "bytes",
                                 "traffic of the whole request by kind", colour="component", log_y=v.log_y,
                                 side_by_side=v.side), width="stretch")


def _memory(v: View) -> None:
    st.altair_chart(charts.lines(an.component_long(v.both, an.MEMORY, v.x), v.x, v.x_title, "GB",
                                 "resident memory at the peak", colour="component", log_y=v.log_y,
                                 side_by_side=v.side), width="stretch")
    st.caption("Weights of all stages, the KV cache after the last decode step, and the largest live activation "
               "set of any one module.")


def _time(v: View) -> None:
    predicted = an.has_prediction(v.frames[0])
    title = "time per stage"  # short: a longer y title was cut at the chart's height; the legend names the lines
    st.altair_chart(charts.lines(an.time_long(v.both, v.x), v.x, v.x_title, "ms", title, log_y=v.log_y,
                                 side_by_side=v.side, series="series" if predicted else None), width="stretch")
    st.caption("Roofline (dashed where a prediction is drawn): each module at its own bound, max(FLOPs / peak, "
               "bytes / bandwidth), summed per stage." + (" Predicted (solid): the time model, the roofline on the "
                                                          "profile's ceilings plus the kernels' measured "
                                                          "inefficiency, launches and host time." if predicted else ""))
    st.caption(v.pred_note)


def _roofline(v: View) -> None:
    idx = v.point_slider("an_point_roof")
    pts = an.roofline_points(v.frames, idx)
    hws = list({hw.name: hw for _, hw in v.configs}.values())
    lo = max(min(pts["intensity"].min(), min(h.ridge_intensity for h in hws)) / 10, 1e-2)
    hi = max(pts["intensity"].max(), max(h.ridge_intensity for h in hws)) * 10
    roofs = pd.concat([resources.roof_frame(h.model_dump_json(), lo, hi) for h in hws], ignore_index=True)
    st.altair_chart(charts.roofline(pts, roofs, "Stages on the roofline", shape="marker"), width="stretch")
    st.dataframe(in_units(pts.drop(columns="marker"), ROOFLINE_UNITS), hide_index=True, width="stretch")
    st.caption("A stage's FLOP/s is its FLOPs over its modelled time; below the roof where its modules are "
               "bound differently (each module is timed at its own bound)."
               + (" Predicted points: the same FLOPs over the predicted time." if an.has_prediction(v.frames[0])
                  else ""))
    st.caption(v.pred_note)


def _modules(v: View) -> None:
    labels = [r.label for r, _ in v.configs]
    sel = st.selectbox("Configuration", labels, key="an_mod_config")
    req0, hw0 = v.configs[labels.index(sel)]
    frame0 = v.frames[labels.index(sel)]
    idx = min(v.point_slider("an_point_mod"), len(frame0) - 1)
    workload = req0.workload(frame0.iloc[idx])
    modules = resources.module_frame(v.spec_json, hw0.model_dump_json(), workload.model_dump_json(), v.pkey)
    stages = list(modules["stage"].unique())
    chosen = st.multiselect("Stages", stages, default=stages, key="an_mod_stages")
    shown = modules[modules["stage"].isin(chosen)]
    st.dataframe(in_units(shown, module_units(shown.columns)), hide_index=True, width="stretch", height=420)
    if "predicted_s" in modules:  # the export names the profile on every row, as the sweep export does
        modules = modules.assign(**_profile_columns(v))
    st.download_button("Per-module table (CSV, SI units)", modules.to_csv(index=False), "modules.csv", "text/csv",
                       key="an_dl_modules")
    st.caption(v.pred_note)


def _ms(seconds) -> float:
    return np.nan if seconds is None else float(seconds) * 1e3


def capacity_rows(v: View, idx: int, ttft_target_ms: float, tpot_target_ms: float) -> pd.DataFrame:
    """What a GPU needs to meet the targets: one row per configuration and target, one time column (on the
    configuration's own hardware, named in its own column); with a prediction, the predicted time and whether it
    meets the target beside the bound."""
    rows = []
    for (req, hw), frame in zip(v.configs, v.frames):
        w = req.workload(frame.iloc[min(idx, len(frame) - 1)])
        need = resources.required_of(v.spec_json, hw.model_dump_json(), w.model_dump_json(),
                                     ttft_target_ms / 1e3 or None, tpot_target_ms / 1e3 or None)
        cap = resources.capacity_of(v.spec_json, hw.model_dump_json(), w.model_dump_json(), v.pkey)
        for target, d in need.items():
            row = {"configuration": req.label, "hardware": hw.name, "target": target.upper(),
                   "target (ms)": d["target_s"] * 1e3, "time (ms)": _ms(d.get("reference_time_s")),
                   "meets": d.get("meets")}
            if f"predicted_{target}_s" in cap:
                p = cap[f"predicted_{target}_s"]
                row |= {"predicted (ms)": _ms(p), "meets (predicted)": bool(p <= d["target_s"])}
            rows.append(row | {"min TFLOP/s": d["min_tflops"], "min TB/s": d["min_tbs"],
                               "same-balance GPU TFLOP/s": d.get("scaled_tflops"),
                               "same-balance GPU TB/s": d.get("scaled_tbs")})
    out = pd.DataFrame(rows)
    for c in out.columns:
        if out[c].dtype.kind == "f":
            out[c] = _sig(out[c])
    return out


def _capacity(v: View) -> None:
    idx = v.point_slider("an_point_cap")
    t1, t2 = st.columns(2)
    ttft_target = t1.number_input("TTFT target (ms)", min_value=0.0, value=500.0, step=50.0, key="an_ttft")
    tpot_target = t2.number_input("TPOT target (ms)", min_value=0.0, value=10.0, step=1.0, key="an_tpot")
    for (req, hw), frame in zip(v.configs, v.frames):
        w = req.workload(frame.iloc[min(idx, len(frame) - 1)])
        cap = resources.capacity_of(v.spec_json, hw.model_dump_json(), w.model_dump_json(), v.pkey)
        st.markdown(f"**{req.label}** on {hw.name}")
        m = st.columns(6)
        m[0].metric("TTFT", f"{cap['ttft_s'] * 1e3:,.1f} ms")
        m[1].metric("TPOT", f"{cap['tpot_s'] * 1e3:,.2f} ms")
        m[2].metric("Request", f"{cap['request_s']:,.2f} s")
        m[3].metric("Pages / day", f"{cap['pages_per_day']:,.0f}")
        m[4].metric("Memory", f"{cap['memory_bytes'] / 1e9:,.1f} GB")
        m[5].metric("Fits", "yes" if cap["fits"] else "no")
        if "predicted_ttft_s" in cap:  # the time model beside the bounds
            m = st.columns(6)
            m[0].metric("Predicted TTFT", f"{cap['predicted_ttft_s'] * 1e3:,.1f} ms")
            m[1].metric("Predicted TPOT", f"{cap['predicted_tpot_s'] * 1e3:,.2f} ms")
            m[2].metric("Predicted request", f"{cap['predicted_request_s']:,.2f} s")
            m[3].metric("Predicted pages / day", f"{cap['predicted_pages_per_day']:,.0f}")
    st.caption("TTFT, TPOT, request and pages/day above: roofline bounds on each configuration's hardware."
               + (" Predicted: the time model of the chosen profile, for the profile's device." if v.pkey else "")
               + f" {MEMORY_SCOPE[0].upper()}{MEMORY_SCOPE[1:]}.")
    st.caption(v.pred_note)
    if ttft_target > 0 or tpot_target > 0:
        st.markdown("**What a GPU needs to meet the targets**")
        st.dataframe(capacity_rows(v, idx, ttft_target, tpot_target), hide_index=True, width="stretch",
                     column_config={"configuration": st.column_config.TextColumn("configuration", width="large"),
                                    "hardware": st.column_config.TextColumn("hardware", width="medium")})
        st.caption("time: the configuration on its own hardware. min TFLOP/s and min TB/s are floors (each alone "
                   "with the other unlimited); the same-balance GPU scales the configuration's hardware until it "
                   "meets the target.")


PROFILE_COLUMNS = ("predicted.profile", "predicted.derived", "predicted.device_kind", "predicted.session_mode",
                   "predicted.engine", "predicted.routing", "predicted.clocks")


def _profile_columns(v: View) -> dict:
    """The columns naming the profile behind the sweep's predictions (the same on every row of the sweep)."""
    f = v.frames[0]
    return {c: f[c].iloc[0] for c in PROFILE_COLUMNS if c in f and len(f)}


def _profile_label(v: View) -> str:
    return str(_profile_columns(v).get("predicted.profile", "none"))


def _shapes(v: View) -> None:
    s1, s2 = st.columns([3, 1])
    lo_c, hi_c = s1.slider("Crop counts", 1, 1000, (1, 30), key="an_shapes_range")
    vendor_only = s2.checkbox("Vendor HF range only (2..9)", key="an_shapes_vendor")
    try:
        shapes = resources.image_shapes(lo_c, hi_c, vendor_only)
        st.dataframe(shapes, hide_index=True, width="stretch", height=420)
        st.caption("Gundam mode: for each crop count the most-square grid, the page size that tiles to it "
                   "exactly, the image slots and the prompt length with the 10-token grounding prompt.")
    except SpecError as exc:
        st.error(str(exc))


def _download(v: View) -> None:
    export = an.export_frame(v.frames, v.spec_label)
    d1, d2 = st.columns(2)
    d1.download_button("Sweep (CSV)", export.to_csv(index=False), "analytic_sweep.csv", "text/csv",
                       key="an_dl_csv")
    d2.download_button("Sweep (JSON)", export.to_json(orient="records"), "analytic_sweep.json",
                       "application/json", key="an_dl_json")
    st.caption("Every column in SI base units (FLOPs, bytes, seconds), as downloaded."
               + (f" Predicted columns (`<stage>.predicted_*`, `capacity.predicted_*`) come from "
                  f"{md(_profile_label(v))}; `predicted.profile`, `predicted.derived` and `predicted.device_kind` "
                  "name it on every row." if v.pkey else ""))
    if not v.pkey:
        st.caption(v.pred_note)
    st.dataframe(export, hide_index=True, width="stretch", height=300)
