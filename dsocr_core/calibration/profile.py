"""The calibration profile: kernel efficiency tables of one GPU (or CPU), as a versioned JSON file.

A profile holds what the kernel microbenchmarks (microbench.py) measured, and nothing else: no constant fitted to
this model's stage times. Every table is a grid over a kernel's shape (GEMM M x N x K, bytes of a memory-bound
kernel, attention heads x query x key x head dim, tokens per expert of a grouped GEMM) whose values are
EFFICIENCIES: the kernel's own roofline time on the profile's ceilings divided by its measured work time

    efficiency = max(F / peak_flops, B / bandwidth) / t_work,     t_work = t_measured - launches x launch gap

with F and B from `entry_work` (one formula per table kind, shared with the time model). So a kernel of that
shape takes `roofline / efficiency` plus its launches x the per-launch cost (the `launch` block). Values are
looked up by `Table.lookup`: multilinear interpolation of log(efficiency) over log(shape), clamped at the edges.

File layout (format_version 1):

    {"format": "dsocr-calibration-profile", "format_version": 1, "created": ISO date,
     "device": {"name", "kind": "cuda"|"cpu", "sm_count", "memory_gb", "l2_bytes"},
     "environment": {...}, "versions": {"torch", "cuda", "triton", "dsocr_core", ...},
     "ceilings": {"flops_per_s", "bytes_per_s", "source"},
     "launch": {"graph_kernel_s", "eager_kernel_s", "host_op_s", "sync_s", "graph_launch_s"},
     "tables": {name: {"axes": {axis: [values]}, "efficiency": nested list, "measured": nested list, "meta"}},
     "calibration": {"quick", "budget_s", "elapsed_s", "complete", "skipped", ...},
     "derived": false, "derivation": null | {"source", "target", "ratios", "method"}}

Loading is strict: a file that is not JSON, is truncated, has another format or version, misses a field, has an
unknown one, or holds a table whose values do not match its axes raises ProfileError naming the problem.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from .. import jsonfile
from ..measure.environment import full_sm_clock_mhz
from ..spec import DTYPE_BYTES, SpecError
from .schema import HOST_KINDS, ProfileModel, TableModel, first_problem

FORMAT = "dsocr-calibration-profile"
FORMAT_VERSION = 1
LAUNCH_KEYS = ("graph_kernel_s", "eager_kernel_s", "host_op_s", "sync_s", "graph_launch_s")
# launch costs `calibrate --tables NAME --add-to PROFILE` can measure and add to an existing profile (name -> key)
ADDABLE_LAUNCH = {"launch.graph_start": "graph_start_s", "launch.host_stages": "host_op_s_by_stage",
                  "launch.host_kinds": "host_op_s_by_kind"}
# launch costs measured with an addable one and added with it: the host's speed while host costs were measured
# (and, with the costs by kind, the costs derived from the mix's mean: a round trip less an op's host time, a replay)
LAUNCH_COMPANIONS = {"host_op_s_by_stage": ("host_stage_probe_op_s",),
                     "host_op_s_by_kind": ("host_op_s", "host_probe_op_s", "sync_s", "graph_launch_s")}
OPTIONAL_LAUNCH = ("host_op_s_by_kind", "host_op_s_by_stage", "graph_start_s", "host_probe_op_s",
                   "host_stage_probe_op_s")
# a view's host cost as a share of the op mixes' mean, for a profile that did not measure views: the H200's host
# measured 3.41 us a view against a 23.9 us mean (data/profiles/h200.json, launch.host_kinds of 2026-11-27); pricing a
# view at the mean, as a launching op, prices the reference engine's views seven times over
VIEW_SHARE = 0.143
SOFTMAX_FLOPS = 6  # per score; the analytic model's constant (analytic/vision.py), so the conventions agree
# a profile file's bounds, checked before it is parsed: real ones are about 110 kB and nest 7 levels
MAX_PROFILE_BYTES = 16 * 2**20
MAX_PROFILE_DEPTH = 32
EFFICIENCY_RANGE = (1e-9, 1e3)  # stored efficiencies are clipped into this range (finite logs)
# What a profile may claim and still describe a real device (anything else is refused, the field named): a kernel
# runs at most a little faster than the roofline on the profile's ceilings (the GEMM and copy peaks are rates, not
# hard limits; the project's H100 profile reaches 1.06 on eager attention), ceilings between a slow CPU and far
# past any GPU, per-launch and host costs of at most a second (real ones are microseconds).
MAX_EFFICIENCY = 1.2
CEILING_RANGES = {"flops_per_s": (1e6, 1e18), "bytes_per_s": (1e6, 1e16)}
MAX_LAUNCH_S = 1.0

# the table kinds named <kind>.<dtype> (their entries computed in that dtype; every other kind in bf16)
DTYPE_KINDS = ("gemm", "grouped_gemm", "conv", "linear")
# the kinds whose entries do an m x n x k GEMM's work (a conv as the GEMM it computes)
MNK_KINDS = ("gemm", "conv", "linear")
# a measured table's meta on its calibration passes (calibrate --passes; a derived table has none)
PASS_META = ("passes", "passes_completed", "pass_spread_max")
# table kind -> its axes, in order
KIND_AXES = {
    "gemm": ("m", "n", "k"),
    # SAM's patch embedding as the reference model runs it (nn.Conv2d, kernel = stride = the patch): m output
    # positions, n output channels, k = 3 x patch^2 input values per position
    "conv": ("m", "n", "k"),
    # a Linear layer with its bias (F.linear: cuBLAS's addmm with a bias epilogue) at a model's own (n, k) over the
    # row counts its pages give, where the GEMM table's grid lines (n, k and m 4x apart) interpolate across kernel
    # changes (the projector, [rows, 2048] x [2048, 1280]: an H100 runs 800 and 900 rows 14-15% slower than the GEMM
    # table says, docs/accuracy.md "The projector's GEMM at its own shape"); profiles without it use the GEMM table
    "linear": ("m", "n", "k"),
    "memory": ("bytes",),
    "attention": ("bh", "q", "k", "d"),
    "attention_causal": ("bh", "s", "d"),
    "grouped_gemm": ("tokens", "n", "k"),
    "bias": ("bh", "side"),
}
# tables timed over more than their kind's axes, with the value each extra axis had where a table was measured
# before it existed (such a table reads back with that one value, and a prediction off it says so):
# - the by-expert MoE kernels' token tile (fast/options.expert_token_tile: every program loads and multiplies a
#   [rows, tile] block, so 64 tokens take longer than 8 over the same experts); timed at 8-9 tokens, a tile of 16,
#   before;
# - the split-KV decode attention's fill, the position's share of the static cache's length (the bucket's end, whose
#   every chunk the kernel's grid covers); timed with the cache ending at the position, a fill of 1, before
EXTRA_AXES = {"memory.moe_gemv": {"tokens": 16.0}, "memory.moe_gemv_combine": {"tokens": 16.0},
              "attention.split_kv": {"fill": 1.0}}


def table_axes(name: str) -> tuple[str, ...]:
    """The axes of table `name`: its kind's (KIND_AXES), then its own extra ones (EXTRA_AXES)."""
    return KIND_AXES[table_kind(name)] + tuple(EXTRA_AXES.get(name, {}))


