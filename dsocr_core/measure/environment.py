"""What machine a run was measured on: software versions, GPU, driver, clocks.

`capture_environment(device)` never raises. Every field it cannot read is None, and `missing[field]` says why
(no GPU, nvidia-smi absent, package not installed, ...), so a stored run shows what was unknown rather than
guessing. GPU facts come from torch (name, memory, compute capability, CUDA, cuDNN) and from
`nvidia-smi --query-gpu` or, when that is absent, pynvml (driver, clocks, power limit).
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Callable

# Every key capture_environment returns; GPU_FIELDS are None on a CPU run.
GPU_FIELDS = (
    "gpu_name", "gpu_uuid", "gpu_memory_bytes", "gpu_compute_capability", "driver",
    "sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz", "mem_clock_max_mhz", "power_limit_w", "pstate",
)
FIELDS = (
    "captured_at", "hostname", "python", "platform", "machine", "cpu_model", "cpu_count",
    "dsocr_core", "torch", "transformers", "numpy", "pydantic", "pandas",
    "device", "cuda_available", "cuda", "cudnn", "gpu_count", "gpu_index", *GPU_FIELDS,
    "clock_source", "cuda_visible_devices", "missing",
)

# nvidia-smi --query-gpu fields, in the order the CSV has them, and our names for them.
_SMI_QUERY = (
    ("uuid", "gpu_uuid"), ("name", "gpu_name"), ("driver_version", "driver"),
    ("clocks.sm", "sm_clock_mhz"), ("clocks.mem", "mem_clock_mhz"),
    ("clocks.max.sm", "sm_clock_max_mhz"), ("clocks.max.mem", "mem_clock_max_mhz"),
    ("power.limit", "power_limit_w"), ("pstate", "pstate"), ("index", "smi_index"),
)
_NUMERIC = {"sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz", "mem_clock_max_mhz", "power_limit_w"}


def capture_environment(device: str = "cpu") -> dict[str, Any]:
    """Describe this machine as seen by a run on `device` ("cpu", "cuda", "cuda:1"). Never raises."""
    env: dict[str, Any] = dict.fromkeys(FIELDS)
    missing: dict[str, str] = {}
    env["missing"] = missing
    env["device"] = str(device)

    def probe(field: str, fn: Callable[[], Any]) -> None:
        try:
            env[field] = fn()
        except Exception as exc:  # a probe failing is a fact to record, never a reason to fail the run
            env[field] = None
            missing[field] = f"{type(exc).__name__}: {exc}"

    probe("captured_at", lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    probe("hostname", socket.gethostname)
    probe("python", lambda: sys.version.split()[0])
    probe("platform", platform.platform)
    probe("machine", platform.machine)
    probe("cpu_model", _cpu_model)
    probe("cpu_count", os.cpu_count)
    probe("cuda_visible_devices", lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
    for dist in ("torch", "transformers", "numpy", "pydantic", "pandas"):
        probe(dist, lambda d=dist: metadata.version(d))
        if env[dist] is None and dist not in missing:
            missing[dist] = "not installed"
    try:
        from .. import __version__

        env["dsocr_core"] = __version__
    except Exception as exc:  # pragma: no cover - the package always has a version
        missing["dsocr_core"] = str(exc)

    try:
        _torch_facts(env, missing)
    except Exception as exc:  # pragma: no cover - defensive: torch misbehaving must not fail a run
        missing.setdefault("torch", f"{type(exc).__name__}: {exc}")

    if env.get("gpu_index") is not None:
        try:
            _clock_facts(env, missing)
        except Exception as exc:  # pragma: no cover - defensive
            missing.setdefault("clock_source", f"{type(exc).__name__}: {exc}")
    else:
        why = missing.get("gpu_index") or f"device is {device!r}, not a CUDA GPU"
        for field in GPU_FIELDS + ("clock_source",):
            if env.get(field) is None:
                missing.setdefault(field, why)
    for field, value in env.items():
        if value is None and field not in missing and field != "cuda_visible_devices":
            missing[field] = "not readable"
    return env


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _torch_facts(env: dict, missing: dict) -> None:
    try:
        import torch
    except Exception as exc:
        for field in ("cuda_available", "cuda", "cudnn", "gpu_count", "gpu_index"):
            missing[field] = f"torch not importable: {exc}"
        return
    env["cuda"] = torch.version.cuda
    if env["cuda"] is None:
        missing["cuda"] = "torch build without CUDA"
    try:
        env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        if env["cudnn"] is None:
            missing["cudnn"] = "cuDNN not available to torch"
    except Exception as exc:
        missing["cudnn"] = f"{type(exc).__name__}: {exc}"
    env["cuda_available"] = bool(torch.cuda.is_available())
    env["gpu_count"] = torch.cuda.device_count() if env["cuda_available"] else 0

    device = str(env["device"])
    if not device.startswith("cuda"):
        missing["gpu_index"] = f"device is {device!r}, not a CUDA GPU"
        return
    if not env["cuda_available"]:
        missing["gpu_index"] = "device asks for CUDA but torch.cuda.is_available() is False"
        return
    try:
        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        props = torch.cuda.get_device_properties(index)
    except Exception as exc:
        missing["gpu_index"] = f"cannot open {device!r}: {type(exc).__name__}: {exc}"
        return
    env["gpu_index"] = index
    env["gpu_name"] = props.name
    env["gpu_memory_bytes"] = int(props.total_memory)
    env["gpu_compute_capability"] = f"{props.major}.{props.minor}"
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        env["gpu_uuid"] = text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _clock_facts(env: dict, missing: dict) -> None:
    """Driver, clocks and power limit of the GPU the run uses: nvidia-smi, else pynvml, else None with reasons."""
    smi_error = None
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            fields = ",".join(q for q, _ in _SMI_QUERY)
            out = subprocess.run(
                [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=15, check=True,
            ).stdout
            rows = parse_nvidia_smi_csv(out)
            row = _pick_gpu(rows, env)
            if row is None:
                raise LookupError(f"no nvidia-smi row matches GPU {env.get('gpu_uuid') or env.get('gpu_index')}")
            _merge(env, missing, row, "nvidia-smi")
            return
        except Exception as exc:
            smi_error = f"nvidia-smi failed: {type(exc).__name__}: {exc}".strip()
    else:
        smi_error = "nvidia-smi not found"
    try:
        row = _nvml_row(env)
        _merge(env, missing, row, "pynvml")
        return
    except ImportError:
        nvml_error = "pynvml not importable"
    except Exception as exc:
        nvml_error = f"pynvml failed: {type(exc).__name__}: {exc}"
    why = f"{smi_error}; {nvml_error}"
    for field in ("driver", "sm_clock_mhz", "mem_clock_mhz", "sm_clock_max_mhz", "mem_clock_max_mhz",
                  "power_limit_w", "pstate", "clock_source"):
        if env.get(field) is None:
            missing[field] = why


def full_sm_clock_mhz(environment) -> float | None:
    """The maximum SM clock (MHz) an environment record names (capture_environment's sm_clock_max_mhz: the clock a
    GPU's short kernel replays run at, not the idle clock at capture), or None where it names none (a CPU, a record
    older than the field, anything but a mapping holding a positive number)."""
    v = environment.get("sm_clock_max_mhz") if isinstance(environment, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def parse_nvidia_smi_csv(text: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=<_SMI_QUERY fields> --format=csv,noheader,nounits` as dicts of our names.
    "[N/A]" / "N/A" / "[Not Supported]" become None; clocks and power become floats."""
    rows = []
    names = [name for _, name in _SMI_QUERY]
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(names):
            continue
        row: dict[str, Any] = {}
        for name, cell in zip(names, cells):
            if not cell or cell.strip("[]").lower() in ("n/a", "not supported", "unknown error"):
                row[name] = None
            elif name in _NUMERIC:
                try:
                    row[name] = float(cell)
                except ValueError:
                    row[name] = None
            else:
                row[name] = cell
        rows.append(row)
    return rows


