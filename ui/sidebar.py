"""The shared sidebar: which model the session runs (a local checkpoint folder or synthetic weights, clearly
labelled), on which device, in which session mode (reference | fast; fast is refused, with the reason, where
there is no CUDA device), which hardware ceilings the analytic numbers use (a datasheet preset, the
ceilings calibrated on this machine, or custom numbers), and which calibration profile predicts the time beside
the roofline (ui/prediction.py: the picker and "Calibrate this machine")."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from dsocr_core.engines import ENGINES
from dsocr_core.hardware import PRESETS
from dsocr_core.registry import DEFAULT_MODEL, FAMILIES, fast_engine_models, get_family, read_spec
from dsocr_core.spec import Hardware, SpecError

from . import prediction, resources
from .measured import sig
from .resources import GpuInfo

CHECKPOINT_ENV = "DSOCR_CHECKPOINT"  # a default checkpoint folder for the sidebar
SOURCES = {
    "synthetic-tiny": "Synthetic tiny model (random weights)",
    "synthetic-full": "Synthetic full-size model (random weights)",
    "checkpoint": "Local checkpoint folder",
}
DTYPES = {"cpu": ["float32", "bfloat16"], "cuda": ["bfloat16", "float16", "float32"]}
# the session modes are the engine registry's (dsocr_core/engines.py: torch-free, like the whole sidebar)
SESSION_MODES = tuple(ENGINES)
MODE_NAMES = {k: e.title for k, e in ENGINES.items()}
MODE_HELP = (" ".join(f"{e.title}: {e.help}." for e in ENGINES.values())
             + " Both give the same greedy tokens; every result and export names the engine it ran.")
CALIBRATED, CUSTOM = "calibrated", "custom"


@dataclass(frozen=True)
class ModelChoice:
    source: str  # "synthetic" | "checkpoint"
    preset: str | None  # synthetic preset: "tiny" | "full"
    checkpoint: str | None
    device: str  # "cpu" | "cuda"
    dtype: str
    attn: str  # "sdpa" | "eager"
    gpu_name: str | None = None
    session_mode: str = "reference"  # the mode the pages use: "fast" only where the sidebar allowed it
    model: str = DEFAULT_MODEL  # model family (registry): picked for synthetic weights, read from a checkpoint

    @property
    def key(self) -> tuple:
        """What the loaded weights depend on (not the session mode: both modes share one loaded model)."""
        return (self.source, self.preset, self.checkpoint, self.device, self.dtype, self.attn, self.model)

    @property
    def family(self):
        return get_family(self.model)

    @property
    def synthetic(self) -> bool:
        return self.source == "synthetic"

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def where(self) -> str:
        return "CPU" if self.on_cpu else f"GPU ({self.gpu_name})" if self.gpu_name else "GPU"

    @property
    def label(self) -> str:
        """How results of this model are labelled wherever they are shown or exported."""
        if self.synthetic:
            size = "tiny" if self.preset == "tiny" else "full-size"
            return f"synthetic {size}{self._model_name} model on {self.where} (random weights)"
        return f"checkpoint {Path(self.checkpoint or '').name or self.checkpoint}{self._model_name} on {self.where}"

    @property
    def _model_name(self) -> str:
        """' DeepSeek-OCR 2' in the labels of another model than the default (whose labels stay as they were)."""
        return "" if self.model == DEFAULT_MODEL else f" {self.family.label}"


@dataclass(frozen=True)
class Settings:
    model: ModelChoice
    model_error: str | None  # why the chosen model cannot be used (e.g. missing checkpoint folder)
    hardware: Hardware
    hardware_note: str  # where the ceilings come from
    gpu: GpuInfo
    mode_note: str | None = None  # why the fast session mode was refused (CPU), shown in the sidebar
    profile: prediction.ProfileChoice | None = None  # the calibration profile the pages predict with (or none)

    @property
    def spec_kind(self) -> str:
        """Which dimensions the sidebar model has: 'tiny', 'official' or 'checkpoint'."""
        if self.model.synthetic:
            return resources.TINY if self.model.preset == "tiny" else resources.OFFICIAL
        return "checkpoint" if self.model_error is None else resources.OFFICIAL


def _default_source() -> str:
    ckpt = os.environ.get(CHECKPOINT_ENV)
    return "checkpoint" if ckpt and Path(ckpt).is_dir() else "synthetic-tiny"


def _checkpoint_problem(folder: str) -> tuple[str | None, str]:
    """(why the folder cannot be used or None, the model family its config.json names)."""
    if not folder.strip():
        return "enter the path of a local checkpoint folder (with config.json and *.safetensors)", DEFAULT_MODEL
    path = Path(folder).expanduser()
    if not path.exists():
        return f"checkpoint folder {path} does not exist", DEFAULT_MODEL
    if not path.is_dir():
        return f"{path} is not a folder; give the checkpoint folder", DEFAULT_MODEL
    try:
        return None, type(read_spec(path)).family
    except SpecError as exc:
        return str(exc), DEFAULT_MODEL


def _mode_refusal(mode: str, device: str, gpu: GpuInfo, model: str = DEFAULT_MODEL) -> str | None:
    """Why the session mode cannot be used with this device (its engine needs CUDA) or model, or None."""
    engine, family = ENGINES[mode], get_family(model)
    if mode == "fast" and not family.fast_engine:
        return (f"{engine.title} mode runs {', '.join(fast_engine_models())} only; {family.label} runs in the "
                "reference mode (the plain PyTorch model) — using the reference mode.")
    if device == "cuda" or not engine.needs_cuda:
        return None
    if not gpu.available:
        return (f"{engine.title} mode needs a CUDA GPU; this machine has none — using the reference mode. "
                f"({engine.title}: {engine.help}.)")
    return (f"{engine.title} mode needs the CUDA device; the device chosen above is the CPU — using the reference "
            "mode.")


def _ceiling_caption(hw: Hardware) -> str:
    """Three significant digits: a CPU's 0.19 TFLOP/s must not read 0.0."""
    return (f"{sig(hw.peak_tflops)} TFLOP/s · {sig(hw.bandwidth_tbs)} TB/s · {hw.memory_gb:,.0f} GB · "
            f"ridge {hw.ridge_intensity:,.0f} FLOP/byte")


