"""The 'Dataset runs' section of the measured page: a new dataset run over the user's uploaded pages (or pages
from a path on this machine) in the sidebar's model, device and session mode, and the stored runs of kind
`dataset` (recorded here or with `python -m dsocr_core profile`), read through dsocr_core.results.dataset_stats
and shown by ui.dataset_results."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dsocr_core import tiling
from dsocr_core.grounding import samples
from dsocr_core.registry import DEFAULT_MODEL

from . import dataset_results, inputs, resources, scale_out, sweeps, uploads_view
from . import measured as ms
from . import prediction as predictions
from .runs import run_caption, run_title, show_order_check

SOURCES = {"uploads": "Uploaded pages", "path": "A folder, list file, PDF or image on this machine"}


@st.cache_data(max_entries=8, show_spinner="Reading the dataset run ...")
def _view(store_path: str, run_id: str, version: str, hw_json: str | None, pkey: str | None):
    """load_dataset_run, cached per run version, roofline ceilings and prediction (`pkey`: ui.prediction.key, the
    profile's path, mtime and session mode; the prediction is built here from it, never hashed)."""
    from dsocr_core.results import dataset_stats as stats
    from dsocr_core.results.store import RunStore
    from dsocr_core.spec import Hardware

    hw = None if hw_json is None else Hardware.model_validate_json(hw_json)
    prediction = None if pkey is None else predictions.attach(hw, pkey)
    return stats.load_dataset_run(RunStore(store_path), run_id, hw, prediction=prediction)


def load_view(store, run: dict, hardware, pkey: str | None = None):
    return _view(str(store.path), run["id"], resources.run_version(run), resources.to_json(hardware), pkey)


# ---------------------------------------------------------------------------------------------- a new run
def new_run_form(settings, session) -> None:
    """Where the pages come from (uploads by default), the run's settings, and a button that starts it in the
    background in the sidebar's model, device and session mode."""
    runner = sweeps.runner()
    cpu = settings.model.on_cpu
    kind = st.radio("Pages", list(SOURCES), format_func=SOURCES.get, horizontal=True, key="ds_source_kind")
    chosen = uploads_view.panel() if kind == "uploads" else None
    with st.form("new_dataset"):
        st.markdown(f"Model: **{settings.model.label}** · device **{settings.model.device}** · dtype {session.dtype} "
                    f"· **{resources.mode_text(session)}** (model, device and session mode: in the sidebar)")
        source = None
        if kind == "path":
            source = st.text_input("Pages: a folder, a list file, a PDF or an image on this machine",
                                   str(samples.DEFAULT_DIR), key="ds_source")
        c = st.columns(4)
        family = session.family  # the session's model: its modes and crop range (registry)
        modes, own = list(family.modes), "" if family.name == DEFAULT_MODEL else f"_{family.name}"
        mode = c[0].selectbox("Mode", modes, index=modes.index(family.default_mode), key=f"ds_mode{own}",
                              help="Untiled modes: one global view; tiling modes add crop tiles within the crop "
                                   "limits.")
        low, high = family.modes[family.default_mode].crop_range
        min_crops = c[1].number_input("Min crops (tiling modes)", 1, tiling.MAX_CROPS, low, key=f"ds_min_crops{own}")
        max_crops = c[2].number_input("Max crops (tiling modes)", 1, tiling.MAX_CROPS, high,
                                      key=f"ds_max_crops{own}")
        dpi = c[3].number_input("PDF dpi", 18, 1200, 144, key="ds_dpi", help="PDF pages are rendered at this "
                                "resolution (144, as the vendor does).")
        c = st.columns([2, 3])
        prompt_kind = c[0].selectbox("Prompt", [*inputs.PROMPTS, "custom"], key="ds_prompt")
        custom = c[1].text_input("Custom prompt (with <image> once; used when the prompt is 'custom')",
                                 "<image>\nFree OCR.", key="ds_custom")
        c = st.columns(4)
        n = c[0].number_input("Pages per epoch (0 = all)", 0, 100_000, 0 if kind == "uploads" else (2 if cpu else 8),
                              key=f"ds_pages_{kind}")
        epochs = c[1].number_input("Epochs", 1, 100, 1, key="ds_epochs")
        seed = c[2].number_input("Sampling seed", 0, 2**31 - 1, 0, key="ds_seed",
                                 help="Each epoch takes its pages in an order shuffled by this seed.")
        max_new = c[3].number_input("Max new tokens", 1, 8192, 8 if cpu else 256, key="ds_tokens")
        c = st.columns([2, 1, 1])
        trace = c[0].checkbox("Operator breakdown (torch.profiler pass after the timed pages)", False,
                              key="ds_trace", help="Profiles the first pages again under torch.profiler: top "
                              "operators per stage and a Chrome trace to download.")
        trace_pages = c[1].number_input("Traced pages", 1, 8, 1, key="ds_trace_pages")
        trace_tokens = c[2].number_input("Traced tokens per page", 1, 512, 8 if cpu else 32, key="ds_trace_tokens")
        name = st.text_input("Run name (optional)", "", key="ds_name")
        scale = scale_out.inputs("ds", cpu)  # None: this process
        submitted = st.form_submit_button("Start dataset run", type="primary", disabled=runner.busy)
    if not submitted:
        return
    from dsocr_core.measure import dataset_run, datasets

    try:
        if runner.busy:
            raise resources.Busy(runner.busy_message())
        prompt = inputs.PROMPTS.get(prompt_kind) or custom
        ps = dataset_run.ProfileSettings(mode=mode, prompt=prompt, min_crops=int(min_crops),
                                         max_crops=int(max_crops), max_new_tokens=int(max_new),
                                         dpi=int(dpi)).validate()
        if kind == "uploads":
            data = uploads_view.upload_store().dataset(chosen, dpi=int(dpi))
            where = "uploaded pages"
        else:
            data = datasets.discover(source)
            where = data.source.name
        picked = datasets.sample(data.pages, int(n) or None, int(epochs), seed=int(seed))
        if scale is not None and trace:
            raise ValueError("the operator breakdown runs in this process; untick it to run on Ray workers")
        _start(settings, session, data, picked, ps, kind, int(n) or None, int(epochs), int(seed),
               name.strip() or f"dataset {where} ({mode}, {session.session_mode} mode)", scale,
               {"pages": int(trace_pages), "tokens": int(trace_tokens)} if trace else None)
    except (datasets.DatasetError, ValueError) as exc:
        st.error(f"Cannot start this dataset run: {ms.md(exc)}")
    except resources.Busy as exc:
        st.warning(str(exc))


def _start(settings, session, data, picked, ps, kind, n, epochs, seed, name, scale, trace) -> None:
    from dsocr_core.measure import dataset_run

    store = resources.run_store().store
    sampling = {"n": n, "epochs": epochs, "seed": seed, "order": "random", "samples": len(picked),
                "started_from": "dashboard", "pages_from": kind}
    if scale is not None:  # on Ray workers: the run is recorded once they are up (ui/scale_out.py)
        scale_out.start_dataset(scale, settings.model, store, data, picked, ps, sampling, label=settings.model.label,
                                name=f"{name} (Ray workers)")
        return
    meta = {"calibration": _cpu_bound(session.dtype).model_dump(mode="json")} if settings.model.on_cpu else None
    run_id = dataset_run.create_dataset_run(store, session, data, ps, sampling, name=name, meta=meta)
    if trace is not None:
        trace["out_dir"] = str(Path(store.path).parent / "traces" / run_id)
    sweeps.runner().start_dataset(session, store, run_id, picked, ps, name=name, label=settings.model.label,
                                  trace=trace)
    st.session_state["ds_started"] = run_id


def _cpu_bound(dtype: str):
    """This CPU's ceilings in the run's dtype (measured now, about a second, unless measured before in this
    process): stored with a CPU run as the bound of its stages."""
    return resources.calibrations().get(("cpu", dtype)) or resources.run_calibration("cpu", dtype)


def run_bound(run: dict, settings) -> tuple[object, str, str | None]:
    """(ceilings, where they come from, a warning or None) for a run's analytic bound: its GPU's datasheet, else
    the CPU ceilings it stored, else this machine's CPU ceilings measured in its dtype, else the sidebar's (with
    a warning when those are a GPU's under a CPU run: that bound lies decades below the CPU's times)."""
    gpu_preset, stored = ms.run_ceilings(run)
    if gpu_preset is not None:
        return gpu_preset, "the run’s GPU", None
    if stored is not None:
        return stored, "measured with the run", None
    if run["flags"]["cpu"]:
        here = resources.calibrations().get(("cpu", run.get("dtype") or "float32"))
        if here is not None:
            return here, "this machine’s CPU, measured in the sidebar", None
        if not settings.hardware.name.startswith("CPU"):
            return settings.hardware, "the sidebar’s ceilings", (
                f"This CPU run stored no ceilings of its CPU, and the sidebar's ceilings are a GPU's "
                f"({settings.hardware.name}): that roofline is no bound of a CPU's times. Choose 'Calibrated on "
                f"this machine (CPU)' in the sidebar and measure it, in the run's dtype, to draw this run's bound.")
    return settings.hardware, "the sidebar’s ceilings", None


# ---------------------------------------------------------------------------------------------- the runs
def render(store, runs: list[dict], settings) -> None:
    """The chosen dataset run: its summary, per-stage table, and the per-page views (ui.dataset_results), with the
    predicted times of the sidebar's calibration profile (if one is chosen) in the run's own session mode."""
    if not runs and sweeps.runner().busy and sweeps.runner().job.kind == "dataset":
        st.info("The dataset run is starting: it appears here once it is recorded.")
        return
    if not runs:
        st.info("No dataset runs in the store yet. Upload your pages above and start one, or record one with "
                "`python -m dsocr_core profile --pages FOLDER --synthetic tiny --device cpu --max-new-tokens 32` "
                "(or a checkpoint on a GPU); it appears here.")
        return
    by_id = {r["id"]: r for r in runs}
    # A run started here is shown once it is in the store: a new widget key (the browser keeps a widget's old
    # choice when its options change, so setting the old key's state is not enough), then the user's choice.
    started = st.session_state.get("ds_started")
    key, index = ("ds_run", 0) if started not in by_id else (f"ds_run_{started[:8]}", list(by_id).index(started))
    run_id = st.selectbox("Dataset run", list(by_id), index=index, key=key,
                          format_func=lambda i: run_title(by_id[i], size=False))  # no count: it would stay stale
    run = by_id[run_id]
    st.caption(run_caption(run))
    show_order_check(run)
    hardware, bound_from, bound_warning = run_bound(run, settings)
    pkey = predictions.key(settings, run.get("session_mode") or "reference")  # None: no profile chosen
    view = load_view(store, run, hardware, pkey)
    s = view.summary
    c = st.columns(5)
    c[0].metric("Samples", s["samples"])
    c[1].metric("Done / error / oom", f"{s['done']} / {s['error']} / {s['oom']}")
    c[2].metric("Pages / s", "n/a" if s["pages_per_s"] is None else f"{s['pages_per_s']:.3g}")
    c[3].metric("Tokens / page", "n/a" if s["tokens_per_page"] is None else f"{s['tokens_per_page']:.0f}")
    c[4].metric("Output tokens / s", "n/a" if s["output_tokens_per_s"] is None else f"{s['output_tokens_per_s']:.3g}")
    if s["errors"]:
        st.warning(f"**{len(s['errors'])} page(s) skipped or failed** (the run went on with the rest):\n\n"
                   + "\n".join(f"* {ms.md(e['label'])}: {ms.md(e['message'])}" for e in s["errors"][:50]))
    if bound_warning:
        st.warning(bound_warning)
    bound = f"the roofline of {hardware.name} ({bound_from})"
    predicted = (f"; predicted: {ms.md(settings.profile.label)}" if pkey is not None else
                 "; no predicted time (no calibration profile chosen)")
    st.caption(f"Analytic bound: {ms.md(bound)}{predicted}.")
    if pkey is not None:
        predictions.show_misses(settings, run.get("session_mode") or "reference")  # one page at a time: batch 1
    st.markdown("**Per stage, over the done samples (analytic mean beside the measured one)**")
    st.dataframe(dataset_results.stage_table(view.stages), hide_index=True, width="stretch")
    dataset_results.render(store, view, runs, hardware, pkey)