MEMORY_KINDS = ("copy", "elementwise", "norm", "gemv", "fused_gemv", "fused_attention", "transposed_cat",
                "projector_cat", "moe_gemv", "moe_gemv_combine", "gather_rows", "permuted_copy", "permuted_add",
                "group_rows", "cast", "fused_lm_head", "broadcast", "index_put")
# broadcast: an eager elementwise op with a broadcast operand ([rows, 1280] bf16 times a [1280] row), which runs on
# TensorIterator's non-vectorised kernels (the reference LM's norms' weight, its RoPE on transposed q and k: 1.0-1.6
# TB/s in an H200 trace at 300 MB, the table 1.6-1.7 from 64 MB up, where the elementwise table's vectorised add
# reaches 4.4); index_put: rows written to
# scattered places by an index (the reference MoE's expert loop, 0.8 TB/s there). Profiles made before them
# (2026-11-28) price both on the elementwise table
# cast: a bfloat16 tensor copied to float32 (.float(), the lm_head's logits: two bytes read, four written); profiles
# made before it price it on the elementwise table
# transposed_cat: DeepSeek-OCR's projector input as the reference model builds it, a cat of [rows, 1024] with the
# transpose of [1024, rows] (its SAM map is channels-first: reads of the second strided by rows); profiles made before
# it price it on the elementwise table. projector_cat: the same cat as the fast engine builds it (SAM's map
# channels-last, so the flattened map reads whole rows: 1.4-2x faster on an H100); profiles made before it (2026-11-28)
# price it on transposed_cat. gather_rows: whole
# rows gathered by an index (index_select), the fast projector's layout; profiles made before it use elementwise
# permuted_copy / permuted_add: SAM's residual stream as the reference model runs it, channels first in memory but
# seen channels last ([N, 768, P, P] permuted to [N, P, P, 768]): the copy to rows before each LayerNorm, and each
# residual add (its result keeps that layout); profiles made before them price both on transposed_cat, else
# elementwise
# bias.broadcast / bias.strided: SAM's dense relative-position bias as the reference model builds it, the broadcast
# sum of two permuted einsum outputs and then its reshape (a copy of the non-contiguous sum), over bh (views x
# windows x heads) and the attended square's side (its innermost runs: 14, 40 or 64 elements). Profiles made before
# them price the two on the elementwise and copy tables
BIAS_KINDS = ("broadcast", "strided")
# fused_gemv / fused_attention: the fast engine's own batch-1 decode kernels (fast/decode_kernels.py), by bytes
# read; measured on a CUDA GPU with Triton only (elsewhere predictions fall back to gemv / attention, and say so).
# fused_lm_head: that step's lm_head kernel (the final norm, the logits and each block's best token), whose blocks
# stream faster than the o_proj kernel fused_gemv times on some GPUs (an H200's step: 3.48 TB/s at 331 MB, traced,
# against fused_gemv's 2.9);
# profiles made before it price it on fused_gemv.
# moe_gemv: its by-expert MoE kernels of batched decode (fast/triton_kernels.py), by weight bytes read, the same way;
# profiles without it price them on fused_gemv. moe_gemv_combine: the same two launches with the weighted combine +
# residual in the down kernel's last programs (expert_fusion 'fused', 2026-11-28); profiles made before it price them
# on moe_gemv, which lacks the combine's few microseconds. group_rows: its MoE grouping kernels (fast/moe_rows.py), by the
# one-hot work of their two passes over the rows (calibration/ops.GROUP_BYTES_PER_ROW a row); profiles without it
# price that work on elementwise
# split_kv: the fast engine's batched decode attention (fast/triton_kernels.decode_attention_splitkv, one query a
# row; a CUDA GPU with Triton only); profiles without it price it on flash
# sdpa / flash: SDPA limited to the reference LM's backends (flash, memory-efficient, math) / to flash alone;
# default: SDPA with torch's own choice of backend, what the fast engine's compiled SAM, CLIP and LM prefill layers
# call (on an H100 with torch 2.11 that is cuDNN's flash kernel, docs/accuracy.md); profiles made before it price
# those calls on the sdpa (vision) and flash (LM prefill) tables
ATTENTION_IMPLS = ("sdpa", "sdpa_bias", "eager", "flash", "default", "split_kv")


