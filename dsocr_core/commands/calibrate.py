"""`calibrate`: kernel microbenchmarks into a calibration profile (JSON), or a profile derived for another GPU.

    python -m dsocr_core calibrate --out data/profiles/h200.json                   # GPU, <= 5 minutes
    python -m dsocr_core calibrate --device cpu --quick --out /tmp/cpu.json         # tiny shapes, seconds
    python -m dsocr_core calibrate --derive-from h200.json --target h100-sxm --out h100_derived.json
    python -m dsocr_core calibrate --show h200.json                                 # what a profile holds
    python -m dsocr_core calibrate --derive-from data/profiles/h200.json --tables memory.projector_cat \
        --add-to data/profiles/h100.json --out data/profiles/h100.json   # one table derived, labelled so
    python -m dsocr_core calibrate --tables memory.transposed_cat --add-to data/profiles/h100.json \
        --out data/profiles/h100.json          # a table kind the profile lacks, measured on the same GPU model
    python -m dsocr_core calibrate --tables launch.graph_start --add-to data/profiles/h100.json \
        --out data/profiles/h100.json          # a launch cost the profile lacks (a graphed stage's start)
    python -m dsocr_core calibrate --workers 8 --out out/node.json    # every GPU of a node at once (Ray): one
                                                                      # out/node.<host>.gpu<i>.json per GPU
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..measure.scale_out import add_scale_out_options, scale_out_requested


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="kernel microbenchmarks -> calibration profile (time model)",
                       description="Measure GEMM, memory-bound, attention and grouped-expert kernels over shape "
                                   "grids and the per-launch costs, and write a calibration profile that "
                                   "`analytic --profile` predicts stage times from. Or derive a profile for "
                                   "another GPU from a measured one (labelled as derived wherever it is used).")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument("--quick", action="store_true", help="tiny shape grids (smoke test; not for predictions)")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="time budget in seconds (default 300); shapes left when it runs out are filled from "
                        "their nearest measured neighbour and counted in the profile")
    p.add_argument("--passes", type=int, default=1,
                   help="measure every shape this many times, every other pass in reverse order, and keep the "
                        "lowest time (default 1; the budget covers every pass); the profile's notes name the "
                        "shapes whose passes differ by over 20%%")
    p.add_argument("--tables", help="comma-separated table names to measure (default all)")
    p.add_argument("--out", help="profile file to write (.json)")
    p.add_argument("--add-to", metavar="PROFILE", help="with --tables: measure those tables against this profile's "
                   "ceilings and write the profile with them added or replaced (same GPU model; noted in the "
                   "profile)")
    p.add_argument("--derive-from", help="a measured profile to derive a profile for --target from; with --add-to "
                                         "and --tables, only those tables, derived into the --add-to profile (its "
                                         "label says so)")
    p.add_argument("--target", help="GPU preset or device name the derived profile is for (e.g. h100-sxm)")
    p.add_argument("--source-hardware", help="datasheet preset of the source profile's GPU, when its name "
                                             "matches no preset")
    p.add_argument("--show", metavar="FILE", help="print a summary of a profile and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_scale_out_options(p)
    p.set_defaults(func=run)


def _summary(prof) -> str:
    cal = prof.raw["calibration"]
    lines = [prof.label(), f"  ceilings: {prof.peak_flops / 1e12:.4g} TFLOP/s, {prof.bandwidth / 1e12:.4g} TB/s "
                           f"({prof.raw['ceilings']['source']})",
             "  launch: " + ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in prof.launch.items())
             + ("" if prof.graph_start_s is None else f", graph_start_s {prof.graph_start_s * 1e6:.2f} us")]
    if prof.host_stage_costs:
        lines.append("  host per op of the model's own code: " + ", ".join(f"{k} {v * 1e6:.2f} us"
                                                                       for k, v in prof.host_stage_costs.items()))
    probes = {t: prof.host_probe(t) for t in ("kinds", "stages")}
    if any(probes.values()):
        lines.append("  host speed probe while measured (runtime/host_speed.py): " + ", ".join(
            f"{t} {v * 1e6:.2f} us/op" for t, v in probes.items() if v))
    derived = prof.derived_tables
    for name, t in sorted(prof.tables.items()):
        e = t.efficiency
        lines.append(f"  {name:26s} {e.size:4d} shapes ({int(t.measured.sum())} measured), efficiency "
                     f"{float(e.min()):.3g}..{float(e.max()):.3g}"
                     + (f", DERIVED from {derived[name]}'s, not measured here" if name in derived else "")
                     + (f", {t.meta['passes']} passes (differing by up to {t.meta['pass_spread_max']:.0%})"
                        if t.meta.get("pass_spread_max") is not None else ""))
    if not prof.derived:
        lines.append(f"  calibration: {cal.get('elapsed_s')} s, complete={cal.get('complete')}, "
                     f"skipped={cal.get('skipped')}")
        for name, why in (cal.get("failed") or {}).items():
            lines.append(f"  not measured: {name}: {why}")
    return "\n".join(lines)


def run(args) -> int:
    from ..cli import UserError
    from ..calibration.profile import ProfileError, check_addable, load_profile

    if args.show:
        print(_summary(load_profile(args.show)))
        return 0
    if not args.out:
        raise UserError("calibrate: give --out FILE (a .json profile)")
    if not str(args.out).lower().endswith(".json"):
        raise UserError(f"calibrate: --out must end in .json, got {args.out!r}")
    if args.derive_from and args.add_to:  # only --tables derived, into a measured profile of another GPU
        from ..calibration.derive import add_derived_tables

        if not args.tables or args.target:
            raise UserError("calibrate: --derive-from with --add-to takes --tables (the tables to derive), "
                            "not --target (the --add-to profile's GPU is the target)")
        try:
            prof = add_derived_tables(load_profile(args.add_to), load_profile(args.derive_from),
                                      [t.strip() for t in args.tables.split(",") if t.strip()], args.source_hardware)
        except (OSError, ProfileError) as exc:
            raise UserError(f"calibrate: {exc}") from None
        path = prof.save(args.out)
        print(_summary(prof))
        print(f"wrote {path}")
        return 0
    if args.derive_from:
        from ..calibration.derive import derive_profile

        if not args.target:
            raise UserError("calibrate: --derive-from needs --target (a GPU preset, e.g. h100-sxm)")
        prof = derive_profile(load_profile(args.derive_from), args.target, args.source_hardware)
        path = prof.save(args.out)
        print(_summary(prof))
        print(f"wrote {path}")
        return 0
    if args.target or args.source_hardware:
        raise UserError("calibrate: --target and --source-hardware go with --derive-from")
    if not args.budget_s > 0:
        raise UserError(f"calibrate: --budget-s must be positive, got {args.budget_s}")
    if args.passes < 1:
        raise UserError(f"calibrate: --passes must be at least 1, got {args.passes}")
    tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
    from ..calibration.profile import ADDABLE_LAUNCH

    if tables and not args.add_to and set(tables) & set(ADDABLE_LAUNCH):
        raise UserError(f"calibrate: {', '.join(sorted(set(tables) & set(ADDABLE_LAUNCH)))} is measured by every "
                        "full GPU calibration; name it in --tables only with --add-to (to add it to an older profile)")
    if tables and "launch.host_stages" in tables and (args.quick or not str(args.device).startswith("cuda")):
        raise UserError("calibrate: launch.host_stages (the model's host cost per op) needs a CUDA GPU and a full "
                        "calibration (no --quick): on a CPU the ops run synchronously, there is no host term")
    if tables and "launch.host_kinds" in tables and not str(args.device).startswith("cuda"):
        raise UserError("calibrate: launch.host_kinds (the host cost of an eager op by kind) needs a CUDA GPU: on a "
                        "CPU the ops run synchronously, there is no host term")
    if tables:
        _check_table_names(tables, args)
    base = None
    if args.add_to:
        if not tables:
            raise UserError("calibrate: --add-to needs --tables (the tables to measure and add)")
        if scale_out_requested(args):
            raise UserError("calibrate: --add-to runs on one GPU (no --workers)")
        try:
            base = load_profile(args.add_to)
            check_addable(base, args.quick)  # before any GPU time is spent
        except (OSError, ProfileError) as exc:
            raise UserError(f"calibrate: {args.add_to}: {exc}") from None
    if scale_out_requested(args):
        return _run_scaled(args, tables)
    from ..calibration.microbench import run_microbench

    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=0, unit="shape", file=sys.stderr, desc="calibrate", dynamic_ncols=True)

    def progress(done: int, total: int, name: str) -> None:
        if bar is None:
            return
        if bar.total != total:
            bar.total = total
        bar.set_postfix_str(name, refresh=False)
        bar.update(done - bar.n)
    try:
        prof = run_microbench(args.device, quick=args.quick, budget_s=args.budget_s, progress=progress,
                              tables=tables, add_to=base, passes=args.passes)
    except (RuntimeError, ProfileError) as exc:
        raise UserError(f"calibrate: {exc}") from None
    finally:
        if bar is not None:
            bar.close()
    try:
        path = prof.save(args.out)
    except (OSError, ProfileError) as exc:
        raise UserError(f"calibrate: cannot write {args.out}: {exc}") from None
    print(_summary(prof))
    print(json.dumps({"profile": str(path), "device": prof.device_name, "elapsed_s": prof.raw["calibration"]
                      .get("elapsed_s"), "complete": prof.raw["calibration"].get("complete")}))
    return 0


def _run_scaled(args, tables) -> int:
    """One calibration per Ray worker (one per GPU), all at once; a profile file per GPU. Workers load no model
    but the one the host-cost calibration builds (calibration/host_stages.py).
    Each profile's environment names its node and GPU; a line per GPU compares their GEMM efficiency, so a slow
    or throttled GPU stands out before its profile is used."""
    import numpy as np

    from ..calibration.profile import ProfileError, profile_from_dict
    from ..measure.scale_out import calibrate_scaled, command_pool

    with command_pool(args, load=False) as pool:  # ScaleOutError (a ValueError): one line, exit 2
        if pool.settings["resources"] == "CPU" and len(pool.workers) > 1:
            print("warning: CPU workers calibrate at the same time on shared cores and memory, so each profile is "
                  "slower than one calibrated alone; use one worker for a CPU profile you predict with",
                  file=sys.stderr, flush=True)
        results = calibrate_scaled(pool, {"quick": args.quick, "budget_s": args.budget_s, "tables": tables,
                                         "passes": args.passes})
    out = Path(args.out)
    written, failed = [], []
    for r in results:
        where = f"{r.get('node')} GPU {r.get('gpu_index')} ({r.get('gpu_name') or 'cpu'})"
        if "error" in r:
            failed.append(f"{where}: {r['error']}")
            continue
        slot = f"gpu{r['gpu_index']}" if r.get("gpu_index") is not None else f"worker{r.get('worker')}"
        name = out if len(results) == 1 else out.with_name(
            f"{out.stem}.{_safe(r.get('node'))}.{_safe(slot)}{out.suffix}")
        try:
            prof = profile_from_dict(r["profile"], source=where)
            path = prof.save(name)
        except (OSError, ProfileError) as exc:
            failed.append(f"{where}: cannot write {name}: {exc}")
            continue
        gemm = prof.table("gemm.bfloat16")
        median = float(np.median(gemm.efficiency)) if gemm is not None else float("nan")
        written.append({"profile": str(path), "where": where, "gemm_bf16_median_efficiency": round(median, 4),
                        "elapsed_s": prof.raw["calibration"]["elapsed_s"]})
        print(f"{where}: {path} (GEMM bf16 median efficiency {median:.3f}, {prof.raw['calibration']['elapsed_s']} s)")
    for line in failed:
        print(f"not calibrated: {line}", file=sys.stderr)
    print(json.dumps({"profiles": written, "failed": failed}))
    return 0 if written and not failed else 1


def _safe(text) -> str:
    """A file-name part from a host name or GPU index."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in str(text))[:64] or "x"


