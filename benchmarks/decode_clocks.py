"""The fast engine's decode step against the SM clock it ran at, right after bursts of GEMMs (GPU for the clocks).

The time model scales a compute-bound kernel's time with the SM clock (analytic/predict.CLOCK_EXPONENT) and leaves
bandwidth-bound ones as timed. A batched decode step is bandwidth-bound kernels only, yet on an H200 the decode of
batch 16-64 ran at 1,620-1,905 MHz after its prefill and was 5-10% under-predicted (docs/accuracy.md, "The clocks a
stage ran at"). Whether the step's time follows the clock is measured here, with nothing else changing: a page at
each batch is prefilled once, then in rounds, for each of `--bursts-ms` (0: none), the GPU idles `--idle-s`, runs
8192^3 GEMMs for that long (which lowers the clock to its power cap's), and replays `--steps` decode steps, each
between CUDA events; NVML reads the SM clock every 5 ms meanwhile (runtime/gpu_clocks.py), each reading placed in
the steps by the events measured from an anchor. Steps are grouped in runs of about 5 ms; each group is kept with
its median step time, the clock read inside it and the cache length, so the prediction can be compared with any
clock rule afterwards (nothing here is predicted: that needs no GPU).

    python benchmarks/decode_clocks.py --batches 1,16,32,64 --out out/decode_clocks.json      # GPU: about 2 min
    python benchmarks/decode_clocks.py --device cpu --quick --out /tmp/dc.json                 # smoke test
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sustained_load import exponent_of  # noqa: E402 - this folder is on sys.path as a script

GROUP_MS = 5.0  # steps are grouped so that about one clock reading (every 5 ms) falls in each group
FULL_CLOCK_SHARE = 0.99  # a reading at 99% of the GPU's maximum clock or more is the full clock


def step_groups(spans: list[tuple[float, float]], samples: list[tuple[float, float]], group_ms: float = GROUP_MS,
                ) -> list[dict]:
    """Consecutive steps' (host start, host end) spans grouped to about `group_ms` each: [{first, steps, step_ms
    (median), mhz (median reading inside, or None), readings}]."""
    if not spans:
        return []
    step_ms = statistics.median(e - s for s, e in spans) * 1e3
    size = max(1, math.ceil(group_ms / max(step_ms, 1e-6)))
    out = []
    for i in range(0, len(spans) - size + 1, size):
        part = spans[i:i + size]
        lo, hi = part[0][0], part[-1][1]
        inside = [mhz for t, mhz in samples if lo <= t <= hi]
        out.append({"first": i, "steps": len(part), "step_ms": statistics.median(e - s for s, e in part) * 1e3,
                    "mhz": statistics.median(inside) if inside else None, "readings": len(inside)})
    return out


def bucket_of(run: dict, group: dict, bucket: int) -> int | None:
    """The cache bucket (its end, in slots) whose graph ran a group's steps, or None where the group straddles two:
    a step at cache length n runs the graph of the bucket holding position n (fast/engine.py)."""
    first = run["context_first"] + group["first"]
    ends = {-(-(n + 1) // bucket) * bucket for n in (first, first + group["steps"] - 1)}
    return ends.pop() if len(ends) == 1 else None


def full_clock_fit(runs: list[dict], bucket: int, full_mhz: float | None = None):
    """Step ms at the full clock as a function of (cache length, bucket), from the groups of the runs without a
    burst (whose clock read, where one was, is the full clock's): one intercept per bucket and a slope shared by
    all (the step's work changes at each bucket edge, e.g. 2.35 -> 2.68 ms at 1,024 slots at batch 64 on an H200,
    and grows a little with the cache inside a bucket). fit(context, bucket) is None for a bucket no run without a
    burst reached."""
    import numpy as np

    by: dict[int, list[tuple[float, float]]] = {}
    for run in runs:
        for g in run["groups"] if run["burst_ms"] == 0 else ():
            b = bucket_of(run, g, bucket)
            if b is not None and (not full_mhz or not g["mhz"] or g["mhz"] >= FULL_CLOCK_SHARE * full_mhz):
                by.setdefault(b, []).append((run["context_first"] + g["first"] + g["steps"] / 2, g["step_ms"]))
    means = {b: (float(np.mean([x for x, _ in v])), float(np.mean([y for _, y in v]))) for b, v in by.items()}
    sxx = sum((x - means[b][0]) ** 2 for b, v in by.items() for x, _ in v)
    sxy = sum((x - means[b][0]) * (y - means[b][1]) for b, v in by.items() for x, y in v)
    slope = sxy / sxx if sxx > 0 else 0.0

    def fit(context: float, b: int | None) -> float | None:
        return None if b not in means else means[b][1] + slope * (context - means[b][0])
    return fit


def clock_bins(full_mhz: float) -> list[tuple[float, float]]:
    """Bins of the clock read: 100 MHz wide from 1,500 up to the full clock's share, then the full clock."""
    top = FULL_CLOCK_SHARE * full_mhz
    edges = [0.0] + [e for e in (1500.0, 1600.0, 1700.0, 1800.0, 1900.0) if e < top] + [top, 1e9]
    return list(zip(edges[:-1], edges[1:]))


def clock_summary(runs: list[dict], full_mhz: float | None, bucket: int) -> dict:
    """Each group after a burst against the full clock's step at its cache length and bucket (full_clock_fit): per
    bin of the clock read, the median ratio and the exponent x of ratio = (full / clock) ** x; and the first group
    after each burst alone (its reading was taken while the burst held the clock down: NVML's reading trails the
    clock by tens of ms, so later groups' readings can be stale). Groups straddling a bucket edge, or in a bucket no
    run without a burst reached, are left out."""
    seen = [(run, g) for run in runs if run["burst_ms"] > 0 for g in run["groups"] if g["mhz"]]
    full_mhz = full_mhz or max((g["mhz"] for _, g in seen), default=None)
    full = full_clock_fit(runs, bucket, full_mhz)

    def ratio(run, g):
        ref = full(run["context_first"] + g["first"] + g["steps"] / 2, bucket_of(run, g, bucket))
        return None if not ref else g["step_ms"] / ref

    compared = [(run, g, ratio(run, g)) for run, g in seen]
    compared = [(run, g, r) for run, g, r in compared if r is not None]
    bins = []
    for lo, hi in clock_bins(full_mhz) if full_mhz else ():
        inside = [(g, r) for _, g, r in compared if lo <= g["mhz"] < hi]
        if inside:
            mhz = statistics.median(g["mhz"] for g, _ in inside)
            r = statistics.median(r for _, r in inside)
            bins.append({"from_mhz": lo, "to_mhz": min(hi, 1e5), "groups": len(inside), "mhz": mhz, "vs_full": r,
                         "exponent": exponent_of(r, full_mhz, mhz)})
    firsts = []
    for run in runs:
        g = run["groups"][0] if run["burst_ms"] > 0 and run["groups"] else None
        r = ratio(run, g) if g and g["mhz"] else None
        if r is not None:
            firsts.append({"burst_ms": run["burst_ms"], "mhz": g["mhz"], "vs_full": r,
                           "exponent": exponent_of(r, full_mhz, g["mhz"])})
    return {"full_clock_mhz": full_mhz, "bucket": bucket, "compared_groups": len(compared),
            "left_out_groups": len(seen) - len(compared), "bins": bins, "first_groups": firsts}

def timed_steps(fast, token, cache, steps: int, device, anchor) -> list[tuple[float, float]]:
    """`steps` decode steps of the fast engine, each between CUDA events: [(host start, host end)] placed by
    `anchor` (runtime/gpu_clocks.Anchor; None: the events' own times, not comparable with clock readings). On a
    CPU the steps run synchronously and are timed by the host clock."""
    import torch

    if device.type != "cuda":
        at = [time.perf_counter()]
        for _ in range(steps):
            fast.engine.decode_step(token, cache)
            at.append(time.perf_counter())
        return list(zip(at[:-1], at[1:]))
    stream = torch.cuda.current_stream(device)  # the anchor's stream (runtime/gpu_clocks.Anchor), on `device`
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    marks[0].record(stream)
    for m in marks[1:]:
        fast.engine.decode_step(token, cache)
        m.record(stream)
    torch.cuda.synchronize(device)
    host0, first = (anchor.host_s, anchor.event) if anchor else (0.0, marks[0])
    at = [host0 + first.elapsed_time(m) / 1e3 for m in marks]
    return list(zip(at[:-1], at[1:]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="the tiny model, small GEMMs, short runs (CPU smoke test)")
    ap.add_argument("--batches", default="1,16,32,64")
    ap.add_argument("--grid", default="2x2", help="the Gundam page's tile grid (default %(default)s)")
    ap.add_argument("--text-tokens", type=int, default=100)
    ap.add_argument("--bursts-ms", default="0,150,1000", help="GEMM burst lengths before the steps (0: none)")
    ap.add_argument("--steps", type=int, default=48, help="decode steps after each burst")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=1.5, help="idling before each burst")
    ap.add_argument("--gemm-size", type=int, default=8192)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",") if b]
        bursts = [float(b) for b in args.bursts_ms.split(",") if b]
        grid = tuple(int(x) for x in args.grid.lower().split("x"))
    except ValueError as exc:
        ap.error(f"--batches, --bursts-ms, --grid: {exc}")
    if not batches or min(batches) < 1 or not bursts or not all(0 <= b < 1e6 for b in bursts) or len(grid) != 2 \
            or min(grid) < 1:
        ap.error("--batches: positive sizes; --bursts-ms: finite lengths of 0 or more; --grid: WxH")
    if args.gemm_size < 1:
        ap.error("--gemm-size must be at least 1")
    if args.steps < 1 or args.rounds < 1 or args.idle_s < 0 or args.text_tokens < 1:
        ap.error("--steps, --rounds and --text-tokens must be at least 1, --idle-s not negative")
    import torch

    from dsocr_core.measure.environment import capture_environment
    from dsocr_core.runtime.gpu_clocks import Anchor, ClockSampler
    from dsocr_core.runtime.session import Session
    from session_speed import page_inputs
    from sustained_load import make_op, op_seconds, torch_max_clock

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("CUDA is not available here: pass --device cpu (with --quick for a smoke test)")
    if args.quick:
        args.gemm_size, args.steps, args.rounds, args.idle_s = 64, min(args.steps, 6), 1, 0.0
        bursts = bursts[:2]
    dtype = torch.float32 if args.quick else torch.bfloat16
    preset = "tiny" if args.quick else "full"
    session = Session.load(synthetic=preset, device=args.device, dtype=str(dtype).replace("torch.", ""))
    fast = session.with_mode("fast")
    gemm, _, _ = make_op("gemm", args.gemm_size, device, dtype)
    gemm_s = op_seconds(gemm, device)
    full_mhz = torch_max_clock(device)
    result = {"benchmark": "decode_clocks", "environment": capture_environment(args.device),
              "engine": fast.engine_spec.to_dict(), "weights": "synthetic " + preset, "dtype": str(dtype),
              "settings": {k: str(v) for k, v in vars(args).items()}, "gemm_ms": gemm_s * 1e3, "batches": []}
    total = args.steps * len(bursts) * args.rounds
    sampler = ClockSampler.start(device)
    try:
        for b in batches:
            inputs = page_inputs(grid, b, 100 + b, device, dtype, text_tokens=args.text_tokens)
            prompt = int(inputs.input_ids.shape[1])
            # a first pass compiles and captures every cache bucket the timed pass meets
            pre = fast.prefill(inputs, room=total + 8)
            timed_steps(fast, pre.logits[:, -1].argmax(-1), pre.cache, total, device, None)
            pre = fast.prefill(inputs, room=total + 8)
            token, cache = pre.logits[:, -1].argmax(-1), pre.cache
            runs = []
            for r in range(args.rounds):
                for burst in (bursts if r % 2 == 0 else bursts[::-1]):  # the order alternates: contexts balanced
                    time.sleep(args.idle_s)
                    anchor = Anchor.now(device) if sampler else None
                    for _ in range(int(round(burst / 1e3 / gemm_s))):
                        gemm()
                    context = cache.length
                    spans = timed_steps(fast, token, cache, args.steps, device, anchor)
                    runs.append({"round": r, "burst_ms": burst, "context_first": context,
                                 "groups": step_groups(spans, list(sampler.samples) if sampler else [])})
            summary = clock_summary(runs, full_mhz, fast.engine.bucket)
            result["batches"].append({"batch": b, "prompt_tokens": prompt, "runs": runs, "summary": summary})
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1, default=str))
            del inputs, pre, cache
            fast.engine.release(b)
    finally:
        if sampler:
            sampler.stop()
    print(f"== decode step against the SM clock ({result['environment'].get('device_name')}, full clock "
          f"{full_mhz} MHz; {args.gemm_size}^3 GEMMs of {gemm_s * 1e3:.2f} ms before the steps); 'vs full': the "
          "step's time over the full clock's at the same cache length, in the same bucket")
    print(f"{'batch':>5} {'clock read, MHz':>16} {'groups':>6} {'vs full':>7} {'exponent':>8}")
    for row in result["batches"]:
        s = row["summary"]
        lines = [(f"{c['from_mhz']:.0f}-{c['to_mhz']:.0f}", c["groups"], c["mhz"], c["vs_full"], c["exponent"])
                 for c in s["bins"]]
        firsts = s["first_groups"]
        if firsts:
            r = statistics.median(f["vs_full"] for f in firsts)
            mhz = statistics.median(f["mhz"] for f in firsts)
            lines.append(("first after burst", len(firsts), mhz, r, exponent_of(r, s["full_clock_mhz"], mhz)))
        for label, n, mhz, r, exp in lines:
            exp_text = f"{exp:8.2f}" if exp is not None else "       -"
            print(f"{row['batch']:>5} {label:>17} @{mhz:5.0f} {n:>6} {r:7.3f} {exp_text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
