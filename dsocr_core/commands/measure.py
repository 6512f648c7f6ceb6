"""`measure`: a measured sweep into the run store (resumable), optionally calibrated and exported."""
from __future__ import annotations

from pathlib import Path

from ..cli import UserError, add_model_options, session_from_args


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise UserError(f"expected non-negative integers, got {text!r}")
    return values


def _grids(text: str) -> list[tuple[int, int]]:
    from ..measure.sweep import vendor_grids

    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if part == "vendor":
            out += vendor_grids()
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
    p.add_argument("--modes", default="gundam", help="comma-separated: tiny,small,base,large,gundam,gundam-m")
    p.add_argument("--grids", default="1x1,2x2", help="crop grids for gundam modes: 2x2,3x2 or 'vendor' (2..9 tiles)")
    p.add_argument("--text-tokens", default="10", help="non-image prompt tokens incl. BOS, e.g. 10,500")
    p.add_argument("--batch", default="1", help="e.g. 1,4,8")
    p.add_argument("--decode-steps", default="32", help="decode steps K, e.g. 32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--logits", default="all", choices=["all", "last"])
    p.add_argument("--store", type=Path, default=None, help="run store (default data/runs.sqlite or $DSOCR_STORE)")
    p.add_argument("--resume", metavar="RUN_ID", help="continue an earlier run, skipping finished points")
    p.add_argument("--name", default=None)
    p.add_argument("--kind", default="sweep", choices=["sweep", "reference"])
    p.add_argument("--calibrate", action="store_true", help="measure matmul and copy ceilings first (GPU)")
    p.add_argument("--export", type=Path, help="write the run to this .json or .csv when done")
    p.add_argument("--summary", type=Path, help="write the analytic-vs-measured summary (.md, plus .json beside)")
    p.set_defaults(func=run)


def run(args) -> int:
    from tqdm import tqdm

    from ..results.analytic_join import compare_run, summarize, summary_json, summary_markdown
    from ..measure.sweep import run_sweep, sweep_workloads
    from ..results.store import RunStore

    from ..tiling import MODES

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if not modes or unknown:
        raise UserError(f"unknown mode(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(MODES)}")
    if any(b < 1 for b in _ints(args.batch)) or any(t < 1 for t in _ints(args.text_tokens)):
        raise UserError("batch and text tokens must be at least 1")
    workloads = sweep_workloads(modes, _grids(args.grids), _ints(args.text_tokens), _ints(args.batch),
                                _ints(args.decode_steps), dtype=args.dtype, attn=args.attn, logits=args.logits)
    session = session_from_args(args)
    meta = {}
    if args.calibrate:
        from ..hardware import calibrate

        print("calibrating matmul and copy ceilings ...", flush=True)
        hw = calibrate(str(session.device))
        meta["calibration"] = hw.model_dump(mode="json")
        print(f"  {hw.peak_tflops:.1f} TFLOP/s bf16 matmul, {hw.bandwidth_tbs:.3f} TB/s copy", flush=True)
    store = RunStore(args.store)
    bar = tqdm(total=len(workloads), unit="point", dynamic_ncols=True)

    def progress(done, total, w, status):
        bar.set_postfix_str(f"{w.mode} {w.crops or ''} T{w.text_tokens} B{w.batch} K{w.decode_steps}: {status}")
        bar.update(done - bar.n)

    name = args.name or f"{args.kind} {args.synthetic or args.checkpoint} {args.dtype} {args.attn}"
    try:
        run_id = run_sweep(session, store, workloads, run_id=args.resume, name=name, repeats=args.repeats,
                           warmup=args.warmup, seed=args.weights_seed, progress=progress, meta=meta, kind=args.kind)
    finally:
        bar.close()
    run = store.get_run(run_id)
    print(f"run {run_id}: {run['n_done']} done, {run['n_oom']} oom, {run['n_error']} error  ({store.path})")
    if args.export:
        print(f"exported to {store.export_run(run_id, args.export)}")
    summary = summarize(compare_run(store, run_id))
    md = summary_markdown(summary, f"Analytic vs measured: {run['name']}")
    print(md)
    if args.summary:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(md)
        args.summary.with_suffix(".json").write_text(summary_json(summary))
    return 0
