"""The 'Dataset runs' section of the measured page: runs of kind `dataset` (real pages profiled one by one with
`python -m dsocr_core profile`), read through dsocr_core.results.dataset_stats."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from . import measured as ms
from . import resources


@st.cache_data(max_entries=8, show_spinner="Reading the dataset run ...")
def _view(store_path: str, run_id: str, version: str):
    from dsocr_core.results import dataset_stats as stats
    from dsocr_core.results.store import RunStore

    return stats.load_dataset_run(RunStore(store_path), run_id)


def _histogram(latency: pd.DataFrame) -> alt.Chart:
    data = latency.assign(ms=latency["value"] * 1e3)
    return alt.Chart(data).mark_bar().encode(
        x=alt.X("ms:Q", bin=alt.Bin(maxbins=30), title="milliseconds"),
        y=alt.Y("count():Q", title="samples"),
        color=alt.Color("metric:N", legend=None),
        tooltip=["metric", alt.Tooltip("count():Q")],
    ).properties(height=220, width=360).facet(column=alt.Column("metric:N", title=None)).resolve_scale(x="independent")


def render(store, runs: list[dict], settings) -> None:
    if not runs:
        st.info("No dataset runs in the store. Record one with `python -m dsocr_core profile --pages FOLDER "
                "--synthetic tiny --device cpu --max-new-tokens 32` (or a checkpoint on a GPU); it appears here.")
        return
    by_id = {r["id"]: r for r in runs}
    run_id = st.selectbox("Dataset run", list(by_id), format_func=lambda i: ms.run_title(by_id[i]), key="ds_run")
    run = by_id[run_id]
    flags = ms.flag_notes(run)
    if flags:
        st.caption(f"{run['label']}: {', '.join(flags)}")
    view = _view(str(store.path), run_id, resources.run_version(run))
    s = view.summary
    c = st.columns(5)
    c[0].metric("Samples", s["samples"])
    c[1].metric("Done / error / oom", f"{s['done']} / {s['error']} / {s['oom']}")
    c[2].metric("Pages / s", "n/a" if s["pages_per_s"] is None else f"{s['pages_per_s']:.3g}")
    c[3].metric("Tokens / page", "n/a" if s["tokens_per_page"] is None else f"{s['tokens_per_page']:.0f}")
    c[4].metric("Output tokens / s", "n/a" if s["output_tokens_per_s"] is None else f"{s['output_tokens_per_s']:.3g}")
    for err in s["errors"][:10]:
        st.caption(f"{err['label']}: {err['message']}")
    if not view.latency.empty:
        st.altair_chart(_histogram(view.latency))
    st.markdown("**Per stage, over the done samples (analytic mean beside the measured one)**")
    st.dataframe(view.stages, hide_index=True, width="stretch")
    st.markdown("**Per page**")
    st.dataframe(view.pages.drop(columns=["key", "text"], errors="ignore"), hide_index=True, width="stretch",
                 height=300)
    if not view.operators.empty:
        st.markdown("**Top operators per stage (torch.profiler)**")
        st.dataframe(view.operators, hide_index=True, width="stretch", height=300)
