"""The routing loads of points measured before loads were recorded, reproduced on the CPU, and those points predicted
again with them.

Measured runs record each MoE layer-call's loads (the rows each touched expert got) since 2026-11-27; the fast plan
prices the prefill's grouped expert GEMMs from them (fast/plan.py: each rank bucket at its own whole tiles). The
accuracy results measured before that hold only the distinct experts per call. Their points ran synthetic weights
and synthetic inputs, both drawn on the CPU from fixed seeds (model/checkpoint.synthetic_state_dict,
runtime/inputs.synthetic_for_workload, seed 0 as measure/sweep.measure_point uses), so the same prefill on the CPU
routes the same way up to rounding (checked on 2026-11-27: the largest group of every layer within 1-3% of what the
GPU recorded). This runs the reference model's prefill of the chosen points on the CPU, records the loads
(measure/routing_record.record_routing), and predicts each point with the result's recorded routing alone and with
the reproduced loads added at its prefill's token count. It is a check of the pricing on points measured before,
not a held-out figure; nothing it computes is written into the results.

    python benchmarks/routing_loads_cpu.py --result docs/results/h200_prediction_accuracy_random52_fast_2026-11-27.json \\
        --points 2,3,4 --out out/loads52.json        # about a minute per point of 2,000 tokens on 2 CPU cores
    python benchmarks/routing_loads_cpu.py --quick --out /tmp/loads.json    # smoke test (tiny model, a made-up point)

With --groups (a `benchmarks/moe_prefill_groups.py` result) and --steps (a `benchmarks/grouped_gemm_steps.py` result
of the same GPU) it checks the tile model instead: the groups' points' loads are reproduced (seed-1 inputs, as
those benchmarks use) and the grouped GEMMs' time is modelled per group from the step curve (each group at its
whole 256-row tiles), for the router's groups, the plan's even groups and the uniform ones, beside what
moe_prefill_groups measured; the first ten layers (the engine runs the eleventh on the last positions only).

    python benchmarks/routing_loads_cpu.py --groups docs/results/h200_prefill_kernels_2026-11-27/moe_groups.json \
        --steps docs/results/grouped_gemm_steps_2026-11-27/h200.json --out out/tiles_h200.json
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from dsocr_core.analytic.routing import routing_from_calls, routing_from_dict  # noqa: E402
from dsocr_core.calibration.profile import load_profile  # noqa: E402
from dsocr_core.measure.routing_record import record_routing  # noqa: E402
from dsocr_core.results.prediction_check import accuracy_errors  # noqa: E402
from dsocr_core.runtime.inputs import synthetic_for_workload  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.spec import Workload  # noqa: E402


def prefill_loads(session: Session, workload: Workload, seed: int = 0) -> list[tuple[int, int, list[int]]]:
    """(tokens, distinct, loads) of every MoE layer-call of the workload's prefill."""
    inputs = synthetic_for_workload(workload, seed=seed).to(session.device, session.torch_dtype)
    with record_routing(session.model) as calls, torch.inference_mode():
        session.prefill(inputs)
    return [(c.tokens, c.distinct, c.loads) for c in calls]


def with_loads(recorded, calls):
    """The recorded routing with the reproduced calls replacing its entry at their token count."""
    tokens = {float(c[0]) for c in calls}
    kept = [(t, d) for t, d in zip(recorded.tokens, recorded.observed) if t not in tokens]
    return routing_from_calls(kept + [(float(t), float(d), loads) for t, d, loads in calls], recorded.experts,
                              recorded.k, recorded.source + " + loads reproduced on the CPU")


def step_cost(steps: dict):
    """Seconds of one group's gate/up + down GEMMs at `rows` rows, from a grouped_gemm_steps result (64 groups,
    graphed): the curve at the rows the fast plan charges the group (fast/plan.tiled_rows: its whole tiles above
    half a tile), per group."""
    import numpy as np

    from dsocr_core.fast.plan import tiled_rows

    pts = steps["points"]
    rows = np.asarray([p["rows"] for p in pts], dtype=float)
    per = np.asarray([p["gate_up_graph_s"] + p["down_graph_s"] for p in pts]) / steps["experts"]

    def cost(n: float) -> float:
        if n <= 0:
            return 0.0
        q = float(tiled_rows(n))
        return float(np.interp(q, rows, per)) if q <= rows[-1] else float(per[-1] * q / rows[-1])
    return cost


