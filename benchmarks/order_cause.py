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


def parse_point(text: str, steps: int):
    """'tiny-b24', 'g2x3', 'g2x1-t1500-b4': mode or gundam grid, then -tTEXT and -bBATCH."""
    from dsocr_core.spec import Workload

    head, *opts = text.split("-")
    kw = {"text_tokens": 40, "batch": 1}
    for o in opts:
        kw["text_tokens" if o[0] == "t" else "batch"] = int(o[1:])
    if head.startswith("g") and "x" in head:
        w, h = head[1:].split("x")
        return Workload(mode="gundam", crops=(int(w), int(h)), decode_steps=steps, logits="last", **kw)
    return Workload(mode=head, decode_steps=steps, logits="last", **kw)


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", required=True)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--no-auto-dynamic", action="store_true", help="torch._dynamo automatic_dynamic_shapes off")
    ap.add_argument("--json", required=True)
    ap.add_argument("--preset", default="full")
    ap.add_argument("--device", default="cuda")
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
        r = measure_point(session, w, repeats=3, warmup=1, count_flops=False)
        med = {s: round(r.stages[s]["median_s"] * 1e3, 3) for s in ("sam", "clip", "projector", "prefill",
                                                                        "decode_step") if s in r.stages}
        out["points"].append({"point": name, "wall_s": round(time.perf_counter() - t0, 1), "ms": med})
        print(name, med, f"{time.perf_counter() - t0:.1f} s", flush=True)

    engine = session.engine
    last = points[-1]
    inputs = synthetic_for_workload(last, seed=0).to(session.device, session.torch_dtype)
    st = engine._states[last.batch]
    key, _ = prefill_key(engine, inputs, inputs.input_ids.shape[1], last.logits)
    stages = dict(st.prefills[key]["stages"])
    out["lm_prefill_kernels"] = kernels_of(stages["prefill"].fn)
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    fns = engine.prefill_fns()
    variants = {}
    for name in ("lm_layer", "lm_last_layer"):
        f = fns[name]
        entries = _debug_get_cache_entry_list(f.eager.__code__) if hasattr(f, "eager") else []
        variants[name] = {"cache_entries": len(entries), "error": getattr(f, "error", None)}
    out["variants"] = variants
    out["counters"] = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if k in ("stats", "frames")}
    out["describe"] = {k: v for k, v in engine.describe().items() if k in ("compile_errors", "capture_errors")}
    Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({"lm_prefill_kernels": out["lm_prefill_kernels"][:8], "variants": variants}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