class ProfileError(SpecError):
    """A calibration profile that cannot be used (unreadable, malformed, another format version)."""


def table_kind(name: str) -> str:
    """The kind of a table from its name: gemm.<dtype>, memory.<kind>, attention.<impl>[.causal],
    grouped_gemm.<dtype>, conv.<dtype>, linear.<dtype>. Raises ProfileError for any other name."""
    parts = name.split(".")
    if len(parts) == 2 and parts[0] in DTYPE_KINDS and parts[1] in DTYPE_BYTES:
        return parts[0]
    if len(parts) == 2 and parts[0] == "memory" and parts[1] in MEMORY_KINDS:
        return "memory"
    if len(parts) == 2 and parts[0] == "bias" and parts[1] in BIAS_KINDS:
        return "bias"
    if parts[0] == "attention" and len(parts) in (2, 3) and parts[1] in ATTENTION_IMPLS:
        if len(parts) == 2:
            return "attention"
        if parts[2] == "causal":
            return "attention_causal"
    raise ProfileError(f"unknown table {name!r}: expected gemm.<dtype>, grouped_gemm.<dtype>, conv.<dtype>, "
                       f"linear.<dtype>, memory.<{'|'.join(MEMORY_KINDS)}>, bias.<{'|'.join(BIAS_KINDS)}> or "
                       f"attention.<{'|'.join(ATTENTION_IMPLS)}>[.causal]")


def entry_work(name: str, coords: dict[str, Any], meta: dict | None = None) -> tuple[Any, Any]:
    """(FLOPs, bytes) of one benchmarked kernel of table `name` at shape `coords` (arrays broadcast). The same
    conventions as the analytic rows: attention FLOPs are counted non-causally (4 x bh x q x k x d, the
    FlopCounterMode convention, plus the softmax), eager attention moves its materialised scores."""
    meta = meta or {}
    kind = table_kind(name)
    s = DTYPE_BYTES.get(meta.get("dtype", name.split(".")[-1] if kind in DTYPE_KINDS else "bfloat16"), 2)
    c = {k: np.asarray(v, dtype=float) for k, v in coords.items()}
    if kind in MNK_KINDS:
        m, n, k = c["m"], c["n"], c["k"]
        return 2 * m * n * k, (m * k + k * n + m * n) * s
    if kind == "memory":
        return np.zeros_like(c["bytes"]), c["bytes"]
    if kind == "bias":  # bf16 scores: the sum written and the two einsum outputs read; the copy reads and writes
        dense = 2 * c["bh"] * c["side"] ** 4
        nbytes = dense + 4 * c["bh"] * c["side"] ** 3 if name.endswith("broadcast") else 2 * dense
        return np.zeros_like(nbytes), nbytes
    if kind == "grouped_gemm":
        e = float(meta.get("experts", 64))
        t, n, k = c["tokens"], c["n"], c["k"]
        return 2 * e * t * n * k, e * (t * k + k * n + t * n) * s
    bh, d = c["bh"], c["d"]
    q, kk = (c["s"], c["s"]) if kind == "attention_causal" else (c["q"], c["k"])
    scores = bh * q * kk
    flops = 4 * scores * d + SOFTMAX_FLOPS * scores
    nbytes = 2 * bh * (q + kk) * d * s  # q, k, v read; output written
    impl = name.split(".")[1]
    if impl == "eager":  # scores written and read by each eager op (analytic/lm.py's byte model)
        masked = 1.0 if kind == "attention_causal" else 0.0
        nbytes = nbytes + 2 * scores * ((3 + masked) * s + 8)
    elif impl == "sdpa_bias":
        nbytes = nbytes + scores * s  # the dense additive mask is read
    return flops, nbytes


