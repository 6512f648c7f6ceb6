"""Time a vectorised analytic sweep of >= 100,000 workload points (full stage totals for vision, prefill and
decode, with roofline times on a preset GPU). Prints the analytic figures of one reference point first, and as
its LAST line one JSON object with `points` and `points_per_s`. With --profile the time model runs too
(predicted time per stage beside the roofline, analytic/predict.py), in --session-mode reference or fast.

    python benchmarks/analytic_sweep.py [--repeats 5] [--profile FILE [--session-mode fast]]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsocr_core.analytic import Points, evaluate, stage_totals  # noqa: E402
from dsocr_core.hardware import get_hardware  # noqa: E402
from dsocr_core.spec import ModelSpec, Workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported")
    ap.add_argument("--hardware", default="h200")
    ap.add_argument("--profile", help="calibration profile: time the sweep with prediction on")
    ap.add_argument("--session-mode", default="reference", help="reference or fast (with --profile)")
    ap.add_argument("--routing", help="a routing profile (with --profile; default uniform routing)")
    args = ap.parse_args()
    spec, hw = ModelSpec(), get_hardware(args.hardware)
    label = None
    if args.profile:
        from dsocr_core.analytic.predict import with_profile
        from dsocr_core.analytic.routing import load_routing
        from dsocr_core.calibration.profile import load_profile

        prof = load_profile(args.profile)
        routing = load_routing(args.routing) if args.routing else None
        hw, label = with_profile(hw, prof, args.session_mode, routing=routing), prof.label()

    ref = stage_totals(spec, Workload(crops=(2, 2), decode_steps=1000), hw)
    print(f"reference: 2x2 gundam page, 703 prompt tokens, 1000 decode steps on {hw.name}")
    for stage in ("vision", "prefill", "decode"):
        s = ref[stage]
        print(f"  {stage:8s} {s['tensor_flops'] / 1e9:10.1f} GFLOP  {s['bytes'] / 1e9:9.2f} GB  "
              f"{s['time_s'] * 1e3:9.3f} ms  {s['bound']}")

    crops = [(1, 1)] + [(w, h) for w in range(1, 10) for h in range(1, 10) if 2 <= w * h <= 9]  # 23 grids
    text = np.linspace(10, 4010, 37).astype(int)  # 37 prompt lengths
    batch = [1, 2, 4, 8, 16, 32, 64, 128]
    steps = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        pts = Points.grid(crops=crops, text_tokens=text, batch=batch, decode_steps=steps)
        stages = evaluate(spec, pts, hw)
        times.append(time.perf_counter() - t0)
    assert all(np.all(np.isfinite(stages[s]["time_s"])) for s in ("prefill", "decode", "total"))
    if label:
        assert all(np.all(np.isfinite(stages[s]["predicted_s"])) for s in ("prefill", "decode", "total"))
        print(f"prediction on: {label}, {args.session_mode} mode; reference point predicted total "
              f"{float(stage_totals(spec, Workload(crops=(2, 2), decode_steps=1000), hw)['total']['predicted_s']) * 1e3:.3f} ms")
    best, median = min(times), float(np.median(times))
    print(f"sweep: {pts.size} points ({len(crops)} grids x {len(text)} prompts x {len(batch)} batches x "
          f"{len(steps)} step counts), median {median:.3f} s, best {best:.3f} s over {args.repeats} runs")
    print(json.dumps({"points": pts.size, "points_per_s": round(pts.size / median), "seconds": round(median, 4),
                      "best_points_per_s": round(pts.size / best), "repeats": args.repeats, "hardware": hw.name,
                      "prediction": None if label is None else {"profile": label, "session_mode": args.session_mode,
                                                               "routing": hw.prediction.routing_label()},
                      "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__}))


if __name__ == "__main__":
    main()
