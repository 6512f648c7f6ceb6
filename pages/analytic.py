"""Analytic sweep: FLOPs, bytes, memory and roofline time per stage over a sweep, two configurations compared,
roofline chart, per-module table, image-shapes database, capacity planning, downloads."""
import dataclasses

import pandas as pd
import pydantic
import streamlit as st

import ui
from dsocr_core.spec import SpecError
from ui import analytic as an
from ui import charts, forms, inputs, resources

settings = ui.page_setup()
st.title("Analytic sweep")
st.caption("Closed-form cost of every stage on the chosen hardware's roofline (time = sum over modules of "
           "max(FLOPs / peak, bytes / bandwidth)). Nothing here runs the model.")

specs = {resources.OFFICIAL: "official DeepSeek-OCR (3.3B)", resources.TINY: "synthetic tiny model's dimensions"}
if settings.model.source == "checkpoint" and not settings.model_error:
    specs = {"checkpoint": "the sidebar checkpoint's config.json", **specs}
top = st.columns([1, 2])
spec_kind = top[0].selectbox("Model dimensions", list(specs), format_func=specs.get, key="an_spec")

problems: list[str] = []  # typing mistakes: every widget is drawn first, then the mistakes are shown
try:
    spec = resources.spec_from(spec_kind, settings.model.checkpoint)
    with top[1]:
        axis = forms.axis_choice()
    values = forms.axis_values(axis, problems)
    col_a, col_b = st.columns(2)
    with col_a.container(border=True):
        st.markdown("**Configuration A**")
        req_a, hw_a, raw_a = forms.config("an_a", axis, values, "A", settings.hardware, problems)
    with col_b.container(border=True):
        compare = st.toggle("**Configuration B** (compare)", value=True, key="an_compare")
        if compare:
            req_b, hw_b, raw_b = forms.config("an_b", axis, values, "B", settings.hardware, problems,
                                              defaults={"attn": "eager"})
        else:
            st.caption("Turn on to overlay or place side by side a second configuration (eager vs flash, "
                       "H100 vs H200, batch 1 vs 32, ...).")
    if problems:
        raise inputs.InputError("; ".join(problems))
    if compare:
        label_a, label_b = an.config_labels(raw_a, raw_b)
        req_a, req_b = dataclasses.replace(req_a, label=label_a), dataclasses.replace(req_b, label=label_b)
        configs = [(req_a, hw_a), (req_b, hw_b)]
    else:
        configs = [(req_a, hw_a)]
    spec_json = spec.model_dump_json()
    frames = [resources.sweep_frame(spec_json, hw.model_dump_json(), req.to_json()) for req, hw in configs]
except (inputs.InputError, SpecError, pydantic.ValidationError, ValueError) as exc:
    st.error(f"Cannot evaluate these settings: {exc}")
    st.stop()

c1, c2, c3 = st.columns(3)
x_kind = "crop_count"
if axis in ("crops", "image"):
    x_kind = c1.radio("x axis", ["crop_count", "sequence"], format_func=an.X_FIELDS.get, key="an_x")
x = an.x_field(axis, x_kind)
log_y = c2.checkbox("Log y axis", value=True, key="an_logy")
side = c3.radio("Two configurations", ["overlaid", "side by side"], horizontal=True, key="an_layout",
                disabled=len(configs) == 1) == "side by side"
x_title = an.X_FIELDS[x]
both = pd.concat(frames, ignore_index=True)

tabs = st.tabs(["FLOPs", "Bytes", "Memory", "Time", "Roofline", "Per module", "Capacity", "Image shapes",
                "Download"])
with tabs[0]:
    st.altair_chart(charts.lines(an.stage_long(both, "flops", x), x, x_title, "FLOPs", "FLOPs per stage",
                                 log_y=log_y, side_by_side=side), width="stretch")
    st.caption("Decode is summed over all decode steps; vision stages over the global view and every tile.")
with tabs[1]:
    st.altair_chart(charts.lines(an.stage_long(both, "bytes", x), x, x_title, "bytes", "DRAM traffic per stage",
                                 log_y=log_y, side_by_side=side), width="stretch")
    st.altair_chart(charts.lines(an.component_long(both, an.TRAFFIC, x), x, x_title, "bytes",
                                 "traffic of the whole request by kind", colour="component", log_y=log_y,
                                 side_by_side=side), width="stretch")
with tabs[2]:
    st.altair_chart(charts.lines(an.component_long(both, an.MEMORY, x), x, x_title, "GB",
                                 "resident memory at the peak", colour="component", log_y=log_y,
                                 side_by_side=side), width="stretch")
    st.caption("Weights of all stages, the KV cache after the last decode step, and the largest live "
               "activation set of any one module.")
with tabs[3]:
    st.altair_chart(charts.lines(an.stage_long(both, "time_s", x), x, x_title, "ms", "roofline time per stage",
                                 log_y=log_y, side_by_side=side), width="stretch")
    st.caption("Each module at its own bound: max(FLOPs / peak, bytes / bandwidth), summed per stage.")

