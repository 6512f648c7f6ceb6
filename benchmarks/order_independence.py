"""Does a measured point's time depend on the points measured before it? A mixed set of points (modes, grids,
text lengths, batches 1-32) is measured in both session modes, as a sweep measures them (measure.sweep.
measure_point: the engine's kept state released, 1 warm-up, 3 timed repeats, FLOPs counted after timing), in
forward, reverse and shuffled order in one process, and each point alone in a fresh process. Printed per point
and stage: the largest relative difference of an ordered measurement from the point alone; then per stage the
median and max over points, against the target (median <= 2%, max <= 5%).

  python benchmarks/order_independence.py                       # everything, both session modes (GPU)
  python benchmarks/order_independence.py --quick --device cpu  # tiny synthetic model, two points (tests)

On a GPU the phases can run apart (each within a time limit), writing JSON files under --out that the report reads:
  --phase orders --modes fast     the three orders of one session mode in this process
  --phase alone --modes fast      each point in its own fresh process (--points picks some)
  --phase report                  the table from what --out holds

`--alone-runs N` measures each point alone in N fresh processes: the reference for the orders is then the median
of those runs, and the report adds the fresh-process spread (the largest difference of one fresh run from that
median): the noise floor a measurement of that point has on this machine with no order at all. Where the floor
is above the target, no order can meet it; the report says so per stage.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsocr_core.registry import get_family  # noqa: E402

STAGES = (*get_family().vision_stages, "prefill", "decode_step")  # the default model's (it runs DeepSeek-OCR)
FULL_POINTS = ("tiny-b1,tiny-b24,tiny-b32-t100,small-b8-t200,base-b1-t500,large-b2,g2x3,g4x2-b2,g2x1-t1500,"
               "g2x1-t2600-b4")
QUICK_POINTS = "tiny-b1-t10,tiny-b2-t30"
TARGET_MEDIAN, TARGET_MAX = 0.02, 0.05
ORDERS = ("forward", "reverse", "shuffled")


def parse_point(text: str, steps: int, dtype: str = "bfloat16"):
    """'tiny-b24', 'g2x3', 'g2x1-t1500-b4': a mode or a Gundam grid, then -tTEXT_TOKENS and -bBATCH (defaults
    40 text tokens, batch 1); `steps` decode steps, last-position logits."""
    from dsocr_core.spec import Workload

    head, *opts = text.split("-")
    kw = {"text_tokens": 40, "batch": 1}
    for o in opts:
        if o[:1] not in ("t", "b") or not o[1:].isdigit():
            raise ValueError(f"point {text!r}: options are -tTEXT_TOKENS and -bBATCH, got {o!r}")
        kw["text_tokens" if o[0] == "t" else "batch"] = int(o[1:])
    if head.startswith("g") and "x" in head:
        w, h = head[1:].split("x")
        return Workload(mode="gundam", crops=(int(w), int(h)), decode_steps=steps, logits="last", dtype=dtype, **kw)
    return Workload(mode=head, decode_steps=steps, logits="last", dtype=dtype, **kw)


def ordered(names: list[str], order: str, seed: int = 0) -> list[str]:
    if order == "forward":
        return list(names)
    if order == "reverse":
        return names[::-1]
    shuffled = list(names)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def load_session(args, mode: str):
    from dsocr_core.runtime.session import Session

    return Session.load(synthetic="tiny" if args.quick else "full", device=args.device, dtype=args.dtype,
                        session_mode=mode)


def measure(session, name: str, args, count_flops: bool) -> dict:
    """{stage: median seconds, 'state': engine state} of one point, measured as a sweep measures it."""
    from dsocr_core.measure.sweep import measure_point

    r = measure_point(session, parse_point(name, args.steps, args.dtype), args.repeats, args.warmup,
                      count_flops=count_flops)
    return {**{s: r.stages[s]["median_s"] for s in STAGES if r.stages.get(s, {}).get("median_s")},
            "state": r.engine_state}


def environment(args) -> dict:
    import torch

    cuda = args.device == "cuda"
    return {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
            "preset": "tiny" if args.quick else "full", "dtype": args.dtype, "repeats": args.repeats,
            "warmup": args.warmup, "decode_steps": args.steps}


def phase_orders(args, mode: str, names: list[str]) -> dict:
    """The three orders one after another in this process (each order sees what the previous ones left)."""
    session = load_session(args, mode)
    out = {"mode": mode, "environment": environment(args), "orders": {}, "wall_s": {}}
    for order in ORDERS:
        t0 = time.perf_counter()
        out["orders"][order] = {n: measure(session, n, args, count_flops=True) for n in ordered(names, order,
                                                                                                args.seed)}
        out["wall_s"][order] = time.perf_counter() - t0
        print(f"{mode} {order}: {len(names)} points in {out['wall_s'][order]:.1f} s", flush=True)
    return out


def alone_file(out_dir: Path, mode: str, name: str, run: int) -> Path:
    """Run 1 keeps the name earlier results have; further fresh-process runs of the point add `.runN`."""
    return out_dir / (f"one-{mode}-{name}.json" if run == 1 else f"one-{mode}-{name}.run{run}.json")


def phase_alone(args, mode: str, names: list[str], out_dir: Path) -> dict:
    """Each point in `args.alone_runs` fresh processes (this script with --phase one), the runs of one point
    apart in time (all points once, then all again), so that a slow period of the host falls on one run."""
    alone: dict[str, list] = {}
    for run in range(1, args.alone_runs + 1):
        for n in names:
            cmd = [sys.executable, __file__, "--phase", "one", "--modes", mode, "--points", n, "--out",
                   str(out_dir), "--device", args.device, "--dtype", args.dtype, "--steps", str(args.steps),
                   "--repeats", str(args.repeats), "--warmup", str(args.warmup), "--alone-run", str(run)]
            t0 = time.perf_counter()
            subprocess.run(cmd + (["--quick"] if args.quick else []), check=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
            alone.setdefault(n, []).append(json.loads(alone_file(out_dir, mode, n, run).read_text()))
            print(f"{mode} alone {n} (run {run}): {time.perf_counter() - t0:.1f} s", flush=True)
    return alone


def read_alone(out_dir: Path, mode: str) -> dict[str, list[dict]]:
    """{point: [its fresh-process runs]} from the files under out_dir."""
    runs: dict[str, list[dict]] = {}
    for p in sorted(out_dir.glob(f"one-{mode}-*.json")):
        name = p.name[len(f"one-{mode}-"):-len(".json")]
        name, _, _run = name.partition(".run")
        runs.setdefault(name, []).append(json.loads(p.read_text()))
    return runs


def alone_median(runs: list[dict]) -> dict:
    """Per stage, the median over a point's fresh-process runs."""
    return {s: statistics.median(r[s] for r in runs if r.get(s)) for s in STAGES if any(r.get(s) for r in runs)}


