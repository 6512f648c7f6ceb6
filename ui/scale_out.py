"""Ray scale-out from the dashboard: the 'where to run' inputs of the measured-sweep and dataset-run forms, the
background job that starts the workers and feeds them (dsocr_core.measure.scale_out), and a per-worker progress
table. Ray is imported only when such a job starts.

A scaled job is a `sweeps.SweepJob` run by the page's one `sweeps.runner()` (one job at a time, same progress bar,
stop button and ETA); it holds the device lock for the whole run (its workers use the GPUs), starts the pool
(`job.current` says so), and keeps `job.worker_rows` (WorkerPool.progress_rows) fresh for `worker_panel`."""
from __future__ import annotations

import time

import streamlit as st

from . import resources, sweeps

PLACES = {"here": "This process (the sidebar's loaded model)", "local": "Local Ray workers (one per GPU)",
          "cluster": "A Ray cluster"}


def inputs(prefix: str, cpu: bool) -> dict | None:
    """Where the job runs; None for this process (the default), else {workers, address, allow_mixed_gpus}."""
    with st.expander("Run on Ray workers (optional)", expanded=False):
        place = st.radio("Run in", list(PLACES), format_func=PLACES.get, horizontal=True, key=f"{prefix}_place",
                         help="Workers each load the sidebar's model (same weights, dtype, attention and session "
                              "mode); the dashboard writes every result to the store as it arrives.")
        c = st.columns([1, 2, 1])
        workers = c[0].number_input("Workers", 1, 1024, 2 if cpu else 1, key=f"{prefix}_workers",
                                    help="One per GPU (on the CPU: one per core); no more than the GPUs there "
                                         "are.")
        address = c[1].text_input("Cluster address (auto or HOST:PORT)", "auto", key=f"{prefix}_address",
                                  help="Of a cluster started with `ray start --head` (and `ray start --address` on "
                                       "the other nodes).")
        mixed = c[2].checkbox("Allow mixed GPU models", False, key=f"{prefix}_mixed",
                              help="Timings of different GPU models are not comparable; refused unless ticked.")
    if place == "here":
        return None
    return {"workers": int(workers), "address": address.strip() if place == "cluster" else None,
            "allow_mixed_gpus": bool(mixed)}


def load_args(model) -> dict:
    """Session.load's arguments for the sidebar's model choice (ui.sidebar.ModelChoice)."""
    args = dict(device=model.device, dtype=model.dtype, attn=model.attn, session_mode=model.session_mode)
    if model.source == "checkpoint":
        return {**args, "checkpoint": model.checkpoint}
    return {**args, "synthetic": model.preset, "seed": 0, "model": model.model}


def _start_pool(job, scale: dict, model):
    from dsocr_core.measure.scale_out import WorkerPool

    job.current = "starting the Ray workers (each loads the model)"
    pool = WorkerPool.start(load_args(model), workers=scale["workers"], address=scale["address"],
                            allow_mixed_gpus=scale["allow_mixed_gpus"])
    _refresh(job, pool)
    job.current = f"{len(pool.workers)} Ray worker(s) measuring"
    return pool


def _refresh(job, pool) -> None:
    job.worker_rows = pool.progress_rows()
    job.worker_events = list(pool.events)  # deaths, retries, items lost: said on the page, not only in the table


def _progress(job, pool):
    def progress(_i, _n, item, status):
        job.done_one(status)
        _refresh(job, pool)
    return progress


def _on_workers(job, scale: dict, model, body):
    """The background job's body: under the device lock, start the pool, run `body(pool)`, keep the workers' last
    progress rows and close the pool; an error is reported on the page (what was stored stays stored)."""
    def run():
        try:
            with resources.gpu_lock():
                pool = _start_pool(job, scale, model)
                try:
                    body(pool)
                finally:
                    _refresh(job, pool)
                    pool.close()
        except Exception as exc:  # noqa: BLE001 - reported on the page; stored points stay stored
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.current = ""
            job.finished_at = time.time()
    return run


def start_sweep(scale: dict, model, store, workloads: list, *, name: str, label: str, repeats: int, warmup: int,
                weights: list[float] | None = None):
    """A measured sweep over Ray workers in the background (raises resources.Busy while another job runs)."""
    runner = sweeps.runner()
    job = sweeps.SweepJob(name=name, label=label, total=len(workloads), store=store, session_mode=model.session_mode,
                          weights=weights)
    job.worker_rows = []
    meta = {"started_from": "dashboard", "model_label": label, "session_mode": model.session_mode}

    def body(pool):
        from dsocr_core.measure.scale_out import run_sweep_scaled

        job.run_id = run_sweep_scaled(pool, store, [], name=name, repeats=repeats, warmup=warmup, meta=meta)
        run_sweep_scaled(pool, store, workloads, run_id=job.run_id, repeats=repeats, warmup=warmup,
                         progress=_progress(job, pool), should_stop=job.stop.is_set)

    return runner._start(job, _on_workers(job, scale, model, body), ())


def starter(scale: dict, model):
    """A callable with `sweeps.SweepRunner.start`'s signature that runs the sweep on Ray workers instead."""
    def start(_session, store, workloads, *, name, label, repeats, warmup, weights=None):
        return start_sweep(scale, model, store, workloads, name=name, label=label, repeats=repeats, warmup=warmup,
                           weights=weights)
    return start


def start_dataset(scale: dict, model, store, dataset, samples: list, settings, sampling: dict, *, name: str,
                  label: str):
    """A dataset run over Ray workers in the background; the run is recorded once the workers are up (with the
    lead worker's environment), so `job.run_id` is set then."""
    runner = sweeps.runner()
    job = sweeps.SweepJob(name=name, label=label, total=len(samples), store=store, session_mode=model.session_mode,
                          kind="dataset")
    job.worker_rows = []

    def body(pool):
        from dsocr_core.measure.dataset_run import create_dataset_run
        from dsocr_core.measure.scale_out import run_dataset_scaled

        job.run_id = create_dataset_run(store, pool.lead, dataset, settings, sampling, name=name,
                                        environment=pool.lead.info["environment"],
                                        meta={"scale_out": pool.describe()})
        run_dataset_scaled(pool, store, job.run_id, samples, settings, progress=_progress(job, pool),
                           should_stop=job.stop.is_set)

    return runner._start(job, _on_workers(job, scale, model, body), ())


def worker_panel(job) -> None:
    """Progress per worker of a scaled job (nothing for a job run in this process)."""
    rows = getattr(job, "worker_rows", None)
    if not rows:
        return
    import pandas as pd

    table = pd.DataFrame(rows)[["worker", "node", "gpu", "gpu_index", "alive", "done", "failed", "in_flight",
                                "current", "death"]]
    st.dataframe(table, hide_index=True, width="stretch",
                 column_config={"current": st.column_config.TextColumn("current item", width="large")})
    events = getattr(job, "worker_events", None)
    if events:
        from .measured import md

        st.warning("Ray workers died during this run:\n\n" + "\n".join(f"- {md(e)}" for e in events[-20:]))
