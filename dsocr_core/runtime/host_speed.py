"""The host's speed right now: the host time of one small eager CUDA op, probed in a few milliseconds.

The reference session mode is host-bound: its stage times follow how fast the CPU issues ops. On the shared GPU
machines that speed is not a constant. A fresh process pinned to one core, then to another, measured one and the
same eager loop at 9.6 to 16.6 us per op, and a pure-Python loop at 32 to 65 ns per iteration, with no steal time
and CPU time equal to wall time (benchmarks/host_placement.py, docs/results/h100_host_placement_2026-11-27): the
same core was fast in one process and slow in the next, so the CPU itself runs at a speed that changes over
seconds. A point measured in a slow spell is slower, whatever the model. So every measured point records this
probe beside its times, the calibration records it beside the host costs it measures, and a measured point is
predicted at its own host speed (analytic/predict.py: the host costs scaled by the two probes' ratio).

The probe issues the kind of ops the reference model's expert loop issues (an index, a GEMM, SiLU, a multiply, an
index_put on small tensors), times their issue on the host (perf_counter, no synchronisation inside) and returns
the median per-op time of a few rounds. The device is synchronised before and after, so a timed run that follows
starts from an idle GPU, as it did before the probe. On a CPU there is no host term to scale: None.
"""
from __future__ import annotations

import statistics
import time

import torch

OPS_PER_PASS = 5
PASSES, ROUNDS = 40, 5  # 200 ops a round, about 2-3 ms; the median of 5 rounds

_tensors: dict[str, tuple] = {}


def _probe_tensors(device: torch.device) -> tuple:
    key = str(device)
    if key not in _tensors:  # its inputs made once per process and device (its temporaries come from the cache)
        a = torch.randn(8, 256, device=device, dtype=torch.bfloat16)
        w = torch.randn(128, 256, device=device, dtype=torch.bfloat16)
        idx = torch.arange(8, device=device)
        out = torch.empty(8, 128, device=device, dtype=torch.bfloat16)
        _tensors[key] = (a, w, idx, out)
    return _tensors[key]


def probe_host_op_s(device: torch.device | str) -> float | None:
    """Seconds of host time per small eager op on `device` now (median of ROUNDS rounds); None off CUDA."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if device.index is None:  # "cuda" is the current GPU: name it, so the cached inputs are that GPU's
        device = torch.device("cuda", torch.cuda.current_device())
    a, w, idx, out = _probe_tensors(device)
    times = []
    with torch.no_grad():
        torch.cuda.synchronize(device)
        for r in range(ROUNDS + 1):  # the first round warms the dispatcher's caches: not kept
            t0 = time.perf_counter()
            for _ in range(PASSES):
                h = torch.nn.functional.linear(a[idx], w)
                out[idx] = torch.nn.functional.silu(h) * h
            if r:
                times.append((time.perf_counter() - t0) / (PASSES * OPS_PER_PASS))
        torch.cuda.synchronize(device)
    return statistics.median(times)


def probe_median(probes: list[float | None]) -> float | None:
    """The median of probes taken around a measurement; None where the device had none (a CPU)."""
    return statistics.median(probes) if probes and probes[0] is not None else None
