"""Cached wrappers of dsocr_core for the pages.

* The model is ONE `st.cache_resource` entry (max_entries=1): choosing another model in the sidebar replaces
  it. The session modes (engines.ENGINES) share that entry's weights (`LoadedModel`). GPU work from any tab
  goes through `gpu_lock()` (one process-wide lock), so two browser tabs never run on the device at once; a
  page that finds it taken says so instead of waiting.
* The run store is opened once per process; the bundled reference runs (data/reference/*.json) are imported
  into it then (idempotent: an unchanged file is skipped). A store that fails its integrity check is never
  written to: every page says so, and the pages work on a temporary store holding the bundled runs.
* Analytic frames go through `st.cache_data`, keyed by plain JSON text of the spec, hardware and request, and by
  the prediction's key (ui/prediction.py: profile path, file mtime, session mode; None without a profile). The
  predicting Hardware is built inside from that key: the profile object is never a cache argument.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from dsocr_core import analytic, tiling
from dsocr_core.engines import ENGINES
from dsocr_core.hardware import calibrate, cpu_ceilings, match_device_name
from dsocr_core.registry import get_family, read_spec
from dsocr_core.spec import DecoderSpec, Hardware, Workload
from dsocr_core.results.store import RunImportError, RunStore, StoreError, default_path

ROOT = Path(__file__).resolve().parents[1]
PAGE_ICON = Path(__file__).resolve().parent / "assets" / "page_icon.png"
REFERENCE_DIR = ROOT / "data" / "reference"
SHAPES_DB = ROOT / "data" / "image_shapes.sqlite"
REFERENCE_ENV = "DSOCR_REFERENCE_DIR"  # tests point this at their own folder of exported runs


# ------------------------------------------------------------------------------------------- device
@dataclass(frozen=True)
class GpuInfo:
    available: bool
    name: str | None = None
    count: int = 0
    memory_gb: float | None = None
    preset: Hardware | None = None  # the datasheet preset matching the device name, if any

    @property
    def summary(self) -> str:
        if not self.available:
            return "no CUDA GPU detected"
        return f"{self.name} ({self.memory_gb:.0f} GB)" + (f", {self.count} GPUs" if self.count > 1 else "")


# Device files a CUDA (or ROCm) GPU shows up as. Without any, torch.cuda.is_available() is False, and the pages
# that need no model (analytic, measured, MFU) are drawn without importing torch (seconds on a small machine).
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version", "/dev/dxg", "/dev/kfd")


def gpu_device_present() -> bool:
    return any(os.path.exists(p) for p in GPU_DEVICE_FILES)


@st.cache_resource(show_spinner=False)
def detected_gpu() -> GpuInfo:
    if not gpu_device_present():
        return GpuInfo(False)
    torch_ready()
    import torch

    if not torch.cuda.is_available():
        return GpuInfo(False)
    name = torch.cuda.get_device_name(0)
    memory = torch.cuda.get_device_properties(0).total_memory / 1e9
    return GpuInfo(True, name, torch.cuda.device_count(), memory, match_device_name(name))


_log = logging.getLogger(__name__)
_WARM_UP: threading.Thread | None = None
_WARM_UP_GUARD = threading.Lock()
_TORCH_IMPORTED = threading.Event()  # set by the warm-up thread once torch is imported (or the import failed)


def warm_up() -> threading.Thread:
    """Once per server process: import torch and the model code in a background thread, and run torch's first
    meta-device initialisation (about 2.4 s on a 2-core machine, paid once). The analytic, measured and MFU pages
    never import torch; the pages that load a model find it imported (or wait only for what is left).

    Where this thread is torch's first importer it also starts and stops an empty CPU profiler: kineto (the
    backend of torch.profiler) registers its client in the thread that imports torch and refuses to initialise it
    from any other, printing "External init callback must run in same thread as registerClient" when a job thread
    runs the operator breakdown. So every path of the dashboard that imports torch calls torch_ready() first.
    A plain module-level singleton rather than st.cache_resource: job threads call it too, outside any script."""
    global _WARM_UP
    with _WARM_UP_GUARD:
        if _WARM_UP is None:
            _WARM_UP = threading.Thread(target=_warm_up_work, name="dsocr-warm-up", daemon=True)
            _WARM_UP.start()
            # a process leaving while the thread is inside torch's C++ (an import, the meta init) aborts with
            # "FATAL: exception not rethrown": the exit waits for the warm-up (seconds) instead
            atexit.register(_WARM_UP.join, 60)
        return _WARM_UP


def torch_ready() -> None:
    """Wait until torch is imported, by the warm-up thread (see warm_up for why that thread); not for the rest
    of the warm-up (the model code), which the caller may not need."""
    warm_up()
    _TORCH_IMPORTED.wait()


def _warm_up_work() -> None:
    try:
        first_importer = "torch" not in sys.modules  # another thread importing it already put it there
        import torch

        if first_importer:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
                pass  # kineto's client initialised in the thread that registered it
        else:
            _log.info("torch was imported before the warm-up thread: an operator breakdown from a job thread may "
                      "print kineto's 'External init callback must run in same thread as registerClient' once")
        _TORCH_IMPORTED.set()
        from dsocr_core.runtime import session  # noqa: F401 - the model code, imported once

        with torch.device("meta"):
            torch.nn.Embedding(8, 8)  # torch's first meta-device init (prims and refs) happens here
    except Exception:  # noqa: BLE001 - a failed warm-up only means the first model load pays for it
        pass
    finally:
        _TORCH_IMPORTED.set()


@st.cache_resource(show_spinner=False)
def gpu_lock() -> threading.Lock:
    """One lock per server process for every job that runs the model or measures the device."""
    return threading.Lock()


class Busy(RuntimeError):
    """The device is running another job (a measured sweep, a dataset run, a parity run or a calibration)."""


@contextmanager
def gpu_turn():
    """Hold the device for one job, or raise Busy at once when another job holds it. Every job runs torch:
    imported by the warm-up thread first (see warm_up for why)."""
    torch_ready()
    lock = gpu_lock()
    if not lock.acquire(blocking=False):
        raise Busy("the device is busy with another job (a measured sweep, a dataset run, a parity run or a "
                   "calibration from this or another tab); try again when it finishes")
    try:
        yield
    finally:
        lock.release()


# ------------------------------------------------------------------------------------------- hardware
@st.cache_resource(show_spinner=False)
def calibrations() -> dict[tuple[str, str], Hardware]:
    """Ceilings measured on this machine, per (device, dtype) (shared by all tabs: the machine does not change)."""
    return {}


def run_calibration(device: str, dtype: str) -> Hardware:
    """Measure matmul (in the runs' `dtype`, with their threads) and copy ceilings; on the CPU the matmul size
    follows the CPU's speed (hardware.cpu_matmul_size) and the copy is 64 MiB, so it takes about a second."""
    with gpu_turn():
        hw = cpu_ceilings(dtype) if device == "cpu" else calibrate(device=device, dtype=dtype)
    calibrations()[(device, dtype)] = hw
    return hw


# ------------------------------------------------------------------------------------------- session
class LoadedModel:
    """The sidebar model's weights, loaded once, and its session in each session mode (engines.ENGINES).

    The reference session is loaded; another mode's is `with_mode(mode)` of it (same model, tokenizer and lock, no
    second copy of the weights), built on first use, one at a time. Building an engine can fail (no Triton, an
    unsupported dtype, ...): the failure is remembered, shown, and the reference session used instead. Choosing
    another mode drops the built one, so its static caches and graph memory do not sit in the reference mode's
    measured peak memory."""

    def __init__(self, reference):
        self.reference = reference
        self.other: tuple[str, object] | None = None  # (mode, session) of the one other engine built
        self.errors: dict[str, str] = {}  # mode -> why its engine could not be built
        self._guard = threading.Lock()

    def needs_build(self, mode: str) -> bool:
        """Whether asking for `mode` builds an engine now (the page shows a spinner meanwhile)."""
        return (mode != self.reference.session_mode and mode not in self.errors
                and (self.other is None or self.other[0] != mode))

    def session(self, mode: str) -> tuple[object, str | None]:
        """(session in `mode`, None), or (the reference session, why `mode` is refused)."""
        if mode == self.reference.session_mode:
            self.drop_other()
            return self.reference, None
        if self.other is not None and self.other[0] != mode:
            self.drop_other()
        with self._guard:
            if self.other is None and mode not in self.errors:
                try:
                    built = self.reference.with_mode(mode)
                    with self.reference.lock:  # waits for a point of a running sweep, then builds
                        built.engine  # noqa: B018 - built lazily; a failure to build is raised here
                    self.other = (mode, built)
                except Exception as exc:  # noqa: BLE001 - the page keeps working in the reference mode
                    first = str(exc).splitlines()[0] if str(exc) else ""
                    title = ENGINES[mode].title if mode in ENGINES else mode
                    self.errors[mode] = (f"{title} mode is not available: the {mode} engine could not be built "
                                         f"({type(exc).__name__}: {first}) — using the reference mode.")
            if self.other is None:
                return self.reference, self.errors[mode]
            return self.other[1], None

    def drop_other(self) -> None:
        with self._guard:
            if self.other is None:
                return
            self.other = None
        free_device_memory()


@st.cache_resource(max_entries=1, show_spinner="Loading the model ...")
def _loaded(source: str, preset: str | None, checkpoint: str | None, device: str, dtype: str,
            attn: str, model: str | None = None) -> LoadedModel:
    from dsocr_core.runtime.session import Session

    if source == "checkpoint":  # the folder's config.json names the model
        session = Session.load(checkpoint=checkpoint, device=device, dtype=dtype, attn=attn)
    else:
        session = Session.load(synthetic=preset, device=device, dtype=dtype, attn=attn, model=model)
    return LoadedModel(session)


def get_session(model) -> tuple[object | None, str | None]:
    """(session, None) or (None, why it could not be loaded) for a settings.ModelChoice, in its session mode.
    Where fast mode cannot be had the reference session comes back and a warning says why (on the page)."""
    if not _TORCH_IMPORTED.is_set():
        with st.spinner("Importing torch ..."):
            torch_ready()
    try:
        loaded = _loaded(*model.key)
    except Exception as exc:  # noqa: BLE001 - any load failure (missing folder, bad weights, OOM) is a message
        return None, _load_message(exc, model)
    if loaded.needs_build(model.session_mode):
        with st.spinner(f"Building the {model.session_mode} engine ..."):
            session, refusal = loaded.session(model.session_mode)
    else:
        session, refusal = loaded.session(model.session_mode)
    if refusal:
        st.warning(refusal)
    return session, None


def page_session(settings):
    """The session a page runs, or None after drawing why there is none (a bad checkpoint folder, a failed
    load). Also repeats, on the page, why the sidebar's fast mode was refused."""
    if settings.model_error:
        st.error(settings.model_error)
        return None
    if settings.mode_note:
        st.warning(settings.mode_note)
    session, error = get_session(settings.model)
    if error:
        st.error(error)
    return session


def mode_text(session) -> str:
    """How a result names the session mode it ran in, e.g. 'fast session mode'."""
    return f"{session.session_mode} session mode"


def _load_message(exc: BaseException, model) -> str:
    from dsocr_core.runtime.oom import out_of_memory

    if out_of_memory(exc):
        return (f"out of memory while loading the {model.label}: choose a smaller dtype, the CPU, or the "
                "synthetic tiny model")
    return f"cannot load the {model.label}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def free_device_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------- run store
@dataclass
class StoreHandle:
    store: RunStore
    reference_dir: Path
    imported: list[str]
    import_error: str | None
    store_error: str | None = None  # the configured store is unusable; `store` is then a temporary one


@st.cache_resource(show_spinner="Opening the run store ...")
def _open_store(path: str, reference_dir: str) -> StoreHandle:
    store_error = None
    try:
        store = RunStore(path)  # StoreCorrupt when the file fails its integrity check (it is left untouched)
    except StoreError as exc:
        import tempfile

        store_error = str(exc)
        store = RunStore(Path(tempfile.mkdtemp(prefix="dsocr-store-")) / "runs.sqlite")
    error = None
    try:
        imported = store.import_dir(reference_dir)
    except RunImportError as exc:  # good files are imported all the same; the message lists the bad ones
        imported, error = [r["id"] for r in store.list_runs(kind="reference")], str(exc)
    return StoreHandle(store, Path(reference_dir), imported, error, store_error)


def reference_dir() -> Path:
    """The folder of bundled runs imported into every store ($DSOCR_REFERENCE_DIR, or data/reference)."""
    return Path(os.environ.get(REFERENCE_ENV) or REFERENCE_DIR)


def run_store() -> StoreHandle:
    """$DSOCR_STORE (or data/runs.sqlite) with the bundled reference runs imported. When that file is unusable,
    a temporary store stands in and the page shows why (once per page run)."""
    handle = _open_store(str(default_path()), str(reference_dir()))
    if handle.store_error:
        _show_store_error(handle)
    return handle


def _show_store_error(handle: StoreHandle) -> None:
    from streamlit.errors import StreamlitDuplicateElementKey

    from .measured import md

    try:  # app.py and the page both ask for the store: the keyed box appears once per run
        box = st.container(key="dsocr_store_error")
    except StreamlitDuplicateElementKey:
        return
    box.error(f"{md(handle.store_error)}\n\nThe pages show the bundled reference runs from a temporary store "
              f"({md(handle.store.path)}); runs measured or imported now are **not kept** after a restart.")


# ------------------------------------------------------------------------------------------- specs
OFFICIAL = "official"
TINY = "tiny"


def spec_from(kind: str, checkpoint: str | None = None, model: str | None = None) -> DecoderSpec:
    """The spec the analytic model uses: a model's official dimensions, its synthetic tiny ones, or a
    checkpoint's config.json (in the family it names; raises SpecError)."""
    if kind == OFFICIAL:
        return get_family(model).preset("full")
    if kind == TINY:
        return get_family(model).preset("tiny")
    return read_spec(checkpoint)


def family_of_spec(spec: DecoderSpec):
    return get_family(type(spec).family)


def spec_key(spec: DecoderSpec) -> str:
    """A spec as the text the cached functions take: its model family and its dimensions."""
    return json.dumps({"model": type(spec).family, "spec": spec.model_dump(mode="json")}, sort_keys=True)


def _spec(key: str) -> DecoderSpec:
    data = json.loads(key)
    return get_family(data["model"]).spec_class.model_validate(data["spec"])


def _hw(hw_json: str | None, pkey: str | None = None) -> Hardware | None:
    """The Hardware of `hw_json`, carrying the prediction of `pkey` (ui.prediction.key) when there is one."""
    hw = None if hw_json is None else Hardware.model_validate_json(hw_json)
    if pkey is None:
        return hw
    from .prediction import attach

    return attach(hw, pkey)


# ------------------------------------------------------------------------------------------- analytic
@st.cache_data(max_entries=64, show_spinner=False)
def sweep_frame(spec_json: str, hw_json: str, request_json: str, pkey: str | None = None) -> pd.DataFrame:
    """The analytic sweep of one configuration (see ui.analytic.SweepRequest), one row per point; with `pkey`
    the predicted columns beside the roofline ones."""
    from .analytic import SweepRequest

    req = SweepRequest.from_json(request_json)
    return req.table(_spec(spec_json), _hw(hw_json, pkey))


@st.cache_data(max_entries=64, show_spinner=False)
def module_frame(spec_json: str, hw_json: str, workload_json: str, pkey: str | None = None) -> pd.DataFrame:
    return analytic.module_table(_spec(spec_json), Workload.model_validate_json(workload_json), _hw(hw_json, pkey))


@st.cache_data(max_entries=64, show_spinner=False)
def capacity_of(spec_json: str, hw_json: str, workload_json: str, pkey: str | None = None) -> dict:
    """capacity_summary: the bounds, and with `pkey` the predicted_* figures beside them."""
    return analytic.capacity_summary(_spec(spec_json), Workload.model_validate_json(workload_json),
                                     _hw(hw_json, pkey))


@st.cache_data(max_entries=64, show_spinner=False)
def required_of(spec_json: str, hw_json: str, workload_json: str, ttft_s: float | None,
                tpot_s: float | None) -> dict:
    """What a GPU needs to meet the targets (analytic.required_hardware), as plain numbers."""
    w = Workload.model_validate_json(workload_json)
    pts = analytic.Points.from_workload(w)
    out = analytic.required_hardware(_spec(spec_json), pts, ttft_s=ttft_s, tpot_s=tpot_s, reference=_hw(hw_json))
    return {target: {k: (v.reshape(-1)[0].item() if hasattr(v, "reshape") else v) for k, v in d.items()}
            for target, d in out.items()}


@st.cache_data(max_entries=16, show_spinner=False)
def roof_frame(hw_json: str, low: float, high: float, n: int = 64) -> pd.DataFrame:
    """The roofline of a GPU: attainable FLOP/s over intensities low..high (log-spaced)."""
    import numpy as np

    hw = _hw(hw_json)
    intensity = np.logspace(np.log10(low), np.log10(high), n)
    return pd.DataFrame({"intensity": intensity, "attainable_flops": analytic.attainable_flops(intensity, hw),
                         "hardware": hw.name})


@st.cache_data(max_entries=8, show_spinner=False)
def image_shapes(min_crops: int, max_crops: int, vendor_only: bool) -> pd.DataFrame:
    return pd.DataFrame(tiling.query_image_shapes(SHAPES_DB, min_crops, max_crops, vendor_only))


@st.cache_data(max_entries=16, show_spinner=False)
def models_frame(hw_json: str, pages_json: str, preset: str, text_tokens: int, decode_steps: int, batch: int,
                 dtype: str, attn: str, logits: str, pkey: str | None = None) -> pd.DataFrame:
    """analytic.models.models_on_pages: the pages under every model family (with `pkey`, predicted too)."""
    from dsocr_core.analytic.models import models_on_pages

    return models_on_pages([tuple(p) for p in json.loads(pages_json)], _hw(hw_json, pkey), preset=preset,
                           text_tokens=text_tokens, decode_steps=decode_steps, batch=batch, dtype=dtype, attn=attn,
                           logits=logits)


@st.cache_data(max_entries=8, show_spinner=False)
def param_frame(spec_json: str) -> tuple[int, pd.DataFrame]:
    spec = _spec(spec_json)
    groups = analytic.param_breakdown(spec)
    return analytic.total_params(spec), pd.DataFrame({"group": list(groups), "parameters": list(groups.values())})


# ------------------------------------------------------------------------------------------- measured
@st.cache_data(max_entries=32, show_spinner=False)
def comparison(store_path: str, run_id: str, version: str, datasheet_json: str | None,
               calibrated_json: str | None, pkey: str | None = None) -> pd.DataFrame:
    """compare_run for one run; `version` (point counts and last update) makes a growing run recompute. With
    `pkey` (ui.prediction.key in the run's own session mode) the predicted time of every point and stage; only
    that column is read from this evaluation, so it rides on the profile's own ceilings."""
    from dsocr_core.results.analytic_join import compare_run

    return compare_run(RunStore(store_path), run_id, datasheet=_hw(datasheet_json), calibrated=_hw(calibrated_json),
                       prediction=_hw(None, pkey))


def run_version(run: dict, points: pd.DataFrame | None = None) -> str:
    last = "" if points is None or points.empty else str(points["updated_at"].max())
    return f"{run['n_points']}:{run['n_done']}:{run['n_oom']}:{run['n_error']}:{last}"


def to_json(model) -> str | None:
    return None if model is None else model.model_dump_json()