@dataclass(frozen=True, eq=False)
class Table:
    """A grid of efficiencies over a kernel's shape, looked up in log space."""

    name: str
    axes: tuple[str, ...]
    grid: tuple[np.ndarray, ...]
    efficiency: np.ndarray
    measured: np.ndarray
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "_log_grid", tuple(np.log(g) for g in self.grid))
        object.__setattr__(self, "_log_eff", np.log(np.clip(self.efficiency, *EFFICIENCY_RANGE)))

    @property
    def kind(self) -> str:
        return table_kind(self.name)

    def lookup(self, **coords) -> np.ndarray:
        """Efficiency at the given shape (one array or number per axis; they broadcast). Multilinear
        interpolation of log(efficiency) over log(coordinate); outside the grid the edge value holds."""
        missing = [a for a in self.axes if a not in coords]
        if missing:
            raise ProfileError(f"table {self.name}: no value for axis {', '.join(missing)}")
        table = self._log_eff
        base, vary = [], []  # lower grid index per array axis; (axis position, weight of the upper index)
        for a, lg, g in zip(self.axes, self._log_grid, self.grid):
            c = coords[a]
            if lg.size == 1:
                table = table[0]  # a one-value axis: nothing to interpolate
                continue
            x = np.log(np.clip(np.asarray(c, dtype=float), g[0], g[-1]))
            i = np.clip(np.searchsorted(lg, x, side="right") - 1, 0, lg.size - 2)
            w = np.clip((x - lg[i]) / (lg[i + 1] - lg[i]), 0.0, 1.0)
            if np.ndim(x) == 0:  # a number: interpolate the table along this axis once (fewer corners later)
                table = (1.0 - w) * table[int(i)] + w * table[int(i) + 1]
                continue
            table = np.moveaxis(table, 0, -1)  # keep the array axes last, in order
            base.append(i)
            vary.append((len(base) - 1, w))
        if not base:
            out = np.exp(table)
            shape = np.broadcast_shapes(*(np.shape(coords[a]) for a in self.axes))
            return np.broadcast_to(out, shape) if shape else out
        out = 0.0
        for corner in range(1 << len(vary)):
            pick, weight = list(base), 1.0
            for bit, (j, w) in enumerate(vary):
                up = (corner >> bit) & 1
                pick[j] = pick[j] + up
                weight = weight * (w if up else 1.0 - w)
            out = out + weight * table[tuple(pick)]
        out = np.exp(out)
        shape = np.broadcast_shapes(*(np.shape(coords[a]) for a in self.axes))
        return out if np.shape(out) == shape else np.broadcast_to(out, shape)

    def to_dict(self) -> dict:
        return {"axes": {a: [float(v) for v in g] for a, g in zip(self.axes, self.grid)},
                "efficiency": self.efficiency.tolist(), "measured": self.measured.tolist(), "meta": dict(self.meta)}


def _deepen(values, depth: int, extra: int):
    """A nested list with `extra` one-element levels added below its first `depth` levels (a table's values with
    axes of one grid value added after its own); anything not nested as deep is left for the shape checks."""
    if depth == 0:
        for _ in range(extra):
            values = [values]
        return values
    return [_deepen(v, depth - 1, extra) for v in values] if isinstance(values, list) else values


