"""Where a batched decode step's time goes beyond its graph replay (GPU only).

For each batch size, on Gundam 2x2 pages of the full-size synthetic model in the fast engine:
- the step as the accuracy runs measure it: the generation loop without the n-gram ban, CUDA events per step;
- the graph replay alone (decode_step back to back);
- the host's issue rate: the same loop without any synchronisation, host seconds per step handed out;
- a torch.profiler trace of the loop: the GPU's busy time per step and its idle gaps, with the kernels on
  either side of the largest ones (the profiler itself widens gaps, so read them as shares, not as times).

    python benchmarks/decode_loop_gap.py --batches 2,8 --out out/decode_loop_gap.json
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moe_decode import step_ms  # noqa: E402
from session_speed import fast_generate_times, med, page_inputs, sync  # noqa: E402

from dsocr_core.runtime.generate import Greedy  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.runtime.timing import StageTimer  # noqa: E402


def host_issue_s(fast: Session, inputs, steps: int) -> float:
    """Host seconds per decode step handed out by the loop when nothing waits for the GPU."""
    gen = Greedy(fast.engine, inputs, steps, 0, timer=StageTimer(fast.device), stop_at_eos=False, memory="none")
    it = iter(gen)
    next(it)  # the prefill's token
    sync(fast.device)
    t0, n = time.perf_counter(), 0
    for _ in it:
        n += 1
    spent = time.perf_counter() - t0
    sync(fast.device)
    return spent / max(n, 1)


def gpu_gaps(fast: Session, inputs, steps: int) -> dict:
    """The loop traced: GPU busy time and idle gaps per step, the largest gaps by the kernels around them."""
    from torch.profiler import ProfilerActivity, profile

    gen = Greedy(fast.engine, inputs, steps, 0, timer=StageTimer(fast.device), stop_at_eos=False, memory="none")
    it = iter(gen)
    next(it), next(it)  # the prefill's token and the first step stay outside the trace
    sync(fast.device)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in it:
            pass
        sync(fast.device)
    events = [(e.start_ns() / 1e3, e.duration_ns() / 1e3, e.name())
              for e in prof.profiler.kineto_results.events() if str(e.device_type()).endswith("CUDA")]
    return gap_summary(events)


def gap_summary(events: list[tuple[float, float, str]]) -> dict:
    """(start us, length us, kernel name) of a traced loop -> busy and idle time per step (steps counted by the
    step's one embedding kernel) and the 12 largest kinds of gap, named by the kernel that ended last before
    each and the kernel after it."""
    busy, end, before, gaps = 0.0, None, "", {}
    for start, length, name in sorted(events):  # the union of the GPU's activity, and what lies between
        stop = start + length
        if end is None or start >= end:
            if end is not None and start > end:  # back to back is no gap
                key = f"{before[:60]} -> {name[:60]}"
                count, total = gaps.get(key, (0, 0.0))
                gaps[key] = (count + 1, total + start - end)
            busy, end, before = busy + length, stop, name
        elif stop > end:
            busy, end, before = busy + stop - end, stop, name
    steps = sum(1 for _, _, name in events if "embedding" in name) or 1
    idle = sum(total for _, total in gaps.values())
    top = sorted(gaps.items(), key=lambda kv: -kv[1][1])[:12]
    return {"steps_traced": steps, "busy_us_per_step": busy / steps, "idle_us_per_step": idle / steps,
            "largest_gaps": [{"between": k, "per_step": c / steps, "us_per_step": t / steps} for k, (c, t) in top]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="2,8", help="decode batch sizes (comma list)")
    ap.add_argument("--steps", type=int, default=48, help="decode steps timed per loop")
    ap.add_argument("--out", default="out/decode_loop_gap.json")
    ap.add_argument("--batched-choice", default="host", choices=("host", "graph"),
                    help="the engine's greedy choice at batch > 1 (default host: the eager ops between replays this "
                         "gap was first measured with, which fast/plan.py's host branch cites)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("decode_loop_gap.py times CUDA graphs: it needs a CUDA GPU")
    base = Session.load(synthetic="full", device="cuda", dtype="bfloat16", session_mode="reference")
    fast = base.with_mode("fast", batched_choice=args.batched_choice)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batches": {},
              "batched_choice": args.batched_choice}
    for b in (int(x) for x in args.batches.split(",") if x):
        inputs = page_inputs((2, 2), b, 100 + b, fast.device, torch.bfloat16)
        fast_generate_times(fast, inputs, args.steps, 0)  # warm-up: compiles and captures
        loop = fast_generate_times(fast, inputs, args.steps, 0)
        row = {"loop_step_us": med(loop["step_s"][1:]) * 1e6, "replay_us": step_ms(fast, inputs, 30) * 1e3,
               "host_issue_us": host_issue_s(fast, inputs, args.steps) * 1e6,
               **gpu_gaps(fast, inputs, min(args.steps, 24))}
        result["batches"][str(b)] = row
        print(f"batch {b}: loop step {row['loop_step_us']:.0f} us, replay alone {row['replay_us']:.0f} us, host "
              f"issues a step in {row['host_issue_us']:.0f} us; traced: busy {row['busy_us_per_step']:.0f} + idle "
              f"{row['idle_us_per_step']:.0f} us a step", flush=True)
        fast.engine.release(b)
        gc.collect()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
