"""The SM clock each stage of a measured generation ran at, beside its time and its prediction (GPU for the clocks).

A compute-bound kernel's time scales with the SM clock, and the clock falls once the GPU reaches its power cap:
an H200 running 8192^3 GEMMs back to back read about 1,500 MHz instead of 1,980 from 50 ms on, while copies ran
at the full clock (benchmarks/sustained_load.py). Each point here is measured exactly as a sweep measures it
(measure/sweep.measure_point: a warm-up, the timed repeats, every stage's SM clock read through NVML meanwhile,
runtime/gpu_clocks.py), without the FLOP-counting pass, and printed with each stage's median time, the clock it
ran at, and, with --profile, the prediction at the calibration's clock and at the point's clocks.

    python benchmarks/stage_clocks.py --points base:1x1:b47,gundam:8x1:b56:t646 --profile data/profiles/h200.json \\
        --out out/stage_clocks.json
    python benchmarks/stage_clocks.py --device cpu --quick --out /tmp/sc.json      # smoke test (no clocks)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vision_kernels import parse_point, point_arguments  # noqa: E402 - this folder is on sys.path as a script

DEFAULT_POINTS = "base:1x1:b47,large:1x1:b20,gundam:8x1:b56:t646,gundam-m:5x1:b27:t814,small:1x1:b59:t86,tiny:1x1:b13"


def workload_of(point: dict, decode_steps: int, dtype: str):
    from dsocr_core.spec import Workload
    from dsocr_core.tiling import mode_info

    crop = mode_info(point["mode"]).crop_mode
    return Workload(mode=point["mode"], crops=point["grid"] if crop else None, batch=point["batch"],
                    text_tokens=point["text_tokens"], decode_steps=decode_steps, logits="last", dtype=dtype)


def predictions(profile_path: str | None, spec, workload, stage_clocks, gpu_clock_mhz=None) -> dict | None:
    """{"full_clock": {stage: s}, "at_clocks": {stage: s}} of the fast engine's defaults, or None without a profile
    (`gpu_clock_mhz`: this GPU's full SM clock, what a derived profile's tables stand for)."""
    if not profile_path:
        return None
    from dsocr_core.calibration.profile import load_profile
    from prediction_accuracy import predicted  # this folder is on sys.path

    prof = load_profile(profile_path)
    return {"full_clock": predicted(spec, workload, prof, "fast", "engine"),
            "at_clocks": predicted(spec, workload, prof, "fast", "engine", stage_clocks=stage_clocks,
                                   gpu_clock_mhz=gpu_clock_mhz)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    point_arguments(ap, DEFAULT_POINTS, 5, "timed generations per point")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--profile", help="a calibration profile: print each stage's prediction too")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.decode_steps < 1:
        ap.error("--repeats and --decode-steps must be at least 1")
    from dsocr_core.spec import SpecError

    dtype = "float32" if args.quick else "bfloat16"
    try:
        points = [parse_point(p) for p in args.points.split(",") if p]
        workloads = [workload_of(p, args.decode_steps, dtype) for p in points]  # a mode or grid it cannot run
    except (argparse.ArgumentTypeError, SpecError, ValueError) as exc:
        ap.error(str(exc))

    from dsocr_core.measure.environment import capture_environment, full_sm_clock_mhz
    from dsocr_core.measure.sweep import failure, measure_point
    from dsocr_core.registry import get_family
    from dsocr_core.runtime.session import Session

    preset = "tiny" if args.quick else "full"
    session = Session.load(synthetic=preset, device=args.device, dtype=dtype).with_mode("fast")
    result = {"benchmark": "stage_clocks", "environment": capture_environment(args.device),
              "engine": session.engine_spec.to_dict(), "weights": "synthetic " + preset, "dtype": dtype,
              "repeats": args.repeats, "decode_steps": args.decode_steps, "profile": args.profile, "points": []}
    for p, w in zip(points, workloads):
        label = f"{p['mode']} {p['grid'][0]}x{p['grid'][1]} b{p['batch']} t{p['text_tokens']}"
        row = {**p, "grid": list(p["grid"])}
        try:
            measured = measure_point(session, w, repeats=args.repeats, warmup=1, count_flops=False)
        except Exception as exc:  # noqa: BLE001 - one point's failure (out of memory) is recorded, the rest go on
            row["error"] = failure(exc, w)[1]
            print(f"{label}: {row['error'][:160]}", flush=True)
        else:
            stages = [s for s in get_family(None).stage_names if s != "decode"] + ["decode_step"]  # timed ones
            row["stages_s"] = {s: measured.stages[s]["median_s"] for s in stages if s in measured.stages}
            row["stage_clocks"] = measured.stage_clocks
            row["gpu_state"] = measured.gpu_state
            row["predicted_s"] = predictions(args.profile, session.spec, w, measured.stage_clocks,
                                             full_sm_clock_mhz(result["environment"]))
            cells = []
            for s, t in row["stages_s"].items():
                clock = (measured.stage_clocks or {}).get("decode" if s == "decode_step" else s) or {}
                cell = f"{s} {t * 1e3:.3f} ms" + (f" @{clock['mhz']:.0f} MHz" if clock.get("mhz") else "")
                pred, key = row["predicted_s"], "tpot" if s == "decode_step" else s
                if pred and key in pred["full_clock"] and t > 0:
                    cell += (f" ({(pred['full_clock'][key] / t - 1) * 100:+.1f}% full clock, "
                             f"{(pred['at_clocks'][key] / t - 1) * 100:+.1f}% at its clock)")
                cells.append(cell)
            print(f"{label}: " + "; ".join(cells), flush=True)
        result["points"].append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