def _table_from(name: str, t: TableModel) -> Table:
    kind = table_kind(name)
    want = table_axes(name)
    axes, efficiency, measured, meta = dict(t.axes), t.efficiency, t.measured, dict(t.meta)
    older = EXTRA_AXES.get(name, {})
    if older and tuple(axes) == KIND_AXES[kind]:  # measured before its extra axes: one grid value each
        axes |= {a: [v] for a, v in older.items()}
        meta["axes_added"] = dict(older)  # predictions off that value say so (analytic/predict.Predictor)
        depth = len(KIND_AXES[kind])
        efficiency = _deepen(efficiency, depth, len(older))
        measured = None if measured is None else _deepen(measured, depth, len(older))
    if tuple(axes) != want:
        which = "this" if name in EXTRA_AXES else f"a {kind}"
        raise ProfileError(f"table {name}: axes {list(axes)} but {which} table has {list(want)}")
    grid = []
    for a, values in axes.items():
        g = np.asarray(values, dtype=float)
        if g.ndim != 1 or g.size == 0 or not np.all(np.isfinite(g)) or np.any(g <= 0) or np.any(np.diff(g) <= 0):
            raise ProfileError(f"table {name}: axis {a!r} must be positive, finite and strictly increasing")
        grid.append(g)
    shape = tuple(g.size for g in grid)
    try:
        eff = np.asarray(efficiency, dtype=float)
    except (TypeError, ValueError):
        raise ProfileError(f"table {name}: efficiency is not a rectangular array of numbers") from None
    if eff.shape != shape:
        raise ProfileError(f"table {name}: efficiency has shape {list(eff.shape)} but the axes give {list(shape)}")
    if not np.all(np.isfinite(eff)) or np.any(eff <= 0):
        raise ProfileError(f"table {name}: efficiencies must be finite and positive")
    if np.any(eff > MAX_EFFICIENCY):
        raise ProfileError(f"table {name}: efficiency {float(eff.max()):g} is more than {MAX_EFFICIENCY:g} (a kernel "
                           "that much faster than the roofline on the profile's ceilings is not physical)")
    try:
        measured = np.ones(shape, dtype=bool) if measured is None else np.asarray(measured, dtype=bool)
    except (TypeError, ValueError):  # a ragged nested list
        raise ProfileError(f"table {name}: measured is not a grid of true/false values") from None
    if measured.shape != shape:
        raise ProfileError(f"table {name}: measured has shape {list(measured.shape)}, expected {list(shape)}")
    return Table(name, want, tuple(grid), eff, measured, meta)


