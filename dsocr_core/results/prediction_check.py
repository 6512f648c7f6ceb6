"""Measured points predicted again: each stage's predicted time beside its measurement, and the error summary per
stage (median / p90 / max absolute relative error and the median signed error). One implementation for
benchmarks/prediction_accuracy.py and the regression test that re-predicts every GPU measurement the project
ships (tests/test_prediction_regression.py).

Stages (the registry's, of the prediction's model): sam, clip or encoder, projector, vision, prefill (the LM
prefill), decode (the K steps), ttft (vision + prefill), tpot (decode / K); a stored run's comparison (run_errors)
has decode_step in place of ttft and tpot.

Two kinds of shipped measurement are re-predicted: the accuracy benchmark's results (its --out JSON: every point's
workload and measured stage times, the profile and the prediction settings; accuracy_errors) and stored runs (e.g.
the bundled data/reference runs; run_errors, through results.analytic_join.compare_run, so a run is predicted with
its own engine and the routing it observed, as the dashboard predicts it).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from ..analytic.routing import routing_from_dict
from ..engines import engine_before_records
from ..measure.environment import full_sm_clock_mhz
from ..registry import family_of, get_family, stage_names
from ..spec import Hardware, ModelSpec, SpecError, Workload
from .analytic_join import compare_run, stage_totals_as_measured, workload_stage_totals
from .store import RunStore

STAGES = (*stage_names(), "ttft", "tpot")  # every family's; a prediction has its own model's


def predicted_stages(spec: ModelSpec, workloads: list[Workload], hw: Hardware,
                     probes: list[float | None] | None = None,
                     clocks: list[dict | None] | None = None) -> list[dict[str, float]]:
    """Predicted seconds per stage of each workload under `hw` (a ProfiledHardware), vectorised per group of
    workloads, each at the host speed it was measured at (`probes`; None: all at the calibration's) and at the SM
    clocks its stages ran at (`clocks`, {stage: {mhz, samples}} per workload; None: the calibration's); plus
    roofline_ttft (the roofline part of the predicted TTFT)."""
    out = []
    base = [s for s in family_of(spec).all_stages if s != "total"]
    totals = (workload_stage_totals(spec, workloads, hw) if probes is None and clocks is None
              else stage_totals_as_measured(spec, workloads, hw, probes or [None] * len(workloads), clocks)[0])
    for w, st in zip(workloads, totals):
        d = {s: st[s]["predicted_s"] for s in base}
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


def accuracy_errors(result: Mapping[str, Any], profile, mode: str, routing=None,
                    host_speed: bool = True, clocks: bool = True) -> list[dict]:
    """The finished points of one session mode of an accuracy result (benchmarks/prediction_accuracy.py --out),
    predicted again with the current model under `profile` and the result's own settings (synthetic preset, work,
    overlap) on the engine the result recorded (else the engine of the time: engines.engine_before_records), with
    `routing` (analytic/routing.py), else the routing the result's run recorded (its "routing" entry), else
    uniform: [{"workload": Workload, "measured_s", "predicted_s", "error"}]. Each point is predicted at the host
    speed it was measured at where it recorded one (host_probe_op_s; `host_speed` False: at the calibration's),
    and at the SM clocks its stages ran at where it recorded them (stage_clocks; `clocks` False: the calibration's).
    A result without that mode, or with settings the predictor refuses, raises a SpecError naming them."""
    from ..analytic.predict import profile_hardware, with_profile

    settings = result.get("settings") or {}
    entry = (result.get("modes") or {}).get(mode)
    if entry is None:
        have = sorted(result.get("modes") or {})
        raise SpecError(f"the accuracy result has no {mode!r} session mode (it has {have})")
    if routing is None and entry.get("routing"):
        routing = routing_from_dict(entry["routing"], f"the {mode} mode's recorded routing")
    fam, preset = get_family(settings.get("model")), settings.get("synthetic") or "full"  # results name their model
    if preset not in fam.presets:
        raise SpecError(f"settings.synthetic must be one of {', '.join(fam.presets)}, got {preset!r}")
    spec = fam.preset(preset)
    engine = entry.get("engine") or engine_before_records(mode)  # the engine the points ran on
    # the GPU the points ran on (not the machine that predicted them)
    gpu_clock = full_sm_clock_mhz(entry.get("measured_environment"))
    hw = with_profile(profile_hardware(profile), profile, engine, settings.get("work", "engine"),
                      settings.get("overlap", "row"), routing, gpu_clock_mhz=gpu_clock)
    done = [p for p in entry.get("points", []) if p.get("status") == "done"]
    workloads = [Workload(**p["workload"]) for p in done]
    preds = predicted_stages(spec, workloads, hw, [p.get("host_probe_op_s") if host_speed else None for p in done],
                             [p.get("stage_clocks") if clocks else None for p in done])
    return [{"workload": w, "measured_s": p["measured_s"], "predicted_s": pr,
             "error": relative_errors(pr, p["measured_s"])} for w, p, pr in zip(workloads, done, preds)]


def run_errors(store: RunStore, run_id: str, prediction: Hardware) -> list[dict]:
    """Each finished point of a stored run with its stages' relative errors of the predicted time, as the
    dashboard draws them (compare_run with `prediction`, a ProfiledHardware): [{"point", "batch", "error"}]."""
    df = compare_run(store, run_id, prediction=prediction)
    rows: dict[str, dict] = {}
    for r in df.itertuples():
        if r.time_err_predicted is not None and np.isfinite(r.time_err_predicted):
            row = rows.setdefault(r.point, {"point": r.point, "batch": int(r.batch), "error": {}})
            row["error"][r.stage] = float(r.time_err_predicted)
    return list(rows.values())


def exceeded(summary: Mapping[str, Mapping], stated: Mapping[str, tuple[float, float]], margin: float,
             where: str = "") -> list[str]:
    """Where a summary's median or max absolute error is above the stated (median, max) of its stage plus
    `margin` (an absolute share, e.g. 0.01 for one percentage point): one line per breach, naming the stage, the
    figure and both values. A stated stage the summary lacks is a breach too (the points stopped predicting)."""
    out = []
    for stage, (median, worst) in stated.items():
        s = summary.get(stage)
        if s is None:
            out.append(f"{where}{stage}: stated but no longer predicted")
            continue
        for name, got, bound in (("median", s["median_abs"], median), ("max", s["max_abs"], worst)):
            if got > bound + margin:
                out.append(f"{where}{stage} {name} error {got:.1%} > stated {bound:.1%} + {margin:.1%}")
    return out

