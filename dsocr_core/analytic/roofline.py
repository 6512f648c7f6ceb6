"""The roofline: time, bound and attainable FLOP/s for arrays of FLOPs and bytes on a Hardware.

`bound_of` is the one place a bound is decided: rows and stages time themselves through cost.Row.times and name
their bound with it. `roofline_time` and `attainable_flops` serve floors, charts and capacity planning.
"""
from __future__ import annotations

import numpy as np

from ..spec import Hardware


def roofline_time(flops, nbytes, hw: Hardware):
    """(compute_s, memory_s, time_s): time = max(FLOPs / peak, bytes / bandwidth)."""
    compute = np.asarray(flops, dtype=float) / hw.peak_flops  # seconds at the tensor-core peak
    memory = np.asarray(nbytes, dtype=float) / hw.bandwidth  # seconds at DRAM bandwidth
    return compute, memory, np.maximum(compute, memory)


_BOUND_NAMES = np.array(["memory", "compute", "none"])


def bound_of(compute_s, memory_s, time_s):
    """'compute' where the compute time reaches the memory time, else 'memory'; 'none' where there is no work.
    Arrays in, an array of names out (a scalar for scalars)."""
    idx = (np.asarray(compute_s) >= np.asarray(memory_s)).astype(np.int8)
    idx = np.where(np.asarray(time_s) <= 0, 2, idx)
    names = _BOUND_NAMES[idx]
    return str(names) if names.ndim == 0 else names



def attainable_flops(intensity, hw: Hardware):
    """FLOP/s the roofline allows at an arithmetic intensity (FLOPs per byte): min(peak, intensity * bandwidth)."""
    return np.minimum(hw.peak_flops, np.asarray(intensity, dtype=float) * hw.bandwidth)
