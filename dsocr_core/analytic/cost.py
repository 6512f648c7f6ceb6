"""The cost of one module row, as numpy arrays (or scalars) that broadcast over sweep points.

A `Cost` holds additive counts (FLOPs and bytes moved) and footprints (weight, peak activation and KV memory).
A `Row` is one kind of module (e.g. every windowed SAM block's `attn`): the module paths it stands for, the cost
of ONE such module summed over the calls it takes part in, and the per-call parts the roofline times separately
(a kernel is compute or memory bound on its own, so times add per call, not per sum).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ADDITIVE = ("tensor_flops", "tensor_flops_causal", "other_flops", "weight_bytes", "act_read", "act_write",
            "kv_read", "kv_write")
FOOTPRINT = ("peak_activation", "kv_memory")  # combine by max across calls
FIELDS = ADDITIVE + FOOTPRINT + ("weight_memory",)


@dataclass(eq=False)
class Cost:
    """Counts of one call of a module (or of several calls, once combined)."""

    tensor_flops: object = 0.0  # mm/addmm/bmm/conv/SDPA FLOPs, the FlopCounterMode convention (non-causal SDPA)
    tensor_flops_causal: object = 0.0  # the same with attention counted causally (work a causal kernel really does)
    other_flops: object = 0.0  # norms, activations, softmax, rope, routing, residual adds (not counted by torch)
    weight_bytes: object = 0.0  # parameter bytes read
    act_read: object = 0.0  # activation bytes read
    act_write: object = 0.0  # activation bytes written
    kv_read: object = 0.0  # KV-cache bytes read (entries cached by earlier calls)
    kv_write: object = 0.0  # KV-cache bytes written (this call's new keys and values)
    peak_activation: object = 0.0  # largest live activation set while this module runs
    kv_memory: object = 0.0  # KV-cache size owned by this module after the call
    weight_memory: object = 0.0  # parameter bytes of the module

    @property
    def bytes(self):
        return self.weight_bytes + self.act_read + self.act_write + self.kv_read + self.kv_write

    @property
    def flops(self):
        return self.tensor_flops + self.other_flops

    def scaled(self, views, calls) -> "Cost":
        """A per-view cost made into one call over `views` views: everything grows with the views except the
        weights, read once per call (`calls` is 0 or 1, 0 when the call does not happen)."""
        out = Cost(**{f: getattr(self, f) * views for f in ADDITIVE + FOOTPRINT})
        out.weight_bytes = self.weight_bytes * calls  # weights are read once per forward call
        out.weight_memory = self.weight_memory
        return out

    def then(self, other: "Cost") -> "Cost":
        """Two calls of the same module one after the other: counts add, footprints take the larger."""
        out = Cost(**{f: getattr(self, f) + getattr(other, f) for f in ADDITIVE})
        for f in FOOTPRINT:
            setattr(out, f, np.maximum(getattr(self, f), getattr(other, f)))
        out.weight_memory = self.weight_memory
        return out

    def roofline(self, peak_flops: float, bandwidth: float):
        """(compute seconds, memory seconds) of this call: all FLOPs at the tensor-core peak, all bytes at DRAM
        bandwidth. Elementwise work is memory bound by far, so charging its FLOPs at the matmul peak is harmless."""
        return self.flops / peak_flops, self.bytes / bandwidth


def affine_sum(first, last, n):
    """Sum over n equally spaced steps of a quantity affine in the step index, from its first and last values."""
    return n * (first + last) / 2  # arithmetic series


def sum_of_max(c0, c1, m0, m1, n):
    """Sum over n steps i = 0..n-1 of max(c_i, m_i) where c and m are affine in i with first values c0, m0 and last
    values c1, m1 (closed form, no loop over steps). Used for decode time summed over contexts.
    With n == 1 the first and last values must be those of the same (only) step."""
    n = np.asarray(n, dtype=float)
    last = np.maximum(n - 1, 1)
    h0 = c0 - m0  # compute minus memory time at the first step
    dh = np.where(n > 1, ((c1 - m1) - h0) / last, 0.0)  # its change per step
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.where(dh != 0, -h0 / np.where(dh != 0, dh, 1), 0.0)  # step index where compute = memory
    # dh > 0: positive for i >= start; dh < 0: positive for i < stop; dh == 0: everywhere or nowhere
    start = np.where(dh > 0, np.clip(np.floor(root) + 1, 0, n), np.where((dh == 0) & (h0 > 0), 0, n))
    stop = np.where(dh < 0, np.clip(np.ceil(root), 0, n), n)
    start = np.where(dh < 0, 0, start)
    count = np.maximum(stop - start, 0)  # steps where compute exceeds memory
    idx_sum = (start + stop - 1) * count / 2  # sum of their step indices
    excess = np.maximum(count * h0 + dh * idx_sum, 0.0)  # sum of (c - m) over those steps
    return affine_sum(m0, m1, n) + excess  # sum of m plus the excess where c > m


@dataclass(eq=False)
class Row:
    """One kind of module: identical cost for every path in `paths` (per module, not multiplied by len(paths))."""

    stage: str  # sam | clip | projector | prefill | decode
    kind: str  # e.g. "sam.attn.windowed"
    paths: tuple[str, ...]  # torch module paths this row stands for
    cost: Cost  # one module, all its calls combined
    parts: tuple[Cost, ...] = ()  # per-call costs timed separately (vision: global views, tile views)
    steps: tuple[Cost, Cost, object] | None = None  # decode: (first step, last step, number of steps)
    ctx: tuple[dict, ...] = ()  # kernel shapes of each part (or of the call): what analytic/predict.py times

    @property
    def count(self) -> int:
        return len(self.paths)

    def times(self, peak_flops: float, bandwidth: float):
        """(compute_s, memory_s, time_s) of one module on a roofline, time = sum over calls of max(compute, memory)."""
        if self.steps is not None:
            first, last, n = self.steps
            c0, m0 = first.roofline(peak_flops, bandwidth)
            c1, m1 = last.roofline(peak_flops, bandwidth)
            return affine_sum(c0, c1, n), affine_sum(m0, m1, n), sum_of_max(c0, c1, m0, m1, n)
        compute = memory = time = 0.0
        for part in self.parts or (self.cost,):
            c, m = part.roofline(peak_flops, bandwidth)
            compute, memory, time = compute + c, memory + m, time + np.maximum(c, m)
        return compute, memory, time
