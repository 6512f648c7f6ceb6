"""The 'Dataset runs' section of the measured page: runs of kind `dataset` (real pages profiled one by one, with
`python -m dsocr_core profile` or from this page in the sidebar's model and session mode), read through
dsocr_core.results.dataset_stats."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dsocr_core import tiling
from dsocr_core.grounding import samples

from . import charts, resources, scale_out, sweeps
from . import measured as ms
from .runs import run_mode, run_title


@st.cache_data(max_entries=8, show_spinner="Reading the dataset run ...")
def _view(store_path: str, run_id: str, version: str):
    from dsocr_core.results import dataset_stats as stats
    from dsocr_core.results.store import RunStore

    return stats.load_dataset_run(RunStore(store_path), run_id)


def _histogram(latency: pd.DataFrame) -> alt.Chart:
    data = latency.assign(ms=latency["value"] * 1e3)
    return charts.finish(alt.Chart(data).mark_bar().encode(
        x=alt.X("ms:Q", bin=alt.Bin(maxbins=30), title="milliseconds"),
        y=alt.Y("count():Q", title="samples"),
        color=alt.Color("metric:N", legend=None),
        tooltip=["metric", alt.Tooltip("count():Q")],
    ).properties(height=220, width=360).facet(column=alt.Column("metric:N", title=None)).resolve_scale(
        x="independent"))


def new_run_form(settings, session) -> None:
    """Widgets of a new dataset run over pages on this machine (the bundled sample pages by default), in the
    sidebar's model and session mode; starts it in the background on submit."""
    runner = sweeps.runner()
    cpu = settings.model.on_cpu
    with st.form("new_dataset"):
        st.markdown(f"Model: **{settings.model.label}** · dtype {session.dtype} · "
                    f"**{resources.mode_text(session)}**")
        source = st.text_input("Pages: a folder, a list file, a PDF or an image on this machine",
                               str(samples.DEFAULT_DIR), key="ds_source")
        c = st.columns(4)
        modes = list(tiling.MODES)
        mode = c[0].selectbox("Mode", modes, index=modes.index("tiny" if cpu else "gundam"), key="ds_mode")
        n = c[1].number_input("Pages per epoch", 1, 100_000, 2 if cpu else 8, key="ds_pages")
        epochs = c[2].number_input("Epochs", 1, 100, 1, key="ds_epochs")
        max_new = c[3].number_input("Max new tokens", 1, 8192, 8 if cpu else 256, key="ds_tokens")
        name = st.text_input("Run name (optional)", "", key="ds_name")
        scale = scale_out.inputs("ds", cpu)  # None: this process
        submitted = st.form_submit_button("Start dataset run", type="primary", disabled=runner.busy)
    if not submitted:
        return
    from dsocr_core.measure import dataset_run, datasets

    try:
        if runner.busy:
            raise resources.Busy("a measured sweep or dataset run is already running; stop it or wait for it")
        data = datasets.discover(source)
        picked = datasets.sample(data.pages, int(n), int(epochs), seed=0)
        ps = dataset_run.ProfileSettings(mode=mode, max_new_tokens=int(max_new)).validate()
        store = resources.run_store().store
        sampling = {"n": int(n), "epochs": int(epochs), "seed": 0, "order": "random", "samples": len(picked),
                    "started_from": "dashboard"}
        if scale is not None:  # on Ray workers: the run is recorded once they are up (ui/scale_out.py)
            scale_out.start_dataset(scale, settings.model, store, data, picked, ps, sampling, label=settings.model.label,
                                    name=name.strip() or f"dataset {data.source.name} ({mode}, Ray workers)")
            return
        run_id = dataset_run.create_dataset_run(
            store, session, data, ps, sampling,
            name=name.strip() or f"dataset {data.source.name} ({mode}, {session.session_mode} mode)")
        runner.start_dataset(session, store, run_id, picked, ps, name=store.get_run(run_id)["name"],
                             label=settings.model.label)
        st.session_state["ds_started"] = run_id
    except (datasets.DatasetError, ValueError) as exc:
        st.error(f"Cannot start this dataset run: {exc}")
    except resources.Busy as exc:
        st.warning(str(exc))


def render(store, runs: list[dict], settings) -> None:
    if not runs:
        st.info("No dataset runs in the store. Start one above, or record one with `python -m dsocr_core profile "
                "--pages FOLDER --synthetic tiny --device cpu --max-new-tokens 32` (or a checkpoint on a GPU); "
                "it appears here.")
        return
    by_id = {r["id"]: r for r in runs}
    run_id = st.selectbox("Dataset run", list(by_id), format_func=lambda i: run_title(by_id[i]), key="ds_run")
    run = by_id[run_id]
    flags = ms.flag_notes(run)
    st.caption(f"{ms.md(run['label'])}: {', '.join([run_mode(run), *flags])}")
    view = _view(str(store.path), run_id, resources.run_version(run))
    s = view.summary
    c = st.columns(5)
    c[0].metric("Samples", s["samples"])
    c[1].metric("Done / error / oom", f"{s['done']} / {s['error']} / {s['oom']}")
    c[2].metric("Pages / s", "n/a" if s["pages_per_s"] is None else f"{s['pages_per_s']:.3g}")
    c[3].metric("Tokens / page", "n/a" if s["tokens_per_page"] is None else f"{s['tokens_per_page']:.0f}")
    c[4].metric("Output tokens / s", "n/a" if s["output_tokens_per_s"] is None else f"{s['output_tokens_per_s']:.3g}")
    for err in s["errors"][:10]:
        st.caption(f"{ms.md(err['label'])}: {ms.md(err['message'])}")
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