@dataclass(frozen=True, eq=False)
class Profile:
    """A validated calibration profile (see the module docstring)."""

    raw: dict
    tables: dict[str, Table]
    path: str | None = None

    @property
    def device_name(self) -> str:
        return self.raw["device"]["name"]

    @property
    def device(self) -> dict:
        return self.raw["device"]

    @property
    def peak_flops(self) -> float:
        return float(self.raw["ceilings"]["flops_per_s"])

    @property
    def bandwidth(self) -> float:
        return float(self.raw["ceilings"]["bytes_per_s"])

    @property
    def launch(self) -> dict[str, float]:
        return {k: float(self.raw["launch"][k]) for k in LAUNCH_KEYS}

    @property
    def graph_start_s(self) -> float | None:
        """What a graph replay adds to the device time between the events around it beyond its kernels; None in a
        profile made before it was measured (2026-11-27)."""
        v = self.raw["launch"].get("graph_start_s")
        return None if v is None else float(v)

    @property
    def clock_mhz(self) -> float | None:
        """The SM clock the tables were timed at: the calibration GPU's full clock (its environment's maximum SM
        clock; the tables are short replays, which run there: benchmarks/sustained_load.py). None where it was
        not recorded (a CPU) and for a derived profile (its tables are another GPU's, scaled)."""
        return None if self.derived else full_sm_clock_mhz(self.raw.get("environment"))

    @property
    def host_stage_costs(self) -> dict[str, float]:
        """The host cost of one launching op of the reference model's own code per stage (registry.HOST_COST_STAGES,
        calibration/host_stages.py); empty in a profile made before it was measured."""
        return {k: float(v) for k, v in (self.raw["launch"].get("host_op_s_by_stage") or {}).items()}

    def host_probe(self, table: str) -> float | None:
        """The host's speed (runtime/host_speed.py probe, seconds per op) while the host costs `table` ("kinds" or
        "stages") were measured; None in a profile made before it was recorded."""
        v = self.raw["launch"].get("host_probe_op_s" if table == "kinds" else "host_stage_probe_op_s")
        return None if v is None else float(v)

    @property
    def host_costs(self) -> dict[str, float]:
        """The host cost of one eager op per kind (schema.HOST_KINDS); a launching kind the profile did not measure
        (every kind, in a profile made before they were measured) costs the mix's mean, launch.host_op_s, and an
        unmeasured view VIEW_SHARE of it (the prediction notes it: view_share_assumed)."""
        by_kind = self.raw["launch"].get("host_op_s_by_kind") or {}
        mean = float(self.raw["launch"]["host_op_s"])
        return {k: float(by_kind.get(k, mean * (VIEW_SHARE if k == "view" else 1.0))) for k in HOST_KINDS}

    @property
    def view_share_assumed(self) -> float | None:
        """VIEW_SHARE where the profile has no host cost of a view (measured since launch.host_kinds existed) and
        host_costs assumes it; None where the view was measured."""
        return None if "view" in (self.raw["launch"].get("host_op_s_by_kind") or {}) else VIEW_SHARE

    @property
    def derived(self) -> bool:
        return bool(self.raw["derived"])

    @property
    def derived_tables(self) -> dict[str, str]:
        """{table: the GPU it was derived from} of a measured profile's tables that were derived from another
        GPU's (calibrate --derive-from --tables --add-to), not measured; empty for a wholly derived profile, whose
        every table is."""
        if self.derived:
            return {}
        return {name: str(t.meta["derived_from"]) for name, t in sorted(self.tables.items())
                if t.meta.get("derived_from")}

    @property
    def quick(self) -> bool:
        """Measured on the quick grids: a smoke test of the calibration, whose tables stop far below the model's
        shapes (its predictions miss by 10x or more). The dashboard never offers one as a predictor."""
        return bool((self.raw.get("calibration") or {}).get("quick"))

    @property
    def derivation(self) -> dict | None:
        return self.raw.get("derivation")

    @property
    def created(self) -> str:
        return self.raw["created"]

    def table(self, name: str) -> Table | None:
        return self.tables.get(name)

    def label(self) -> str:
        """One line naming the device and whether the profile was measured or derived (shown with every
        prediction and written into every export)."""
        created = self.created[:10]
        if not self.derived:
            quick = " quick" if self.quick else ""
            added = "".join(f" (+ {', '.join(map(str, a.get('tables', [])))} "
                            + (f"DERIVED from {a['derived_from']}'s tables of {str(a.get('source_created', '?'))[:10]}, "
                               "not measured" if a.get("derived_from") else
                               f"measured{' quick' if a.get('quick') else ''} {str(a.get('created', '?'))[:10]}")
                            + ")" for a in self.raw["calibration"].get("added") or [] if isinstance(a, dict))
            return f"{self.device_name} profile, measured{quick} {created}{added}"
        d = self.derivation or {}
        src = d.get("source", {}).get("device", "?")
        r = d.get("ratios", {})
        ratios = ", ".join(f"{k} x{v:.3g}" for k, v in r.items() if isinstance(v, (int, float)))
        return f"{self.device_name} profile DERIVED from {src} ({ratios}), not measured"

    def summary(self) -> dict:
        """The facts an export carries about the profile that produced its predictions."""
        return {"label": self.label(), "device": self.device_name, "created": self.created,
                "derived": self.derived, "derivation": self.derivation, "path": self.path,
                "format_version": self.raw["format_version"]}

    def to_dict(self) -> dict:
        """The profile as a file holds it: a copy, so that changing it leaves this profile as it is."""
        out = copy.deepcopy(self.raw)
        out["tables"] = {n: t.to_dict() for n, t in self.tables.items()}
        return out

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON (through a temporary file, so a failure leaves no partial profile)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.part")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path