def check_tiles(session: Session, groups: dict, steps: dict, k: int, experts: int) -> list[dict]:
    cost = step_cost(steps)
    out = []
    for p in groups["points"]:
        w = Workload(mode=p["mode"], crops=tuple(p["grid"]) if tuple(p["grid"]) != (1, 1) else None,
                     batch=p["batch"], text_tokens=p["text_tokens"], dtype=str(session.torch_dtype).split(".")[-1])
        calls = prefill_loads(session, w, seed=1)
        model = {"router_s": 0.0, "plan_s": 0.0, "uniform_s": 0.0}
        measured = dict.fromkeys(model, 0.0)
        for layer, (t, distinct, loads) in list(zip(p["layers"], calls))[:10]:
            shared = 2 * cost(t)
            slots = k * t
            model["router_s"] += sum(cost(n) for n in loads) + shared
            model["plan_s"] += distinct * cost(slots / distinct) + shared
            model["uniform_s"] += experts * cost(slots / experts) + shared
            for name in measured:
                measured[name] += layer[name]
        row = {"point": [p["mode"], p["grid"], p["batch"], p["text_tokens"]], "tokens": calls[0][0],
               "measured_s": measured, "tile_model_s": model}
        out.append(row)
        print(f"{p['mode']:8s} {p['grid']} b{p['batch']:<3d} t{p['text_tokens']:<5d} {calls[0][0]:6d} tokens: router's / "
              f"plan's groups measured {measured['router_s'] / measured['plan_s']:.3f}, tile model "
              f"{model['router_s'] / model['plan_s']:.3f}; router's groups {measured['router_s'] * 1e3:.3f} ms "
              f"measured, {model['router_s'] * 1e3:.3f} modelled", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--result", type=Path, help="an accuracy result (benchmarks/prediction_accuracy.py --out)")
    ap.add_argument("--points", default="", help="indices of its finished fast-mode points (default: all)")
    ap.add_argument("--profile", help="calibration profile (default: the one the result names)")
    ap.add_argument("--groups", type=Path, help="a moe_prefill_groups.py result: check the tile model on its points")
    ap.add_argument("--steps", type=Path, help="with --groups: a grouped_gemm_steps.py result of the same GPU")
    ap.add_argument("--quick", action="store_true", help="tiny model and a made-up point (smoke test)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.quick:
        session = Session.load(synthetic="tiny", device="cpu", dtype="float32")
        calls = prefill_loads(session, Workload(mode="tiny", text_tokens=20, batch=2, dtype="float32"))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"quick": True, "calls": [list(c) for c in calls]}))
        print(f"{len(calls)} layer-calls, largest groups {[c[2][0] for c in calls]}")
        return 0
    if args.groups is not None:
        if args.steps is None:
            ap.error("--groups needs --steps")
        session = Session.load(synthetic="full", device="cpu", dtype="bfloat16")
        spec = session.spec
        rows = check_tiles(session, json.loads(args.groups.read_text()), json.loads(args.steps.read_text()),
                           spec.num_experts_per_tok, spec.n_routed_experts)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"groups": str(args.groups), "steps": str(args.steps), "points": rows}))
        return 0
    if args.result is None:
        ap.error("--result, --groups or --quick is required")
    result = json.loads(args.result.read_text())
    entry = result["modes"]["fast"]
    done = [p for p in entry["points"] if p.get("status") == "done"]
    chosen = [int(i) for i in args.points.split(",") if i] or list(range(len(done)))
    settings = result.get("settings") or {}
    profile = load_profile(args.profile or ROOT / result["profile"]["path"])
    recorded = routing_from_dict(entry["routing"], f"{args.result}: the fast mode's routing")
    session = Session.load(synthetic=settings.get("synthetic") or "full", device="cpu",
                           dtype=settings.get("dtype") or "bfloat16")
    rows = []
    for i in chosen:
        w = Workload(**done[i]["workload"])
        t0 = time.perf_counter()
        calls = prefill_loads(session, w)
        one = copy.deepcopy(result)
        one["modes"]["fast"]["points"] = [done[i]]
        before = accuracy_errors(one, profile, "fast")[0]["error"]
        after = accuracy_errors(one, profile, "fast", routing=with_loads(recorded, calls))[0]["error"]
        rows.append({"index": i, "workload": done[i]["workload"], "calls": [list(c) for c in calls],
                     "error_recorded_routing": before, "error_with_loads": after})
        print(f"{i:2d} {w.mode:8s} {str(w.crops or ''):7s} b{w.batch:<3d} t{w.text_tokens:<5d} {calls[0][0]:6d} tokens, "
              f"largest group {max(c[2][0] for c in calls)}: LM prefill {before['prefill'] * 100:+6.1f}% -> "
              f"{after['prefill'] * 100:+6.1f}%, TTFT {before['ttft'] * 100:+5.1f}% -> {after['ttft'] * 100:+5.1f}% "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"result": str(args.result), "profile": profile.label(), "points": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
