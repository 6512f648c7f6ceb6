"""MFU: per-stage MFU and MBU of a measured run against the datasheet and the calibrated peaks, the measured
points on the roofline, and each stage's measured time beside its predicted time (with a calibration profile
chosen in the sidebar, in the run's own session mode) and its time at the limit."""
import pandas as pd
import streamlit as st

import ui
from dsocr_core.results.analytic_join import FLAG_NOTE, summarize, summary_frame
from ui import charts, prediction, resources, routing_choice
from ui import measured as ms
from ui.runs import run_caption, run_session_mode, run_title, show_order_check

settings = ui.page_setup()
st.title("MFU and MBU")
st.caption("MFU = analytic FLOPs / (peak FLOP/s x measured time); MBU = analytic bytes / (bandwidth x measured "
           "time). Against the GPU's datasheet ceilings and the ceilings calibrated in the same run.")
handle = resources.run_store()
store = handle.store
runs = [r for r in store.list_runs() if r["kind"] in ("reference", "sweep") and r["n_done"]]
if not runs:
    st.info(f"No measured run with finished points in the store (and no bundled reference run in "
            f"`{handle.reference_dir}`). Start a sweep on the Measured sweep page or import a run.")
    st.stop()
runs.sort(key=lambda r: (not ms.is_gpu_run(r), r["kind"] != "reference"))  # GPU reference runs first
by_id = {r["id"]: r for r in runs}
c1, c2 = st.container(), st.container()  # the run's title (about 150 characters) needs the full width
run_id = c1.selectbox("Run", list(by_id), format_func=lambda i: run_title(by_id[i]), key="mfu_run")
run = by_id[run_id]
ds, cal = ms.run_ceilings(run)
use_sidebar = c2.toggle(f"Use the sidebar's ceilings ({settings.hardware.name})", value=ds is None and cal is None,
                        key="mfu_sidebar",
                        help="Replaces the run's own ceilings: the sidebar hardware as the datasheet (or as the "
                             "calibrated ceilings when it was calibrated).")
if use_sidebar:
    ds, cal = (None, settings.hardware) if settings.hardware.calibrated else (settings.hardware, cal)
    if not ms.is_gpu_run(run):
        st.warning(f"This run was measured on the CPU; its MFU against {settings.hardware.name} is only a "
                   "demonstration of the method.")
st.caption(run_caption(run))
show_order_check(run)
if ds is None and cal is None:
    st.warning("This run has no GPU ceilings (no datasheet preset matches its device and it stored no "
               "calibration): turn on the sidebar's ceilings to compute MFU and MBU against them.")
    st.stop()
st.caption(" · ".join(f"{name}: {hw.name}, {hw.peak_tflops:,.1f} TFLOP/s, {hw.bandwidth_tbs:,.3g} TB/s"
                      for name, hw in (("datasheet", ds), ("calibrated", cal)) if hw is not None))

pts = store.points(run_id)
cmp = resources.comparison(str(store.path), run_id, resources.run_version(run, pts), resources.to_json(ds),
                           resources.to_json(cal), prediction.key(settings, run_session_mode(run)))
choices = ms.point_choices(cmp)
MEDIAN = "median over all points"
point = st.selectbox("Point", [MEDIAN, *choices], format_func=lambda p: choices.get(p, p), key="mfu_point")
point = None if point == MEDIAN else point

mfu = ms.mfu_long(cmp, point)
if mfu.empty:
    st.info("No finished point to compare.")
    st.stop()
st.altair_chart(charts.bars(mfu, "stage", "value", "metric", "share", "utilisation", column="peak"), width="stretch")

left, right = st.columns(2)
with left:
    roof_pts = ms.roofline_points(cmp, point)
    hws = [hw for hw in (ds, cal) if hw is not None]
    lo = max(min(roof_pts["intensity"].min(), min(h.ridge_intensity for h in hws)) / 10, 1e-2)
    hi = max(roof_pts["intensity"].max(), max(h.ridge_intensity for h in hws)) * 10
    roofs = pd.concat([resources.roof_frame(h.model_dump_json(), lo, hi).assign(
        hardware=f"{h.name} ({'calibrated' if h.calibrated else 'datasheet'})") for h in hws], ignore_index=True)
    st.altair_chart(charts.roofline(roof_pts, roofs, "Measured stages on the roofline"), width="stretch")
    st.caption("x: analytic FLOPs per analytic byte; y: analytic FLOPs per measured second.")
with right:
    limits = ms.limit_long(cmp, point)
    st.altair_chart(charts.bars(limits, "stage", "value", "time", "ms", "time", log_y=True), width="stretch")
    st.caption("Measured time next to the predicted time (with a profile) and the time the stage would take at "
               "the roofline limit; log scale, so the short vision stages stay visible beside decode.")
    st.caption(prediction.note(settings, run_session_mode(run), run=True))
    prediction.show_misses(settings, run_session_mode(run), int(cmp["batch"].max()))

# the summary's medians are the chart's: the same rows (all points, or the chosen one), the same ceilings
st.subheader(f"Analytic vs measured: {ms.md(run['name'])}")
st.dataframe(ms.stages_as_columns(summary_frame(summarize(cmp if point is None else cmp[cmp["point"] == point]))),
             hide_index=True, width="stretch")
st.caption(FLAG_NOTE)
routing_choice.show_run_routing(run, pts)
with st.expander("Every point and stage"):
    table = cmp.assign(session_mode=run.get("session_mode"))  # the export names the mode it was measured in
    st.dataframe(table, hide_index=True, width="stretch", height=320)
    st.download_button("Comparison (CSV)", table.to_csv(index=False), f"mfu_{run_id[:8]}.csv", "text/csv",
                       key="mfu_dl")
