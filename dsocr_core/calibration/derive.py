"""Profiles for GPUs one does not have: a measured profile's kernel tables moved to another GPU's datasheet.

For every table entry (a kernel shape) the measured work time on the source GPU, t_S = roofline_S / efficiency,
is moved to the target by what limits that kernel on the source:

* memory-bound entries (bytes / bandwidth >= FLOPs / peak on the source): t_T = L + (t_S - L) x W_S / W_T, where
  L is the table's fixed cost per kernel: its smallest measured entry's time beyond what that entry's bytes
  take at the best bandwidth the table reached (0 for a one-entry table). Launch latency, the first loads' round
  trip, the grid's ramp and tail do not shrink with a wider memory bus, only the streaming does (without L, a
  3 MB kernel that is latency-bound on both GPUs was moved by the full bandwidth ratio); an entry faster than L
  keeps its time;
* compute-bound entries: t_T = t_S x rate_S(c) / rate_T(c), with rate(c) = peak x min(c, SMs) / SMs and c the
  kernel's thread blocks (128 x 128 output tiles of a GEMM, per expert for grouped GEMMs, 128-query tiles per
  head of attention): a kernel too small to fill the GPU runs on c SMs at the per-SM rate, so more SMs do not
  help it and a faster SM does; a kernel that fills both GPUs scales with the peak ratio. Without an SM count
  (a preset lacks one) the peak ratio is used for every compute-bound entry.

The target efficiency is then its own roofline / t_T. Launch and host costs are kept as measured (they are set by
the host CPU, the driver and the launch path more than by the GPU): an assumption the derivation states. The
profile is labelled `derived: true` with its source, target and ratios, and the label travels into every
prediction and export (Profile.label()). Nothing is fitted.
"""
from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

from ..hardware import get_hardware, match_device_name
from ..spec import Hardware
from .profile import KIND_AXES, MNK_KINDS, Profile, ProfileError, build_profile, entry_work, table_kind

TILE = 128  # output rows/columns per thread block assumed for the occupancy estimate

# Streaming multiprocessors per GPU, from the vendors' architecture whitepapers / datasheets (None: not published
# in a datasheet we could cite).
SM_COUNTS: dict[str, int | None] = {
    "h200": 132,  # GH100 as in H100 SXM5 (NVIDIA H200 product brief: same Hopper GPU, HBM3e)
    "h100-sxm": 132,  # NVIDIA H100 Tensor Core GPU Architecture whitepaper: H100 SXM5 132 SMs
    "h100-pcie": 114,  # same whitepaper: H100 PCIe 114 SMs
    "a100-sxm-80gb": 108,  # NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs
    "a100-sxm-40gb": 108,
    "l40s": 142,  # NVIDIA L40S datasheet: 18,176 CUDA cores = 142 SMs x 128
    "rtx4090": 128,  # NVIDIA Ada Lovelace architecture whitepaper: 128 SMs
    "rtx5090": 170,  # NVIDIA RTX Blackwell architecture whitepaper: 170 SMs
    "h20": None,
    "b200": None,
}


def _preset_key(hw: Hardware) -> str | None:
    from ..hardware import PRESETS

    for key, preset in PRESETS.items():
        if preset.name == hw.name:
            return key
    return None


def sm_count(hw: Hardware) -> int | None:
    key = _preset_key(hw)
    return SM_COUNTS.get(key) if key else None


def _blocks(name: str, c: dict, experts: float) -> np.ndarray:
    kind = table_kind(name)
    tiles = lambda x: np.ceil(np.asarray(x, dtype=float) / TILE)  # noqa: E731
    if kind in MNK_KINDS:
        return tiles(c["m"]) * tiles(c["n"])
    if kind == "grouped_gemm":
        return experts * tiles(c["tokens"]) * tiles(c["n"])
    if kind == "attention":
        return np.asarray(c["bh"], dtype=float) * tiles(c["q"])
    if kind == "attention_causal":
        return np.asarray(c["bh"], dtype=float) * tiles(c["s"])
    return np.full(np.shape(c["bh" if kind == "bias" else "bytes"]), np.inf)  # memory-bound: every SM busy


def _fixed_cost(work_s: np.ndarray, nbytes: np.ndarray, keep: np.ndarray) -> float:
    """A table's fixed cost per kernel: the time of its smallest entry among `keep` (the measured memory-bound
    ones) beyond what its bytes take at the best bandwidth any of them reached (0 for fewer than two entries:
    nothing to tell the two parts apart)."""
    t, b = work_s[keep], np.broadcast_to(nbytes, work_s.shape)[keep]
    if t.size < 2 or not np.all(t > 0):
        return 0.0
    best = float(np.max(b / t))
    smallest = int(np.argmin(b))
    return max(float(t[smallest] - b[smallest] / best), 0.0)


