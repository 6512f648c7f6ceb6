"""The 'new sweep' panel: a form that starts a background sweep, and a fragment that shows its progress and its
points as they finish (re-run every second while the sweep runs)."""
from __future__ import annotations

import streamlit as st

from dsocr_core import tiling
from dsocr_core.measure import sweep as measure

from . import inputs, measured, resources, sweeps


def sweep_form(settings, session) -> None:
    """Widgets of a new sweep; starts it in the background on submit."""
    runner = sweeps.runner()
    cpu = settings.model.on_cpu
    with st.form("new_sweep"):
        mode = resources.mode_text(session)
        st.markdown(f"Model: **{settings.model.label}** · dtype {session.dtype} · {session.attn_impl} attention · "
                    f"**{mode}**")
        c = st.columns(3)
        modes = c[0].multiselect("Modes", list(tiling.MODES), default=["tiny", "small"] if cpu else ["gundam"],
                                 key="ms_modes")
        grids = c[1].text_input("Crop grids (gundam modes)", "1x1, 2x1, 2x2" if not cpu else "1x1, 2x1",
                                key="ms_grids")
        texts = c[2].text_input("Text tokens", "10", key="ms_text")
        c = st.columns(4)
        batches = c[0].text_input("Batch sizes", "1", key="ms_batch")
        steps = c[1].text_input("Decode steps", "8" if cpu else "32", key="ms_steps")
        repeats = c[2].number_input("Repeats", 1, 50, 1 if cpu else 3, key="ms_repeats")
        warmup = c[3].number_input("Warm-up runs", 0, 10, 0 if cpu else 1, key="ms_warmup")
        name = st.text_input("Run name", f"dashboard sweep ({settings.model.label}, {session.session_mode} mode)",
                             key="ms_name")
        submitted = st.form_submit_button("Start sweep", type="primary", disabled=runner.busy)
    if not submitted:
        return
    try:
        if not modes:
            raise inputs.InputError("choose at least one mode")
        workloads = measure.sweep_workloads(
            modes, inputs.pair_list(grids, "crop grids", 1, tiling.MAX_CROPS), inputs.int_list(texts, "text tokens", 1),
            inputs.int_list(batches, "batch sizes", 1, 4096), inputs.int_list(steps, "decode steps", 0, 100_000),
            dtype=session.dtype, attn=session.attn_impl)
        if len(workloads) > 500:
            raise inputs.InputError(f"{len(workloads)} points; at most 500 per sweep from the page")
        runner.start(session, resources.run_store().store, workloads, name=name, label=settings.model.label,
                     repeats=int(repeats), warmup=int(warmup))
        st.session_state["ms_started"] = True
    except (inputs.InputError, ValueError) as exc:
        st.error(f"Cannot start this sweep: {exc}")
    except resources.Busy as exc:
        st.warning(str(exc))


def progress_panel(kind: str = "sweep") -> None:
    """The running (or last) job of this kind ("sweep" | "dataset"): progress bar, stop button, its points from
    the store."""
    runner = sweeps.runner()
    prefix = "ms" if kind == "sweep" else "ds"
    what = "sweep" if kind == "sweep" else "dataset run"

    @st.fragment(run_every=1 if runner.busy else None)
    def panel():
        job = runner.job
        if job is None or job.kind != kind:
            if job is not None and job.running:
                st.caption(f"A {'dataset run' if job.kind == 'dataset' else 'measured sweep'} is running (see its "
                           "tab); one job runs at a time.")
            else:
                st.caption(f"No {what} started from this server yet." if job is None else f"No {what} running.")
            return
        st.progress(job.fraction, text=f"{job.name}: {job.summary()}")
        if job.running:
            st.caption(f"Measuring: {job.current or 'starting ...'} · labelled *{job.label}* · "
                       f"{job.session_mode} session mode")
            if st.button("Stop after the current point" if kind == "sweep" else "Stop after the current page",
                         key=f"{prefix}_stop", type="secondary"):
                runner.stop()
                st.toast("Stopping after the current point; measured points are kept.")
        elif job.error:
            st.error(f"The {what} stopped with an error: {job.error}. Points measured before it are kept.")
        elif job.stopped:
            st.warning("Stopped; every point measured before the stop is in the store.")
        else:
            st.success(f"Finished ({job.session_mode} session mode).")
        if job.run_id:
            st.dataframe(measured.point_table(job.store.points(job.run_id)), hide_index=True, width="stretch")
        if not job.running and st.session_state.get(f"{prefix}_seen_finish") != id(job):
            st.session_state[f"{prefix}_seen_finish"] = id(job)
            st.rerun(scope="app")  # the finished run now shows in the run list

    panel()
