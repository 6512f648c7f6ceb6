"""Measured points predicted again: each stage's predicted time beside its measurement, and the error summary per
stage (median / p90 / max absolute relative error and the median signed error). One implementation for
benchmarks/prediction_accuracy.py and the regression test that re-predicts every GPU measurement the project
ships (tests/test_prediction_regression.py).

Stages: sam, clip, projector, vision, prefill (the LM prefill), decode (the K steps), ttft (vision + prefill),
tpot (decode / K).
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from ..spec import Hardware, ModelSpec, Workload
from .analytic_join import workload_stage_totals

STAGES = ("sam", "clip", "projector", "vision", "prefill", "decode", "ttft", "tpot")
_BASE = ("sam", "clip", "projector", "vision", "prefill", "decode")


def predicted_stages(spec: ModelSpec, workloads: list[Workload], hw: Hardware) -> list[dict[str, float]]:
    """Predicted seconds per stage of each workload under `hw` (a ProfiledHardware), vectorised per group of
    workloads; plus roofline_ttft (the roofline part of the predicted TTFT)."""
    out = []
    for w, st in zip(workloads, workload_stage_totals(spec, workloads, hw)):
        d = {s: st[s]["predicted_s"] for s in _BASE}
        d["ttft"] = d["vision"] + d["prefill"]
        d["tpot"] = d["decode"] / max(w.decode_steps, 1)
        d["roofline_ttft"] = st["vision"]["predicted_roofline_s"] + st["prefill"]["predicted_roofline_s"]
        out.append(d)
    return out


def relative_errors(predicted: Mapping[str, float], measured: Mapping[str, float]) -> dict[str, float]:
    """(predicted - measured) / measured per stage both have (a stage measured at 0 s is left out)."""
    return {s: predicted[s] / measured[s] - 1.0 for s in STAGES
            if s in measured and s in predicted and measured[s] and measured[s] > 0}


def summarize(rows: Iterable[Mapping], stages: tuple[str, ...] = STAGES) -> dict[str, dict]:
    """Per stage over rows carrying "error": points, median / p90 / max absolute relative error, median signed."""
    rows = list(rows)
    out = {}
    for stage in stages:
        err = np.array([r["error"][stage] for r in rows if stage in r["error"]], dtype=float)
        if err.size == 0:
            continue
        a = np.abs(err)
        out[stage] = {"n": int(err.size), "median_abs": float(np.median(a)), "p90_abs": float(np.percentile(a, 90)),
                      "max_abs": float(a.max()), "median_signed": float(np.median(err))}
    return out
