"""A measured sweep started from the page runs in a background thread, so it survives reruns and closed tabs.

One sweep at a time per server process (`runner()` is an `st.cache_resource`). The thread measures one point
per `dsocr_core.measure.sweep.run_sweep` call, holding the device lock only for that point, so a parity run from
another tab can take its turn between points. Each point is written to the run store as soon as it is
measured (run_sweep does that), so a stop, a closed tab or a crash loses nothing already measured. The page
reads `SweepJob` (progress) and the store (points) from an `st.fragment(run_every=1)`.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import streamlit as st

from dsocr_core.measure import sweep as measure
from dsocr_core.spec import Workload

from . import resources


@dataclass
class SweepJob:
    name: str
    label: str  # the model label (e.g. "synthetic tiny model on CPU (random weights)")
    total: int
    store: object = None  # the RunStore its points go to
    run_id: str | None = None
    handled: int = 0
    statuses: Counter = field(default_factory=Counter)
    current: str = ""
    started: float = field(default_factory=time.time)
    finished_at: float | None = None
    error: str | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def running(self) -> bool:
        return self.finished_at is None

    @property
    def stopped(self) -> bool:
        return self.stop.is_set()

    @property
    def fraction(self) -> float:
        return self.handled / self.total if self.total else 1.0

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items())) or "no points yet"
        state = ("running" if self.running else "stopped" if self.stopped else "failed" if self.error
                 else "finished")
        return f"{state}: {self.handled}/{self.total} points ({counts}) in {self.elapsed:.0f} s"

    @property
    def elapsed(self) -> float:
        return (self.finished_at or time.time()) - self.started


def describe(w: Workload) -> str:
    grid = f" {w.crops[0]}x{w.crops[1]}" if w.crops else ""
    return f"{w.mode}{grid}, text {w.text_tokens}, batch {w.batch}, {w.decode_steps} decode steps"


class SweepRunner:
    """Owns at most one running sweep thread."""

    def __init__(self):
        self._guard = threading.Lock()
        self.job: SweepJob | None = None
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None and self.job.running

    def start(self, session, store, workloads: list[Workload], *, name: str, label: str, repeats: int,
              warmup: int) -> SweepJob:
        with self._guard:
            if self.busy:
                raise resources.Busy("a measured sweep is already running; stop it or wait for it to finish")
            job = SweepJob(name=name, label=label, total=len(workloads), store=store)
            self.job = job
            self._thread = threading.Thread(target=self._run, name="dsocr-sweep", daemon=True,
                                            args=(job, session, store, list(workloads), repeats, warmup))
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
        lock = resources.gpu_lock()
        meta = {"started_from": "dashboard", "model_label": job.label}

        def progress(_i, _n, _w, status):
            job.statuses[status] += 1
            job.handled += 1

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
                                                       should_stop=job.stop.is_set, meta=meta)
        except Exception as exc:  # noqa: BLE001 - reported on the page; stored points stay stored
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.current = ""
            job.finished_at = time.time()


@st.cache_resource(show_spinner=False)
def runner() -> SweepRunner:
    return SweepRunner()