def profile_from_dict(data: Any, source: str = "profile") -> Profile:
    """Validate a parsed profile. Raises ProfileError naming the first problem."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a JSON object, got {type(data).__name__}")
    fmt, version = data.get("format"), data.get("format_version")
    if fmt != FORMAT:
        raise ProfileError(f"{source}: not a calibration profile (format {fmt!r}, expected {FORMAT!r})")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise ProfileError(f"{source}: profile format_version {version!r} is not supported (this tool reads "
                           f"version {FORMAT_VERSION}); re-run `python -m dsocr_core calibrate`")
    try:
        model = ProfileModel.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(f"{source}: invalid profile: {first_problem(exc)}") from None
    for key, (low, high) in CEILING_RANGES.items():
        v = getattr(model.ceilings, key)
        if not (math.isfinite(v) and v > 0):
            raise ProfileError(f"{source}: ceilings.{key} must be a positive number, got {v}")
        if not low <= v <= high:
            raise ProfileError(f"{source}: ceilings.{key} is {v:g}, outside what a real device reaches "
                               f"({low:g} to {high:g})")
    costs = {key: getattr(model.launch, key) for key in LAUNCH_KEYS}
    costs.update({f"host_op_s_by_kind.{k}": v for k, v in (model.launch.host_op_s_by_kind or {}).items()})
    costs.update({f"host_op_s_by_stage.{k}": v for k, v in (model.launch.host_op_s_by_stage or {}).items()})
    for key in ("graph_start_s", "host_probe_op_s", "host_stage_probe_op_s"):
        if getattr(model.launch, key) is not None:
            costs[key] = getattr(model.launch, key)
    for key in ("host_probe_op_s", "host_stage_probe_op_s"):  # a probe of 0 would read as none: refused
        if key in costs and not costs[key] > 0:
            raise ProfileError(f"{source}: launch.{key} must be a positive number, got {costs[key]}")
    for key, v in costs.items():
        if not (math.isfinite(v) and v >= 0):
            raise ProfileError(f"{source}: launch.{key} must be a non-negative number, got {v}")
        if v > MAX_LAUNCH_S:
            raise ProfileError(f"{source}: launch.{key} is {v:g} s, more than the {MAX_LAUNCH_S:g} s a launch, host "
                               "operation or synchronisation can plausibly cost")
    if model.derived != (model.derivation is not None):
        raise ProfileError(f"{source}: 'derived' is {model.derived} but 'derivation' is "
                           f"{'absent' if model.derivation is None else 'present'}")
    if not any(n.startswith("gemm.") for n in model.tables):
        raise ProfileError(f"{source}: the profile has no GEMM table")
    tables = {}
    for name, t in model.tables.items():
        try:
            tables[name] = _table_from(name, t)
        except ProfileError as exc:
            raise ProfileError(f"{source}: {exc}") from None
    raw = model.model_dump(mode="json")
    # absent stays absent: a saved profile stays readable by older versions of the tool (their schema refuses
    # unknown fields)
    for key in OPTIONAL_LAUNCH:
        if raw["launch"][key] is None:
            del raw["launch"][key]
    raw["tables"] = {}  # the Table objects hold them
    return Profile(raw, tables, source if source != "profile" else None)


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file. Raises ProfileError (a missing file, one past MAX_PROFILE_BYTES or
    nested past MAX_PROFILE_DEPTH, checked before it is parsed, a truncated or malformed file, another format
    version: the message names the file and the problem)."""
    path = Path(path)
    if not path.exists():
        raise ProfileError(f"no calibration profile at {path}")
    if path.is_dir():
        raise ProfileError(f"{path} is a folder, not a calibration profile")
    raw = jsonfile.read_bytes(path, ProfileError, MAX_PROFILE_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ProfileError(f"{path} is not a text (JSON) file") from None
    if not text.strip():
        raise ProfileError(f"{path} is empty")
    jsonfile.check_bytes(raw, str(path), ProfileError, MAX_PROFILE_BYTES, MAX_PROFILE_DEPTH)
    try:
        data = jsonfile.parse(text, str(path), ProfileError)
    except json.JSONDecodeError as exc:
        end = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string") or _unclosed(text)
        why = "truncated (the JSON ends early)" if end else f"not valid JSON ({exc.msg} at line {exc.lineno})"
        raise ProfileError(f"{path} is {why}") from None
    prof = profile_from_dict(data, str(path))
    return Profile(prof.raw, prof.tables, str(path))


def _unclosed(text: str) -> bool:
    """More brackets opened than closed outside strings: a file cut short."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            esc, in_str = (not esc and ch == "\\"), in_str and not (ch == '"' and not esc)
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return depth > 0 or in_str


def build_profile(*, device: dict, environment: dict, versions: dict, ceilings: dict, launch: dict,
                  tables: dict[str, dict], calibration: dict, created: str, derived: bool = False,
                  derivation: dict | None = None) -> Profile:
    """A profile from its parts, validated as a file would be."""
    data = {"format": FORMAT, "format_version": FORMAT_VERSION, "created": created, "device": device,
            "environment": environment, "versions": versions, "ceilings": ceilings, "launch": launch,
            "tables": tables, "calibration": calibration, "derived": derived, "derivation": derivation}
    return profile_from_dict(json.loads(json.dumps(data, default=_jsonable)))


def check_addable(base: Profile, quick: bool, device_name: str | None = None) -> None:
    """Refuse tables that cannot go into `base`: a DERIVED profile (its ceilings are another GPU's datasheet's),
    quick tables into a full profile or the reverse, another GPU model's (when `device_name` is known). The
    calibrate command asks before measuring; add_tables asks again."""
    if base.derived:
        raise ProfileError("tables cannot be added to a DERIVED profile (another GPU's tables scaled): add them to "
                           "the measured profile it was derived from, then derive it again")
    if base.quick != quick:
        raise ProfileError(f"it is a {'quick' if base.quick else 'full'} profile: add tables measured the same "
                           f"way ({'with' if base.quick else 'without'} --quick)")
    if device_name is not None and device_name != base.device_name:
        raise ProfileError(f"tables of a {device_name} cannot go into a profile of a {base.device_name}")


def without_tables(added: list | None, names) -> list:
    """The calibration's `added` entries without `names` (tables replaced now, by a measurement or a derivation:
    the label names each table's latest addition only); an entry left with no table goes."""
    names, out = set(names), []
    for a in added or []:
        if isinstance(a, dict):
            a = {**a, "tables": [t for t in a.get("tables") or [] if t not in names]}
            if not a["tables"]:
                continue
        out.append(a)
    return out


def add_tables(base: Profile, tables: dict[str, dict], device: dict, environment: dict, versions: dict,
               created: str, quick: bool = False, launch: dict[str, float] | None = None,
               notes: list[str] | None = None) -> Profile:
    """`base` with `tables` (table name -> table as a profile file holds it) added or replaced: measured later on
    the same GPU model against base's ceilings (microbench.run_microbench(add_to=base)), e.g. a table kind that did
    not exist when base was measured; `launch`: launch costs measured with them (ADDABLE_LAUNCH: e.g.
    {"graph_start_s": ...}), added or replaced the same way. Said in the profile's calibration notes (every use
    shows them)."""
    check_addable(base, quick, device.get("name"))
    data = base.to_dict()  # a copy
    data["tables"].update(json.loads(json.dumps(tables, default=_jsonable)))
    launch = {k: ({s: float(x) for s, x in v.items()} if isinstance(v, dict) else float(v))
              for k, v in (launch or {}).items()}
    addable = {*ADDABLE_LAUNCH.values(), *(c for key in launch for c in LAUNCH_COMPANIONS.get(key, ()))}
    unknown = sorted(set(launch) - addable)  # a companion only with the cost it was measured with
    if unknown:
        raise ProfileError(f"launch costs {', '.join(unknown)} cannot be added to a profile")
    data["launch"].update(launch)
    tables = {**tables, **{name: None for name, key in ADDABLE_LAUNCH.items() if key in launch}}
    # a table measured again, or measured here now where it was derived from another GPU's: the label names the
    # latest measurement only (no longer DERIVED)
    data["calibration"]["added"] = without_tables(data["calibration"].get("added"), tables)
    data["calibration"]["added"].append({"tables": sorted(tables), "created": created, "device": device.get("name"),
                                         "quick": quick})
    data["calibration"].setdefault("notes", []).append(
        f"{', '.join(sorted(tables))} added on {created[:10]} from a calibration on {device.get('name')} (driver "
        f"{environment.get('driver')}, torch {versions.get('torch')}); every other table is the "
        f"{base.created[:10]} calibration unless another note says so")
    data["calibration"]["notes"].extend(notes or ())  # what the calibration of the added tables noticed
    return profile_from_dict(data)


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)


