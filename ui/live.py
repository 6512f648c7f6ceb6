"""The 'new sweep' panel: its widgets with the size of the sweep and how long it will take (before it starts), a
button that starts it in the background, and a fragment that shows its progress, its time left and its points as
they finish (re-run every second while the sweep runs)."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from dsocr_core import tiling
from dsocr_core.registry import DEFAULT_MODEL

from . import forms, inputs, measured, resources, scale_out, sweeps

MAX_POINTS = 500  # per sweep started from the page
# Warm-up runs and timed repeats per point, by device. CPU: the first run of a shape pays one-off costs (allocator
# growth, oneDNN primitive creation, thread-pool start), so one untimed warm-up; three repeats give a median that
# one outlier cannot move. CUDA: the first runs also pick cuBLAS/cuDNN kernels (and, in the fast mode, compile and
# capture graphs), so two warm-ups; five cheap repeats give a median robust to two outliers and a p10-p90 spread.
MEASURE_DEFAULTS = {"cpu": {"warmup": 1, "repeats": 3}, "cuda": {"warmup": 2, "repeats": 5}}


def measure_defaults(device: str) -> dict:
    return MEASURE_DEFAULTS["cpu" if device == "cpu" else "cuda"]


def sweep_form(settings, session) -> None:
    """Widgets of a new sweep (redrawn as they change, so the size and time estimate follow them); starts it in
    the background."""
    runner = sweeps.runner()
    cpu = settings.model.on_cpu
    dev = "cpu" if cpu else "cuda"
    defaults = measure_defaults(settings.model.device)
    with st.container(border=True):
        mode = resources.mode_text(session)
        st.markdown(f"Model: **{settings.model.label}** · dtype {session.dtype} · {session.attn_impl} attention · "
                    f"**{mode}**")
        c = st.columns(3)
        family = session.family  # the session's model: its modes (registry)
        modes = c[0].multiselect("Modes", list(family.modes), default=forms.cheap_modes(family, cpu),
                                 key=f"ms_modes{'' if family.name == DEFAULT_MODEL else '_' + family.name}")
        grids = c[1].text_input("Crop grids (tiling modes)", "1x1, 2x1, 2x2" if not cpu else "1x1, 2x1",
                                key="ms_grids")
        texts = c[2].text_input("Text tokens", "10", key="ms_text")
        c = st.columns(4)
        batches = c[0].text_input("Batch sizes", "1", key="ms_batch")
        steps = c[1].text_input("Decode steps", "8" if cpu else "32", key="ms_steps")
        repeats = c[2].number_input("Repeats", 1, 50, defaults["repeats"], key=f"ms_repeats_{dev}",
                                    help="Timed runs per point: the page shows their median and p10-p90 spread.")
        warmup = c[3].number_input("Warm-up runs", 0, 10, defaults["warmup"], key=f"ms_warmup_{dev}",
                                   help="Untimed runs of each point first: they pay the one-off costs (allocator "
                                        "growth, kernel selection) that would otherwise land in the first repeat.")
        name = st.text_input("Run name", f"dashboard sweep ({settings.model.label}, {session.session_mode} mode)",
                             key="ms_name")
        try:
            workloads = _workloads(session, modes, grids, texts, batches, steps)
            problem = None
        except (inputs.InputError, ValueError) as exc:
            workloads, problem = [], str(exc)
        passes = int(warmup) + int(repeats) + 1  # the warm-ups, the timed repeats, the FLOP-counting pass
        weights = _weights(session, workloads, settings.hardware, passes) if workloads else None
        if workloads:
            st.caption(estimate_text(settings, session, workloads, weights, passes, int(warmup), int(repeats)))
        scale = scale_out.inputs("ms", cpu)  # None: this process
        submitted = st.button("Start sweep", type="primary", disabled=runner.busy, key="ms_start")
    if not submitted:
        return
    try:
        if problem:
            raise inputs.InputError(problem)
        start = runner.start if scale is None else scale_out.starter(scale, settings.model)
        job = start(session, resources.run_store().store, workloads, name=name, label=settings.model.label,
                    repeats=int(repeats), warmup=int(warmup), weights=weights)
        st.session_state["ms_started"] = id(job)  # the Runs tab adds this sweep to the chosen runs
    except (inputs.InputError, ValueError) as exc:
        st.error(f"Cannot start this sweep: {exc}")
    except resources.Busy as exc:
        st.warning(str(exc))


def _workloads(session, modes, grids, texts, batches, steps) -> list:
    from dsocr_core.measure import sweep as measure

    if not modes:
        raise inputs.InputError("choose at least one mode")
    workloads = measure.sweep_workloads(
        modes, inputs.pair_list(grids, "crop grids", 1, tiling.MAX_CROPS), inputs.int_list(texts, "text tokens", 1),
        inputs.int_list(batches, "batch sizes", 1, 4096), inputs.int_list(steps, "decode steps", 0, 100_000),
        dtype=session.dtype, attn=session.attn_impl)
    if len(workloads) > MAX_POINTS:
        raise inputs.InputError(f"{len(workloads)} points; at most {MAX_POINTS} per sweep from the page")
    return workloads


def _weights(session, workloads, hardware, passes: int) -> list[float] | None:
    """Each point's analytic time (one pass of the session's model on the sidebar's ceilings) x passes: the
    relative cost the estimate and the ETA scale by. None where the analytic model cannot evaluate them."""
    from dsocr_core.results.analytic_join import workload_stage_totals

    try:
        totals = workload_stage_totals(session.spec, workloads, hardware)
    except Exception:  # noqa: BLE001 - the ETA then counts points instead
        return None
    return [t["total"]["time_s"] * passes for t in totals]


def estimate_text(settings, session, workloads, weights, passes: int, warmup: int, repeats: int) -> str:
    """'N points x P passes ...' and the expected duration: from earlier runs of this model on this device (their
    measured time over the analytic time of their points, applied to the analytic time of the new points), else
    the analytic roofline time as a lower bound (GPU), else a note that the ETA follows the first point."""
    n = len(workloads)
    head = (f"**{n} point{'s' if n != 1 else ''}** x {passes} passes each ({warmup} warm-up, {repeats} timed, "
            "1 FLOP count)")
    ratio, source = history_ratio(settings, session)
    if weights and ratio:
        return f"{head} · estimated **{sweeps.duration(ratio * sum(weights))}** ({source}); the ETA updates as " \
               "points finish."
    if weights and not settings.model.on_cpu:
        return (f"{head} · at least {sweeps.duration(sum(weights))} at the roofline of {settings.hardware.name} "
                "(no earlier run of this model on this device to scale it by); the ETA follows the first point.")
    return f"{head} · no earlier run of this model on this device to estimate from: the ETA follows the first point."


def history_ratio(settings, session) -> tuple[float | None, str]:
    """Measured over analytic time (vision + prefill + decode, on the sidebar's ceilings) of the points of the
    latest stored runs of this model label, dtype and session mode: (ratio, where it comes from)."""
    store = resources.run_store().store
    runs = [r for r in store.list_runs(kind="sweep") if r["n_done"]
            and (r.get("meta") or {}).get("model_label") == settings.model.label and r.get("dtype") == session.dtype
            and (r.get("session_mode") or "reference") == session.session_mode]
    measured = predicted = 0.0
    used = 0
    for run in runs[:3]:
        pts = store.points(run["id"])
        cmp = resources.comparison(str(store.path), run["id"], resources.run_version(run, pts),
                                   resources.to_json(settings.hardware), None)
        if cmp.empty:
            continue
        sel = cmp[cmp["stage"].isin(("vision", "prefill", "decode"))].dropna(subset=["predicted_datasheet_s"])
        measured += float(sel["measured_s"].sum())
        predicted += float(sel["predicted_datasheet_s"].sum())
        used += 1
    if not used or predicted <= 0:
        return None, ""
    return measured / predicted, f"from {used} earlier run{'s' if used > 1 else ''} of this model on this device"


@st.cache_data(max_entries=4, show_spinner=False)
def sweep_points(store_path: str, run_id: str, handled: int):
    """The running sweep's points table, read again only when another point is done (`handled`), not on every
    tick of the progress panel."""
    from dsocr_core.results.store import RunStore

    return measured.point_table(RunStore(store_path).points(run_id))


@st.cache_data(max_entries=4, show_spinner=False)
def recent_pages(store_path: str, run_id: str, handled: int, n: int = 5):
    """The last `n` pages a dataset run measured: label, status (and why, for a failed page), TTFT, TPOT, wall.
    Read again only when the job has handled another page (`handled`), not on every tick of the progress panel."""
    from dsocr_core.results.dataset_stats import page_table
    from dsocr_core.results.store import RunStore

    pages = page_table(RunStore(store_path), run_id, analytic=False).sort_values("updated_at").tail(n).iloc[::-1]
    out = pages[["label", "epoch", "status", "message"]].copy()
    for col, name in (("ttft_s", "TTFT (ms)"), ("tpot_s", "TPOT (ms)"), ("wall_s", "page wall (ms)")):
        out[name] = [measured.sig(float(v) * 1e3, 4) if pd.notna(v) else "" for v in pages[col]]  # 4 digits
    return out


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
                where = "in the sidebar" if job.kind == "calibration" else "see its tab"
                st.caption(f"A {sweeps.KIND_NAMES[job.kind]} is running ({where}); one job runs at a time.")
            else:
                st.caption(f"No {what} started from this server yet." if job is None else f"No {what} running.")
            return
        st.progress(job.fraction, text=f"{measured.md(job.name)}: {job.summary()}")
        scale_out.worker_panel(job)  # per-worker progress of a job on Ray workers
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
        if job.note:
            st.caption(measured.md(job.note))
        if job.run_id and kind == "sweep":
            st.dataframe(sweep_points(str(job.store.path), job.run_id, job.handled), hide_index=True,
                         width="stretch")
        elif job.run_id:
            recent = recent_pages(str(job.store.path), job.run_id, job.handled)
            st.caption(f"The {len(recent)} page(s) measured last, of {job.handled} handled so far (the run has "
                       f"{job.total}); every page is in the run's views below.")
            st.dataframe(recent, hide_index=True, width="stretch")
        if not job.running and st.session_state.get(f"{prefix}_seen_finish") != id(job):
            st.session_state[f"{prefix}_seen_finish"] = id(job)
            st.rerun(scope="app")  # the finished run now shows in the run list

    panel()