def _check_table_names(tables: list[str], args) -> None:
    """--tables names tables this device's calibration has (or launch costs an older profile can be given), and a
    profile of its own (no --add-to) a GEMM table: else a UserError saying which, before any time is spent."""
    from ..calibration.microbench import grids
    from ..calibration.profile import ADDABLE_LAUNCH
    from ..cli import UserError

    known = {*grids(args.quick, args.device), *ADDABLE_LAUNCH}  # tables, and launch costs that can be added
    unknown = [t for t in tables if t not in known]
    gpu_only = [t for t in unknown if t in grids(False, "cuda")]  # a full GPU calibration has it
    if gpu_only and not str(args.device).startswith("cuda"):
        raise UserError(f"calibrate: {', '.join(gpu_only)} is timed on a CUDA GPU only (the engine runs those kernels "
                        f"there: Triton's, or the GPU's own), not on {args.device}")
    if unknown:
        raise UserError(f"calibrate: no table {', '.join(unknown)} on {args.device} (tables: "
                        f"{', '.join(sorted(known))})")
    if not args.add_to and not any(t.startswith("gemm.") for t in tables):
        raise UserError("calibrate: a profile of its own needs a GEMM table (every prediction prices GEMMs on one): "
                        "name gemm.bfloat16 in --tables too, or add the tables to a profile with --add-to PROFILE")
