"""Why can a measured point's time depend on the points measured before it? Measure a sequence of points in this
process (as a sweep does) and, after the last one, record what ran for it: the LM prefill's kernels (torch.profiler
over the prefill stage's function, outside its CUDA graph), torch.compile's variants of the prefill functions, and
the engine state. Run it once with the point alone and once after other points, in fresh processes, and compare.

  python benchmarks/order_cause.py --points tiny-b24 --json alone.json
  python benchmarks/order_cause.py --points g2x3,g4x2,g2x1-t1500,g2x1-t2600,tiny-b24 --json after.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from order_independence import parse_point  # noqa: E402 - this folder is on sys.path when run as a script


def kernels_of(fn, top: int = 12) -> list[dict]:
    """The CUDA kernels one call of `fn` launches, by total device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        sync()
    rows = [{"name": e.key[:140], "count": e.count,
             "device_us": round(e.device_time_total if cuda else e.self_cpu_time_total, 1)}
            for e in prof.key_averages() if (e.device_time_total if cuda else e.self_cpu_time_total) > 0]
    rows.sort(key=lambda r: -r["device_us"])
    return rows[:top]


def compiled_states(engine) -> dict:
    """Each compiled prefill function's shape policy, variants held and fallback (Compiled.state)."""
    return {name: f.state() for name, f in engine.prefill_fns().items() if hasattr(f, "state")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--no-auto-dynamic", action="store_true", help="torch._dynamo automatic_dynamic_shapes off")
    ap.add_argument("--json", required=True)
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--flops", action="store_true", help="count FLOPs after each point, as run_sweep does")
    args = ap.parse_args()

    import torch
    from dsocr_core.measure.sweep import measure_point
    from dsocr_core.runtime.session import Session
    from dsocr_core.fast.prefill import prefill_key
    from dsocr_core.runtime.inputs import synthetic_for_workload

    if args.no_auto_dynamic:
        torch._dynamo.config.automatic_dynamic_shapes = False
    session = Session.load(synthetic=args.preset, device=args.device, dtype="bfloat16", session_mode="fast")
    out = {"points": [], "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "auto_dynamic": not args.no_auto_dynamic}
    points = [parse_point(p, args.steps) for p in args.points.split(",")]
    for name, w in zip(args.points.split(","), points):
        t0 = time.perf_counter()
        r = measure_point(session, w, repeats=3, warmup=1, count_flops=args.flops)
        med = {s: round(r.stages[s]["median_s"] * 1e3, 3) for s in (*session.vision_stages, "prefill",
                                                                        "decode_step") if s in r.stages}
        state = {"errors": session.engine.describe()["compile_errors"],
                 "compiled": compiled_states(session.engine),
                 "frames": {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if k in ("stats",)}}
        out["points"].append({"point": name, "wall_s": round(time.perf_counter() - t0, 1), "ms": med,
                              "state": state})
        print(name, med, f"{time.perf_counter() - t0:.1f} s", json.dumps(state)[:600], flush=True)

    engine = session.engine
    last = points[-1]
    inputs = synthetic_for_workload(last, seed=0).to(session.device, session.torch_dtype)
    st = engine._states[last.batch]
    key, _ = prefill_key(engine, inputs, inputs.input_ids.shape[1], last.logits)
    stages = dict(st.prefills[key]["stages"])
    out["lm_prefill_kernels"] = kernels_of(stages["prefill"].fn)
    variants = compiled_states(engine)
    out["variants"] = variants
    out["counters"] = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if k in ("stats", "frames")}
    out["describe"] = {k: v for k, v in engine.describe().items() if k in ("compile_errors", "capture_errors")}
    Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({"lm_prefill_kernels": out["lm_prefill_kernels"][:8], "variants": variants}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