def derive_profile(source: Profile, target: Hardware | str, source_hardware: Hardware | str | None = None) -> Profile:
    """A profile for `target` (a preset or device name) from the measured `source` profile."""
    if source.derived:
        raise ProfileError("derive from a measured profile, not from a derived one")
    tgt = get_hardware(target) if isinstance(target, str) else target
    if source_hardware is not None:
        src = get_hardware(source_hardware) if isinstance(source_hardware, str) else source_hardware
    else:
        src = match_device_name(source.device_name)
        if src is None:
            raise ProfileError(f"the source profile's device {source.device_name!r} has no datasheet preset; give "
                               "the source hardware (--source-hardware) to derive from it")
    p_s, w_s = src.peak_flops, src.bandwidth
    p_t, w_t = tgt.peak_flops, tgt.bandwidth
    sm_s = source.device.get("sm_count") or sm_count(src)
    sm_t = sm_count(tgt)
    ceil_s = (source.peak_flops, source.bandwidth)  # the ceilings the source efficiencies are relative to
    tables = {}
    for name, t in source.tables.items():
        axes = dict(zip(t.axes, t.grid))
        mesh = dict(zip(t.axes, np.meshgrid(*t.grid, indexing="ij")))
        flops, nbytes = entry_work(name, mesh, t.meta)
        work_s = np.maximum(flops / ceil_s[0], nbytes / ceil_s[1]) / t.efficiency  # measured work time
        compute_bound = flops / p_s >= nbytes / w_s
        if sm_s and sm_t:
            c = _blocks(name, mesh, float(t.meta.get("experts", 64)))
            ratio_c = (p_s * np.minimum(c, sm_s) / sm_s) / (p_t * np.minimum(c, sm_t) / sm_t)
        else:
            ratio_c = np.full(flops.shape, p_s / p_t)
        fixed = _fixed_cost(work_s, nbytes, t.measured & ~compute_bound)
        # an entry faster than the fixed cost keeps its own time: nothing of it is streaming to speed up
        streamed = np.minimum(work_s, fixed) + np.maximum(work_s - fixed, 0.0) * (w_s / w_t)
        work_t = np.where(compute_bound, work_s * ratio_c, streamed)
        eff = np.maximum(flops / p_t, nbytes / w_t) / work_t
        tables[name] = {"axes": {a: [float(v) for v in g] for a, g in axes.items()},
                        "efficiency": np.clip(eff, 1e-9, 1e3).tolist(), "measured": t.measured.tolist(),
                        "meta": {**t.meta, "derived_from": source.device_name}}
        assert tuple(axes) == KIND_AXES[table_kind(name)]
    ratios = {"flops": p_t / p_s, "bandwidth": w_t / w_s, "sm": (sm_t / sm_s) if sm_s and sm_t else None}
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return build_profile(
        device={"name": tgt.name, "kind": "cuda", "sm_count": sm_t, "memory_gb": tgt.memory_gb, "l2_bytes": None},
        environment=dict(source.raw["environment"]), versions=dict(source.raw["versions"]),
        ceilings={"flops_per_s": p_t, "bytes_per_s": w_t, "source": f"datasheet {tgt.name} (derived profile)"},
        launch=dict(source.raw["launch"]), tables=tables,  # host costs per kind too, where the source has them
        calibration={**source.raw["calibration"], "derived_at": now},
        created=now, derived=True,
        derivation={
            "source": {"device": source.device_name, "created": source.created, "path": source.path,
                       "datasheet": src.name, "peak_tflops": src.peak_tflops, "bandwidth_tbs": src.bandwidth_tbs,
                       "sm_count": sm_s},
            "target": {"device": tgt.name, "peak_tflops": tgt.peak_tflops, "bandwidth_tbs": tgt.bandwidth_tbs,
                       "sm_count": sm_t, "source": tgt.source},
            "ratios": ratios,
            "method": ("per kernel shape: memory-bound work time above the table's fixed cost (its smallest "
                       "entry's time beyond its bytes at the table's best bandwidth, kept) x source/target "
                       "bandwidth; compute-bound work "
                       f"time x per-SM rate ratio at min(blocks, SMs) ({TILE}x{TILE} tiles), or the peak ratio "
                       "without SM counts; launch and host costs kept as measured on the source"),
        })
