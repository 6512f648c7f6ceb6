"""The Runs tab of the measured page: which stored runs to show, filters that default to what those runs contain,
the measured points (median and p10-p90 spread) over the analytic roofline times and, with a calibration profile
chosen in the sidebar, the predicted time of each run in its own session mode; and each run's point table.

Widget state that must survive the tab or the page being closed (Streamlit forgets the value of a widget that a
script run does not draw) is kept in a shadow entry of the session state and given back when the widget returns.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from dsocr_core.registry import FAMILIES

from . import charts, prediction, resources, sweeps
from . import measured as ms
from .runs import engine_note, run_mode, run_session_mode, run_title, show_order_check

RUNS_KEY = "ms_runs"
FILTERS = ("ms_f_modes", "ms_f_batch", "ms_f_text")


def _kept(key: str) -> str:
    return f"_{key}_kept"


def _prepare(key: str, options: list, default: list, reset: bool = False) -> None:
    """Set the widget's value before it is drawn: its current value (or the one kept from its last drawing)
    limited to `options`, or `default` when `reset` or when nothing of it is left."""
    current = None if reset else st.session_state.get(key, st.session_state.get(_kept(key)))
    valid = [v for v in (current or []) if v in options]
    st.session_state[key] = valid if current is not None and (valid or not current) else \
        [v for v in default if v in options]


def _keep(key: str) -> None:
    st.session_state[_kept(key)] = list(st.session_state.get(key) or [])


def _with_new_sweep(chosen: list[str], by_id: dict) -> list[str]:
    """The chosen runs plus the sweep this browser session started, once it has points (added once, so the user
    can still take it out again)."""
    job = sweeps.runner().job
    if (job is None or job.kind != "sweep" or job.run_id is None or job.run_id not in by_id
            or st.session_state.get("ms_started") != id(job) or st.session_state.get("ms_added") == job.run_id):
        return chosen
    st.session_state["ms_added"] = job.run_id
    return [*chosen, job.run_id] if job.run_id not in chosen else chosen


def filter_defaults(frames: list[pd.DataFrame]) -> dict[str, list]:
    """What each filter shows by default: per run the points of its model's default mode (gundam, dynamic; all its
    modes where it has none), its smallest batch and its shortest text; the union over the chosen runs, so every
    chosen run has points on the chart."""
    modes, batches, texts = set(), set(), set()
    defaults = {f.default_mode for f in FAMILIES.values()}
    for cmp in frames:
        present = set(cmp["mode"])
        modes |= (present & defaults) or present
        batches.add(int(cmp["batch"].min()))
        texts.add(int(cmp["text_tokens"].min()))
    return {"ms_f_modes": sorted(modes), "ms_f_batch": sorted(batches), "ms_f_text": sorted(texts)}


def render(store, runs: list[dict], references: list[dict], settings) -> None:
    if not runs:
        st.info("The store holds no measured runs yet.")
        return
    by_id = {r["id"]: r for r in runs}
    default = [r["id"] for r in references[:1]] or [runs[0]["id"]]
    _prepare(RUNS_KEY, list(by_id), default)
    st.session_state[RUNS_KEY] = _with_new_sweep(st.session_state[RUNS_KEY], by_id)
    chosen = st.multiselect("Runs", list(by_id), format_func=lambda i: run_title(by_id[i]), key=RUNS_KEY)
    _keep(RUNS_KEY)
    frames, notes = [], []
    for run_id in chosen:
        run = by_id[run_id]
        ds, cal = ms.run_ceilings(run)
        pts = store.points(run_id)
        cmp = resources.comparison(str(store.path), run_id, resources.run_version(run, pts),
                                   resources.to_json(ds), resources.to_json(cal),
                                   prediction.key(settings, run_session_mode(run)))
        frames.append((run, cmp, pts))
        if ds is None and cal is None:
            notes.append(f"**{ms.md(run['label'])}** has no GPU ceilings (no matching GPU preset, no calibration): "
                         "measured times are shown without an analytic time prediction.")
    for n in notes:
        st.caption(n)
    _prediction_notes(settings, [by_id[i] for i in chosen],
                      max([int(c["batch"].max()) for _, c, _ in frames if not c.empty], default=1))
    finished = [c for _, c, _ in frames if not c.empty]
    if chosen and not finished:
        st.warning("The chosen runs have no finished points yet.")
    if finished:
        _chart(frames, finished)
    for run, _, pts in frames:
        st.markdown(f"**{ms.md(run['label'])}** ({run_mode(run)}) — {run['n_done']} done, {run['n_oom']} oom, "
                    f"{run['n_error']} error")
        show_order_check(run)
        st.caption(ms.md(engine_note(run)))
        st.dataframe(ms.point_table(pts), hide_index=True, width="stretch", height=260,
                     column_config={"status": st.column_config.TextColumn("status", width="small")})
    if any(not pts.empty for _, _, pts in frames):
        st.caption("Stage times are medians of the timed repeats; p10-p90 is the spread the repeats measured "
                   "(one repeat: none).")


def _prediction_notes(settings, chosen: list[dict], max_batch: int) -> None:
    """Which profile the predicted lines come from, in which mode, where its device is not the run's, and where
    the prediction is known to miss (the reference mode's misses include the fast mode's)."""
    c = settings.profile
    if c is None:
        st.caption(prediction.HOW_TO)
        return
    modes = sorted({run_session_mode(r) for r in chosen})
    st.caption(f"Predicted (solid lines) with **{ms.md(c.label)}**, with each run's own engine "
               f"({', '.join(modes) or 'none chosen'}) and the MoE routing it observed (uniform, assumed, where it "
               "recorded none).")
    if modes:
        prediction.show_misses(settings, "reference" if "reference" in modes else modes[0], max_batch)
    for r in chosen:
        on_cpu = bool(r["flags"]["cpu"])
        if on_cpu != (c.device_kind == "cpu"):
            st.caption(f"**{ms.md(r['label'])}** was measured on {'the CPU' if on_cpu else 'a GPU'}; the profile "
                       f"is of {'a CPU' if c.device_kind == 'cpu' else 'a GPU'}: its prediction is for that device, "
                       "not this run's.")


def _chart(frames, finished: list[pd.DataFrame]) -> None:
    done = pd.concat(finished, ignore_index=True)
    signature = tuple(sorted(r["id"] for r, c, _ in frames if not c.empty))
    reset = st.session_state.get("_ms_f_runs") != signature  # other runs chosen: filters follow them
    st.session_state["_ms_f_runs"] = signature
    defaults = filter_defaults(finished)
    # two rows, so a chip ('gundam') and the x axis ('sequence length (prompt tokens)') are never cut to 'gun…'
    f = st.columns([1.2, 1, 1]) + st.columns([2, 1.3])
    options = {"ms_f_modes": sorted(done["mode"].unique()),
               "ms_f_batch": sorted(int(b) for b in done["batch"].unique()),
               "ms_f_text": sorted(int(t) for t in done["text_tokens"].unique())}
    for key in FILTERS:
        _prepare(key, options[key], defaults[key], reset)
    mode_sel = f[0].multiselect("Modes", options["ms_f_modes"], key="ms_f_modes")
    batch_sel = f[1].multiselect("Batch", options["ms_f_batch"], key="ms_f_batch")
    text_sel = f[2].multiselect("Text tokens", options["ms_f_text"], key="ms_f_text")
    for key in FILTERS:
        _keep(key)
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
        st.info("No finished point matches these filters (the filters above choose modes, batch sizes and text "
                "lengths).")
        return
    st.altair_chart(charts.measured_vs_analytic(measured_df, predicted_df, x, ms.X_CHOICES[x], title="stage time"),
                    width="stretch")
    predicted = "source" in predicted_df and bool((predicted_df["source"] == "predicted").any())
    st.caption("Points: measured medians; vertical bars: their p10-p90 spread over the timed repeats. Lines: the "
               "analytic roofline time with the run GPU's datasheet ceilings (long dashes) and with the ceilings "
               "calibrated in the same run (short dashes), where the run has them"
               + ("; the predicted time (solid)." if predicted else "."))
    flops = pd.concat(flop_parts, ignore_index=True)
    if not flops.empty:
        with st.expander("FLOPs: counted (FlopCounterMode) vs analytic", expanded=False):
            st.altair_chart(charts.lines(flops, x, ms.X_CHOICES[x], "FLOPs", "tensor FLOPs", colour="stage",
                                         log_y=True), width="stretch")
