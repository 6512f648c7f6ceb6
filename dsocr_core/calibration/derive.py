"""Profiles for GPUs one does not have: a measured profile's kernel tables moved to another GPU's datasheet.

For every table entry (a kernel shape) the measured work time on the source GPU, t_S = roofline_S / efficiency,
is moved to the target by what limits that kernel on the source:

* memory-bound entries (bytes / bandwidth >= FLOPs / peak on the source), by the bandwidth B_S = bytes / t_S they
  reached. A kernel streams at most at the GPU's streaming share of its bandwidth, s x W (s: the best efficiency
  of the source's plain copy and elementwise tables, about 0.9 on an H100 and an H200); below that it is held
  back by what a wider bus does not change: launch latency, the bytes its blocks keep in flight (Little's law),
  its own arithmetic. So an entry that streams (B_S >= 0.8 s W_S) moves with the bandwidth, B_T = B_S x W_T / W_S,
  and any other keeps its bandwidth, B_T = B_S (x SMs_T / SMs_S where both counts are known: the bytes in
  flight scale with the SMs), never above s x W_T; t_T = bytes / B_T. Measured on the two GPUs this project has
  (each profile derived from the other and compared with its own tables, 2026-11-27): a small copy, a LayerNorm
  and a GEMV run at the same bandwidth on an H100 and an H200 up to 4 MB, the LayerNorm at any size (1.85 TB/s on
  both), and only plain streams gain the H200's 1.43x; moving every entry by the bandwidth ratio above a fixed cost
  per table (the rule before) put the memory tables 24.5% slow (H200 to H100, median) and 19% fast (H100 to
  H200), this rule 6.3% and 7.3%. The 0.8 was chosen among 0.8, 0.9 and 0.95 on that comparison;
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
from .profile import (MNK_KINDS, PASS_META, Profile, ProfileError, build_profile, entry_work,
                      profile_from_dict, table_axes, table_kind, without_tables)

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


STREAMING_TABLES = ("memory.copy", "memory.elementwise")  # plain streams: their best share of the bandwidth
STREAMS_AT = 0.8  # an entry reaching this much of the streaming bandwidth is taken as streaming (module docstring)


def streaming_share(source: Profile) -> float:
    """The best share of its bandwidth ceiling the source's plain streams reached (its copy and elementwise
    tables; any memory table where it has neither)."""
    names = [n for n in STREAMING_TABLES if source.table(n) is not None] or \
        [n for n in source.tables if table_kind(n) == "memory"]
    return max(float(np.max(source.table(n).efficiency)) for n in names) if names else 1.0


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
    stream_s = streaming_share(source) * ceil_s[1]  # bytes/s the source's plain streams reached
    stream_t = stream_s * w_t / w_s
    sm_ratio = (sm_t / sm_s) if sm_s and sm_t else 1.0
    tables = {}
    for name, t in source.tables.items():
        axes = dict(zip(t.axes, t.grid))
        mesh = dict(zip(t.axes, np.meshgrid(*t.grid, indexing="ij")))
        flops, nbytes, roof_s = _entry_roofline(name, t, *ceil_s)
        work_s = roof_s / t.efficiency  # measured work time
        compute_bound = flops / p_s >= nbytes / w_s
        if sm_s and sm_t:
            c = _blocks(name, mesh, float(t.meta.get("experts", 64)))
            ratio_c = (p_s * np.minimum(c, sm_s) / sm_s) / (p_t * np.minimum(c, sm_t) / sm_t)
        else:
            ratio_c = np.full(flops.shape, p_s / p_t)
        reached = nbytes / work_s  # bytes/s the entry reached on the source
        moved = np.where(reached >= STREAMS_AT * stream_s, reached * w_t / w_s, reached * sm_ratio)
        work_t = np.where(compute_bound, work_s * ratio_c, nbytes / np.minimum(moved, stream_t))
        eff = np.maximum(flops / p_t, nbytes / w_t) / work_t
        tables[name] = {"axes": {a: [float(v) for v in g] for a, g in axes.items()},
                        "efficiency": np.clip(eff, 1e-9, 1e3).tolist(), "measured": t.measured.tolist(),
                        "meta": {**{k: v for k, v in t.meta.items() if k not in PASS_META},  # not measured here
                                 "derived_from": _chain(source.device_name, t.meta)}}
        assert tuple(axes) == table_axes(name)
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
            "method": ("per kernel shape: a memory-bound entry that streams (at least "
                       f"{STREAMS_AT:g} of the source's plain-stream bandwidth) moves with the bandwidth ratio, any "
                       "other keeps the bandwidth it reached (x the SM ratio), never above the target's streaming "
                       "bandwidth; compute-bound work "
                       f"time x per-SM rate ratio at min(blocks, SMs) ({TILE}x{TILE} tiles), or the peak ratio "
                       "without SM counts; launch and host costs kept as measured on the source"),
        })


def add_derived_tables(base: Profile, source: Profile, names: list[str],
                       source_hardware: Hardware | str | None = None) -> Profile:
    """`base` (a measured profile) with the tables `names` derived from `source`, another GPU's measured profile,
    by derive_profile's rule, each entry keeping the time it is derived to take against base's own ceilings. For a
    table whose kernel changed after base was measured, until it is measured on base's GPU: the label says which
    tables are derived and from where, and each table's meta names its source."""
    if base.derived:
        raise ProfileError("add derived tables to a measured profile, not to a derived one")
    target = match_device_name(base.device_name)
    if target is None:
        raise ProfileError(f"the profile's device {base.device_name!r} has no datasheet preset to derive for")
    if not names:
        raise ProfileError("name the kernel tables to derive")
    for name in names:
        table_kind(name)  # a kernel table's name (not a launch cost), or a ProfileError naming the kinds
    missing = [n for n in names if source.table(n) is None]
    if missing:
        raise ProfileError(f"{source.device_name}'s profile has no {', '.join(missing)} to derive from")
    chained = [n for n in names if source.table(n).meta.get("derived_from")]
    if chained:  # a table derived from a derived one would hide where it was measured
        raise ProfileError(f"{source.device_name}'s {', '.join(chained)} is itself derived (from "
                           f"{source.table(chained[0]).meta['derived_from']}): derive from the GPU it was measured on")
    derived = derive_profile(source, target, source_hardware)
    data = base.to_dict()
    for name in names:
        t = derived.table(name)
        # the derived time of each entry, as an efficiency against base's ceilings instead of the datasheet's
        eff = t.efficiency * (_entry_roofline(name, t, base.peak_flops, base.bandwidth)[2]
                              / _entry_roofline(name, t, derived.peak_flops, derived.bandwidth)[2])
        table = derived.to_dict()["tables"][name]
        table["efficiency"] = np.clip(eff, 1e-9, 1e3).tolist()
        table["meta"] = {**table["meta"], "derived_from_created": _measured_on(source, name)}
        data["tables"][name] = table
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    measured = max(_measured_on(source, name) for name in names)
    # derived again, or derived where it was measured: the earlier addition of the same tables leaves the label
    data["calibration"]["added"] = without_tables(data["calibration"].get("added"), names)
    data["calibration"]["added"].append(
        {"tables": sorted(names), "created": now, "device": base.device_name, "quick": False,
         "derived_from": source.device_name, "source_created": measured})
    data["calibration"].setdefault("notes", []).append(
        f"{', '.join(sorted(names))} DERIVED on {now[:10]} from {source.device_name}'s tables measured "
        f"{measured[:10]} (not measured on this GPU; {derived.derivation['method']})")
    return profile_from_dict(data)


def _measured_on(profile: Profile, name: str) -> str:
    """When `profile`'s table `name` was measured: its last addition, else the profile's own calibration."""
    added = [str(a.get("created")) for a in profile.raw["calibration"].get("added") or []
             if isinstance(a, dict) and name in (a.get("tables") or []) and not a.get("derived_from")]
    return added[-1] if added else profile.created


def _chain(source_device: str, meta: dict) -> str:
    """The derived_from of a table derived from `source_device`'s, naming where that one came from if it was
    itself derived (a profile derived from another whose table was derived back from this GPU is no check of it)."""
    earlier = meta.get("derived_from")
    return f"{source_device} (its table derived from {earlier})" if earlier else source_device


def _entry_roofline(name: str, table, peak_flops: float, bandwidth: float):
    """(FLOPs, bytes, roofline seconds) of every entry of `table` under these ceilings: an entry's time is its
    roofline over its efficiency."""
    mesh = dict(zip(table.axes, np.meshgrid(*table.grid, indexing="ij")))
    flops, nbytes = entry_work(name, mesh, table.meta)
    return flops, nbytes, np.maximum(flops / peak_flops, nbytes / bandwidth)
