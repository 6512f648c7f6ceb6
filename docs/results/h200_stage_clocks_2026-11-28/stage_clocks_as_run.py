"""The version of benchmarks/stage_clocks.py that produced sc.json / sc.log in this folder (2026-11-28, an H200).

It read the GPU's state with nvidia-smi from a thread (every 20-50 ms) and placed each reading in the stage running
on the host clock (a stage timer that stamped the host time after each boundary synchronisation). The benchmark
now measures through measure/sweep.measure_point, whose NVML sampler (runtime/gpu_clocks.py) reads every 5 ms and
places readings by the stages' events; run it from the repository root as it stood on that day to reproduce."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from dsocr_core.runtime.timing import StageTimer  # noqa: E402
from sustained_load import ClockSampler  # noqa: E402 - the nvidia-smi sampler of that day's sustained_load.py
from vision_kernels import parse_point  # noqa: E402

DEFAULT_POINTS = "base:1x1:b47,large:1x1:b20,gundam:8x1:b56:t646,gundam-m:5x1:b27:t814,small:1x1:b59:t86,tiny:1x1:b13"


class HostStampedTimer(StageTimer):
    def __init__(self, device):
        super().__init__(device)
        self.stamps: list[tuple[str, float, float]] = []

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        with super().stage(name, track_memory, count) as mark:
            start = time.perf_counter()
            yield mark
        self.stamps.append((name, start, time.perf_counter()))


def stage_of(stamps, t: float) -> str | None:
    holding = [(end - start, name) for name, start, end in stamps if start <= t <= end]
    return min(holding)[1] if holding else None


def clocks_by_stage(stamps, samples) -> dict[str, dict]:
    from dsocr_core.runtime.gpu_state import slowdowns

    by: dict[str, list[dict]] = {}
    for t, state in samples:
        name = stage_of(stamps, t)
        if name is not None:
            by.setdefault(name, []).append(state)
    out = {}
    for name, states in by.items():
        clocks = [s["sm_clock_mhz"] for s in states if s.get("sm_clock_mhz") is not None]
        power = [s["power_w"] for s in states if s.get("power_w") is not None]
        out[name] = {"samples": len(states), "sm_clock_mhz": statistics.median(clocks) if clocks else None,
                     "sm_clock_min_mhz": min(clocks) if clocks else None,
                     "power_w": statistics.median(power) if power else None,
                     "slowdowns": sorted({r for s in states for r in slowdowns(s)})}
    return out


def measure(session, inputs, repeats: int, decode_steps: int) -> dict:
    from dsocr_core.measure.stage_stats import timed_generation

    timed_generation(session, inputs, decode_steps, stop_at_eos=False, logits="last")  # compile, capture
    timers, totals = [], []
    with ClockSampler(session.device) as sampler:
        for _ in range(repeats):
            timer = HostStampedTimer(session.device)
            run = timed_generation(session, inputs, decode_steps, stop_at_eos=False, logits="last", timer=timer)
            timers.append(timer)
            totals.append(run.totals)
    stamps = [s for t in timers for s in t.stamps]
    clocks = clocks_by_stage(stamps, sampler.samples)
    return {name: {"median_s": statistics.median(t[name] for t in totals), **clocks.get(name, {"samples": 0})}
            for name in totals[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    points = [parse_point(p) for p in args.points.split(",") if p]

    from dsocr_core.measure.environment import capture_environment
    from dsocr_core.runtime import gpu_state
    from dsocr_core.runtime.inputs import synthetic_inputs
    from dsocr_core.runtime.oom import out_of_memory
    from dsocr_core.runtime.session import Session

    preset = "tiny" if args.quick else "full"
    dtype = "float32" if args.quick else "bfloat16"
    session = Session.load(synthetic=preset, device=args.device, dtype=dtype).with_mode("fast")
    result = {"benchmark": "stage_clocks", "environment": capture_environment(args.device),
              "engine": session.engine_spec.to_dict(), "weights": "synthetic " + preset, "dtype": dtype,
              "repeats": args.repeats, "decode_steps": args.decode_steps,
              "idle_state": gpu_state.read(session.device), "points": []}
    for p in points:
        label = f"{p['mode']} {p['grid'][0]}x{p['grid'][1]} b{p['batch']} t{p['text_tokens']}"
        inputs = synthetic_inputs(p["mode"], p["grid"], text_tokens=p["text_tokens"], batch=p["batch"], seed=1,
                                  dtype=session.torch_dtype, device=session.device)
        row = {**p, "grid": list(p["grid"])}
        try:
            row["stages"] = measure(session, inputs, args.repeats, args.decode_steps)
        except Exception as exc:  # noqa: BLE001
            if not out_of_memory(exc):
                raise
            row["error"] = f"out of memory: {exc}"[:300]
        del inputs
        session.engine.release()
        result["points"].append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
        if "error" in row:
            print(f"{label}: {row['error'][:120]}", flush=True)
            continue
        cells = []
        for name, s in row["stages"].items():
            clock = (f" {s['sm_clock_mhz']:.0f} MHz/{s['power_w']:.0f} W ({s['samples']})"
                     if s.get("sm_clock_mhz") is not None else "")
            cells.append(f"{name} {s['median_s'] * 1e3:.2f} ms{clock}")
        print(f"{label}: " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
