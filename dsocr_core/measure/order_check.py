"""The order check of a measured run: its first point (a dataset run's first page) measured again after every
other, compared stage by stage with its first measurement.

A point's time must be a property of the point, not of what the run measured before it. If the repeat differs
from the first measurement by more than the two measurements' own spread allows, something the run left behind
(compiled variants, graphs, cache room, the allocator) changed how the point runs, and the run is flagged. The
allowance is twice the narrower of the two spreads: a first measurement that had not settled (its repeats 15 to
139 us where the repeat's are 15 us to within 0.3 us, the projector of an H100 run of 2026-11-27) must not
excuse itself by its own spread, while two equally noisy measurements still allow what either shows.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from ..registry import vision_stage_names
from ..runtime import gpu_state

# every family's (registry); a run compares the stages its model has (the others are missing, so not compared)
CHECKED_STAGES = (*vision_stage_names(), "prefill", "decode_step")
# Differences under these are noise on any device: 2% of the stage (the order-independence target's median)
# or 20 us (launch jitter of the smallest stages), whichever is larger.
RELATIVE_FLOOR = 0.02
ABSOLUTE_FLOOR_S = 20e-6


def _spread_s(stats: Mapping[str, Any]) -> float:
    """The repeats' range (max - min) in seconds; 0 for a single timing."""
    lo, hi = stats.get("min_s"), stats.get("max_s")
    return float(hi - lo) if lo is not None and hi is not None else 0.0


def compare(first: Mapping[str, Mapping], again: Mapping[str, Mapping], workload: Mapping[str, Any]) -> dict:
    """{workload, stages: {stage: first_s, again_s, relative, allowed, ok}, flagged, worst}. A stage differs
    beyond its allowance when |again - first| > max(2 x the narrower range, RELATIVE_FLOOR x first,
    ABSOLUTE_FLOOR_S). Stages missing from either side (or of zero time) are not compared."""
    stages: dict[str, dict] = {}
    for name in CHECKED_STAGES:
        a, b = first.get(name), again.get(name)
        if not a or not b or not a.get("median_s"):
            continue
        first_s, again_s = float(a["median_s"]), float(b["median_s"])
        allowed_s = max(2 * min(_spread_s(a), _spread_s(b)), RELATIVE_FLOOR * first_s, ABSOLUTE_FLOOR_S)
        stages[name] = {"first_s": first_s, "again_s": again_s, "relative": again_s / first_s - 1,
                        "allowed": allowed_s / first_s, "ok": abs(again_s - first_s) <= allowed_s}
    off = [s for s, v in stages.items() if not v["ok"]]
    worst = max(stages, key=lambda s: abs(stages[s]["relative"]) / stages[s]["allowed"], default=None)
    return {"workload": dict(workload), "stages": stages, "flagged": bool(off), "stages_off": off, "worst": worst}


def failed(check: Mapping[str, Any] | None) -> bool:
    """Whether a run's check found its first point's repeat beyond the spread (not: skipped or absent)."""
    return bool(check and check.get("flagged"))


def summary(check: Mapping[str, Any] | None) -> str | None:
    """One line for the CLI and the dashboard, or None when the run has no check."""
    if not check:
        return None
    if check.get("skipped"):
        return f"order check skipped: {check['skipped']}"
    if not check.get("stages"):
        return "order check: nothing comparable was measured"
    parts = [f"{s} {v['relative']:+.1%} (allowed ±{v['allowed']:.1%})" for s, v in check["stages"].items()]
    if failed(check):
        return ("order check FAILED: the first point, measured again at the end, differs beyond its spread in "
                f"{', '.join(check['stages_off'])}; this run's times depend on measurement order: " + "; ".join(parts)
                + _gpu_states(check))
    return "order check passed: the first point measured again at the end agrees: " + "; ".join(parts)


def _gpu_states(check: Mapping[str, Any]) -> str:
    """'; GPU at the first measurement: SM 1,980 MHz, ...; at the repeat: ...' where both were recorded (the
    state at the end of each measurement's timed repeats): whether the GPU itself ran at other clocks."""
    first, again = (((check.get(k) or {}).get("after")) for k in ("gpu_state_first", "gpu_state_again"))
    if not first or not again:
        return ""
    return f"; GPU at the first measurement: {gpu_state.describe(first)}; at the repeat: {gpu_state.describe(again)}"


def with_gpu_states(check: dict, first_extra: Mapping[str, Any], again_gpu: Mapping | None) -> dict:
    """The check with the GPU's state of both measurements (the first point's as stored, the repeat's): whether
    the GPU itself ran at other clocks. Returns the check."""
    check["gpu_state_first"] = first_extra.get("gpu_state")
    check["gpu_state_again"] = again_gpu
    return check


def first_point(store, run_id: str) -> tuple[dict, dict[str, dict], dict] | None:
    """(key, {stage: stored statistics}, the point's extra) of the run's first finished point (the lowest point
    id: points are numbered as they are first stored), or None when fewer than two points are done (nothing ran
    after it)."""
    frame = store.points(run_id)
    done = frame[(frame["status"] == "done") & frame["stage"].notna()]
    if done["point_id"].nunique() < 2:
        return None
    rows = done[done["point_id"] == done["point_id"].min()]
    stages = {r["stage"]: {"median_s": r["median_s"], "min_s": r["min_s"], "max_s": r["max_s"]}
              for _, r in rows.iterrows()}
    extra = rows["extra"].iloc[0]
    return json.loads(rows["key"].iloc[0]), stages, (extra if isinstance(extra, dict) else {})


def record(store, run_id: str, check: dict) -> dict:
    """Store a check in the run's meta["order_check"]; returns it."""
    store.update_run(run_id, meta={"order_check": check})
    return check
