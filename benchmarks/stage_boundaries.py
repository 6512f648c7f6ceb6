"""Does the stage timer's synchronisation at every stage boundary change what a stage measures?

The stage timer (runtime/timing.py) synchronises the device at the start and end of every prefill stage to read
the stage's peak memory, then queues a ~100 us GPU wait so the stage's first launch is not charged. A run without
the timer pauses nowhere: each stage starts when the one before ends. On an H100 (2026-11-28; docs/accuracy.md
"The projector after SAM and CLIP") the fast projector's stage held up to 65 us beyond its kernels, more after a long
compute stage. The projector's graph replayed on its own between the timer's steps measured just its kernels'
sum. This benchmark tests whether that excess is the pause.

For each point it times the fast engine's prefill alternately with the timer as it is ("synced") and with a
timer that only records CUDA events at the boundaries ("unsynced": no synchronisation, no wait, so the host runs
ahead). Each mode is warmed up once first. It prints every stage's median both ways and the span from the first
stage's start to the last stage's end. A stage that is shorter unsynced by more than its spread is paying for the
pause, and so does every sweep's figure of that stage.

    python benchmarks/stage_boundaries.py --points base:1x1:b47,base:1x1:b17,gundam-m:6x1:b4 --out out/sb.json
    python benchmarks/stage_boundaries.py --device cpu --quick --out /tmp/sb.json     # smoke test (tiny model)
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dsocr_core.results.schema import stage_stats  # noqa: E402
from dsocr_core.runtime.timing import StageTimer  # noqa: E402
from vision_kernels import parse_point, point_arguments  # noqa: E402 - this folder is on sys.path as a script

DEFAULT_POINTS = "base:1x1:b47,base:1x1:b17,small:1x1:b30,gundam-m:6x1:b4,tiny:1x1:b13,gundam:2x2"
MODES = ("synced", "unsynced")


class UnsyncedTimer(StageTimer):
    """The stage timer without its boundary synchronisation: events only (no peak memory, no GPU wait)."""

    @contextmanager
    def stage(self, name: str, track_memory: bool = False, count: int = 1):
        with super().stage(name, False, count) as mark:
            yield mark


def timer_of(mode: str, device) -> StageTimer:
    return StageTimer(device) if mode == "synced" else UnsyncedTimer(device)


def run_once(session, inputs, mode: str) -> dict[str, float]:
    """One prefill timed in `mode`: {stage: seconds} and "span" (first stage's start to last stage's end)."""
    timer = timer_of(mode, session.device)
    session.prefill(inputs, timer=timer)
    totals = timer.totals()
    if session.device.type == "cuda":
        span = timer.marks[0].start.elapsed_time(timer.marks[-1].end) / 1e3
    else:
        span = timer.marks[-1].end - timer.marks[0].start
    return {**totals, "span": span}


def measure(session, inputs, repeats: int) -> dict[str, dict]:
    """{mode: {stage: stage_stats (median_s, min_s, max_s, ...)}} over `repeats` prefills per mode, the modes
    alternating."""
    for mode in MODES:  # warm-up: compile, capture; the unsynced one also leaves nothing pending
        run_once(session, inputs, mode)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for i in range(2 * repeats):
        mode = MODES[i % 2]
        runs[mode].append(run_once(session, inputs, mode))
    return {mode: {k: stage_stats(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    point_arguments(ap, DEFAULT_POINTS, 10, "timed prefills per mode and point")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    try:
        points = [parse_point(p) for p in args.points.split(",") if p]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))

    from dsocr_core.measure.environment import capture_environment
    from dsocr_core.runtime.inputs import synthetic_inputs
    from dsocr_core.runtime.session import Session

    preset = "tiny" if args.quick else "full"
    dtype = "float32" if args.quick else "bfloat16"
    session = Session.load(synthetic=preset, device=args.device, dtype=dtype).with_mode("fast")
    result = {"benchmark": "stage_boundaries", "environment": capture_environment(args.device),
              "engine": session.engine_spec.to_dict(), "weights": "synthetic " + preset, "dtype": dtype,
              "repeats": args.repeats, "points": []}
    for p in points:
        inputs = synthetic_inputs(p["mode"], p["grid"], text_tokens=p["text_tokens"], batch=p["batch"], seed=1,
                                  dtype=session.torch_dtype, device=session.device)
        row = {**p, "grid": list(p["grid"]), **measure(session, inputs, args.repeats)}
        result["points"].append(row)
        session.engine.release()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
        label = f"{p['mode']} {p['grid'][0]}x{p['grid'][1]} b{p['batch']} t{p['text_tokens']}"
        cells = []
        for stage in row["synced"]:
            a, b = row["synced"][stage]["median_s"], row["unsynced"][stage]["median_s"]
            cells.append(f"{stage} {a * 1e6:.1f}/{b * 1e6:.1f} us ({(b / a - 1) * 100 if a else 0.0:+.1f}%)")
        print(f"{label}: synced/unsynced " + ", ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
