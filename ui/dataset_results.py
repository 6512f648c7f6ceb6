"""The views of one dataset run (only the open one is drawn): each page's stage times against its crop grid or
prompt length with the analytic bound and the predicted time through them, the distribution per stage, the
slowest pages with their thumbnails, the operator breakdown (readable names, the Chrome trace to download), two
runs side by side on the same pages, and the tables. The frames come from dsocr_core.results.page_costs."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from dsocr_core.registry import LM_STAGES, get_family, vision_stage_names
from dsocr_core.results.runs import run_model
from dsocr_core.results import page_costs as pc

from . import dataset_charts as charts
from . import measured as ms
from . import resources
from .runs import run_title

VIEWS = ["Per page", "Distribution", "Slowest pages", "Operators", "Compare runs", "Tables"]
MODEL_STAGES = (*vision_stage_names(), *LM_STAGES)  # every family's (registry)
SLOW_METRICS = {"wall_s": "page wall time", "ttft_s": "TTFT", "decode_s": "LM decode", "tpot_s": "TPOT",
                "prefill_s": "LM prefill", "sam_s": "SAM"}


def render(store, view, runs: list[dict], hardware, pkey: str | None) -> None:
    if view.pages.empty or not (view.pages["status"] == "done").any():
        st.info("No page of this run has finished yet.")
        return
    tabs = st.tabs(VIEWS, key="ds_view", on_change="rerun")
    if tabs[0].open:
        with tabs[0]:
            per_page(view)
    if tabs[1].open:
        with tabs[1]:
            distribution(view)
    if tabs[2].open:
        with tabs[2]:
            slowest(view)
    if tabs[3].open:
        with tabs[3]:
            operators(view)
    if tabs[4].open:
        with tabs[4]:
            compare(store, view, runs, hardware, pkey)
    if tabs[5].open:
        with tabs[5]:
            tables(view)


def per_page(view) -> None:
    long = pc.page_stage_long(view.pages)
    if long.empty:
        st.info("No stage time was recorded for the finished pages.")
        return
    # crop tiles by default where the pages differ in them, else the prompt length (a run without tiles)
    varies = long["crop_count"].nunique() > 1
    x = st.radio("Against", list(pc.X_AXES), format_func=pc.X_AXES.get, horizontal=True, index=0 if varies else 1,
                 key="ds_x")
    st.altair_chart(charts.page_stages(long, x))
    defects = pc.bound_defects(long)
    if len(defects):
        where = ", ".join(f"{r.stage} {r.n} of {r.of} (down to {r.lowest:.2g}x its bound)"
                          for r in defects.itertuples())
        st.error(f"**The analytic bound lies above measured points** (red rings): {where}. A lower bound can "
                 "never exceed a measurement, so the bound is wrong there: its ceilings are below what this device "
                 "reaches in the run's dtype, or the model over-counts the stage's work.")
    has_pred = long["predicted_s"].notna().any()
    st.caption("Points: each page's measured time (every epoch). Dashed: the analytic bound (roofline) of the same "
               "page workloads" + (", solid: the predicted time" if has_pred else "") + ", their mean at each x. "
               "TTFT = SAM + CLIP + projector + LM prefill; TPOT = the page's median decode step.")


def distribution(view) -> None:
    spread = pc.stage_spread(view.pages)
    st.altair_chart(charts.spread(spread))
    st.caption("Per stage over the done samples: bar p10-p90, tick the median, whisker min-max (log scale).")
    if not view.latency.empty:
        st.altair_chart(charts.latency_histogram(view.latency))
    table = spread.drop(columns=["metric"]).copy()
    for c in ("min", "p10", "median", "mean", "p90", "max", "std"):
        table[c] = table[c] * 1e3
    st.dataframe(table.rename(columns={c: f"{c} (ms)" for c in ("min", "p10", "median", "mean", "p90", "max",
                                                                   "std")}), hide_index=True, width="stretch")


@st.cache_data(max_entries=64, show_spinner=False)
def _thumbnail(path: str, pdf_page: int | None, mtime: float):
    resources.torch_ready()  # datasets imports torch: by the warm-up thread first (resources.warm_up)
    from dsocr_core.measure.datasets import Page, thumbnail

    return thumbnail(Page(Path(path), Path(path).name, pdf_page))


def slowest(view) -> None:
    metric = st.selectbox("Slowest by", list(SLOW_METRICS), format_func=SLOW_METRICS.get, key="ds_slow_by")
    top = pc.slowest_pages(view.pages, metric, n=6)
    if top.empty:
        st.info("No finished page has this time.")
        return
    cols = st.columns(3)
    for i, row in top.iterrows():
        with cols[i % 3]:
            source = row.get("source")
            pdf_page = None if pd.isna(row.get("pdf_page")) else int(row["pdf_page"])
            try:
                path = Path(str(source))
                st.image(_thumbnail(str(path), pdf_page, path.stat().st_mtime), width=220)
            except Exception:  # noqa: BLE001 - the file is gone or was measured on another machine
                st.caption("(page file not available on this machine)")
            grid = row.get("grid") or "-"
            st.markdown(f"**{i + 1}. {ms.md(row['label'])}**")
            st.caption(f"{SLOW_METRICS[metric]} **{row[metric] * 1e3:,.1f} ms** · grid {grid} · "
                       f"{row.get('prompt_tokens')} prompt tokens · {row['epochs']} epoch(s)")


def operators(view) -> None:
    if view.operators.empty:
        st.info("This run has no operator breakdown. Tick 'Operator breakdown' when starting a run here, or run "
                "`python -m dsocr_core profile ... --trace`.")
        return
    breakdown = pc.operator_breakdown(view.operators, top=10)
    present = list(dict.fromkeys(breakdown["stage"]))
    stages = [s for s in MODEL_STAGES if s in present] + [s for s in present if s not in MODEL_STAGES]
    c = st.columns(2)
    stage = c[0].selectbox("Stage", stages, key="ds_op_stage", help="Model stages first; 'preprocess' is loading "
                           "and preparing the page, 'outside' the work between the stages (token choice).")
    devices = sorted(set(breakdown.loc[breakdown["stage"] == stage, "device"]))
    device = c[1].selectbox("Device", devices, key="ds_op_device") if len(devices) > 1 else devices[0]
    part = breakdown[(breakdown["stage"] == stage) & (breakdown["device"] == device)]
    st.altair_chart(charts.operators(part))
    st.caption("Operator (and, on CUDA, kernel) names shortened; hover a bar for the full name. Self time summed "
               "over the traced pages.")
    st.dataframe(part.drop(columns=["stage", "device"]), hide_index=True, width="stretch",
                 column_config={"short": "operator", "operator": "full name", "self_ms": "self (ms)"})
    if not view.operator_stages.empty:
        st.markdown("**Time per stage in the traced pages**")
        st.dataframe(operator_stage_table(view.operator_stages), hide_index=True, width="stretch")
    trace = view.files.get("trace")
    if trace and Path(trace).is_file():
        st.download_button("Chrome trace (JSON; open in ui.perfetto.dev or chrome://tracing)",
                           lambda: Path(trace).read_bytes(), f"trace_{view.run['id'][:8]}.json", "application/json",
                           key="ds_trace_dl", on_click="ignore")
    elif trace:
        st.caption(f"The Chrome trace was written to {ms.md(trace)}, which is not on this machine.")


def stage_table(stages: pd.DataFrame) -> pd.DataFrame:
    """dataset_stats.stage_summary as shown: times in ms and FLOPs in GFLOP (the units of the charts beside it),
    4 significant digits, an empty cell where there is no analytic value, the internal metric names dropped."""
    scale = {"s": (1e3, "ms"), "FLOP": (1e-9, "GFLOP")}
    rows = []
    for r in stages.to_dict("records"):
        factor, unit = scale.get(r["unit"], (1.0, r["unit"]))
        row = {"stage": r["stage"], "unit": unit, "samples": int(r["n"])}
        for col, name in (("mean", "mean"), ("median", "median"), ("p90", "p90"), ("min", "min"), ("max", "max"),
                          ("analytic_mean", "analytic mean")):
            row[name] = _num(r[col] * factor)
        row["measured / analytic"] = _num(r["measured_over_analytic"])
        rows.append(row)
    return pd.DataFrame(rows)


def _num(value) -> str:
    return "" if value is None or pd.isna(value) else ms.sig(float(value), 4)


def operator_stage_table(stages: pd.DataFrame) -> pd.DataFrame:
    """operators' stage totals as shown: ms like the operator table beside it, the share in percent."""
    return pd.DataFrame({
        "stage": stages["stage"], "device": stages["device"], "ranges": stages["ranges"],
        "wall time in the stage's ranges (ms)": [_num(v / 1e3) for v in stages["range_us"]],
        "operators' self time (ms)": [_num(v / 1e3) for v in stages["total_us"]],
        "share of the device's self time": ["" if pd.isna(v) else f"{v:.1%}" for v in stages["share_of_total"]]})