def uniform_profile(peak_flops: float, bandwidth: float, efficiency: float = 1.0, launch: float = 0.0,
                    name: str = "uniform", kind: str = "cpu") -> Profile:
    """A profile with every table at one efficiency and every launch cost equal to `launch` (tests, and the
    'roofline' reading of the time model: efficiency 1 and no launch cost give the roofline exactly). `kind`
    "cuda" gives the fast mode its CUDA graphs and fused batch-1 decode step, "cpu" runs it eagerly."""
    e = float(efficiency)
    tables = {}
    for dt in DTYPE_BYTES:
        tables[f"gemm.{dt}"] = {"axes": {"m": [1.0], "n": [1.0], "k": [1.0]}, "efficiency": [[[e]]]}
        tables[f"grouped_gemm.{dt}"] = {"axes": {"tokens": [1.0], "n": [1.0], "k": [1.0]}, "efficiency": [[[e]]],
                                        "meta": {"experts": 64}}
    for mem in MEMORY_KINDS:
        extra = EXTRA_AXES.get(f"memory.{mem}", {})  # every axis, one value each: the same at every shape
        tables[f"memory.{mem}"] = {"axes": {"bytes": [1.0], **{a: [1.0] for a in extra}},
                                   "efficiency": _deepen([e], 1, len(extra))}
    for impl in ATTENTION_IMPLS:
        extra = EXTRA_AXES.get(f"attention.{impl}", {})
        tables[f"attention.{impl}"] = {"axes": {"bh": [1.0], "q": [1.0], "k": [1.0], "d": [1.0],
                                                **{a: [1.0] for a in extra}},
                                       "efficiency": _deepen([[[[e]]]], 4, len(extra))}
        if impl != "sdpa_bias":
            tables[f"attention.{impl}.causal"] = {"axes": {"bh": [1.0], "s": [1.0], "d": [1.0]},
                                                  "efficiency": [[[e]]]}
    return build_profile(device={"name": name, "kind": kind}, environment={}, versions={},
                         ceilings={"flops_per_s": peak_flops, "bytes_per_s": bandwidth, "source": "given"},
                         launch={k: launch for k in LAUNCH_KEYS}, tables=tables,
                         calibration={"quick": False, "synthetic": True}, created="1970-01-01T00:00:00+00:00")
