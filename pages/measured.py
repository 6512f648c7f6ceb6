"""Measured sweep: runs from the store (bundled reference runs and local runs) overlaid on the analytic model,
per-point status, a new sweep on the local device (in the sidebar's session mode), import/export, dataset runs."""
import streamlit as st

import ui
from dsocr_core.results.store import RunImportError
from ui import dataset_view, live, resources, runs_tab, sweeps
from ui import measured as ms
from ui.runs import run_title

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

# Only the open tab runs (on_change="rerun"): the New sweep tab loads the model, the others need none.
tabs = st.tabs(["Runs", "New sweep", "Import / export", "Dataset runs"], key="ms_tab", on_change="rerun")

if tabs[0].open:
    with tabs[0]:
        runs_tab.render(store, runs, references, settings)

if tabs[1].open:
    with tabs[1]:
        session = resources.page_session(settings)
        if session is not None:
            if settings.model.synthetic:
                st.info(f"Sweeps measure the **{settings.model.label}** in the {resources.mode_text(session)}; the "
                        "run is stored with that label, its session mode and its flags (synthetic weights, CPU).")
            live.sweep_form(settings, session)
        live.progress_panel("sweep")

if tabs[2].open:
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
            c2.download_button("Run (CSV, one line per point and stage)", store.export_csv(pick),
                               f"run_{pick[:8]}.csv", "text/csv", key="ms_dl_csv")

if tabs[3].open:
    with tabs[3]:
        datasets = [r for r in all_runs if r["kind"] == "dataset"]
        with st.expander("New dataset run: upload your pages (or give a folder) and profile them",
                         expanded=not datasets or sweeps.runner().busy):
            session = resources.page_session(settings)
            if session is not None:
                dataset_view.new_run_form(settings, session)
        live.progress_panel("dataset")
        # read again: a run started by the form above is in the store now, not in the list read before it
        dataset_view.render(store, [r for r in store.list_runs() if r["kind"] == "dataset"], settings)
