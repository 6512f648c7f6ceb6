"""A measured sweep (or a dataset run) started from the page runs in a background thread, so it survives reruns
and closed tabs.

One job at a time per server process (`runner()` is an `st.cache_resource`), a sweep or a dataset run, in the
session mode of the session it was given (the run store records the mode with the run). The thread measures one point
per `dsocr_core.measure.sweep.run_sweep` call, holding the device lock only for that point, so a parity run from
another tab can take its turn between points. Each point is written to the run store as soon as it is
measured (run_sweep does that), so a stop, a closed tab or a crash loses nothing already measured. The page
reads `SweepJob` (progress) and the store (points) from an `st.fragment(run_every=1)`. A dataset run holds the
device lock for the whole run (its warm-ups and FLOP counts are shared by the pages of one shape), so a parity
run from another tab is told the device is busy until it ends or is stopped. A calibration ("Calibrate this
machine" in the sidebar, ui/prediction.py) is the third kind of job: the kernel microbenchmarks, holding the device
lock for the whole run (a parity run or a sweep point in between would disturb the timings), saved as a profile.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import streamlit as st

from dsocr_core.spec import Workload

from . import resources


@dataclass
class SweepJob:
    name: str
    label: str  # the model label (e.g. "synthetic tiny model on CPU (random weights)")
    total: int
    session_mode: str = "reference"  # the session mode it measures in
    kind: str = "sweep"  # "sweep" | "dataset" | "calibration"
    store: object = None  # the RunStore its points go to
    run_id: str | None = None
    handled: int = 0
    statuses: Counter = field(default_factory=Counter)
    current: str = ""
    started: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    weights: list[float] | None = None  # relative cost of each point (analytic time x passes), for the ETA
    last_done: float | None = None  # when the last point (or page) finished
    note: str | None = None  # e.g. why a dataset run's operator breakdown was skipped
    output: str | None = None  # a calibration's saved profile file

    def done_one(self, status: str) -> None:
        self.statuses[status] += 1
        self.handled += 1
        self.last_done = time.time()

    def eta_s(self) -> float | None:
        """Seconds left while running: the time the finished points took, scaled by the analytic cost of the
        points left over that of the points done (by their count where the weights are unknown), less the time
        the current point has already run. None before the first point finishes."""
        if not self.running or not self.handled or self.last_done is None:
            return None
        done_time = self.last_done - self.started
        w = self.weights
        if w and len(w) == self.total and sum(w[:self.handled]) > 0:
            left = done_time * sum(w[self.handled:]) / sum(w[:self.handled])
        else:
            left = done_time * (self.total - self.handled) / self.handled
        return max(left - (time.time() - self.last_done), 0.0)

    @property
    def running(self) -> bool:
        return self.finished_at is None

    @property
    def stopped(self) -> bool:
        return self.stop.is_set()

    @property
    def fraction(self) -> float:
        return self.handled / self.total if self.total else (0.0 if self.running else 1.0)  # size not known yet

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items())) or "no points yet"
        state = ("running" if self.running else "stopped" if self.stopped else "failed" if self.error
                 else "finished")
        unit = {"dataset": "pages", "calibration": "shapes"}.get(self.kind, "points")
        eta = self.eta_s()
        left = "" if eta is None or not self.running else f", about {duration(eta)} left"
        return f"{state}: {self.handled}/{self.total} {unit} ({counts}) in {duration(self.elapsed)}{left}"

    @property
    def elapsed(self) -> float:
        return (self.finished_at or time.time()) - self.started


def duration(seconds: float) -> str:
    """'45 s', '12 min 5 s', '3 h 20 min'."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def describe(w: Workload) -> str:
    grid = f" {w.crops[0]}x{w.crops[1]}" if w.crops else ""
    return f"{w.mode}{grid}, text {w.text_tokens}, batch {w.batch}, {w.decode_steps} decode steps"


