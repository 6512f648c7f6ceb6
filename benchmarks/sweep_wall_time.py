"""How long does a measured sweep take? One sweep of N distinct points (Tiny, Small, Base and Gundam pages, batch
1-8, 10-1,000 text tokens, few decode steps) through `measure.sweep.run_sweep` (1 warm-up, 3 timed repeats, FLOPs
counted), timed end to end (session load excluded), with the dsocr_core found at --code-root: this checkout by
default, or an older checkout (e.g. `git worktree add /tmp/before cb73914^`) to compare the measurement of today
with an earlier one on the same machine. Prints the wall time, the seconds per point, and writes a JSON file.

    python benchmarks/sweep_wall_time.py --modes fast --points 100 --out out/sweep_now.json
    python benchmarks/sweep_wall_time.py --code-root /tmp/before --out out/sweep_before.json
    python benchmarks/sweep_wall_time.py --quick --device cpu --points 4 --out /tmp/sweep.json   # tests

The API used (Session.load, RunStore, run_sweep, Workload) is the one every version since the sweep existed has.
"""
from __future__ import annotations

import argparse
import inspect
import itertools
import json
import sys
import tempfile
import time
from pathlib import Path


def workloads(n: int, steps: int, quick: bool):
    """N distinct points, cycling page kinds so that shapes change from one point to the next as a user's sweep
    does."""
    from dsocr_core.spec import Workload

    pages = [("tiny", None), ("small", None), ("gundam", (2, 1)), ("base", None), ("gundam", (2, 3))]
    if quick:
        pages = [("tiny", None)]
    batches = (1, 2, 4, 8) if not quick else (1, 2)
    texts = (10, 100, 250, 500, 1000) if not quick else (10, 20, 30, 40)
    combos = itertools.product(texts, batches, pages)
    out = []
    for text, batch, (mode, crops) in combos:
        out.append(Workload(mode=mode, crops=crops, batch=batch, text_tokens=text, decode_steps=steps,
                            logits="last", dtype="float32" if quick else "bfloat16"))
        if len(out) == n:
            return out
    raise SystemExit(f"at most {len(out)} distinct points; ask for fewer")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code-root", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the checkout whose dsocr_core measures (default: this one)")
    ap.add_argument("--modes", default="fast", help="session mode (fast or reference)")
    ap.add_argument("--points", type=int, default=100)
    ap.add_argument("--steps", type=int, default=8, help="decode steps per point (default 8)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-order-check", action="store_true",
                    help="skip the re-measure of the first point at the end (versions before it have none)")
    ap.add_argument("--quick", action="store_true", help="tiny synthetic model (CPU tests)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.points < 1:
        ap.error("--points must be at least 1")
    root = str(args.code_root.resolve())
    if root not in sys.path:  # a fresh process (the CLI) imports the dsocr_core found there
        sys.path.insert(0, root)
    import dsocr_core
    from dsocr_core.measure.sweep import run_sweep
    from dsocr_core.results.store import RunStore
    from dsocr_core.runtime.session import Session

    points = workloads(args.points, args.steps, args.quick)
    session = Session.load(synthetic="tiny" if args.quick else "full", device=args.device,
                           dtype="float32" if args.quick else "bfloat16", session_mode=args.modes)
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(Path(tmp) / "runs.sqlite")
        t0 = time.perf_counter()
        has_check = "order_check" in inspect.signature(run_sweep).parameters
        kw = {"order_check": False} if has_check and args.no_order_check else {}
        run_id = run_sweep(session, store, points, name="sweep wall time", **kw)
        wall = time.perf_counter() - t0
        finished = len(store.finished_keys(run_id))
    result = {"code_root": str(args.code_root.resolve()), "dsocr_core": str(Path(dsocr_core.__file__).parent),
              "mode": args.modes, "device": args.device, "points": len(points), "steps": args.steps,
              "wall_s": wall, "s_per_point": wall / len(points), "finished": finished,
              "order_check": has_check and not args.no_order_check}
    if args.device == "cuda":
        import torch

        result["gpu"] = torch.cuda.get_device_name()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"{result['dsocr_core']}: {len(points)} points ({args.modes}"
          f"{', order check' if result['order_check'] else ''}) in {wall:.1f} s, {wall / len(points):.2f} s per point")
    return 0


if __name__ == "__main__":
    sys.exit(main())
