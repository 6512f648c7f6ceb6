"""Roofline helpers on a Hardware: time, bound and attainable FLOP/s for arrays of FLOPs and bytes.

Rows and stages time themselves through cost.Row.times; these helpers serve charts and capacity planning.
"""
from __future__ import annotations

import numpy as np

from ..spec import Hardware


def roofline_time(flops, nbytes, hw: Hardware):
    """(compute_s, memory_s, time_s): time = max(FLOPs / peak, bytes / bandwidth)."""
    compute = np.asarray(flops, dtype=float) / hw.peak_flops  # seconds at the tensor-core peak
    memory = np.asarray(nbytes, dtype=float) / hw.bandwidth  # seconds at DRAM bandwidth
    return compute, memory, np.maximum(compute, memory)


def bound(flops, nbytes, hw: Hardware):
    """'compute' where FLOPs/bytes reaches the ridge point, else 'memory'; 'none' where both are zero."""
    compute, memory, time = roofline_time(flops, nbytes, hw)
    return np.where(time <= 0, "none", np.where(compute >= memory, "compute", "memory"))


def attainable_flops(intensity, hw: Hardware):
    """FLOP/s the roofline allows at an arithmetic intensity (FLOPs per byte): min(peak, intensity * bandwidth)."""
    return np.minimum(hw.peak_flops, np.asarray(intensity, dtype=float) * hw.bandwidth)
