"""`measure`: a measured sweep into the run store (resumable), optionally calibrated and exported."""
from __future__ import annotations

from pathlib import Path

from ..cli import UserError, add_model_options, family_from_args, session_from_args
from ..measure.scale_out import add_scale_out_options, lost_to_dead_workers, scale_out_requested
from ..registry import FAMILIES


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise UserError(f"expected non-negative integers, got {text!r}")
    return values


def _grids(text: str, crop_range: tuple[int, int] = (2, 9)) -> list[tuple[int, int]]:
    """Crop grids of --grids; 'vendor' stands for every grid the vendor's rule can choose in `crop_range`."""
    from ..measure.sweep import vendor_grids

    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part == "vendor":
            out += vendor_grids(*crop_range)
        elif part:
            try:
                w, h = (int(v) for v in part.split("x"))
            except ValueError:
                raise UserError(f"crop grid must look like 2x2 or 'vendor', got {part!r}") from None
            out.append((w, h))
    return out


def register(sub) -> None:
    p = sub.add_parser("measure", help="measured sweep over modes, crop grids, text lengths, batches, decode steps")
    add_model_options(p)  # --seed seeds the weights and the synthetic inputs
    listing = "; ".join(f"{f.name}: {','.join(f.modes)}" for f in FAMILIES.values())
    p.add_argument("--modes", default=None, help=f"comma-separated modes of --model (default: its default mode; "
                                                 f"{listing})")
    p.add_argument("--grids", default="1x1,2x2", help="crop grids of the tiling modes: 2x2,3x2 or 'vendor' (every "
                                                      "grid the vendor's crop range allows)")
    p.add_argument("--text-tokens", default="10", help="non-image prompt tokens incl. BOS, e.g. 10,500")
    p.add_argument("--batch", default="1", help="e.g. 1,4,8")
    p.add_argument("--decode-steps", default="32", help="decode steps K, e.g. 32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--no-order-check", action="store_true",
                   help="do not measure the first point again at the end (the check that a point's time does not "
                        "depend on the points measured before it)")
    p.add_argument("--logits", default="all", choices=["all", "last"])
    p.add_argument("--store", type=Path, default=None, help="run store (default data/runs.sqlite or $DSOCR_STORE)")
    p.add_argument("--resume", metavar="RUN_ID", help="continue an earlier run, skipping finished points")
    p.add_argument("--name", default=None, help="name of a new run (with --resume: must be the run's, or left out)")
    p.add_argument("--kind", default=None, choices=["sweep", "reference"],
                   help="kind of a new run (default sweep; with --resume: must be the run's, or left out)")
    p.add_argument("--calibrate", action="store_true", help="measure matmul and copy ceilings first (GPU)")
    p.add_argument("--export", type=Path, help="write the run to this .json or .csv when done")
    p.add_argument("--summary", type=Path, help="write the analytic-vs-measured summary (.md, plus .json beside)")
    add_scale_out_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..measure.sweep import sweep_workloads
    from ..results.schema import MAX_NAME_CHARS
    from ..results.store import RunStore

    family = family_from_args(args)
    modes = [m.strip() for m in (args.modes or family.default_mode).split(",") if m.strip()]
    unknown = [m for m in modes if m not in family.modes]
    if not modes or unknown:
        raise UserError(f"unknown {family.label} mode(s) {', '.join(unknown) or '(none given)'}; "
                        f"choose from {', '.join(family.modes)}")
    if any(b < 1 for b in _ints(args.batch)) or any(t < 1 for t in _ints(args.text_tokens)):
        raise UserError("batch and text tokens must be at least 1")
    if args.repeats < 1 or args.warmup < 0:
        raise UserError("--repeats must be at least 1 and --warmup at least 0")
    kind = args.kind or "sweep"
    name = args.name or f"{kind} {args.synthetic or args.checkpoint} {args.dtype} {args.attn}"
    if len(name) > MAX_NAME_CHARS:
        raise UserError(f"--name has {len(name)} characters, more than the limit of {MAX_NAME_CHARS}")
    tiled = [family.modes[m].crop_range for m in modes if family.modes[m].crop_mode] or [(2, 9)]
    crop_range = (min(r[0] for r in tiled), max(r[1] for r in tiled))
    workloads = sweep_workloads(modes, _grids(args.grids, crop_range), _ints(args.text_tokens), _ints(args.batch),
                                _ints(args.decode_steps), dtype=args.dtype, attn=args.attn, logits=args.logits)
    # the store and the run to resume are checked before the model loads: a corrupt store, an unknown id or a
    # resume with other settings ends here, in one line, with nothing measured
    store = RunStore(args.store)  # StoreCorrupt (a ValueError): one line, exit 2
    run_id = _resume_target(store, args) if args.resume else None
    args.kind = kind  # checked against a resumed run's above; from here on the kind of the run
    pool = None
    if scale_out_requested(args):
        if args.calibrate:
            raise UserError("--calibrate measures one device; run `calibrate` on a worker's GPU instead of "
                            "combining it with --workers / --ray-address")
        from ..measure.scale_out import command_pool

        with command_pool(args) as pool:
            return _run_loaded(args, store, run_id, pool.lead, workloads, name, pool)
    session = session_from_args(args)
    return _run_loaded(args, store, run_id, session, workloads, name, None)