def _pick_gpu(rows: list[dict], env: dict) -> dict | None:
    """The nvidia-smi row of the GPU torch uses: by UUID when torch knows it; otherwise by index, mapped through
    CUDA_VISIBLE_DEVICES when that lists plain indices (nvidia-smi ignores it)."""
    uuid = env.get("gpu_uuid")
    if uuid:
        for row in rows:
            if row.get("gpu_uuid") and (row["gpu_uuid"] == uuid or row["gpu_uuid"].endswith(uuid.split("-", 1)[-1])):
                return row
    index = env.get("gpu_index")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        if index is not None and index < len(entries):
            target = entries[index]
            for row in rows:
                if target in (row.get("smi_index"), row.get("gpu_uuid")):
                    return row
            return None
    if index is not None:
        for row in rows:
            if row.get("smi_index") == str(index):
                return row
    return None


def _nvml_row(env: dict) -> dict[str, Any]:
    import pynvml  # optional dependency (nvidia-ml-py)

    pynvml.nvmlInit()
    try:
        handle = None
        if env.get("gpu_uuid"):
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(env["gpu_uuid"])
            except Exception:
                handle = None
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(env["gpu_index"])

        def text(value):
            return value.decode() if isinstance(value, bytes) else value

        def safe(fn, *args):
            try:
                return fn(*args)
            except Exception:
                return None

        power = safe(pynvml.nvmlDeviceGetPowerManagementLimit, handle)
        return {
            "gpu_name": text(safe(pynvml.nvmlDeviceGetName, handle)),
            "driver": text(safe(pynvml.nvmlSystemGetDriverVersion)),
            "sm_clock_mhz": safe(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": safe(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            "sm_clock_max_mhz": safe(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_max_mhz": safe(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": None if power is None else power / 1000.0,
            "pstate": None,
        }
    finally:
        pynvml.nvmlShutdown()


def _merge(env: dict, missing: dict, row: dict, source: str) -> None:
    env["clock_source"] = source
    for field, value in row.items():
        if field == "smi_index":
            continue
        if field in ("gpu_name", "gpu_uuid") and env.get(field):
            continue  # torch's view of the device wins; nvidia-smi only fills gaps
        env[field] = value
        if value is None:
            missing[field] = f"{source} reports it as not available"
