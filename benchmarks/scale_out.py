"""Scale-out over Ray: points/s and pages/s for 1..N workers against the plain single-process run on the same
items, Ray's overhead per item, and the scaling efficiency.

    python benchmarks/scale_out.py --device cpu --quick        # 2 CPU workers, tiny model: runs anywhere (~3 min)
    python benchmarks/scale_out.py --workers 1                 # one GPU: 1 worker against the single process
    python benchmarks/scale_out.py --workers 1,2,4,8 --json out/scale_out.json

For every worker count the same sweep points and the same pages go through `run_sweep_scaled` /
`run_dataset_scaled` (a fresh pool; its start-up, which loads the model in every worker, is printed apart and not
counted), and the stored points are checked against the single-process run's (same keys, statuses and FLOPs).

Columns: items/s = items / wall time of the run (model loaded, start-up excluded); efficiency = items/s at N
workers / (N x single-process items/s); overhead/item = (N x wall - the workers' own measuring time) / items: the
time a worker was not measuring, per item (Ray's dispatch and result transfer, the driver's store writes, the
idle tail at the end of the run), also as a share of the mean item time (the issue's target: under 2% of a 2x2
page's time on one GPU); round trip = the driver's submit-to-result time minus the worker's measuring time, per
item, from a separate 1-worker pass with one item in flight (nothing queued), i.e. Ray's own cost per item.
On a shared CPU machine the worker counts compete with each other (and with other jobs) for the cores: CPU
figures show that the machinery works, not how GPUs scale.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dsocr_core.engines import SESSION_MODES  # noqa: E402  (torch-free: the engine registry)


def same_points(store, a: str, b: str) -> str:
    """'yes', or what differs between two runs' points (keys, statuses, FLOPs per stage)."""
    def table(run_id):
        df = store.points(run_id)
        return {k: (g.status.iloc[0], {s: f for s, f in zip(g.stage, g.flops) if s is not None})
                for k, g in df.groupby("key")}

    ta, tb = table(a), table(b)
    if set(ta) != set(tb):
        return f"no: keys differ ({len(set(ta) ^ set(tb))})"
    bad = [k for k in ta if ta[k] != tb[k]]
    return "yes" if not bad else f"no: {len(bad)} point(s) differ"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--synthetic", choices=["tiny", "full"], help="default: full on a GPU, tiny on the CPU")
    ap.add_argument("--dtype", help="default: bfloat16 on a GPU, float32 on the CPU")
    ap.add_argument("--session-mode", default="reference", choices=SESSION_MODES)
    ap.add_argument("--workers", help="worker counts, e.g. 1,2,4 (default: 1..the GPUs, or 1,2 on the CPU)")
    ap.add_argument("--quick", action="store_true", help="few, small items (4 points, 2 pages, short decodes)")
    ap.add_argument("--pages", type=Path, help="page folder for the dataset part (default: the bundled samples)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)

    import torch

    from dsocr_core.measure.dataset_run import ProfileSettings, create_dataset_run, run_dataset
    from dsocr_core.measure.datasets import discover, sample
    from dsocr_core.measure.scale_out import WorkerPool, run_dataset_scaled, run_sweep_scaled
    from dsocr_core.measure.sweep import run_sweep, sweep_workloads
    from dsocr_core.results.store import RunStore
    from dsocr_core.results.tables import format_table
    from dsocr_core.runtime.session import Session

    cuda = args.device != "cpu" and torch.cuda.is_available()
    synthetic = args.synthetic or ("full" if cuda else "tiny")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    counts = ([int(v) for v in args.workers.split(",")] if args.workers
              else list(range(1, torch.cuda.device_count() + 1)) if cuda else [1, 2])
    load = dict(synthetic=synthetic, seed=0, device="cuda" if cuda else "cpu", dtype=dtype,
                session_mode=args.session_mode)
    if args.quick:
        workloads = sweep_workloads(["tiny", "gundam"], [(2, 1)], [10, 30], [1], [2], dtype=dtype)
        sweep_kw = dict(repeats=1, warmup=0, seed=0)
        settings = ProfileSettings(mode="tiny", max_new_tokens=4)
        n_pages = 2
    else:
        workloads = sweep_workloads(["gundam"], [(1, 1), (2, 1), (2, 2), (3, 2)], [10, 500], [1], [32], dtype=dtype)
        sweep_kw = dict(repeats=3, warmup=1, seed=0)
        settings = ProfileSettings(mode="gundam", max_new_tokens=64)
        n_pages = 8
    if args.pages:
        dataset = discover(args.pages)
    else:
        from dsocr_core.grounding.samples import sample_pages

        dataset = discover(Path(list(sample_pages())[0]).parent)
    samples = sample(dataset.pages, n_pages, 1, 0, "fixed")
    folder = Path(tempfile.mkdtemp(prefix="scale_out_"))
    store = RunStore(folder / "runs.sqlite")
    print(f"{synthetic} model, {dtype}, {load['device']}, {args.session_mode} mode; {len(workloads)} sweep points "
          f"(repeats {sweep_kw['repeats']}), {len(samples)} pages ({settings.mode}, {settings.max_new_tokens} tokens); "
          f"worker counts {counts}", flush=True)

    # ------------------------------------------------------------------ single process
    if not cuda:  # like a CPU worker: Ray runs an actor of num_cpus=1 with one thread (OMP_NUM_THREADS=1)
        torch.set_num_threads(1)
        print("single process on 1 CPU thread, as each CPU worker", flush=True)
    session = Session.load(**load)
    t0 = time.perf_counter()
    single_sweep = run_sweep(session, store, workloads, name="single", **sweep_kw)
    sweep_wall = time.perf_counter() - t0
    single_ds = create_dataset_run(store, session, dataset, settings, {"n": n_pages})
    t0 = time.perf_counter()
    run_dataset(session, store, single_ds, samples, settings)
    pages_wall = time.perf_counter() - t0
    del session
    rows = [{"workers": "single process", "startup_s": None, "points_per_s": len(workloads) / sweep_wall,
             "pages_per_s": len(samples) / pages_wall, "same_points": "-", "same_pages": "-"}]
    base_pts, base_pgs = rows[0]["points_per_s"], rows[0]["pages_per_s"]
    print(f"single process: {sweep_wall:.1f} s sweep, {pages_wall:.1f} s pages", flush=True)

    # ------------------------------------------------------------------ 1..N workers
    import ray

    owns = not ray.is_initialized()
    if owns:
        ray.init(num_cpus=max(max(counts), 1) if not cuda else None, include_dashboard=False, log_to_driver=False,
                 logging_level="warning")
    round_trip = None
    try:
        for n in counts:
            t0 = time.perf_counter()
            pool = WorkerPool.start(load, workers=n)
            startup = time.perf_counter() - t0
            try:
                st_p, st_d = {}, {}
                t0 = time.perf_counter()
                scaled_sweep = run_sweep_scaled(pool, store, workloads, name=f"{n} workers", stats=st_p, **sweep_kw)
                w_pts = time.perf_counter() - t0
                ds = create_dataset_run(store, pool.lead, dataset, settings, {"n": n_pages},
                                        environment=pool.lead.info["environment"],
                                        meta={"scale_out": pool.describe()})
                t0 = time.perf_counter()
                run_dataset_scaled(pool, store, ds, samples, settings, stats=st_d)
                w_pgs = time.perf_counter() - t0
                if n == 1:  # Ray's own cost per item: one item in flight, nothing queued
                    rt = {}
                    run_sweep_scaled(pool, store, workloads, name="round trip", stats=rt, in_flight=1, **sweep_kw)
                    round_trip = (rt["driver_s"] - rt["worker_s"]) / max(rt["results"], 1)
            finally:
                pool.close()
            items = len(workloads) + len(samples)
            busy = st_p["worker_s"] + st_d["worker_s"]
            overhead = (n * (w_pts + w_pgs) - busy) / items
            rows.append({"workers": n, "startup_s": startup, "points_per_s": len(workloads) / w_pts,
                         "pages_per_s": len(samples) / w_pgs,
                         "efficiency_points": len(workloads) / w_pts / (n * base_pts),
                         "efficiency_pages": len(samples) / w_pgs / (n * base_pgs),
                         "overhead_per_item_s": overhead, "overhead_share": overhead / (busy / items),
                         "mean_item_s": busy / items, "retried": st_p["retried"] + st_d["retried"],
                         "same_points": same_points(store, single_sweep, scaled_sweep),
                         "same_pages": same_points(store, single_ds, ds)})
            print(f"{n} worker(s): start-up {startup:.1f} s, {w_pts:.1f} s sweep, {w_pgs:.1f} s pages", flush=True)
    finally:
        if owns:
            ray.shutdown()

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    table = [[r["workers"], f(r["startup_s"], ".1f"), f(r["points_per_s"], ".3f"), f(r["pages_per_s"], ".3f"),
              f(r.get("efficiency_points"), ".0%"), f(r.get("efficiency_pages"), ".0%"),
              f(None if r.get("overhead_per_item_s") is None else r["overhead_per_item_s"] * 1e3, ",.1f"),
              f(r.get("overhead_share"), ".1%"), r["same_points"], r["same_pages"]] for r in rows]
    print("\n" + format_table(["workers", "start-up s", "points/s", "pages/s", "eff. points", "eff. pages",
                               "overhead ms/item", "of item", "same points", "same pages"], table))
    if round_trip is not None:
        mean_item = next(r["mean_item_s"] for r in rows if r["workers"] == 1)
        print(f"\nRay round trip beyond the measurement (1 worker, 1 item in flight): {round_trip * 1e3:.1f} ms per "
              f"item ({round_trip / mean_item:.2%} of the mean item's {mean_item:.2f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "round_trip_s": round_trip, "device": load["device"],
                                         "synthetic": synthetic, "dtype": dtype, "quick": args.quick}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
