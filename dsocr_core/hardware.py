"""GPU presets (datasheet ceilings), matching of `torch.cuda.get_device_name()` strings, and calibration.

Presets are dense BF16 tensor-core peaks (FP32 accumulate, no sparsity) and DRAM bandwidth from the vendor
datasheets named in each preset's `source`. Calibration measures what the present device really achieves (a large
matmul in the runs' dtype and a device-to-device copy) and returns a Hardware with calibrated=True.
"""
from __future__ import annotations

import datetime as _dt
import re
import statistics
import time

from .spec import Hardware, SpecError

_H100_DS = ("NVIDIA H100 Tensor Core GPU datasheet, "
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet")
_A100_DS = ("NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/"
            "a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")

PRESETS: dict[str, Hardware] = {
    "h200": Hardware(name="NVIDIA H200 SXM", peak_tflops=989, bandwidth_tbs=4.8, memory_gb=141,
                     source="NVIDIA H200 Tensor Core GPU datasheet (H200 SXM: BF16 1,979 TFLOPS with sparsity, "
                            "989 dense; 141 GB HBM3e at 4.8 TB/s), https://www.nvidia.com/en-us/data-center/h200/"),
    "h100-sxm": Hardware(name="NVIDIA H100 SXM", peak_tflops=989, bandwidth_tbs=3.35, memory_gb=80,
                         source=_H100_DS + " (H100 SXM: BF16 1,979 TFLOPS with sparsity, 989 dense; 80 GB HBM3 "
                                           "at 3.35 TB/s)"),
    "h100-pcie": Hardware(name="NVIDIA H100 PCIe", peak_tflops=756, bandwidth_tbs=2.0, memory_gb=80,
                          source=_H100_DS + " (H100 PCIe: BF16 1,513 TFLOPS with sparsity, 756 dense; 80 GB HBM2e "
                                            "at 2.0 TB/s)"),
    "h20": Hardware(name="NVIDIA H20", peak_tflops=148, bandwidth_tbs=4.0, memory_gb=96,
                    source="NVIDIA H20 product brief (China-market Hopper; NVIDIA publishes no public datasheet "
                           "page): BF16 148 TFLOPS dense, 96 GB HBM3 at 4.0 TB/s"),
    "a100-sxm-80gb": Hardware(name="NVIDIA A100 SXM 80GB", peak_tflops=312, bandwidth_tbs=2.039, memory_gb=80,
                              source=_A100_DS + " (A100 80GB SXM: BF16 312 TFLOPS dense; HBM2e at 2,039 GB/s)"),
    "a100-sxm-40gb": Hardware(name="NVIDIA A100 SXM 40GB", peak_tflops=312, bandwidth_tbs=1.555, memory_gb=40,
                              source=_A100_DS + " (A100 40GB SXM: BF16 312 TFLOPS dense; HBM2 at 1,555 GB/s)"),
    "l40s": Hardware(name="NVIDIA L40S", peak_tflops=362, bandwidth_tbs=0.864, memory_gb=48,
                     source="NVIDIA L40S GPU datasheet (BF16 733 TFLOPS with sparsity, 362 dense; 48 GB GDDR6 at "
                            "864 GB/s), https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"),
    "rtx4090": Hardware(name="NVIDIA GeForce RTX 4090", peak_tflops=165, bandwidth_tbs=1.008, memory_gb=24,
                        source="NVIDIA Ada Lovelace GPU Architecture whitepaper, GeForce RTX 4090 table (BF16 tensor "
                               "with FP32 accumulate 165.2 TFLOPS dense; 24 GB GDDR6X at 1,008 GB/s), "
                               "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    "rtx5090": Hardware(name="NVIDIA GeForce RTX 5090", peak_tflops=209.5, bandwidth_tbs=1.792, memory_gb=32,
                        source="NVIDIA RTX Blackwell GPU Architecture whitepaper, GeForce RTX 5090 table (BF16 "
                               "tensor with FP32 accumulate 209.5 TFLOPS dense; 32 GB GDDR7 at 1,792 GB/s), "
                               "https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
                               "nvidia-rtx-blackwell-gpu-architecture.pdf"),
    "b200": Hardware(name="NVIDIA B200", peak_tflops=2250, bandwidth_tbs=8.0, memory_gb=180,
                     source="NVIDIA HGX B200 datasheet, per GPU (FP16/BF16 4.5 PFLOPS with sparsity, 2.25 dense; "
                            "180 GB HBM3e at 8 TB/s), https://www.nvidia.com/en-us/data-center/hgx/"),
}

# (preset, pattern that must match, pattern that must not) on the normalised device name; the exclusions keep
# look-alike products with other clocks or memory (NVL, laptop and China "D" variants, A100 PCIe) unmatched.
_DEVICE_PATTERNS: list[tuple[str, str, str | None]] = [
    ("h200", r"\bh200\b", r"\bnvl\b"),
    ("h100-pcie", r"\bh100\b.*\bpcie\b", None),
    ("h100-sxm", r"\bh100\b.*\b(sxm\d?|hbm3)\b", r"\b(nvl|pcie)\b"),
    ("h20", r"\bh20\b", None),
    ("a100-sxm-80gb", r"\ba100\b.*\bsxm\d?\b.*\b80gb\b", None),
    ("a100-sxm-40gb", r"\ba100\b.*\bsxm\d?\b.*\b40gb\b", None),
    ("l40s", r"\bl40s\b", None),
    ("rtx4090", r"\brtx 4090\b", r"\b(laptop|mobile)\b|4090 d\b"),
    ("rtx5090", r"\brtx 5090\b", r"\b(laptop|mobile)\b|5090 d\b"),
    ("b200", r"\bb200\b", None),
]


def _normalise(name: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"[-_/,()]", " ", name.lower())).strip()


