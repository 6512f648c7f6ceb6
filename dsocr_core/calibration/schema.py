"""The strict schema of a calibration profile file (pydantic, unknown fields refused): see profile.py."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ..registry import HOST_COST_STAGES


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Device(Strict):
    name: str
    kind: Literal["cuda", "cpu"]
    sm_count: int | None = None
    memory_gb: float | None = None
    l2_bytes: int | None = None


class Ceilings(Strict):
    flops_per_s: float
    bytes_per_s: float
    source: str


# The host cost of one eager op by kind (calibration/ops.py host_mixes): a GEMM (F.linear), attention (SDPA, which
# dispatches through several layers), any other launching op (elementwise, casts, reductions, softmax, top-k,
# gathers, cat) and a view that launches nothing (slicing, view, transpose): the time model prices each eager op at
# its kind's cost (analytic/kernels.py host_kind), not at the mean of a mix whose one SDPA in twelve ops weighs
# the same as the LM's hundreds of elementwise ops per layer.
HOST_KINDS = ("gemm", "attention", "other", "view")


class Launch(Strict):
    graph_kernel_s: float
    eager_kernel_s: float
    host_op_s: float  # the mean over the whole mix: what a kind the profile did not measure costs
    sync_s: float
    graph_launch_s: float
    host_op_s_by_kind: dict[Literal[HOST_KINDS], float] | None = None  # absent in profiles made before it
    # the host cost of one launching op of the reference model's own code per stage (calibration/host_stages.py;
    # registry.HOST_COST_STAGES says which stages and why); absent in profiles made before it
    host_op_s_by_stage: dict[Literal[HOST_COST_STAGES], float] | None = None
    # the device time a graph replay adds between the stage timer's events beyond its kernels (the graph's start;
    # the timer's wait hides the host's submission); the fast plan charges it to the projector and the LM prefill;
    # absent in profiles made before 2026-11-27
    graph_start_s: float | None = None
    # the host's speed while the host costs by kind and by stage were measured (runtime/host_speed.py's probe, seconds
    # per small eager op): a measured point is predicted at its own speed, these costs scaled by the probes' ratio;
    # absent in profiles made before 2026-11-27 (no scaling)
    host_probe_op_s: float | None = None
    host_stage_probe_op_s: float | None = None


class TableModel(Strict):
    axes: dict[str, list[float]]
    efficiency: list
    measured: list | None = None
    meta: dict[str, Any] = {}


class Derivation(Strict):
    source: dict[str, Any]
    target: dict[str, Any]
    ratios: dict[str, float | None]
    method: str


class ProfileModel(Strict):
    format: str
    format_version: int
    created: str
    device: Device
    environment: dict[str, Any]
    versions: dict[str, Any]
    ceilings: Ceilings
    launch: Launch
    tables: dict[str, TableModel]
    calibration: dict[str, Any]
    derived: bool
    derivation: Derivation | None = None


def first_problem(exc: ValidationError) -> str:
    e = exc.errors()[0]
    where = ".".join(str(p) for p in e["loc"]) or "top level"
    kind = e.get("type", "")
    if kind == "missing":
        return f"missing field {where!r}"
    if kind == "extra_forbidden":
        return f"unknown field {where!r}"
    return f"field {where!r}: {e['msg']}"