def _run_loaded(args, store, run_id, session, workloads, name, pool) -> int:
    """The sweep once the session (or, scaled out, the pool and its lead worker's session facts) is ready."""
    import sys

    from tqdm import tqdm

    from ..measure import order_check as checks
    from ..measure.sweep import run_sweep
    from ..results.analytic_join import compare_run, summarize, summary_json, summary_markdown
    from ..results.store import StoreError

    driver: dict = {}  # scaled out: the driver's counts (items lost when workers died)
    if pool is not None:
        from ..measure.scale_out import run_sweep_scaled

        def sweep_fn(_session, *a, **k):
            return run_sweep_scaled(pool, *a, stats=driver, **k)
    else:
        sweep_fn = run_sweep
    if run_id is not None:
        _check_resume_session(store, run_id, session)
    meta = {"logits": args.logits}
    if args.calibrate:
        from ..hardware import calibrate

        print("calibrating matmul and copy ceilings ...", flush=True)
        device = str(session.device)
        cpu = device == "cpu"
        hw = calibrate(device, dtype=session.dtype, **(dict(matmul_size=None, copy_bytes=64 << 20) if cpu else {}))
        meta["calibration"] = hw.model_dump(mode="json")
        print(f"  {hw.peak_tflops:.3g} TFLOP/s {session.dtype} matmul, {hw.bandwidth_tbs:.3g} TB/s copy", flush=True)
    sweep = dict(name=name, repeats=args.repeats, warmup=args.warmup, seed=args.weights_seed, meta=meta,
                 kind=args.kind)
    if run_id is None:  # an empty sweep records the run, so its id is known (and printed) before any point
        run_id = sweep_fn(session, store, [], order_check=False, **sweep)
    elif args.calibrate:
        store.update_run(run_id, meta={"calibration": meta["calibration"]})
    print(f"run {run_id}  ({'resumed' if args.resume else 'new'}; store {store.path}); resume it with "
          f"--resume {run_id[:12]}", file=sys.stderr, flush=True)
    bar = tqdm(total=len(workloads), unit="point", dynamic_ncols=True)

    def progress(done, total, w, status):
        bar.set_postfix_str(f"{w.mode} {w.crops or ''} T{w.text_tokens} B{w.batch} K{w.decode_steps}: {status}")
        bar.update(done - bar.n)

    try:
        sweep_fn(session, store, workloads, run_id=run_id, progress=progress, order_check=not args.no_order_check,
                 **sweep)
    except KeyboardInterrupt:
        bar.close()
        try:
            n = store.get_run(run_id)["n_points"]
        except StoreError:
            n = "its"
        print(f"interrupted; {n} points of run {run_id} are stored in {store.path}. Resume with: "
              f"--resume {run_id[:12]}", file=sys.stderr, flush=True)
        raise
    finally:
        bar.close()
    run = store.get_run(run_id)
    print(f"run {run_id}: {run['n_done']} done, {run['n_oom']} oom, {run['n_error']} error  ({store.path})")
    check = run["meta"].get("order_check")
    if check:
        print(checks.summary(check), file=sys.stderr if checks.failed(check) else sys.stdout)
    if args.export:
        print(f"exported to {store.export_run(run_id, args.export)}")
    summary = summarize(compare_run(store, run_id))
    md = summary_markdown(summary, f"Analytic vs measured: {run['name']}")
    print(md)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(md)
        args.summary.with_suffix(".json").write_text(summary_json(summary))
    return lost_to_dead_workers(driver, run_id)


def _resume_target(store, args) -> str:
    """The full id of --resume (a unique prefix will do), refused unless it is a measured sweep recorded with the
    same settings these arguments ask for (as `profile --resume` refuses)."""
    from ..results.runs import plain_text, settings_problems
    from ..results.store import StoreError

    try:
        run_id = store.resolve_id(args.resume, kinds=("sweep", "reference"))
        run = store.get_run(run_id)
    except StoreError as exc:
        raise UserError(f"--resume: {exc}") from None
    if run.get("imported_from"):
        raise UserError(f"--resume: run {run_id} was imported from {run['imported_from']}; measure a new run instead")
    wanted = {"dtype": args.dtype, "attn": args.attn, "session_mode": getattr(args, "session_mode", "reference"),
              "seed": args.weights_seed, "repeats": args.repeats, "warmup": args.warmup, "logits": args.logits,
              "weights_source": "synthetic" if args.synthetic else "checkpoint"}
    points = store.points(run_id)
    problems = settings_problems(run, wanted, point_logits=points["logits"].dropna().unique())
    # a resume continues the run under its own name and kind: another --name or --kind would be ignored, so refuse
    if args.name is not None and args.name != run["name"]:
        problems.append(f"name {plain_text(run['name'], 80)!r} -> {plain_text(args.name, 80)!r}")
    if args.kind is not None and args.kind != run["kind"]:
        problems.append(f"kind {run['kind']} -> {args.kind}")
    if problems:
        raise UserError(f"cannot resume run {run_id[:12]} with different settings ({'; '.join(problems)}); start a "
                        "new run instead (leave out --resume)")
    return run_id


def _check_resume_session(store, run_id: str, session) -> None:
    """The loaded weights and device must be those of the run too (checked once the model is loaded, before any
    point is measured)."""
    from ..results.runs import settings_problems

    wanted = {"weights_detail": session.weights.get("detail"), "device_type": session.device.type}
    family = getattr(session, "family", None)  # a Session or the scale-out lead's RemoteSession
    if family is not None:
        wanted["model"] = family.name
    problems = settings_problems(store.get_run(run_id), wanted)
    if problems:
        raise UserError(f"cannot resume run {run_id[:12]} with different settings ({'; '.join(problems)}); start a "
                        "new run instead (leave out --resume)")