def preset_names() -> list[str]:
    return list(PRESETS)


def match_device_name(device_name: str) -> Hardware | None:
    """The preset for a `torch.cuda.get_device_name()` string ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB",
    "NVIDIA GeForce RTX 4090", ...), or None when no preset describes that exact product."""
    norm = _normalise(device_name)
    for key, pattern, exclude in _DEVICE_PATTERNS:
        if re.search(pattern, norm) and not (exclude and re.search(exclude, norm)):
            return PRESETS[key]
    return None


def get_hardware(name: str) -> Hardware:
    """A preset by key ("h200", "h100-sxm", "rtx4090"; case, spaces and dashes ignored) or by device name.
    Raises SpecError naming the presets when nothing matches."""
    if not isinstance(name, str) or not name.strip():
        raise SpecError("hardware name is empty")
    squash = lambda s: re.sub(r"[\s\-_]", "", s.lower())  # noqa: E731
    by_key = {squash(k): hw for k, hw in PRESETS.items()}
    hw = by_key.get(squash(name)) or match_device_name(name)
    if hw is None:
        raise SpecError(f"unknown hardware {name!r}; presets: {', '.join(PRESETS)} "
                        "(or a torch.cuda.get_device_name() string of one of them)")
    return hw


def run_ceilings(run: dict) -> tuple[Hardware | None, Hardware | None]:
    """(datasheet, calibrated) ceilings of a stored run: the preset matching its GPU name and the calibration
    stored in its meta (measured in the same run), each None when unknown (e.g. a CPU run)."""
    env = run.get("environment") or {}
    datasheet = match_device_name(env["gpu_name"]) if env.get("gpu_name") else None
    cal = (run.get("meta") or {}).get("calibration")
    return datasheet, (Hardware(**cal) if cal else None)


# --------------------------------------------------------------------------------------------- calibration
class CalibrationError(SpecError):
    """Calibration cannot run here (no CUDA device, bad sizes)."""


def _median_seconds(fn, device: str, warmup: int, repeats: int, best: bool = False) -> float:
    """Median (best=True: shortest) wall time of fn() on `device`: CUDA events around each repeat on GPUs,
    perf_counter on CPU."""
    import torch

    if warmup < 0 or repeats < 1:
        raise CalibrationError("need warmup >= 0 and repeats >= 1")
    for _ in range(warmup):
        fn()
    samples = []
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)  # ms -> s
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return min(samples) if best else statistics.median(samples)


def _check_device(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise CalibrationError("calibration needs a CUDA GPU, but torch.cuda.is_available() is False "
                                   "(use a preset with --hardware NAME, or device='cpu' for a smoke test)")
    elif device != "cpu":
        raise CalibrationError(f"unsupported calibration device {device!r}; use 'cuda', 'cuda:N' or 'cpu'")


MATMUL_DTYPES = ("bfloat16", "float16", "float32")


def _torch_dtype(dtype: str):
    import torch

    if dtype not in MATMUL_DTYPES:
        raise CalibrationError(f"unsupported calibration dtype {dtype!r}; use one of {', '.join(MATMUL_DTYPES)}")
    return getattr(torch, dtype)


def measure_matmul_flops(size: int = 8192, device: str = "cuda", warmup: int = 3, repeats: int = 10,
                         dtype: str = "bfloat16", best: bool = False) -> float:
    """Achieved FLOP/s of a size^3 matmul in `dtype` (2*size^3 FLOPs per call), median (best=True: fastest) of
    `repeats` after warm-up. Measure in the dtype the runs use: a CPU without bf16 units runs a bf16 matmul tens of
    times slower than a float32 one, and a ceiling measured that way is no bound of a float32 run."""
    import torch

    _check_device(device)
    if size < 1:
        raise CalibrationError("matmul size must be positive")
    kind = _torch_dtype(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, generator=gen).to(kind)
    b = torch.randn(size, size, device=device, generator=gen).to(kind)
    out = torch.empty(size, size, device=device, dtype=kind)
    seconds = _median_seconds(lambda: torch.mm(a, b, out=out), device, warmup, repeats, best)
    return 2.0 * size ** 3 / seconds  # 2 FLOPs per multiply-add


def cpu_matmul_size(dtype: str = "float32", target_s: float = 0.15, largest: int = 2048) -> int:
    """The matmul size a CPU calibration uses: doubled from 256 until one call takes `target_s` (or `largest`).
    A small matmul does not reach a CPU's peak (1024^3 float32 reached a quarter of 2048^3's on a 2-core
    machine), and a large bf16 one on a CPU without bf16 units takes minutes: the size follows the speed."""
    import torch

    kind = _torch_dtype(dtype)
    size = 256
    while size < largest:
        a = torch.ones(size, size, dtype=kind)
        t0 = time.perf_counter()
        torch.mm(a, a)
        if time.perf_counter() - t0 >= target_s:
            break
        size *= 2
    return size


def measure_copy_bandwidth(nbytes: int = 1 << 30, device: str = "cuda", warmup: int = 3, repeats: int = 10,
                           best: bool = False) -> float:
    """Achieved copy bandwidth in bytes/s, counting bytes read plus bytes written (2 * nbytes per copy); median
    (best=True: fastest) of `repeats`."""
    import torch

    _check_device(device)
    if nbytes < 1:
        raise CalibrationError("copy size must be positive")
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda: dst.copy_(src), device, warmup, repeats, best)
    return 2.0 * nbytes / seconds  # read + write


