"""Kernel microbenchmarks over kernel shape grids (never the model's stages), written into a calibration profile.

Tables (profile.py names them): GEMM efficiency by M, N, K per dtype; memory-bound kernels by bytes moved (copy,
elementwise add, LayerNorm, GEMV); attention by implementation (sdpa with the LM's backends, sdpa with a dense
additive mask as SAM runs it, the reference's eager softmax attention, flash) over heads x query x key x head dim,
and causal over heads x length x head dim; grouped expert GEMMs (torch._grouped_mm, or bmm where it cannot run)
by tokens per expert x N x K; and the per-launch costs: an empty kernel inside a CUDA graph, an eager launch
queued behind a busy GPU, the host time of one eager op, a host synchronisation, a graph replay's host time.

Timing on a GPU: each shape is captured N times in one CUDA graph over rotating inputs (enough copies to spill
the L2 cache, so weights come from DRAM as in the model) and the replay is timed with CUDA events: device time
per kernel, gaps included; the kernel's launch gap (the graph-kernel cost times its kernels) is subtracted, so a
table holds work time and the time model adds launches x the mode's per-launch cost back. On a CPU the same code
times eager calls with perf_counter (the tests run it with tiny shapes: `--device cpu --quick`).

Shapes above a work or memory cap, and shapes left when the time budget runs out, are not measured: they take
the value of the nearest measured shape of the same table (marked `measured: false` in the profile).
"""
from __future__ import annotations

import itertools
import math
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import numpy as np

from ..spec import DTYPE_BYTES
from .profile import KIND_AXES, LAUNCH_KEYS, Profile, build_profile, entry_work, table_kind

Progress = Callable[[int, int, str], None]  # (entries done, entries planned, what ran last)
ATTN_KERNELS = {"sdpa": 1, "flash": 1, "sdpa_bias": 1, "eager": 6, "eager.causal": 10}
GROUPED_EXPERTS = 64


@dataclass
class Settings:
    device: str
    quick: bool
    budget_s: float
    flops_cap: float  # per call
    memory_cap: float  # bytes of live inputs (all rotating copies)
    target_s: float  # device time one timed replay should take
    repeats: int
    max_inner: int
    l2_bytes: int
    experts: int = GROUPED_EXPERTS
    notes: list = field(default_factory=list)


def grids(quick: bool, device: str) -> dict[str, dict[str, list[float]]]:
    """The shape grid of every table (the full grid on a GPU, a tiny one with quick or on a CPU)."""
    if quick:
        g = {"m": [1, 16, 128], "n": [16, 128], "k": [16, 128]}
        att = {"bh": [1, 4], "q": [1, 16, 64], "k": [16, 64], "d": [16, 64]}
        causal = {"bh": [1, 4], "s": [16, 64], "d": [16, 64]}
        out = {"gemm.bfloat16": g, "gemm.float32": g}
        out |= {f"memory.{k}": {"bytes": [4096, 65536, 1 << 20]} for k in ("copy", "elementwise", "norm", "gemv")}
        for impl in ("sdpa", "eager", "flash"):
            out[f"attention.{impl}"] = att
            out[f"attention.{impl}.causal"] = causal
        out["attention.sdpa_bias"] = {"bh": [1, 4], "q": [16, 64], "k": [16, 64], "d": [16, 64]}
        out["grouped_gemm.bfloat16"] = {"tokens": [1, 8], "n": [64], "k": [64]}
        if device != "cpu":
            out.pop("attention.flash.causal")  # a quick GPU run keeps the flash table short
        return out
    gemm = {"m": [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536], "n": [16, 64, 256, 1024, 4096, 16384, 131072],
            "k": [64, 256, 1024, 4096, 16384]}
    small = {"m": [1, 16, 256, 4096, 65536], "n": [64, 1024, 16384, 131072], "k": [256, 1024, 4096]}
    att = {"bh": [1, 8, 64, 512, 4096], "q": [1, 16, 256, 1024, 4096], "k": [16, 256, 1024, 4096, 16384],
           "d": [64, 128, 256]}
    causal = {"bh": [1, 8, 64, 512], "s": [16, 256, 1024, 4096, 8192], "d": [64, 128, 256]}
    out = {"gemm.bfloat16": gemm}
    out |= {f"memory.{k}": {"bytes": [float(4 ** i) for i in range(6, 17)]}
            for k in ("copy", "elementwise", "norm", "gemv")}
    out |= {"attention.sdpa": att, "attention.sdpa.causal": causal,
            "grouped_gemm.bfloat16": {"tokens": [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096],
                                      "n": [256, 1024, 4096], "k": [256, 1024, 4096]},
            "attention.flash": att, "attention.flash.causal": causal,
            "attention.sdpa_bias": {"bh": [1, 8, 64, 512, 4096], "q": [16, 256, 1024, 4096],
                                    "k": [16, 256, 1024, 4096], "d": [64, 128, 256]},
            "attention.eager": {"bh": [1, 8, 64, 512], "q": [1, 16, 256, 1024, 4096], "k": [16, 256, 1024, 4096],
                                "d": [64, 128]},
            "attention.eager.causal": {"bh": [1, 8, 64], "s": [16, 256, 1024, 4096], "d": [64, 128]},
            "gemm.float32": small, "gemm.float16": small}
    return out


