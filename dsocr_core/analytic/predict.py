"""Predicted time: the roofline plus what the kernels that really run cost beyond it, from a calibration profile.

For one call of an analytic row (rows carry their kernel shapes in `Row.ctx`), the engine's kernel plan (built from
the prediction's engine description, engines.EngineSpec.kernel_plan) lists the kernels the engine runs and splits
the row's FLOPs and bytes over them. With P and W the profile's ceilings:

    roofline  R = max(F / P, B / W)                                     (the row's roofline on the profile)
    kernel    K = sum_k [ max(F'_k / P, B'_k / W) / eff_k - max(F_k / P, B_k / W) ]
    launch    L = launches x per-launch device cost (graph gap in the fast mode, eager gap in the reference)
    device    D = R + K + L
    host      H = sum over kinds of eager host ops x host cost of the kind + syncs x sync_s
                  + graph replays x graph_launch_s
    time      t = max(D, H) = D + max(H - D, 0)

eff_k is the profile's efficiency of kernel k at its shape (log-space interpolation, clamped at the edges; above 1,
which a profile may hold up to calibration.profile.MAX_EFFICIENCY, it is taken as 1, so no kernel is predicted
faster than its own roofline and no row faster than the roofline of the work the engine really does);
(F_k, B_k) its share of the row's work, (F'_k, B'_k) the work the engine really does (= the share with
work="analytic"). The shares partition the row, so with every efficiency 1, every launch cost 0 and
work="analytic" the prediction is the roofline exactly; with work="engine" it is the roofline plus the engine's
uncounted work (the reference cache's concatenation) minus the traffic the fast engine does not do (SAM's dense
mask, fused elementwise ops). Decode rows sum the steps: the roofline in closed form (cost.sum_of_max), the rest by
Simpson's rule over the first, middle and last step (every count is affine in the context; efficiencies vary
smoothly with it), or, for an engine whose decode kernels change shape at a static cache's bucket edges
(EnginePlan.step_bucket: the cache's length, the split-KV kernel's fill), over each bucket's steps on their own
(within a bucket the shapes vary smoothly; across an edge they jump). Everything is numpy over sweep points; nothing
loops over points.

overlap="kernel" (an option, off by default) replaces R by the sum of the kernels' own rooflines: kernels run one
after another, so a call of compute-bound GEMMs and memory-bound elementwise kernels cannot overlap the two as
the row's roofline assumes. It no longer equals the roofline at efficiency 1 (it is >= it); docs/time-model.md
gives the size of the difference per stage.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from pydantic import ConfigDict, Field

from ..engines import EngineSpec, as_engine
from ..registry import stage_names, stage_rank
from ..spec import Hardware, SpecError
from .cost import FIELDS as COST_FIELDS, Cost, Row
from .kernels import EVERY_ROW, Call, Kernel, host_ops_by_kind

# a decode row's steps are summed one Simpson panel per cache bucket, up to this many panels; beyond it whole buckets
# share a panel. Each panel prices its row three more times: the analytic sweep's 102,120 points (up to 8,192 steps)
# with an H200 profile ran at 587,000 points/s with one panel, 236,000 with up to 4 and 174,000 with up to 8; against
# the steps priced one by one, 4 panels were within 0.9% (one: -3.6% to +1.6%; tests/test_split_kv_fill.py)
MAX_BUCKET_PANELS = 4
PREDICTED = ("predicted_s", "predicted_roofline_s", "predicted_kernel_s", "predicted_launch_s", "predicted_host_s")
WORK_MODES = ("engine", "analytic")
OVERLAP_MODES = ("row", "kernel")


@dataclass(frozen=True, eq=False)
class Prediction:
    """What a prediction needs besides the workload: a profile, the engine (kind and options: its kernel plan),
    the work convention, the overlap model and the MoE routing (None: uniform, each token picking k of E experts
    independently; else a routing.Routing, e.g. observed in a measured run)."""

    profile: Any  # calibration.profile.Profile
    engine: EngineSpec
    work: str = "engine"
    overlap: str = "row"  # row: the roofline of each call (compute and memory overlap across its kernels);
    # kernel: each kernel's own roofline, summed (kernels run one after another; no longer equal to the roofline)
    routing: Any = None
    # the host's speed at a measured point (runtime/host_speed.py probe, seconds per op): its eager host costs are
    # the profile's scaled by this over the profile's own probe; None: the host as fast as when the profile measured
    host_probe_op_s: float | None = None
    # the SM clock each stage of a measured point ran at, ((stage, MHz), ...) (runtime/gpu_clocks.py; at_clocks):
    # the cycles of a stage's kernels (a compute-bound kernel's time; a bandwidth-bound one's beyond its bytes'
    # floor; the launches) take (the profile's clock over this) ** CLOCK_EXPONENT times longer; None: at the
    # calibration's clock
    clocks: tuple | None = None
    # the clocks are a what-if (at_sm_clock: every stage at one clock the user chose), not a point's measurement
    clocks_what_if: bool = False
    # the full SM clock of the GPU a measured run ran on (its environment's maximum): a DERIVED profile's tables
    # stand for that GPU at its full clock, so its points' clocks are scaled against this (calibration_clock)
    gpu_clock_mhz: float | None = None
    notes: set = field(default_factory=set, compare=False)  # fallbacks taken (a table missing from the profile)

    def __post_init__(self):
        if not isinstance(self.engine, EngineSpec):
            raise SpecError(f"a prediction needs an engine description (engines.EngineSpec), got {self.engine!r}")
        if self.work not in WORK_MODES:
            raise SpecError(f"work must be one of {', '.join(WORK_MODES)}, got {self.work!r}")
        if self.overlap not in OVERLAP_MODES:
            raise SpecError(f"overlap must be one of {', '.join(OVERLAP_MODES)}, got {self.overlap!r}")

    @property
    def session_mode(self) -> str:
        return self.engine.kind

    def routing_label(self) -> str:
        return UNIFORM_ROUTING if self.routing is None else self.routing.label()

    def host_ratio(self, table: str) -> float:
        """The point's host over the profile's while it measured the host costs `table` ("kinds", "stages")."""
        return host_ratio(self.host_probe_op_s, self.profile.host_probe(table))

    def host_label(self) -> str:
        """The host speed the prediction is at: the point's over the calibration's, per host-cost table probed."""
        ratios = [f"{self.host_ratio(t):.2f}x ({name})" for t, name in HOST_TABLES.items()
                  if self.host_probe_op_s is not None and self.profile.host_probe(t)]
        if not ratios:
            return HOST_AS_CALIBRATED
        return f"measured with the point: {', '.join(ratios)} the calibration's host time per op"

    def calibration_clock(self) -> float | None:
        """The SM clock the tables stand for: the profile's calibration clock; for a derived profile (whose tables
        are another GPU's, scaled to this one's ceilings) the full clock of the GPU the run ran on, where known."""
        if self.profile.derived:  # a what-if clock cannot move them: nothing says which clock they stand for
            return None if self.clocks_what_if else self.gpu_clock_mhz
        return self.profile.clock_mhz

    def clock_label(self) -> str:
        """The clocks the prediction is at: the calibration's, or the point's per stage against it."""
        cal = self.calibration_clock()
        whose = "the run's GPU's full" if self.profile.derived else "the calibration's"
        if not self.clocks or cal is None:
            return CLOCKS_AS_CALIBRATED + (f" ({cal:,.0f} MHz)" if cal and not self.profile.derived else "")
        if self.clocks_what_if:
            return f"what-if: SM {self.clocks[0][1]:,.0f} MHz in every stage against {whose} {cal:,.0f} MHz"
        stages = ", ".join(f"{s} {mhz:,.0f}" for s, mhz in self.clocks)
        return f"measured with the point: SM {stages} MHz against {whose} {cal:,.0f} MHz"

    def summary(self) -> dict:
        """What every export says about the prediction (the profile's label travels with it)."""
        return {**self.profile.summary(), "session_mode": self.session_mode, "engine": self.engine.to_dict(),
                "engine_label": self.engine.label(), "work": self.work, "overlap": self.overlap,
                "routing": self.routing_label(), "host_speed": self.host_label(), "clocks": self.clock_label(),
                "notes": sorted(self.notes)}


UNIFORM_ROUTING = "uniform (assumed)"  # each token picks its k of the E routed experts independently
HOST_TABLES = {"kinds": "op kinds", "stages": "the model's code"}  # the profile's host costs, each with its probe
HOST_AS_CALIBRATED = "as calibrated"  # the host issues ops as fast as when the profile measured its host costs
# compute-bound kernels at the SM clock the tables were timed at (the full clock): what-if predictions, and points
# measured without recording their clocks. Under sustained load a GPU at its power cap runs slower (gpu_clocks.py)
CLOCKS_AS_CALIBRATED = "the calibration's full SM clock"
CLOCK_STEP_MHZ = 5.0  # a point's stage clocks are rounded to this: points of a run share a few predictions
# time counted in SM cycles grows as (f_cal / f) ** CLOCK_EXPONENT when the reported SM clock falls from f_cal to f:
# on an H200 at its power cap, 8192^3 GEMMs ran 1.179-1.206x slower at clocks 1.294-1.333x lower (steady state,
# 100 ms-5 s; benchmarks/sustained_load.py prints the exponent of a GPU: 0.64-0.70 there, median 0.66). The reported
# clock is a sample of one that moves faster than it is read, and part of a GEMM's time waits on memory, which runs
# at its own clock. With the exponent 1 SAM's large batches were over-predicted by 2-4% (docs/accuracy.md). Cycles
# are a compute-bound kernel's whole time, a bandwidth-bound kernel's time beyond its bytes at the profile's
# bandwidth (its ramp, drain and latency: a batched decode step, all bandwidth-bound kernels, ran 1.13-1.20x slower
# right after GEMMs had lowered the clock to 1,440-1,575 MHz, benchmarks/decode_clocks.py), and the launches' cost
CLOCK_EXPONENT = 0.66


class ProfiledHardware(Hardware):
    """A Hardware (the roofline's ceilings) that also carries a Prediction: every function that takes a
    Hardware (evaluate, sweep_columns, capacity, the chunked sweep writer) then adds predicted columns."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)
    prediction: Any = Field(default=None, exclude=True)


def with_profile(hw: Hardware, profile, engine: "EngineSpec | str" = "reference", work: str = "engine",
                 overlap: str = "row", routing=None, host_probe_op_s: float | None = None,
                 gpu_clock_mhz: float | None = None) -> ProfiledHardware:
    """`hw` plus a prediction from `profile` for `engine` (an EngineSpec, or a session mode: its default
    options), under `routing` (None: uniform), at the host speed `host_probe_op_s` (None: the calibration's), for
    a measured run on a GPU whose full SM clock is `gpu_clock_mhz` (Prediction.gpu_clock_mhz; None: unknown)."""
    try:  # anything but a clock any GPU could have (a unit mix-up, a string) is unknown, not a huge ratio
        gpu = what_if_mhz(gpu_clock_mhz)
    except SpecError:
        gpu = None
    return ProfiledHardware(**hw.model_dump(), prediction=Prediction(profile, as_engine(engine), work, overlap,
                                                                     routing, host_probe_op_s,
                                                                     gpu_clock_mhz=gpu))


def at_host_speed(hw: ProfiledHardware, host_probe_op_s: float | None) -> ProfiledHardware:
    """`hw`'s prediction at another host speed (a measured point's probe; None: the calibration's); its notes are
    shared, so fallbacks taken under either show in both."""
    pred = hw.prediction
    ref = pred.profile.host_probe("stages") or pred.profile.host_probe("kinds")
    if host_probe_op_s is not None and ref:  # to 1% of the calibration's speed, far finer than the probe's noise:
        host_probe_op_s = ref * round(host_probe_op_s / ref, 2)  # the points of a run share a few predictions
    elif not ref:
        host_probe_op_s = None  # a profile without a probe: nothing to scale against
    if pred.host_probe_op_s == host_probe_op_s:
        return hw
    return hw.model_copy(update={"prediction": replace(pred, host_probe_op_s=host_probe_op_s, notes=pred.notes)})


def at_clocks(hw: ProfiledHardware, stage_clocks: dict | None) -> ProfiledHardware:
    """`hw`'s prediction at the SM clocks a measured point recorded per stage ({stage: {"mhz", "samples"}},
    runtime/gpu_clocks.clocks_by_stage; None: the calibration's clock). A stage no reading fell in takes the clock
    of the stage that ran before it (in registry.stage_rank's order: a store keeps the dict sorted by name): it is
    a short stage, and the clock moves over tens of milliseconds."""
    pairs, last = [], None
    for stage, rec in sorted((stage_clocks or {}).items(), key=lambda kv: (stage_rank(kv[0]), kv[0])):
        mhz = (rec or {}).get("mhz") if isinstance(rec, dict) else None
        last = mhz if isinstance(mhz, (int, float)) and mhz > 0 else last
        if last is not None:
            pairs.append((stage, _rounded_clock(last)))
    return _with_clocks(hw, tuple(pairs) or None, what_if=False)


def _rounded_clock(mhz: float) -> float:
    """A clock as predictions use it: to CLOCK_STEP_MHZ, so that the points of a run share a few predictions."""
    return CLOCK_STEP_MHZ * round(float(mhz) / CLOCK_STEP_MHZ)


def _with_clocks(hw: ProfiledHardware, clocks: tuple | None, what_if: bool) -> ProfiledHardware:
    """`hw`'s prediction at `clocks` ((stage, MHz), ...), a what-if or a point's; `hw` itself where it already is.
    Notes are shared as in at_host_speed."""
    what_if = what_if and clocks is not None
    pred = hw.prediction
    if pred.clocks == clocks and pred.clocks_what_if == what_if:
        return hw
    return hw.model_copy(update={"prediction": replace(pred, clocks=clocks, clocks_what_if=what_if,
                                                       notes=pred.notes)})


WHAT_IF_MHZ = (100.0, 5000.0)  # what a what-if SM clock may be: any GPU's clock lies between


def what_if_mhz(mhz) -> float | None:
    """A what-if SM clock as predictions use it (rounded to CLOCK_STEP_MHZ, like a point's), None for None; a
    SpecError for anything but a number of MHz in WHAT_IF_MHZ."""
    if mhz is None:
        return None
    lo, hi = WHAT_IF_MHZ
    if isinstance(mhz, bool) or not isinstance(mhz, numbers.Real) or not math.isfinite(mhz) or not lo <= mhz <= hi:
        raise SpecError(f"a what-if SM clock is a number of MHz from {lo:,.0f} to {hi:,.0f}, got {mhz!r}")
    return _rounded_clock(mhz)


def at_sm_clock(hw: ProfiledHardware, mhz: float | None) -> ProfiledHardware:
    """`hw`'s what-if prediction with every stage at the SM clock `mhz` (None: the calibration's), e.g. the clock a
    GPU holds at its power cap under sustained large batches (an H200: about 1,500-1,700 MHz against 1,980; see
    benchmarks/sustained_load.py). Above the calibration's clock every kernel stays as timed. A measured point's
    prediction takes its own clocks instead (at_clocks), whatever was asked here."""
    step = what_if_mhz(mhz)
    clocks = None if step is None else tuple((stage, step) for stage in stage_names() if stage != "vision")
    return _with_clocks(hw, clocks, what_if=True)


def profile_hardware(profile, memory_gb: float | None = None) -> Hardware:
    """A Hardware whose ceilings are the profile's (its roofline is the one the time model adds to)."""
    mem = memory_gb or profile.device.get("memory_gb") or 1.0
    return Hardware(name=profile.device_name, peak_tflops=profile.peak_flops / 1e12,
                    bandwidth_tbs=profile.bandwidth / 1e12, memory_gb=float(mem),
                    source=f"ceilings of the calibration profile: {profile.raw['ceilings']['source']}",
                    calibrated=not profile.derived)


def predictor_for(hw) -> "Predictor | None":
    pred = getattr(hw, "prediction", None)
    return None if pred is None else Predictor(pred)


# table kind in a plan -> the profile tables to try, in order, and how to read the kernel's coordinates there
def _candidates(name: str, dtype: str) -> list[tuple[str, Any]]:
    same = None
    if name == "gemm":
        return [(f"gemm.{dtype}", same), ("gemm.bfloat16", same)]
    # a layer's own table in the run's dtype, else the GEMM it computes in that dtype (profiles made before the
    # table, and dtypes it was not measured in), then both in bf16
    if name == "conv":
        return [(f"conv.{dtype}", same), (f"gemm.{dtype}", same), ("conv.bfloat16", same), ("gemm.bfloat16", same)]
    if name == "linear":
        return [(f"linear.{dtype}", same), (f"gemm.{dtype}", same), ("linear.bfloat16", same), ("gemm.bfloat16", same)]
    if name == "gemm.float32":
        return [("gemm.float32", same), ("gemm.bfloat16", same)]
    if name == "grouped_gemm":
        to_gemm = lambda c: dict(m=c["tokens"], n=c["n"], k=c["k"])  # noqa: E731
        return [(f"grouped_gemm.{dtype}", same), ("grouped_gemm.bfloat16", same), (f"gemm.{dtype}", to_gemm),
                ("gemm.bfloat16", to_gemm)]
    if name == "attention.split_kv":  # the fast engine's batched decode attention; else flash at its shape
        return [(name, same), ("attention.flash", same), ("attention.sdpa", same)]
    if name.startswith("attention."):
        impl, causal = name.split(".")[1], name.endswith(".causal")
        # then sdpa; the default backend's causal table first flash, which the fast LM prefill was priced on before
        later = (["flash"] if impl == "default" and causal else []) + ([] if impl == "sdpa" else ["sdpa"])
        out = [(name, same)] + [(f"attention.{i}" + (".causal" if causal else ""), same) for i in later]
        if causal:  # a non-causal table at q = k = s (the causal kernel skips about half of that work)
            square = lambda c: dict(bh=c["bh"], q=c["s"], k=c["s"], d=c["d"])  # noqa: E731
            out += [(f"attention.{i}", square) for i in [impl, *later]]
        return out
    if name == "memory.fused_attention":  # the fused decode kernel; else the flash table at its shape
        return [(name, same), ("attention.flash", same), ("attention.sdpa", same)]
    if name == "memory.fused_gemv":
        return [(name, same), ("memory.gemv", same), ("memory.elementwise", same), ("memory.copy", same)]
    # the fused step's lm_head kernel and the by-expert Triton experts of batched decode: else the fused step's
    # weight-streaming kernels' table, and what that falls back to
    if name in ("memory.fused_lm_head", "memory.moe_gemv"):
        return [(name, same), *_candidates("memory.fused_gemv", dtype)]
    if name == "memory.moe_gemv_combine":  # profiles made before it: the same kernels without the combine
        return [(name, same), *_candidates("memory.moe_gemv", dtype)]
    if name == "bias.strided":  # profiles made before the bias tables: by bytes (the kernels carry both), a copy
        return [(name, same), ("memory.copy", same), ("memory.elementwise", same)]
    if name == "memory.projector_cat":  # profiles made before it: the reference's cat (reads through a transpose)
        return [(name, same), ("memory.transposed_cat", same), ("memory.elementwise", same), ("memory.copy", same)]
    if name in ("memory.permuted_copy", "memory.permuted_add"):  # profiles made before them: reads across a stride
        return [(name, same), ("memory.transposed_cat", same), ("memory.elementwise", same), ("memory.copy", same)]
    if name.startswith("memory.") or name == "bias.broadcast":
        return [(name, same), ("memory.elementwise", same), ("memory.copy", same)]
    raise SpecError(f"unknown kernel table {name!r}")


# the plans' tables of bandwidth-bound kernels: their time does not follow the SM clock (Predictor._excess)
MEMORY_TABLES = ("memory.", "bias.")

# every kernel kind the engines' plans (analytic/kernels.py builders) time, and the dtypes they are looked up in
PLAN_TABLES = ("gemm", "gemm.float32", "grouped_gemm", "conv", "linear", "attention.sdpa", "attention.sdpa.causal",
               "attention.flash", "attention.flash.causal", "attention.default", "attention.default.causal",
               "attention.eager", "attention.eager.causal", "attention.sdpa_bias", "attention.split_kv",
               "memory.copy", "memory.elementwise", "memory.norm", "memory.gemv", "memory.fused_gemv",
               "memory.moe_gemv", "memory.moe_gemv_combine", "memory.fused_attention", "memory.fused_lm_head",
               "memory.transposed_cat", "memory.projector_cat", "memory.gather_rows", "memory.group_rows", "memory.cast",
               "memory.broadcast", "memory.index_put", "memory.permuted_copy", "memory.permuted_add", "bias.broadcast",
               "bias.strided")


def timing_table(profile, name: str, dtype: str):
    """(the profile's table that times kernel kind `name` in `dtype`: itself or the first fallback it has, the
    conversion of the kernel's coordinates to that table's, whether it is a fallback), or None where the profile
    has none of them."""
    for i, (cand, conv) in enumerate(_candidates(name, dtype)):
        table = profile.table(cand)
        if table is not None:
            return table, conv, i > 0
    return None


def prediction_gaps(profile, dtypes: tuple[str, ...] = ("bfloat16", "float32")) -> list[str]:
    """Kernel kinds the plans use that no table of `profile` can time, not even through a fallback (a calibration
    stopped or out of budget before it reached them): such a profile would fail in the middle of a prediction,
    so the dashboard refuses it up front."""
    return sorted({name for name in PLAN_TABLES for dt in dtypes if timing_table(profile, name, dt) is None})


# what pricing off the one value an older table has on an axis added since does to the prediction
AXIS_ADDED_MISS = {"tokens": "under-pricing larger ones (each program multiplies a whole token tile)",
                   "fill": "under-pricing smaller ones (the split-KV grid's chunks past the position still run)"}


class Predictor:
    """Predicted time of analytic rows under one Prediction (see the module docstring)."""

    def __init__(self, prediction: Prediction):
        p = prediction.profile
        self.prediction = prediction
        self.profile = p
        self.engine_work = prediction.work == "engine"
        self.kernel_overlap = prediction.overlap == "kernel"
        self.P, self.W = p.peak_flops, p.bandwidth
        launch = p.launch
        # the engine's plan on the profile's device kind: a fast engine on a CPU runs eagerly, without graphs
        self.plan = prediction.engine.kernel_plan(p.device.get("kind", "cuda"))
        # rows whose kernels the engine runs one after another with nothing fused across them: their kernels'
        # own rooflines add up, whatever the overlap setting (EnginePlan.separate_rows; none by default). Part of
        # the engine's work: with work="analytic" every row keeps the analytic roofline
        rows = getattr(self.plan, "separate_rows", ()) if self.engine_work else ()
        self.separate = rows if isinstance(rows, type(EVERY_ROW)) else frozenset(rows)
        prediction.notes.update(self.plan.notes)
        self.routing = prediction.routing
        self.graphs = self.plan.graphs
        self.per_launch = launch["graph_kernel_s"] if self.graphs else launch["eager_kernel_s"]
        # per eager op kind (kernels.host_kind), at the point's host speed where it was probed
        kinds = prediction.host_ratio("kinds")
        self.host_costs, self.sync_s = {k: v * kinds for k, v in p.host_costs.items()}, launch["sync_s"]
        # a plan whose eager ops are the model's own code (EnginePlan.host_costs_by_stage) prices them at the
        # profile's host cost per op of that code, by stage, where the profile measured it (views folded in)
        by_stage = getattr(self.plan, "host_costs_by_stage", False) and p.device.get("kind", "cuda") == "cuda"
        stages = prediction.host_ratio("stages")  # (a CPU's ops run synchronously: no host term)
        self.stage_costs = {k: v * stages for k, v in p.host_stage_costs.items()} if by_stage else {}
        if by_stage and not self.stage_costs:
            prediction.notes.add("the profile has no host cost per op of the model's own code (calibrate --tables "
                                 "launch.host_stages): the reference engine's eager ops are priced at the op "
                                 "mixes' costs by kind")
        if by_stage and p.view_share_assumed is not None:
            prediction.notes.add(f"the profile has no host cost of a view (calibrate --tables launch.host_kinds): the "
                                 f"reference engine's views outside the stages with a host cost of their own (the "
                                 f"expert loop's in the LM prefill, the projector's) are priced at "
                                 f"{p.view_share_assumed:g} of an eager op's mean cost, the share an H200's host "
                                 "measured")
        self.graph_launch_s = launch["graph_launch_s"] * kinds if self.graphs else 0.0
        self.graph_start_s = (p.graph_start_s or 0.0) if self.graphs else 0.0
        if self.graphs and p.graph_start_s is None:
            prediction.notes.add("the profile has no graph start cost (calibrate --tables launch.graph_start): the "
                                 "projector's and the LM prefill's graphs are predicted without the few us a replay "
                                 "adds (the projector's share of it is largest)")
        # per stage: the calibration's SM clock over the one the point ran at, to CLOCK_EXPONENT (time counted in
        # cycles grows with it; never below 1: the tables ran at the full clock); row() sets self._clock
        cal = prediction.calibration_clock()
        if prediction.clocks and cal is None:
            prediction.notes.add("the profile records no calibration clock (a CPU profile, or a derived one for a run "
                                 "that recorded no full SM clock, or a what-if): the SM clocks asked for are not used")
        self.clock_ratio = ({s: max(cal / mhz, 1.0) ** CLOCK_EXPONENT for s, mhz in prediction.clocks}
                            if prediction.clocks and cal else {})
        self._clock = 1.0
        self._resolved: dict[tuple[str, str], tuple[Any, Any]] = {}
        self._batches: dict[int, tuple] = {}  # per call context (its id): its distinct batch sizes
        self._paths: dict[int, tuple] = {}  # per call context (its id): its decode paths' points
        self._nodes: dict[tuple, tuple] = {}  # per decode rows' contexts and steps (their ids): _step_nodes

    # ----------------------------------------------------------------------------------------- one kernel
    def _table(self, name: str, dtype: str):
        key = (name, dtype)
        if key not in self._resolved:
            found = timing_table(self.profile, name, dtype)
            if found is None:
                raise SpecError(f"the calibration profile has no table for {name} ({dtype}); re-run calibrate")
            table, conv, fallback = found
            if fallback:
                self.prediction.notes.add(f"{name} ({dtype}) timed with table {table.name}: the profile has "
                                          f"no {_candidates(name, dtype)[0][0]}")
            self._resolved[key] = (table, conv)
        return self._resolved[key]

    def efficiency(self, k: Kernel, dtype: str):
        table, conv = self._table(k.table, dtype)
        coords = k.coords if conv is None else conv(k.coords)
        eff = table.lookup(**coords)
        for axis, value in table.meta.get("axes_added", {}).items():  # a table measured before that axis existed
            if axis in coords and np.any(np.asarray(coords[axis]) != value):
                self.prediction.notes.add(self._axis_added_note(k.table, table, axis, value))
        if np.any(eff > 1.0):
            self.prediction.notes.add(f"{table.name}: efficiencies above 1 taken as 1 (never faster than the "
                                      "roofline)")
        return np.minimum(eff, 1.0)

    @staticmethod
    def _axis_added_note(wanted: str, table, axis: str, value: float) -> str:
        """The note of a lookup off the one value an older table has on an axis added since (profile.EXTRA_AXES),
        with what measures it: on this GPU, or on the GPU a derived table came from."""
        source = table.meta.get("derived_from")
        how = (f"measure {wanted} on {source} (calibrate --tables {wanted} --add-to its profile) and derive again"
               if source else f"calibrate --tables {wanted} --add-to PROFILE measures it")
        used = "" if table.name == wanted else f" (priced on {table.name}: the profile has no {wanted})"
        return (f"{table.name}: {'derived from a table ' if source else ''}measured at {axis} {value:g} only, before "
                f"the table had that axis{used}; shapes at other {axis} are priced as at {value:g}, "
                f"{AXIS_ADDED_MISS.get(axis, 'which may misprice them')}: {how}")

    def kernel_s(self, k: Kernel, dtype: str):
        """One planned kernel's device time on its own: its roofline at its table's efficiency plus its launches
        (what a benchmark timing that kernel alone compares with)."""
        own = np.maximum(np.asarray(k.flops, dtype=float) / self.P, np.asarray(k.nbytes, dtype=float) / self.W)
        return own + self._excess(k, dtype) + np.asarray(k.launches, dtype=float) * self.per_launch * self._clock

    def table_name(self, name: str, dtype: str) -> str:
        """The profile's table that times kernel kind `name` (itself, or the fallback the prediction notes)."""
        return self._table(name, dtype)[0].name

    def _excess(self, k: Kernel, dtype: str):
        """The kernel's time beyond its share of the roofline: its real work at its table's efficiency (at the row's
        clock where compute bounds it), less the share."""
        flop_s = np.asarray(k.flops, dtype=float) / self.P
        byte_s = np.asarray(k.nbytes, dtype=float) / self.W
        share = np.maximum(flop_s, byte_s)
        if self.engine_work:
            rf = k.flops if k.real_flops is None else k.real_flops
            rb = k.nbytes if k.real_bytes is None else k.real_bytes
            flop_s, byte_s = np.asarray(rf, dtype=float) / self.P, np.asarray(rb, dtype=float) / self.W
        t = np.maximum(flop_s, byte_s) / self.efficiency(k, dtype)
        if self._clock != 1.0:
            # at a lower SM clock the kernel's cycles take longer (clock_ratio): all of a compute-bound kernel's
            # time; of a bandwidth-bound one only what it takes beyond its bytes at the profile's bandwidth (the
            # memory keeps its own clock; a stream's ramp, drain and latency do not)
            compute = (flop_s >= byte_s) & (not k.table.startswith(MEMORY_TABLES))
            floor = np.where(compute, 0.0, np.minimum(byte_s, t))
            t = floor + (t - floor) * self._clock
        return t - share

    # ----------------------------------------------------------------------------------------- one call
    def _call(self, kind: str, cost: Cost, ctx: dict, path: str):
        """(roofline, kernel excess, launch, host) seconds of one call of one module on one decode path. With
        segments (Plan.segments) the host entry is the device time plus the segments' summed excess of host over
        device, so that row()'s max(host - device, 0) is that sum."""
        pl = self.plan.plan(Call(kind, cost, ctx, path, self.routing))
        dtype = ctx.get("dtype", "bfloat16")
        flops, nbytes = cost.flops, cost.bytes
        roof = np.maximum(np.asarray(flops, dtype=float) / self.P, np.asarray(nbytes, dtype=float) / self.W)
        excess, launches, own = 0.0, 0.0, 0.0
        used_f, used_b = 0.0, 0.0
        for k in pl.kernels:
            used_f, used_b = used_f + k.flops, used_b + k.nbytes
            by_batch = k.by_batch and ctx.get("phase") == "decode"
            excess = excess + (self._excess_by_batch(k, dtype, ctx) if by_batch else self._excess(k, dtype))
            own = own + np.maximum(np.asarray(k.flops, dtype=float) / self.P,
                                   np.asarray(k.nbytes, dtype=float) / self.W)
            launches = launches + k.launches
        rest_f = np.maximum(flops - used_f, 0.0)
        rest_b = np.maximum(nbytes - used_b, 0.0)
        # bytes per launch of the remainder: a packed group's share of a launch (fewer than 1) is looked up at
        # the whole launch's bytes, not at this group's
        per = np.where(np.asarray(pl.rest_launches) > 0, pl.rest_launches, 1.0)
        rb = rest_b if pl.rest_real_bytes is None else pl.rest_real_bytes
        rest = Kernel(pl.rest_table, dict(bytes=np.asarray(rb if self.engine_work else rest_b) / per), rest_f,
                      rest_b, pl.rest_launches, real_bytes=pl.rest_real_bytes)
        rest.by_batch = pl.rest_by_batch
        if pl.rest_by_batch and ctx.get("phase") == "decode":
            excess = excess + self._excess_by_batch(rest, dtype, ctx)
        else:
            excess = excess + self._excess(rest, dtype)
        if self.kernel_overlap or kind in self.separate:  # the kernels' own rooflines, one after another
            roof = own + np.maximum(rest_f / self.P, rest_b / self.W)
        launches = launches + pl.rest_launches
        # the launches' cost is the GPU's front end working through its queue: cycles, at the row's clock (seen in
        # graphed decode steps, benchmarks/decode_clocks.py; eager launches are assumed to behave alike)
        launch = (launches * self.per_launch + pl.graph_starts * self.graph_start_s) * self._clock
        ops = host_ops_by_kind(pl, self.graphs)
        per_op = self.stage_costs.get(host_stage(kind, ctx))
        if per_op is None:
            host = sum(n * self.host_costs[k] for k, n in ops.items())
        else:  # the stage's cost per launching op, its views and Python folded in
            host = (ops["gemm"] + ops["attention"] + ops["other"]) * per_op
        host = host + pl.syncs * self.sync_s + pl.graph_launches * self.graph_launch_s
        # the graph's start follows the host's submission, so no host time hides it: it is in the device time
        # (launch) and in the host time the row's overlap compares with it (row() keeps what host exceeds)
        host = host + pl.graph_starts * self.graph_start_s * self._clock
        if pl.segments is not None:  # overlap within each segment only: the host time beyond the device's is the
            # sum over segments of each one's excess, returned as the host time that leaves that excess in row()
            host_share, device_share = pl.segments
            device = np.asarray(roof + excess + launch, dtype=float)[..., None]
            host = device[..., 0] + np.sum(np.maximum(np.asarray(host, dtype=float)[..., None] * host_share
                                                      - device * device_share, 0.0), -1)
        return roof, excess, launch, host

    def call(self, kind: str, cost: Cost, ctx: dict):
        """One call. A decode step takes the path the engine takes at its batch size (plan.decode_paths: the
        fused step at batch 1, the experts' kernels by batch): each group of points is planned with its own."""
        if ctx.get("phase") != "decode":
            return self._call(kind, cost, ctx, "")
        groups = self._path_groups(ctx)
        if len(groups) == 1:
            return self._call(kind, cost, ctx, groups[0][0])
        shape = np.shape(ctx["b"])
        out = [np.zeros(shape) for _ in range(4)]
        for path, idx in groups:  # each plan on its own points only
            part = self._call(kind, *_subset(cost, ctx, idx, shape), path)
            for o, v in zip(out, part):
                o.reshape(-1)[idx] = np.broadcast_to(v, idx.shape)
        return tuple(out)

    # ----------------------------------------------------------------------------------------- one row
    def _path_groups(self, ctx: dict) -> list[tuple[str, np.ndarray]]:
        """[(decode path, flat indices of its points)] of a decode call's points (plan.decode_paths of each distinct
        batch size), computed once per call context: every row of a step shares it."""
        key = id(ctx)
        if key not in self._paths:
            b = np.asarray(ctx["b"])
            first, inv = self._batch_index(ctx)
            paths = np.asarray(self.plan.decode_paths(b.reshape(-1)[first], ctx["spec"]))
            groups = [(str(path), np.flatnonzero(np.isin(inv.reshape(-1), np.flatnonzero(paths == path))))
                      for path in np.unique(paths)]
            self._paths[key] = (ctx, groups)  # ctx kept alive: its id stays unique
        return self._paths[key][1]

    def _batch_index(self, ctx: dict):
        """(index of one point per distinct batch size, inverse map) of a decode call's points (cached)."""
        b = np.asarray(ctx["b"])
        key = id(ctx)
        if key not in self._batches:
            _, first, inv = np.unique(b.reshape(-1), return_index=True, return_inverse=True)
            self._batches[key] = (ctx, first, inv.reshape(b.shape))  # ctx kept alive: its id stays unique
        return self._batches[key][1:]

    def _excess_by_batch(self, k: Kernel, dtype: str, ctx: dict):
        """_excess of a kernel whose work and shape depend on the batch only: once per distinct batch size."""
        b = np.asarray(ctx["b"])
        if b.size < 256:
            return self._excess(k, dtype)
        first, inv = self._batch_index(ctx)
        take = lambda v: np.broadcast_to(v, b.shape).reshape(-1)[first] if np.ndim(v) else v  # noqa: E731
        small = Kernel(k.table, {a: take(v) for a, v in k.coords.items()}, take(k.flops), take(k.nbytes),
                       real_flops=None if k.real_flops is None else take(k.real_flops),
                       real_bytes=None if k.real_bytes is None else take(k.real_bytes))
        e = self._excess(small, dtype)
        return np.asarray(e)[inv] if np.ndim(e) else e

    def _by_batch(self, kind: str, cost: Cost, ctx: dict):
        """call() of a decode row whose cost depends on the batch only (not the context): evaluated once per
        distinct batch size and spread back (same formulas, far fewer array elements)."""
        b = np.asarray(ctx["b"])
        first, inv = self._batch_index(ctx)
        take = lambda v: np.asarray(v).reshape(-1)[first] if np.ndim(v) else v  # noqa: E731
        flops, nbytes = np.broadcast_to(cost.flops, b.shape), np.broadcast_to(cost.bytes, b.shape)
        small = Cost(tensor_flops=take(flops), act_read=take(nbytes))
        if not (np.array_equal(small.tensor_flops[inv], flops) and np.array_equal(small.act_read[inv], nbytes)):
            return self.call(kind, cost, ctx)  # the work depends on more than the batch: every point
        sctx = {k: (take(np.broadcast_to(v, b.shape)) if isinstance(v, np.ndarray) else v) for k, v in ctx.items()}
        return tuple(np.asarray(x)[inv] if np.ndim(x) else x for x in self.call(kind, small, sctx))

    def row(self, row: Row, roofline: tuple | None = None) -> dict[str, Any]:
        """Predicted seconds of ONE module of the row (all its calls, or all its decode steps), by component.
        `roofline`: (peak FLOP/s, bandwidth, row.times(...)[2]) already computed, reused when the ceilings are
        the profile's."""
        if not row.ctx:
            raise SpecError(f"row {row.kind} carries no kernel shapes; build rows with analytic.stages")
        self._clock = self.clock_ratio.get(row.stage, 1.0)
        try:
            return self._row(row, roofline)
        finally:
            self._clock = 1.0

    def _row(self, row: Row, roofline: tuple | None) -> dict[str, Any]:
        separate = self.kernel_overlap or row.kind in self.separate
        if roofline is not None and roofline[0] == self.P and roofline[1] == self.W and not separate:
            roof_sum = roofline[2]
        else:
            roof_sum = None
        if row.steps is not None:
            first, last, n = row.steps
            c0 = row.ctx[0]
            n = np.asarray(n, dtype=float)
            if _same(first, last):  # the context does not change this row's work: one step is every step
                r, e, lt, h = self._by_batch(row.kind, first, c0)
                roof, kernel, launch, host = n * r, n * e, n * lt, n * np.maximum(h - (r + e + lt), 0.0)
            else:
                roof = None if separate else (
                    roof_sum if roof_sum is not None else row.times(self.P, self.W)[2])  # exact over the steps
                kernel = launch = host = summed_roof = 0.0
                for weight, u, ctx in self._step_nodes(row):  # every count is affine in the step: interpolate
                    cost = Cost(**{f: getattr(first, f) + u * (getattr(last, f) - getattr(first, f))
                                   for f in COST_FIELDS})
                    r, e, lt, h = self.call(row.kind, cost, ctx)
                    kernel, launch = kernel + weight * e, launch + weight * lt
                    host = host + weight * np.maximum(h - (r + e + lt), 0.0)
                    summed_roof = summed_roof + weight * r
                roof = summed_roof if roof is None else roof
        else:
            parts = row.parts or (row.cost,)
            roof = kernel = launch = host = 0.0
            for part, ctx in zip(parts, row.ctx):
                r, e, lt, h = self.call(row.kind, part, ctx)
                roof, kernel, launch = roof + r, kernel + e, launch + lt
                host = host + np.maximum(h - (r + e + lt), 0.0)
            if roof_sum is not None:
                roof = roof_sum
        total = roof + kernel + launch + host
        return {"predicted_s": total, "predicted_roofline_s": roof, "predicted_kernel_s": kernel,
                "predicted_launch_s": launch, "predicted_host_s": host}

    def _step_nodes(self, row: Row) -> list[tuple[Any, Any, dict]]:
        """Simpson's rule over a decode row's steps as [(weight, u, the call context at u)]: the steps' sum is
        sum(weight x the step at u), u in [0, 1] from the first step to the last (arrays over points). One panel
        over all the steps, or with a step bucket one per bucket the steps touch (at most MAX_BUCKET_PANELS;
        beyond, whole buckets share a panel): a bucket's steps are those whose cache ends at the same bucket edge.
        Every row of a decode step shares its contexts and step counts, so the nodes and their contexts are built
        once for all of them (and the contexts' per-batch caches with them)."""
        c0, c1 = row.ctx
        steps = row.steps[2]
        key = (id(c0), id(c1), id(steps))
        if key not in self._nodes:
            n = np.asarray(steps, dtype=float)
            bucket = getattr(self.plan, "step_bucket", None)
            if not bucket:
                weighted = [(n / 6, 0.0), (4 * n / 6, 0.5), (n / 6, 1.0)]
            else:
                # the cache length each step attends over: its position + 1 (the query's own slot)
                sq = np.asarray(c0.get("sq", 1), dtype=float)
                k0 = np.asarray(c0["n"], dtype=float) + sq
                k1 = np.asarray(c1["n"], dtype=float) + sq
                buckets = np.max(np.ceil(k1 / bucket) - np.ceil(k0 / bucket)) + 1
                width = float(bucket) * max(1, math.ceil(buckets / MAX_BUCKET_PANELS))
                span = np.where(k1 > k0, k1 - k0, 1.0)
                per_step = n / (k1 - k0 + 1)  # 1, or 0 for a point without decode steps
                start = np.ceil(k0 / width)  # the panel holding the first step
                at = lambda k: np.clip((k - k0) / span, 0.0, 1.0)  # noqa: E731  (u of cache length k)
                weighted = []
                for j in range(int(np.max(np.ceil(k1 / width) - start)) + 1):
                    lo = np.maximum(k0, (start + j - 1) * width + 1)  # this panel's steps, by cache length
                    hi = np.minimum(k1, (start + j) * width)
                    count = np.maximum(hi - lo + 1, 0.0) * per_step
                    weighted += [(count / 6, at(lo)), (4 * count / 6, at((lo + hi) / 2)), (count / 6, at(hi))]
            nodes = [(w, u, dict(c0, n=c0["n"] + u * (c1["n"] - c0["n"]))) for w, u in weighted]
            self._nodes[key] = (c0, c1, steps, nodes)  # kept alive: their ids stay unique
        return self._nodes[key][3]


def host_stage(kind: str, ctx: dict) -> str:
    """The stage a row's call runs in, as the host-cost calibration names it (registry.HOST_COST_STAGES): the vision
    rows' module (sam, clip, projector; DeepSeek-OCR 2's encoder, not measured), the layout with the projector,
    else the phase (prefill, decode)."""
    phase = ctx.get("phase")
    if phase == "vision":
        return kind.split(".")[0]
    return "projector" if phase == "layout" else str(phase)


def host_ratio(point_s: float | None, profile_s: float | None) -> float:
    """How much slower (> 1) or faster the host was at a point than when the profile measured its host costs
    (runtime/host_speed.py's probe on both sides); 1 where either side has no probe."""
    if not point_s or not profile_s:
        return 1.0
    return float(point_s) / float(profile_s)


def _subset(cost: Cost, ctx: dict, idx: np.ndarray, shape: tuple) -> tuple[Cost, dict]:
    """The call's work and shapes at points `idx` only (arrays over the points are indexed, numbers kept)."""
    pick = lambda v: np.broadcast_to(v, shape).reshape(-1)[idx] if np.ndim(v) else v  # noqa: E731
    small = Cost(**{f: pick(getattr(cost, f)) for f in COST_FIELDS})  # every field: a plan may read any of them
    return small, {k: (pick(v) if isinstance(v, np.ndarray) else v) for k, v in ctx.items()}


def _same(a: Cost, b: Cost) -> bool:
    """Two steps with identical work (FLOPs and bytes at every point)."""
    return bool(np.array_equal(a.flops, b.flops) and np.array_equal(a.bytes, b.bytes))