def render() -> Settings:
    gpu = resources.detected_gpu()
    side = st.sidebar
    side.header("Model")
    source = side.radio("Model source", list(SOURCES), format_func=SOURCES.get, key="sb_source",
                        index=list(SOURCES).index(_default_source()),
                        help="Synthetic models have seeded random weights: their text is meaningless, their "
                             "cost and the parity of the two generation paths are real.")
    checkpoint, error = None, None
    if source == "checkpoint":
        checkpoint = side.text_input("Checkpoint folder", key="sb_checkpoint",
                                     value=os.environ.get(CHECKPOINT_ENV, "checkpoints/DeepSeek-OCR"))
        error, model_name = _checkpoint_problem(checkpoint)
        if error:
            side.error(error)
        else:
            side.caption(f"The folder's config.json names **{get_family(model_name).label}**.")
        checkpoint = str(Path(checkpoint).expanduser())
    else:
        model_name = side.selectbox("Model", list(FAMILIES), format_func=lambda m: FAMILIES[m].label,
                                    key="sb_model", help="The model family the synthetic weights and every page "
                                    "use: its stages, modes and dimensions come from the model registry.")
    devices = ["cuda", "cpu"] if gpu.available else ["cpu"]
    device = side.selectbox("Device", devices, key="sb_device",
                            help=None if gpu.available else "No CUDA GPU detected: the model runs on the CPU.")
    dtype = side.selectbox("Dtype", DTYPES[device], key=f"sb_dtype_{device}")
    attn = side.selectbox("LM attention", ["sdpa", "eager"], key="sb_attn")
    requested = side.radio("Session mode", list(SESSION_MODES), format_func=MODE_NAMES.get, key="sb_session_mode",
                           horizontal=True, help=MODE_HELP)
    if not get_family(model_name).fast_engine:
        side.caption(f"The fast session mode is {' / '.join(fast_engine_models())}-only; "
                     f"{get_family(model_name).label} runs in the reference mode.")
    mode_note = _mode_refusal(requested, device, gpu, model_name)
    if mode_note:
        side.warning(mode_note)
    model = ModelChoice("checkpoint" if source == "checkpoint" else "synthetic",
                        None if source == "checkpoint" else source.split("-")[1], checkpoint, device, dtype, attn,
                        gpu.name if device == "cuda" else None, "reference" if mode_note else requested, model_name)
    if model.synthetic:
        side.caption(f"Results are labelled **{model.label}**.")
        if model.preset == "full" and model.on_cpu:
            side.warning("The full-size model on the CPU needs ~13 GB of memory (float32) and is slow.")

    side.header("Hardware ceilings")
    default = next((k for k, hw in PRESETS.items() if gpu.preset is not None and hw == gpu.preset), "h200")
    options = [*PRESETS, CALIBRATED, CUSTOM]
    names = {k: f"{hw.name} (datasheet)" for k, hw in PRESETS.items()}
    names |= {CALIBRATED: f"Calibrated on this machine ({'GPU' if gpu.available else 'CPU'})",
              CUSTOM: "Custom ceilings"}
    choice = side.selectbox("Ceilings", options, index=options.index(default), format_func=names.get,
                            key="sb_hardware")
    if choice == CALIBRATED:
        measured = resources.calibrations().get((device, dtype))
        if side.button("Measure now" if measured is None else "Measure again", key="sb_calibrate"):
            status = side.status(f"Measuring {dtype} matmul and copy ceilings ...", expanded=False)
            try:
                with status:
                    measured = resources.run_calibration(device, dtype)
                status.update(label=f"Measured: {_ceiling_caption(measured)}", state="complete")
            except resources.Busy as exc:
                status.update(label="Not measured: the device is busy", state="error")
                side.warning(str(exc))
            except Exception as exc:  # noqa: BLE001 - a failed calibration leaves the app running
                status.update(label="Calibration failed", state="error")
                side.error(f"calibration failed: {type(exc).__name__}: {exc}")
        if measured is None:
            hardware = PRESETS[default]
            note = f"not calibrated yet: using the {hardware.name} datasheet until you measure"
            side.info(note)
        else:
            hardware, note = measured, measured.source
            if not device.startswith("cuda"):
                side.caption(f"Calibrated on this CPU in {dtype} with its threads: the bound of CPU runs in "
                             f"{dtype}, not GPU ceilings.")
    elif choice == CUSTOM:
        c1, c2 = side.columns(2)
        peak = c1.number_input("TFLOP/s", min_value=0.001, value=989.0, key="sb_peak")
        bw = c2.number_input("TB/s", min_value=0.001, value=4.8, key="sb_bw")
        mem = side.number_input("Memory GB", min_value=0.1, value=141.0, key="sb_mem")
        hardware = Hardware(name="custom", peak_tflops=peak, bandwidth_tbs=bw, memory_gb=mem,
                            source="custom ceilings typed in the sidebar")
        note = hardware.source
    else:
        hardware, note = PRESETS[choice], PRESETS[choice].source
    side.caption(_ceiling_caption(hardware))
    side.caption(f"Detected: {gpu.summary}.")
    profile = prediction.render(side, gpu)
    return Settings(model, error, hardware, note, gpu, mode_note, profile)