# ---------------------------------------------------------------------------------------------- kernels
def _dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _kernel(name: str, c: dict, dev: str, experts: int):
    """(make one input set, run the kernel on an input set, input bytes per set, kernels per call)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = table_kind(name)
    gen = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *shape, dt=torch.bfloat16: torch.randn(*shape, device=dev, dtype=dt, generator=gen)  # noqa: E731
    i = {k: int(round(v)) for k, v in c.items()}
    if kind == "gemm":
        dt = _dtype(name.split(".")[1])
        s = DTYPE_BYTES[name.split(".")[1]]
        return (lambda: (rnd(i["m"], i["k"], dt=dt), rnd(i["n"], i["k"], dt=dt)),
                lambda x: F.linear(x[0], x[1]), (i["m"] * i["k"] + i["n"] * i["k"]) * s, 1)
    if kind == "grouped_gemm":
        t, n, k = i["tokens"], i["n"], i["k"]
        offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * t
        make = lambda: (rnd(experts * t, k), rnd(experts, n, k))  # noqa: E731
        grouped = lambda x: torch._grouped_mm(x[0], x[1].transpose(1, 2), offs=offs)  # noqa: E731
        bmm = lambda x: torch.bmm(x[0].view(experts, t, k), x[1].transpose(1, 2))  # noqa: E731
        try:
            if not hasattr(torch, "_grouped_mm"):
                raise RuntimeError("no torch._grouped_mm")
            grouped(make())
            return make, grouped, experts * (t * k + n * k) * 2, 1
        except Exception:  # CPU, or a GPU/dtype without a grouped GEMM kernel: the batched GEMM stand-in
            return make, bmm, experts * (t * k + n * k) * 2, 1
    if kind == "memory":
        what = name.split(".")[1]
        nbytes = max(int(c["bytes"]), 64)
        if what == "copy":
            n = nbytes // 4  # bf16 elements: read + write = bytes
            return (lambda: (rnd(n), torch.empty(n, device=dev, dtype=torch.bfloat16)),
                    lambda x: x[1].copy_(x[0]), 2 * n * 2, 1)
        if what == "elementwise":
            n = max(nbytes // 6, 1)  # two reads and a write
            return lambda: (rnd(n), rnd(n)), lambda x: torch.add(x[0], x[1]), 2 * n * 2, 1
        if what == "norm":
            width = 1024
            rows = max(nbytes // (4 * width), 1)  # read and write [rows, 1024] bf16
            return (lambda: (rnd(rows, width), torch.ones(width, device=dev, dtype=torch.bfloat16)),
                    lambda x: F.layer_norm(x[0], (width,), x[1]), rows * width * 2, 1)
        k = 2048
        n = max(nbytes // (2 * k), 1)  # weight [n, 2048] bf16 dominates
        return lambda: (rnd(1, k), rnd(n, k)), lambda x: F.linear(x[0], x[1]), (n * k + k) * 2, 1
    impl = name.split(".")[1]
    causal = kind == "attention_causal"
    bh, d = i["bh"], i["d"]
    q, k = (i["s"], i["s"]) if causal else (i["q"], i["k"])
    make = lambda: (rnd(1, bh, q, d), rnd(1, bh, k, d), rnd(1, bh, k, d))  # noqa: E731
    nbytes = bh * (q + 2 * k) * d * 2
    if impl == "eager":  # the reference LM's eager attention (model/decoder.py Attention._eager), op for op
        def eager(x):
            qq, kk, vv = x
            scores = torch.matmul(qq, kk.transpose(-1, -2)) * d ** -0.5
            if causal:
                mask = torch.ones(q, k, dtype=torch.bool, device=qq.device).tril(diagonal=k - q)
                scores = scores.masked_fill(~mask, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).to(qq.dtype)
            return torch.matmul(probs, vv)
        return make, eager, nbytes, ATTN_KERNELS["eager.causal" if causal else "eager"]
    if impl == "sdpa_bias":  # SAM: a dense additive mask, default SDPA backends
        return (lambda: (*make(), rnd(1, bh, q, k)),
                lambda x: F.scaled_dot_product_attention(x[0], x[1], x[2], attn_mask=x[3]), nbytes + bh * q * k * 2, 1)
    backends = ([SDPBackend.FLASH_ATTENTION] if impl == "flash" else
                [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])  # the LM's list

    def sdpa(x):
        with sdpa_kernel(backends):
            return F.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=causal)
    return make, sdpa, nbytes, 1


# ---------------------------------------------------------------------------------------------- timing
def _sync(dev: str):
    import torch

    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)


def _time_calls(run: Callable[[int], object], n: int, st: Settings) -> float:
    """Seconds per call: a CUDA graph of n calls replayed (events) on a GPU, perf_counter on a CPU."""
    import torch

    samples = []
    if st.device.startswith("cuda"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for j in range(2):
                run(j)
        torch.cuda.current_stream().wait_stream(side)
        _sync(st.device)
        graph = None
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for j in range(n):
                    run(j)
            replay = graph.replay
        except Exception:  # not capturable: eager launches, timed the same way
            graph = None
            _sync(st.device)

            def replay():
                for j in range(n):
                    run(j)
        replay()
        _sync(st.device)
        for _ in range(st.repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            replay()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / 1e3 / n)
        del graph
        return statistics.median(samples)
    run(0)
    for _ in range(st.repeats):
        t0 = time.perf_counter()
        for j in range(n):
            run(j)
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def _estimate(run: Callable[[int], object], st: Settings) -> float:
    """One call's time, roughly (to size the timed loop)."""
    import torch

    run(0)
    _sync(st.device)
    if st.device.startswith("cuda"):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(0)
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3
    t0 = time.perf_counter()
    run(0)
    return time.perf_counter() - t0