point_labels = [f"{x_title.split(' (')[0]} = {v}" + (f" ({g})" if axis in ("crops", "image") else "")
                for v, g in zip(frames[0][x], frames[0]["grid"])]
with tabs[4]:
    idx = st.select_slider("Sweep point", options=list(range(len(frames[0]))), format_func=point_labels.__getitem__,
                           key="an_point_roof", value=min(len(frames[0]) - 1, len(frames[0]) // 2))
    pts = pd.concat([an.stage_points(f, min(idx, len(f) - 1)) for f in frames], ignore_index=True)
    hws = list({hw.name: hw for _, hw in configs}.values())
    lo = max(min(pts["intensity"].min(), min(h.ridge_intensity for h in hws)) / 10, 1e-2)
    hi = max(pts["intensity"].max(), max(h.ridge_intensity for h in hws)) * 10
    roofs = pd.concat([resources.roof_frame(h.model_dump_json(), lo, hi) for h in hws], ignore_index=True)
    st.altair_chart(charts.roofline(pts, roofs, "Stages on the roofline"), width="stretch")
    st.dataframe(pts, hide_index=True, width="stretch")
    st.caption("A stage's FLOP/s is its FLOPs over its modelled time; below the roof where its modules are "
               "bound differently (each module is timed at its own bound).")
with tabs[5]:
    sel = st.selectbox("Configuration", [r.label for r, _ in configs], key="an_mod_config")
    req0, hw0 = next((r, h) for r, h in configs if r.label == sel)
    frame0 = frames[[r.label for r, _ in configs].index(sel)]
    idx_m = st.select_slider("Sweep point", options=list(range(len(frame0))), key="an_point_mod",
                             format_func=point_labels.__getitem__, value=min(len(frame0) - 1, len(frame0) // 2))
    workload = req0.workload(frame0.iloc[idx_m])
    modules = resources.module_frame(spec_json, hw0.model_dump_json(), workload.model_dump_json())
    stages = st.multiselect("Stages", list(modules["stage"].unique()), default=list(modules["stage"].unique()),
                            key="an_mod_stages")
    st.dataframe(modules[modules["stage"].isin(stages)], hide_index=True, width="stretch", height=420)
    st.download_button("Per-module table (CSV)", modules.to_csv(index=False), "modules.csv", "text/csv",
                       key="an_dl_modules")
with tabs[6]:
    idx_c = st.select_slider("Sweep point", options=list(range(len(frames[0]))), key="an_point_cap",
                             format_func=point_labels.__getitem__, value=min(len(frames[0]) - 1, len(frames[0]) // 2))
    t1, t2 = st.columns(2)
    ttft_target = t1.number_input("TTFT target (s)", min_value=0.0, value=0.5, step=0.1, key="an_ttft")
    tpot_target = t2.number_input("TPOT target (ms)", min_value=0.0, value=10.0, step=1.0, key="an_tpot")
    rows = []
    for (req, hw), frame in zip(configs, frames):
        w = req.workload(frame.iloc[min(idx_c, len(frame) - 1)])
        cap = resources.capacity_of(spec_json, hw.model_dump_json(), w.model_dump_json())
        st.markdown(f"**{req.label}** on {hw.name}")
        m = st.columns(6)
        m[0].metric("TTFT", f"{cap['ttft_s'] * 1e3:,.1f} ms")
        m[1].metric("TPOT", f"{cap['tpot_s'] * 1e3:,.2f} ms")
        m[2].metric("Request", f"{cap['request_s']:,.2f} s")
        m[3].metric("Pages / day", f"{cap['pages_per_day']:,.0f}")
        m[4].metric("Memory", f"{cap['memory_bytes'] / 1e9:,.1f} GB")
        m[5].metric("Fits", "yes" if cap["fits"] else "no")
        if ttft_target > 0 or tpot_target > 0:
            need = resources.required_of(spec_json, hw.model_dump_json(), w.model_dump_json(),
                                         ttft_target or None, tpot_target / 1e3 or None)
            for target, d in need.items():
                rows.append({"configuration": req.label, "target": target, "target_s": d["target_s"],
                             f"time on {hw.name} (s)": d.get("reference_time_s"), "meets": d.get("meets"),
                             "min TFLOP/s": d["min_tflops"], "min TB/s": d["min_tbs"],
                             "same-balance GPU TFLOP/s": d.get("scaled_tflops"),
                             "same-balance GPU TB/s": d.get("scaled_tbs")})
    if rows:
        st.markdown("**What a GPU needs to meet the targets**")
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        st.caption("min TFLOP/s and min TB/s are floors (each alone with the other unlimited); the same-balance "
                   "GPU scales the configuration's hardware until it meets the target.")
with tabs[7]:
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
with tabs[8]:
    export = an.export_frame(frames, specs[spec_kind])
    d1, d2 = st.columns(2)
    d1.download_button("Sweep (CSV)", export.to_csv(index=False), "analytic_sweep.csv", "text/csv",
                       key="an_dl_csv")
    d2.download_button("Sweep (JSON)", export.to_json(orient="records"), "analytic_sweep.json",
                       "application/json", key="an_dl_json")
    st.dataframe(export, hide_index=True, width="stretch", height=300)