def compare(store, view, runs: list[dict], hardware, pkey: str | None) -> None:
    from .dataset_view import load_view

    others = {r["id"]: r for r in runs if r["id"] != view.run["id"]}
    if not others:
        st.info("Record a second dataset run over the same pages (another session mode, another GPU, the other "
                "model) to compare.")
        return
    other_id = st.selectbox("Compare with", list(others), format_func=lambda i: run_title(others[i]),
                            key="ds_compare")
    other = load_view(store, others[other_id], hardware, pkey)
    cmp = pc.compare_runs(view.pages, other.pages)
    names = (f"A: {view.run['name'][:40]} ({view.run['id'][:6]})",
             f"B: {others[other_id]['name'][:40]} ({other_id[:6]})")
    if not cmp.shared:
        st.warning("These two runs share no page (compared by file, then by page name).")
        return
    models = [get_family(run_model(r)).label for r in (view.run, others[other_id])]
    st.caption(f"{cmp.shared} shared page(s) (matched by {'file' if cmp.joined_on == 'file' else 'page name'}); "
               f"{cmp.only_a} only in A, {cmp.only_b} only in B. Per page: the mean over its epochs."
               + (f" A runs {models[0]}, B {models[1]}: each tiles the pages its own way, and a stage only one "
                  "of them has (CLIP, the encoder) shows that run's median alone." if models[0] != models[1] else ""))
    st.altair_chart(charts.compare_stages(cmp.stages, names))
    st.altair_chart(charts.compare_pages(cmp.pages, names))
    table = cmp.stages.assign(median_a=cmp.stages["median_a"] * 1e3, median_b=cmp.stages["median_b"] * 1e3)
    st.dataframe(table.drop(columns=["metric"]).rename(columns={"median_a": "A median (ms)",
                                                               "median_b": "B median (ms)", "b_over_a": "B / A"}),
                 hide_index=True, width="stretch")


def page_numbers(pages: pd.DataFrame) -> pd.DataFrame:
    """The PDF page counted from 1, as the labels count it ('three_pages.pdf p1' beside a pdf_page of 0 read as
    two pages); the CSV keeps the store's 0-based pdf_page."""
    if "pdf_page" not in pages:
        return pages
    out = pages.copy()
    out["pdf_page"] = pd.to_numeric(out["pdf_page"], errors="coerce").add(1).astype("Int64")
    return out.rename(columns={"pdf_page": "PDF page"})


def tables(view) -> None:
    st.markdown("**Per page**")
    shown = view.pages.drop(columns=["key", "text", "source"], errors="ignore")
    st.dataframe(page_numbers(shown), hide_index=True, width="stretch", height=300)
    st.download_button("Per-page table (CSV)", shown.to_csv(index=False), f"pages_{view.run['id'][:8]}.csv",
                       "text/csv", key="ds_pages_csv", on_click="ignore")