def measure_entry(name: str, coords: dict, st: Settings) -> float:
    """Per-call time of one table entry (device time in a graph on a GPU), launch gaps included."""
    make, op, set_bytes, _ = _kernel(name, coords, st.device, st.experts)
    copies = int(min(max(math.ceil(2 * st.l2_bytes / max(set_bytes, 1)), 1), 16 if st.quick else 64,
                     max(st.memory_cap // max(set_bytes, 1), 1)))
    sets = [make() for _ in range(copies)]
    run = lambda j: op(sets[j % copies])  # noqa: E731
    one = max(_estimate(run, st), 1e-7)
    n = int(min(max(round(st.target_s / one), 1), st.max_inner))
    n = max(n, min(copies, st.max_inner))
    return _time_calls(run, n, st)


def launch_costs(st: Settings) -> dict[str, float]:
    """The per-launch costs (LAUNCH_KEYS)."""
    import torch

    x = torch.zeros(1, device=st.device)
    n = 50 if st.quick else 200
    if not st.device.startswith("cuda"):
        per = _time_calls(lambda j: x.add_(1), n, st)
        return {"graph_kernel_s": per, "eager_kernel_s": per, "host_op_s": per, "sync_s": 0.0, "graph_launch_s": 0.0}
    graph_kernel = _time_calls(lambda j: x.add_(1), n, st)
    eager = []
    for _ in range(st.repeats):  # queue the launches behind a busy GPU: the device-side cost of each
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(2e7))  # ~10 ms of GPU time, so the host is far ahead when the adds run
        a.record()
        for _ in range(n):
            x.add_(1)
        b.record()
        b.synchronize()
        eager.append(a.elapsed_time(b) / 1e3 / n)
    host = []
    for _ in range(st.repeats):
        torch.cuda._sleep(int(2e7))
        t0 = time.perf_counter()
        for _ in range(n):
            x.add_(1)
        host.append((time.perf_counter() - t0) / n)
        _sync(st.device)
    syncs = []
    for _ in range(20):
        t0 = time.perf_counter()
        x.add_(1)
        x.item()  # launch, finish, copy one value to the host
        syncs.append(time.perf_counter() - t0)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        x.add_(1)
    replays = []
    for _ in range(20):
        _sync(st.device)
        t0 = time.perf_counter()
        g.replay()
        replays.append(time.perf_counter() - t0)
    _sync(st.device)
    return {"graph_kernel_s": graph_kernel, "eager_kernel_s": statistics.median(eager),
            "host_op_s": statistics.median(host), "sync_s": max(statistics.median(syncs) - statistics.median(host), 0.0),
            "graph_launch_s": statistics.median(replays)}


# ---------------------------------------------------------------------------------------------- the sweep
def _entries(name: str, axes: dict) -> list[tuple[tuple[int, ...], dict]]:
    names = KIND_AXES[table_kind(name)]
    out = []
    for idx in itertools.product(*(range(len(axes[a])) for a in names)):
        out.append((idx, {a: float(axes[a][i]) for a, i in zip(names, idx)}))
    return out


def _too_big(name: str, coords: dict, st: Settings) -> bool:
    flops, nbytes = entry_work(name, coords, {"experts": st.experts})
    _, _, set_bytes, _ = _kernel_bytes(name, coords, st)
    return float(flops) > st.flops_cap or set_bytes > st.memory_cap / 2 or float(nbytes) > 4 * st.memory_cap


def _kernel_bytes(name: str, c: dict, st: Settings):
    """Input bytes of one entry without allocating (for the caps)."""
    kind = table_kind(name)
    if kind == "gemm":
        s = DTYPE_BYTES[name.split(".")[1]]
        return None, None, (c["m"] * c["k"] + c["n"] * c["k"] + c["m"] * c["n"]) * s, 1
    if kind == "grouped_gemm":
        return None, None, st.experts * (c["tokens"] * (c["k"] + c["n"]) + c["n"] * c["k"]) * 2, 1
    if kind == "memory":
        return None, None, c["bytes"], 1
    q, k = (c["s"], c["s"]) if kind == "attention_causal" else (c["q"], c["k"])
    extra = c["bh"] * q * k * (2 if name.startswith("attention.sdpa_bias") else 0)
    if name.startswith("attention.eager"):
        extra = c["bh"] * q * k * 12  # scores, fp32 copy, probabilities
    return None, None, c["bh"] * (2 * q + 2 * k) * c["d"] * 2 + extra, 1


def _fill(measured: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Entries not measured take the value of the nearest measured entry (L1 distance in grid steps; ties: the
    one with the larger shape, since unmeasured entries are the largest or the last)."""
    out = values.copy()
    have = np.argwhere(measured)
    for idx in np.argwhere(~measured):
        dist = np.abs(have - idx).sum(1)
        best = np.flatnonzero(dist == dist.min())
        pick = have[best[np.argmax(have[best].sum(1))]]
        out[tuple(idx)] = values[tuple(pick)]
    return out


def run_microbench(device: str = "cuda", quick: bool = False, budget_s: float = 300.0,
                   progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                   tables: list[str] | None = None) -> Profile:
    """Run every table's grid (or `tables` only) within `budget_s` seconds and return the profile."""
    import torch

    from ..measure.environment import capture_environment

    start = time.perf_counter()
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("calibrate --device cuda needs a CUDA GPU (torch.cuda.is_available() is False); "
                           "use --device cpu for a CPU profile")
    if not cuda and device != "cpu":
        raise ValueError(f"unsupported device {device!r}; use cuda, cuda:N or cpu")
    if cuda:
        props = torch.cuda.get_device_properties(device)
        free, _ = torch.cuda.mem_get_info(device)
        dev_info = {"name": torch.cuda.get_device_name(device), "kind": "cuda",
                    "sm_count": int(props.multi_processor_count), "memory_gb": props.total_memory / 1e9,
                    "l2_bytes": int(getattr(props, "L2_cache_size", 50 << 20))}
        st = Settings(device, quick, budget_s, flops_cap=2e11 if quick else 4e12,
                      memory_cap=min(8e9, 0.3 * free), target_s=5e-4 if quick else 2e-3,
                      repeats=3 if quick else 5, max_inner=50 if quick else 200, l2_bytes=dev_info["l2_bytes"])
    else:
        import os
        import platform

        dev_info = {"name": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)",
                    "kind": "cpu", "sm_count": None, "memory_gb": None, "l2_bytes": None}
        st = Settings(device, quick, budget_s, flops_cap=5e7 if quick else 5e9, memory_cap=64e6 if quick else 1e9,
                      target_s=2e-4 if quick else 5e-3, repeats=2 if quick else 3, max_inner=8 if quick else 50,
                      l2_bytes=1 << 20, experts=4 if quick else GROUPED_EXPERTS)
    if quick and cuda:
        st.experts = 8
    launch = launch_costs(st)
    gap = launch["graph_kernel_s"] if cuda else launch["eager_kernel_s"]
    plan = grids(quick, device)
    if tables is not None:
        plan = {k: v for k, v in plan.items() if k in tables}
    jobs = [(name, idx, c) for name, axes in plan.items() for idx, c in _entries(name, axes)]
    raw: dict[str, np.ndarray] = {n: np.full(tuple(len(plan[n][a]) for a in KIND_AXES[table_kind(n)]), np.nan)
                                  for n in plan}
    failed: dict[str, str] = {}
    skipped = {"cap": 0, "budget": 0, "error": 0}
    stopped = False
    for done, (name, idx, coords) in enumerate(jobs, 1):
        if should_stop is not None and should_stop():
            stopped = True
        if stopped or time.perf_counter() - start > budget_s:
            skipped["budget"] += 1
        elif _too_big(name, coords, st):
            skipped["cap"] += 1
        else:
            try:
                t = measure_entry(name, coords, st)
                kernels = _kernel_count(name)
                raw[name][idx] = max(t - kernels * gap, 0.05 * t)  # work time: the launch gaps taken out
            except Exception as exc:  # an unsupported kernel (flash on a CPU) or an out-of-memory: not measured
                skipped["error"] += 1
                failed.setdefault(name, f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
                if cuda:
                    torch.cuda.empty_cache()
        if progress is not None:
            progress(done, len(jobs), name)
    if cuda:
        torch.cuda.empty_cache()
    if not any(np.isfinite(t).any() for n, t in raw.items() if n.startswith("gemm.")):
        raise RuntimeError(f"calibration measured no GEMM shape (budget {budget_s:g} s, skipped {skipped}, "
                           f"failures {failed or 'none'}); a profile needs at least one GEMM table")
    ceilings = _ceilings(dev_info, raw, plan, st)
    out_tables = {}
    for name, t_work in raw.items():
        measured = np.isfinite(t_work)
        if not measured.any():
            st.notes.append(f"{name}: nothing measured ({failed.get(name, 'over the caps or the budget')})")
            continue
        meta = {"dtype": name.split(".")[1] if table_kind(name) in ("gemm", "grouped_gemm") else "bfloat16",
                "launch_gap_subtracted_s": gap, "kernels_per_call": _kernel_count(name)}
        if table_kind(name) == "grouped_gemm":
            meta["experts"] = st.experts
        axes = {a: list(plan[name][a]) for a in KIND_AXES[table_kind(name)]}
        mesh = np.meshgrid(*[np.asarray(v, dtype=float) for v in axes.values()], indexing="ij")
        flops, nbytes = entry_work(name, dict(zip(axes, mesh)), meta)
        roof = np.maximum(flops / ceilings["flops_per_s"], nbytes / ceilings["bytes_per_s"])
        eff = np.where(measured, roof / np.where(measured, t_work, 1.0), np.nan)
        eff = _fill(measured, np.clip(eff, 1e-9, 1e3))
        out_tables[name] = {"axes": axes, "efficiency": eff.tolist(), "measured": measured.tolist(), "meta": meta}
    elapsed = time.perf_counter() - start
    versions = _versions()
    env = capture_environment(device)
    return build_profile(
        device=dev_info, environment=env, versions=versions, ceilings=ceilings, launch=launch, tables=out_tables,
        calibration={"quick": quick, "budget_s": budget_s, "elapsed_s": round(elapsed, 2),
                     "complete": not stopped and skipped["budget"] == 0, "stopped": stopped,
                     "entries": len(jobs), "skipped": skipped, "failed": failed, "notes": st.notes,
                     "caps": {"flops_per_call": st.flops_cap, "memory_bytes": st.memory_cap},
                     "timing": "CUDA graph replay, events" if cuda else "perf_counter, eager"},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def _kernel_count(name: str) -> int:
    kind = table_kind(name)
    if kind in ("attention", "attention_causal"):
        impl = name.split(".")[1]
        return ATTN_KERNELS["eager.causal" if impl == "eager" and kind == "attention_causal" else impl]
    return 1


def _ceilings(dev_info: dict, raw: dict, plan: dict, st: Settings) -> dict:
    """The datasheet peaks of a GPU with a preset; otherwise the best measured GEMM and copy rates."""
    from ..hardware import match_device_name

    preset = match_device_name(dev_info["name"]) if dev_info["kind"] == "cuda" else None
    if preset is not None:
        return {"flops_per_s": preset.peak_flops, "bytes_per_s": preset.bandwidth,
                "source": f"datasheet {preset.name}: {preset.peak_tflops:g} TFLOP/s, {preset.bandwidth_tbs:g} TB/s"}
    best = {}
    for name, kind_key in (("gemm.bfloat16", 0), ("memory.copy", 1)):
        t = raw.get(name)
        if t is None or not np.isfinite(t).any():
            continue
        axes = plan[name]
        mesh = np.meshgrid(*[np.asarray(axes[a], dtype=float) for a in KIND_AXES[table_kind(name)]], indexing="ij")
        flops, nbytes = entry_work(name, dict(zip(KIND_AXES[table_kind(name)], mesh)))
        rate = (flops if kind_key == 0 else nbytes) / np.where(np.isfinite(t), t, np.inf)
        best[kind_key] = float(np.max(rate))
    fl, bw = best.get(0, 1e12), best.get(1, 1e11)
    return {"flops_per_s": fl, "bytes_per_s": bw,
            "source": f"best measured on {dev_info['name']} (no datasheet preset): GEMM {fl / 1e12:.3g} TFLOP/s, "
                      f"copy {bw / 1e9:.3g} GB/s (read + write)"}


def _versions() -> dict:
    import platform

    import torch

    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "numpy": np.__version__,
           "python": platform.python_version(), "dsocr_core": "0.1.0"}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = None
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        out["cudnn"] = None
    return out


__all__ = ["LAUNCH_KEYS", "Settings", "grids", "launch_costs", "measure_entry", "run_microbench"]