def calibrate(device: str = "cuda", matmul_size: int | None = 8192, copy_bytes: int = 1 << 30, warmup: int = 3,
              repeats: int = 10, dtype: str = "bfloat16") -> Hardware:
    """Measure the present device and return a calibrated Hardware: peak = achieved matmul FLOP/s in `dtype` (the
    dtype the runs use), bandwidth = achieved device-to-device copy (read + write). device='cpu' measures the CPU
    with the threads torch uses in this process (the runs' own), named in the Hardware's name; matmul_size=None
    there picks the size by speed (cpu_matmul_size)."""
    import torch

    _check_device(device)
    _torch_dtype(dtype)
    if matmul_size is None:
        matmul_size = cpu_matmul_size(dtype) if device == "cpu" else 8192
    flops = measure_matmul_flops(matmul_size, device, warmup, repeats, dtype)
    bandwidth = measure_copy_bandwidth(copy_bytes, device, warmup, repeats)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        memory_gb = torch.cuda.get_device_properties(device).total_memory / 1e9
        preset = match_device_name(name)
        where = name
    else:
        name, memory_gb, where = _cpu_identity(dtype)
        preset = None
    source = (f"calibrated on {where} at {when} with torch {torch.__version__}: {dtype} {matmul_size}^3 matmul "
              f"{flops / 1e12:.3g} TFLOP/s, copy of {copy_bytes / 2**20:.0f} MiB {bandwidth / 1e12:.3g} TB/s "
              f"(read + write), medians of {repeats} after {warmup} warm-up")
    if preset is not None:
        source += f"; datasheet {preset.peak_tflops:g} TFLOP/s, {preset.bandwidth_tbs:g} TB/s"
    return Hardware(name=name, peak_tflops=flops / 1e12, bandwidth_tbs=bandwidth / 1e12, memory_gb=memory_gb,
                    source=source, calibrated=True)


CPU_COPY_BYTES = (1 << 20, 8 << 20, 64 << 20)  # from cache to main memory: the bound takes the fastest


def cpu_ceilings(dtype: str = "float32") -> Hardware:
    """This CPU's ceilings in `dtype` with torch's threads, in about two seconds: what a CPU run stores (meta
    'calibration') as the bound of its own stages. A GPU's roofline under a CPU run is decades off, and a CPU's
    bf16 matmul is no bound of a float32 run.

    A lower bound must use the fastest rate the CPU reaches, not a typical one: the FASTEST of the repeats (on a
    shared machine other processes only ever slow a repeat down; medians of 3 taken under load put a page's LM
    prefill and decode 18-25% below their bound), of two matmul sizes, and of copies from 1 MiB (cache) to
    64 MiB (main memory): a small model's decode streams weights that sit in cache, faster than a large copy."""
    import torch

    size = cpu_matmul_size(dtype)
    flops = max(measure_matmul_flops(n, "cpu", 1, 5, dtype, best=True) for n in (size // 2, size))
    bandwidth = max(measure_copy_bandwidth(n, "cpu", 1, 7, best=True) for n in CPU_COPY_BYTES)
    name, memory_gb, where = _cpu_identity(dtype)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    source = (f"calibrated on {where} at {when} with torch {torch.__version__}: the fastest of 5 {dtype} matmuls "
              f"of {size // 2}^3 and {size}^3, {flops / 1e12:.3g} TFLOP/s, and of 7 copies each of 1, 8 and 64 MiB "
              f"(read + write), {bandwidth / 1e12:.3g} TB/s: a bound takes the fastest rate the CPU reaches")
    return Hardware(name=name, peak_tflops=flops / 1e12, bandwidth_tbs=bandwidth / 1e12, memory_gb=memory_gb,
                    source=source, calibrated=True)


def _cpu_identity(dtype: str) -> tuple[str, float, str]:
    """(name, memory in GB, where) of this CPU as its calibrations name it: the dtype and torch's threads, which
    the ceilings depend on."""
    import os

    import torch

    threads = torch.get_num_threads()
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return (f"CPU ({dtype}, {threads} thread{'s' if threads != 1 else ''})", memory_gb,
            f"CPU with {threads} torch thread(s)")
