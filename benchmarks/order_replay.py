"""Measure a stored run's points again in their order, its first point again after each: which point moves it?

What a failed order check calls for. The run's order check measured its first point once more at the end; this
measures every point of the run in the order the run did, and with --first-after-each the first point again
after every other one, so a change shows after the point that caused it (or never, when the run's machine or
process was the cause). Each measurement prints its stage times beside the stored ones and the GPU's state
(runtime/gpu_state.py). The session runs the engine the run recorded (its kind and options; engines.run_engine)
in the run's dtype over the synthetic preset --synthetic names (the accuracy runs use 'full'); each point is
measured as a sweep measures it (1 warm-up, inputs of seed 0). A point that fails (out of memory) is reported and
the replay goes on.

    python benchmarks/order_replay.py --store out/accuracy_random63.sqlite --first-after-each --out out/replay.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsocr_core.engines import run_engine  # noqa: E402
from dsocr_core.measure.order_check import CHECKED_STAGES  # noqa: E402
from dsocr_core.measure.sweep import failure, free_memory, measure_with_attn  # noqa: E402
from dsocr_core.results.store import RunStore  # noqa: E402
from dsocr_core.runtime import gpu_state  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.spec import Workload  # noqa: E402

STAGES = CHECKED_STAGES  # the stages the order check compares, every family's (registry)


def stored_points(store: RunStore, run_id: str) -> list[tuple[Workload, dict[str, float]]]:
    """(workload, {stage: stored median s}) of the run's finished points, in the order they were measured; each
    workload from its stored key, exactly as measured (a page size and crop range, not only the grid it chose)."""
    frame = store.points(run_id)
    done = frame[(frame["status"] == "done") & frame["stage"].notna()]
    out = []
    for _, rows in done.groupby("point_id", sort=True):
        medians = {r["stage"]: float(r["median_s"]) for _, r in rows.iterrows()}
        out.append((Workload(**json.loads(rows["key"].iloc[0])), medians))
    return out


def order(points: list, first_after_each: bool) -> list[int]:
    """Indices to measure: every point once in its order, and the first again after each when asked."""
    if not first_after_each:
        return list(range(len(points)))
    return [0] + [i for k in range(1, len(points)) for i in (k, 0)]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", required=True, help="the run store (sqlite) holding the run")
    ap.add_argument("--run", help="run id (default: the store's latest sweep run)")
    ap.add_argument("--first-after-each", action="store_true", help="measure the first point again after each")
    ap.add_argument("--flops", action=argparse.BooleanOptionalAction, default=True,
                    help="count each point's FLOPs after timing it, as the run did (default on)")
    ap.add_argument("--synthetic", default="full", help="weights preset of the run (default full)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", help="default: the run's")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write every measurement as JSON here")
    args = ap.parse_args(argv)
    store = RunStore(args.store)
    runs = store.list_runs("sweep")
    if not runs:
        raise SystemExit(f"no sweep run in {args.store}")
    run = next((r for r in runs if r["id"].startswith(args.run)), None) if args.run else runs[0]
    if run is None:
        raise SystemExit(f"no run {args.run!r} in {args.store}")
    points = stored_points(store, run["id"])
    if len(points) < 2:
        raise SystemExit(f"run {run['id'][:12]} has {len(points)} finished point(s): nothing to replay")
    base = Session.load(synthetic=args.synthetic, device=args.device, dtype=args.dtype or run.get("dtype") or
                        "bfloat16", session_mode="reference")
    engine = run_engine(run)[0]  # the engine the run's points ran on, options and all
    mode = engine.kind
    session = base.with_mode(mode, **engine.non_default())
    rows = []
    print(f"run {run['id'][:12]} ({run.get('name')}), {len(points)} points, engine {engine.label()}", flush=True)
    for i in order(points, args.first_after_each):
        workload, stored = points[i]
        try:
            result = measure_with_attn(session, workload, args.repeats, 1, 0, count_flops=args.flops)
        except Exception as exc:  # noqa: BLE001 - one failed point (out of memory) must not end the replay
            status, message = failure(exc)
            free_memory(session.device)
            rows.append({"point": i, "workload": workload.model_dump(), "status": status, "message": message})
            print(f"point {i} ({workload.mode} b{workload.batch} t{workload.text_tokens}): {status}: {message}",
                  flush=True)
            continue
        now = {s: v["median_s"] for s, v in result.stages.items() if s in STAGES and isinstance(v, dict)}
        after = (result.gpu_state or {}).get("after")
        rows.append({"point": i, "workload": workload.model_dump(), "status": "done", "measured_s": now,
                     "stored_s": stored, "gpu_state": result.gpu_state})
        moved = "; ".join(f"{s} {now[s] * 1e3:.3f} ms ({now[s] / stored[s] - 1:+.1%})" for s in STAGES
                          if s in now and stored.get(s))
        print(f"point {i} ({workload.mode} b{workload.batch} t{workload.text_tokens}): {moved}; "
              f"{gpu_state.describe(after)}", flush=True)
    out = {"store": args.store, "run": run["id"], "mode": mode, "engine": engine.to_dict(), "measurements": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    return out


if __name__ == "__main__":
    main()