class SweepRunner:
    """Owns at most one running job thread (a sweep or a dataset run)."""

    def __init__(self):
        self._guard = threading.Lock()
        self.job: SweepJob | None = None
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None and self.job.running

    def busy_message(self) -> str:
        """What a start refused while a job runs says: the job that runs, by name (a sweep, a dataset run or a
        calibration)."""
        what = KIND_NAMES[self.job.kind] if self.job is not None else "job"
        return f"a {what} is already running; stop it or wait for it to finish"

    def start(self, session, store, workloads: list[Workload], *, name: str, label: str, repeats: int,
              warmup: int, weights: list[float] | None = None) -> SweepJob:
        """A measured sweep of `workloads` in the background (`weights`: each point's relative cost, for the
        ETA)."""
        job = SweepJob(name=name, label=label, total=len(workloads), store=store,
                       session_mode=session.session_mode, weights=weights)
        return self._start(job, self._run, (job, session, store, list(workloads), repeats, warmup))

    def start_dataset(self, session, store, run_id: str, samples: list, settings, *, name: str,
                      label: str, trace: dict | None = None) -> SweepJob:
        """A dataset run (dsocr_core.measure.dataset_run, already created as `run_id`) in the background; with
        `trace` ({"pages", "tokens", "out_dir"}), then a torch.profiler pass over its first pages, whose operator
        breakdown is kept in the run (and its Chrome trace in out_dir)."""
        job = SweepJob(name=name, label=label, total=len(samples), store=store, run_id=run_id,
                       session_mode=session.session_mode, kind="dataset")
        return self._start(job, self._run_dataset, (job, session, store, list(samples), settings, trace))

    def start_calibration(self, device: str, quick: bool, budget_s: float, out) -> SweepJob:
        """Kernel microbenchmarks (calibration.microbench.run_microbench) in the background, saved to `out`."""
        what = "CPU, quick grids" if device == "cpu" else f"{device}{', quick grids' if quick else ''}"
        job = SweepJob(name=f"calibration ({what})", label=what, total=0, kind="calibration")
        return self._start(job, self._run_calibration, (job, device, quick, budget_s, out))

    def _start(self, job: SweepJob, target, args) -> SweepJob:
        resources.torch_ready()  # torch imported by the warm-up thread, not by the job's (resources.warm_up)
        with self._guard:
            if self.busy:
                raise resources.Busy(self.busy_message())
            self.job = job
            self._thread = threading.Thread(target=target, name=f"dsocr-{job.kind}", daemon=True, args=args)
            self._thread.start()
        return job

    def stop(self) -> None:
        if self.job is not None:
            self.job.stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @staticmethod
    def _run(job: SweepJob, session, store, workloads: list[Workload], repeats: int, warmup: int) -> None:
        from dsocr_core.measure import sweep as measure

        lock = resources.gpu_lock()
        meta = {"started_from": "dashboard", "model_label": job.label, "session_mode": job.session_mode}

        def progress(_i, _n, _w, status):
            job.done_one(status)

        def announce(w):  # the order check is not a point of the run: no count, only what runs now
            job.current = f"order check: {describe(w)} measured again"

        try:
            for w in workloads:
                if job.stopped:
                    break
                job.current = describe(w)
                with lock:  # waits while a parity run of another tab holds the device
                    if job.stopped:
                        break
                    with session.lock:
                        job.run_id = measure.run_sweep(session, store, [w], run_id=job.run_id, name=job.name,
                                                       repeats=repeats, warmup=warmup, progress=progress,
                                                       should_stop=job.stop.is_set, meta=meta, order_check=False)
            if not job.stopped and job.run_id is not None:
                with lock, session.lock:
                    measure.recheck_first(session, store, job.run_id, repeats, warmup, announce=announce)
        except Exception as exc:  # noqa: BLE001 - reported on the page; stored points stay stored
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.current = ""
            job.finished_at = time.time()

    @staticmethod
    def _run_dataset(job: SweepJob, session, store, samples: list, settings, trace: dict | None = None) -> None:
        from dsocr_core.measure import dataset_run

        def progress(_i, _n, sample, status):
            if status == "recheck":  # the order check is not a page of the run: no count
                job.current = f"order check: {sample.label} measured again"
                return
            job.done_one(status)
            job.current = f"last page: {sample.label} ({status})"

        try:
            job.current = "waiting for the device"
            with resources.gpu_lock():  # the whole run: shared warm-ups and FLOP counts per input shape
                job.current = "starting"
                dataset_run.run_dataset(session, store, job.run_id, samples, settings, progress=progress,
                                        should_stop=job.stop.is_set)
                if trace is not None and not job.stopped:
                    _trace_dataset(job, session, store, samples, settings, trace)
        except Exception as exc:  # noqa: BLE001 - reported on the page; stored points stay stored
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.current = ""
            job.finished_at = time.time()

    @staticmethod
    def _run_calibration(job: SweepJob, device: str, quick: bool, budget_s: float, out) -> None:
        from dsocr_core.analytic.predict import prediction_gaps
        from dsocr_core.calibration.microbench import run_microbench

        def progress(_done, total, table):  # after each shape (measured, or skipped over a cap or the budget)
            job.total = total
            job.done_one("done")
            job.current = f"last table: {table}"

        try:
            job.current = "waiting for the device"
            with resources.gpu_lock():  # the whole run: another job's kernels would be in the timings
                job.current = "starting (launch costs)"
                job.started = time.time()  # the ETA counts from here, not from the wait
                profile = run_microbench(device, quick=quick, budget_s=budget_s, progress=progress,
                                         should_stop=job.stop.is_set)
            gaps = prediction_gaps(profile)
            if gaps:  # it could not predict: keep nothing rather than a profile the picker would refuse
                raise RuntimeError(f"stopped before {', '.join(gaps)} were measured; nothing saved (give it more "
                                   "time, or let it finish)")
            job.output = str(profile.save(out))
        except Exception as exc:  # noqa: BLE001 - reported in the sidebar; no partial file is written
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.current = ""
            job.finished_at = time.time()


KIND_NAMES = {"sweep": "measured sweep", "dataset": "dataset run", "calibration": "calibration"}


def _trace_dataset(job: SweepJob, session, store, samples: list, settings, trace: dict) -> None:
    """The operator breakdown of a finished dataset run (measure.operators; the timed pages are already stored)."""
    from dsocr_core.measure.operators import profile_operators, store_operator_profile

    job.current = f"operator breakdown: torch.profiler over {trace['pages']} page(s), {trace['tokens']} tokens each"
    try:
        prof = profile_operators(session, samples, settings, n_pages=int(trace["pages"]),
                                 max_new_tokens=int(trace["tokens"]), out_dir=trace.get("out_dir"))
    except ValueError as exc:  # no readable page
        job.note = f"operator breakdown skipped: {exc}"
        return
    store_operator_profile(store, job.run_id, prof)


@st.cache_resource(show_spinner=False)
def runner() -> SweepRunner:
    return SweepRunner()