def fresh_spread(alone_runs: dict[str, list[dict]]) -> dict:
    """{point: {stage: largest |run / median - 1| over its fresh-process runs}} for points run more than once."""
    out: dict[str, dict] = {}
    for name, runs in alone_runs.items():
        if len(runs) < 2:
            continue
        med = alone_median(runs)
        for s, m in med.items():
            out.setdefault(name, {})[s] = max(abs(r[s] / m - 1) for r in runs if r.get(s))
    return out


def differences(orders: dict, alone: dict, relative: bool = True) -> dict:
    """{point: {stage: largest |ordered / alone - 1| over the orders}} for points measured both ways (relative), or
    the largest |ordered - alone| in seconds."""
    out: dict[str, dict] = {}
    for name, ref in alone.items():
        for stage in STAGES:
            if not ref.get(stage):
                continue
            diffs = [abs(o[name][stage] / ref[stage] - 1) if relative else abs(o[name][stage] - ref[stage])
                     for o in orders.values() if o.get(name, {}).get(stage)]
            if diffs:
                out.setdefault(name, {})[stage] = max(diffs)
    return out


def report(out_dir: Path, modes: list[str]) -> dict:
    """Read what --out holds, print the per-point table and the per-stage summary; returns the summary."""
    summary: dict = {"modes": {}}
    for mode in modes:
        orders_file = out_dir / f"orders-{mode}.json"
        if not orders_file.exists():
            continue
        orders = json.loads(orders_file.read_text())
        alone_runs = read_alone(out_dir, mode)
        alone = {n: alone_median(runs) for n, runs in alone_runs.items()}
        diffs = differences(orders["orders"], alone)
        absolute = differences(orders["orders"], alone, relative=False)
        if not diffs:
            continue
        print(f"\n{mode} session mode on {orders['environment']['device']}: largest relative difference of "
              "forward / reverse / shuffled from the point alone in a fresh process")
        print(f"{'point':<16}" + "".join(f"{s:>12}" for s in STAGES))
        for name, row in diffs.items():
            print(f"{name:<16}" + "".join(f"{row[s]:>11.1%} " if s in row else f"{'-':>12}" for s in STAGES))
        stages = {}
        for s in STAGES:
            values = [row[s] for row in diffs.values() if s in row]
            if values:
                med, worst = statistics.median(values), max(values)
                stages[s] = {"median": med, "max": worst, "points": len(values),
                             "meets_target": med <= TARGET_MEDIAN and worst <= TARGET_MAX}
        print(f"{'median':<16}" + "".join(f"{stages[s]['median']:>11.1%} " if s in stages else f"{'-':>12}"
                                          for s in STAGES))
        print(f"{'max':<16}" + "".join(f"{stages[s]['max']:>11.1%} " if s in stages else f"{'-':>12}"
                                       for s in STAGES))
        for s, v in stages.items():
            v["max_abs_us"] = max(row[s] for row in absolute.values() if s in row) * 1e6
        print(f"{'max abs (us)':<16}" + "".join(f"{stages[s]['max_abs_us']:>11.1f} " if s in stages else f"{'-':>12}"
                                                for s in STAGES))
        spread = fresh_spread(alone_runs)
        if spread:
            runs = min(len(alone_runs[n]) for n in spread)
            print(f"{'fresh spread':<16}" + "".join(
                f"{max(row[s] for row in spread.values() if s in row):>11.1%} "
                if any(s in row for row in spread.values()) else f"{'-':>12}"
                for s in STAGES) + f"  (max over points: a fresh process against the median of its runs, "
                f"{runs} or more)")
            for s, v in stages.items():
                floor = [row[s] for row in spread.values() if s in row]
                if floor:  # a stage none of the repeated points has stays without a floor
                    v["fresh_spread_median"], v["fresh_spread_max"] = statistics.median(floor), max(floor)
                    v["noise_above_target"] = v["fresh_spread_max"] > TARGET_MAX
            noisy = [s for s, v in stages.items() if v.get("noise_above_target")]
            if noisy:
                print(f"noise floor above the {TARGET_MAX:.0%} max in: {', '.join(noisy)} (fresh processes of the same "
                      "point differ by more than the target: no order can meet it there)")
        met = all(v["meets_target"] for v in stages.values())
        print(f"target (median <= {TARGET_MEDIAN:.0%}, max <= {TARGET_MAX:.0%} for every stage): "
              f"{'met' if met else 'MISSED'}; sweep wall time per order: "
              + ", ".join(f"{o} {t:.1f} s" for o, t in orders["wall_s"].items()))
        summary["modes"][mode] = {"environment": orders["environment"], "points": diffs, "stages": stages,
                                  "fresh_spread": spread, "alone_runs": {n: len(r) for n, r in alone_runs.items()},
                                  "meets_target": met, "wall_s": orders["wall_s"]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny synthetic model and two points (for the tests)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on a GPU, float32 on a CPU")
    ap.add_argument("--modes", default="reference,fast", help="session modes, comma-separated")
    ap.add_argument("--points", default=None, help=f"comma-separated (default: {FULL_POINTS})")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per point (default 40; --quick 3)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="the shuffled order's seed")
    ap.add_argument("--alone-runs", type=int, default=1, help="fresh processes per point alone (default 1; 3 shows "
                                                              "the noise floor)")
    ap.add_argument("--alone-run", type=int, default=1, help=argparse.SUPPRESS)  # --phase one: which run it is
    ap.add_argument("--phase", choices=["all", "orders", "alone", "report", "one"], default="all")
    ap.add_argument("--out", type=Path, default=Path("out/order_independence"))
    args = ap.parse_args(argv)
    if args.alone_runs < 1:
        ap.error("--alone-runs must be at least 1")
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    args.steps = args.steps if args.steps is not None else (3 if args.quick else 40)
    names = (args.points or (QUICK_POINTS if args.quick else FULL_POINTS)).split(",")
    for n in names:
        parse_point(n, args.steps, args.dtype)  # a bad name fails before anything loads
    modes = args.modes.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.phase == "one":
        alone_file(args.out, modes[0], names[0], args.alone_run).write_text(
            json.dumps(measure(load_session(args, modes[0]), names[0], args, count_flops=False), default=str))
        return 0
    for mode in modes:
        if args.phase in ("all", "orders"):
            (args.out / f"orders-{mode}.json").write_text(json.dumps(phase_orders(args, mode, names), default=str))
        if args.phase in ("all", "alone"):
            phase_alone(args, mode, names, args.out)
    if args.phase in ("all", "report"):
        report(args.out, modes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
