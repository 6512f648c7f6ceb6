"""Measured sweep: runs from the store (bundled reference runs and local runs) overlaid on the analytic model,
per-point status, a new sweep on the local device (in the sidebar's session mode), import/export, dataset runs."""
import pandas as pd
import streamlit as st

import ui
from dsocr_core.results.store import RunImportError
from ui import charts, dataset_view, live, resources
from ui import measured as ms
from ui.runs import run_mode, run_title

settings = ui.page_setup()
st.title("Measured sweep")
handle = resources.run_store()
store = handle.store
if handle.import_error:
    st.warning(f"Some bundled reference runs could not be imported:\n\n{handle.import_error}")
all_runs = store.list_runs()
runs = [r for r in all_runs if r["kind"] in ("reference", "sweep")]
references = [r for r in runs if r["kind"] == "reference"]
if references:
    st.caption(f"{len(references)} bundled reference run(s) from `{handle.reference_dir.name}/` are in the store "
               f"(`{store.path}`), next to {len(runs) - len(references)} local sweep run(s).")
else:
    st.info(f"No bundled reference runs yet: `{handle.reference_dir}` holds no exported run. Start a sweep below "
            "(on the CPU it measures the synthetic tiny model) or import an exported run.")

tabs = st.tabs(["Runs", "New sweep", "Import / export", "Dataset runs"])

with tabs[0]:
    if not runs:
        st.info("The store holds no measured runs yet.")
    else:
        by_id = {r["id"]: r for r in runs}
        default = [r["id"] for r in references[:1]] or [runs[0]["id"]]
        chosen = st.multiselect("Runs", list(by_id), default=default, format_func=lambda i: run_title(by_id[i]),
                                key="ms_runs")
        frames, notes = [], []
        for run_id in chosen:
            run = by_id[run_id]
            ds, cal = ms.run_ceilings(run)
            pts = store.points(run_id)
            cmp = resources.comparison(str(store.path), run_id, resources.run_version(run, pts),
                                       resources.to_json(ds), resources.to_json(cal))
            frames.append((run, cmp, pts))
            if ds is None and cal is None:
                notes.append(f"**{ms.md(run['label'])}** has no GPU ceilings (no matching GPU preset, no calibration): "
                             "measured times are shown without an analytic time prediction.")
        for n in notes:
            st.caption(n)
        finished = [c for _, c, _ in frames if not c.empty]
        done = pd.concat(finished, ignore_index=True) if finished else pd.DataFrame()
        if chosen and done.empty:
            st.warning("The chosen runs have no finished points yet.")
        if not done.empty:
            f = st.columns([1, 1, 1, 2, 1])
            modes = sorted(done["mode"].unique())
            mode_sel = f[0].multiselect("Modes", modes, default=["gundam"] if "gundam" in modes else modes,
                                        key="ms_f_modes")
            batches = sorted(done["batch"].unique())
            batch_sel = f[1].multiselect("Batch", batches, default=batches[:1], key="ms_f_batch")
            texts = sorted(done["text_tokens"].unique())
            text_sel = f[2].multiselect("Text tokens", texts, default=texts[:1], key="ms_f_text")
            stage_sel = f[3].multiselect("Stages", list(ms.TIME_STAGES), default=["vision", "prefill", "decode"],
                                         key="ms_f_stages")
            x = f[4].selectbox("x axis", list(ms.X_CHOICES), format_func=ms.X_CHOICES.get, key="ms_f_x")
            measured_parts, predicted_parts, flop_parts = [], [], []
            for run, cmp, _ in frames:
                if cmp.empty:
                    continue
                sel = cmp[cmp["mode"].isin(mode_sel) & cmp["batch"].isin(batch_sel) & cmp["text_tokens"].isin(text_sel)]
                m, p = ms.overlay_frames(sel, run["name"] or run["id"][:8], stage_sel, x)
                measured_parts.append(m)
                predicted_parts.append(p)
                flop_parts.append(ms.flop_frame(sel, x).assign(run=run["name"]))
            measured_df = pd.concat(measured_parts, ignore_index=True)
            predicted_df = pd.concat(predicted_parts, ignore_index=True)
            if measured_df.empty:
                st.info("No finished point matches these filters.")
            else:
                st.altair_chart(charts.measured_vs_analytic(measured_df, predicted_df, x, ms.X_CHOICES[x],
                                                            title="stage time"), width="stretch")
                st.caption("Points: measured medians. Dashed lines: the analytic roofline time with the run GPU's "
                           "datasheet ceilings and with the ceilings calibrated in the same run.")
                flops = pd.concat(flop_parts, ignore_index=True)
                if not flops.empty:
                    with st.expander("FLOPs: counted (FlopCounterMode) vs analytic", expanded=False):
                        st.altair_chart(charts.lines(flops, x, ms.X_CHOICES[x], "FLOPs", "tensor FLOPs",
                                                     log_y=True), width="stretch")
        for run, _, pts in frames:
            st.markdown(f"**{ms.md(run['label'])}** ({run_mode(run)}) — {run['n_done']} done, {run['n_oom']} oom, "
                        f"{run['n_error']} error")
            st.dataframe(ms.point_table(pts), hide_index=True, width="stretch", height=260,
                         column_config={"status": st.column_config.TextColumn("status", width="small")})

with tabs[1]:
    session = resources.page_session(settings)
    if session is not None:
        if settings.model.synthetic:
            st.info(f"Sweeps measure the **{settings.model.label}** in the {resources.mode_text(session)}; the run "
                    "is stored with that label, its session mode and its flags (synthetic weights, CPU).")
        live.sweep_form(settings, session)
    live.progress_panel("sweep")

with tabs[2]:
    upload = st.file_uploader("Import an exported run (.json)", type=["json"], key="ms_import")
    if upload is not None:
        try:
            run_id = store.import_bytes(upload.getvalue(), source=upload.name)
            st.success(f"Imported {ms.md(store.get_run(run_id)['label'])}.")
        except RunImportError as exc:
            st.error(ms.md(exc, one_line=False))
    if all_runs:
        by_id = {r["id"]: r for r in all_runs}
        pick = st.selectbox("Export a run", list(by_id), format_func=lambda i: run_title(by_id[i]),
                            key="ms_export")
        c1, c2 = st.columns(2)
        c1.download_button("Run (JSON, importable)", store.export_json(pick), f"run_{pick[:8]}.json",
                           "application/json", key="ms_dl_json")
        c2.download_button("Run (CSV, one line per point and stage)", store.export_csv(pick), f"run_{pick[:8]}.csv",
                           "text/csv", key="ms_dl_csv")

with tabs[3]:
    with st.expander("New dataset run", expanded=False):
        session = resources.page_session(settings)
        if session is not None:
            dataset_view.new_run_form(settings, session)
        live.progress_panel("dataset")
    dataset_view.render(store, [r for r in all_runs if r["kind"] == "dataset"], settings)
