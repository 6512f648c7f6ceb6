"""`profile`: a dataset run over real pages (a folder or a list file, PDFs rendered at --dpi), with sampling,
per-stage statistics and the analytic prediction beside them, stored in the run store (resumable), and an
optional torch.profiler operator breakdown per stage (--trace)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..cli import UserError, add_mode_options, add_model_options, family_from_args, resolve_mode, session_from_args
from ..measure.scale_out import add_scale_out_options, scale_out_requested

DEFAULT_PROMPT = "<image>\n<|grounding|>Convert the document to markdown."


def register(sub) -> None:
    p = sub.add_parser("profile", help="profile real pages: per-stage statistics over a data set, operator breakdown",
                       description=__doc__)
    p.add_argument("--pages", type=Path, required=True,
                   help="folder of page images/PDFs (recursive), a text file listing paths (relative to the "
                        "list's folder), or one image or PDF")
    add_model_options(p, seed_flag="--weights-seed")  # --seed is the sampling seed
    p.add_argument("--sample", type=int, metavar="N", help="pages per epoch (default: all)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--order", choices=["random", "fixed"], default="random",
                   help="random: a seeded shuffle per epoch; fixed: the listed order")
    p.add_argument("--dpi", type=int, default=144, help="PDF rendering resolution (vendor: 144)")
    add_mode_options(p)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--no-repeat-ngram-size", type=int, default=20)
    p.add_argument("--logits", choices=["all", "last"], default="all")
    p.add_argument("--flops", choices=["shape", "page", "none"], default="shape",
                   help="FLOP counting pass: once per input shape (exact, reused), every page, or none")
    p.add_argument("--warmup", choices=["shape", "first", "none"], default="shape",
                   help="untimed warm-up before the first page of each input shape, before the first page only, "
                        "or never")
    p.add_argument("--store", type=Path, help="run store file (default: $DSOCR_STORE or data/runs.sqlite)")
    p.add_argument("--name", help="run name")
    p.add_argument("--resume", metavar="RUN_ID", help="continue this dataset run (an id or a unique id prefix)")
    p.add_argument("--trace", action="store_true",
                   help="after the timed pages, a torch.profiler pass: operators per stage (CSV) and a Chrome trace")
    p.add_argument("--trace-pages", type=int, default=2, help="pages in the profiler pass")
    p.add_argument("--trace-tokens", type=int, default=32, help="tokens generated per page in the profiler pass")
    p.add_argument("--trace-dir", type=Path, help="where to write operators.csv, operator_stages.csv, trace.json "
                                                  "(default: out/profile/<run id>)")
    p.add_argument("--record-shapes", action="store_true", help="record operator input shapes in the trace")
    p.add_argument("--hardware", help="hardware preset for the analytic time prediction (default: the run's GPU)")
    p.add_argument("--no-order-check", action="store_true",
                   help="do not measure the first page again at the end (the check that a page's time does not "
                        "depend on the pages measured before it)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print one JSON object (summary and stage statistics)")
    add_scale_out_options(p)
    p.set_defaults(func=run)


def _resolve_run(store, args) -> str:
    """The full id of --resume, resolved as the store resolves ids (a unique prefix, any case), checked before the
    model loads; a --name other than the run's is refused (a resume never renames a run)."""
    from ..results.runs import plain_text
    from ..results.store import StoreError

    try:
        run_id = store.resolve_id(args.resume, kinds=("dataset",))
        run = store.get_run(run_id)
    except StoreError as exc:
        raise UserError(f"--resume: {exc}") from None
    if args.name is not None and args.name != run["name"]:
        raise UserError(f"cannot resume run {run_id[:12]} under another name (name {plain_text(run['name'], 80)!r} "
                        f"-> {plain_text(args.name, 80)!r}); leave out --name, or start a new run")
    return run_id


def run(args) -> int:
    from ..measure.datasets import DatasetError, discover, sample
    from ..measure.dataset_run import ProfileSettings
    from ..results.store import RunStore

    mode, min_crops, max_crops = resolve_mode(args, family_from_args(args))
    settings = ProfileSettings(mode=mode, prompt=args.prompt, min_crops=min_crops, max_crops=max_crops,
                               max_new_tokens=args.max_new_tokens, no_repeat_ngram_size=args.no_repeat_ngram_size,
                               logits=args.logits, dpi=args.dpi, flops=args.flops, warmup=args.warmup)
    try:
        settings.validate()
        dataset = discover(args.pages)
        samples = sample(dataset.pages, args.sample, args.epochs, args.seed, args.order)
    except DatasetError as exc:
        raise UserError(str(exc)) from None
    if args.trace_pages < 1 or args.trace_tokens < 1:
        raise UserError("--trace-pages and --trace-tokens must be at least 1")
    hardware = None
    if args.hardware:
        from ..hardware import get_hardware

        hardware = get_hardware(args.hardware)
    store = RunStore(args.store)
    run_id = _resolve_run(store, args) if args.resume else None
    if scale_out_requested(args):
        if args.trace:
            raise UserError("--trace (the operator breakdown) runs in one process; leave out --workers / "
                            "--ray-address for it")
        from ..measure.scale_out import command_pool

        with command_pool(args) as pool:
            return _run_loaded(args, store, run_id, pool.lead, dataset, samples, settings, hardware, pool)
    return _run_loaded(args, store, run_id, session_from_args(args), dataset, samples, settings, hardware, None)


def _run_loaded(args, store, run_id, session, dataset, samples, settings, hardware, pool) -> int:
    """The dataset run once the session (or, scaled out, the pool and its lead worker's session facts) is
    ready."""
    from ..measure.dataset_run import check_resume, create_dataset_run, run_dataset

    from ..measure.scale_out import lost_to_dead_workers

    create, run_fn, driver = {}, run_dataset, {}  # driver: scaled out, the driver's counts (items lost)
    if pool is not None:
        from ..measure.scale_out import run_dataset_scaled

        create = {"environment": pool.lead.info["environment"], "meta": {"scale_out": pool.describe()}}
        run_fn = lambda _session, *a, **k: run_dataset_scaled(pool, *a, stats=driver, **k)  # noqa: E731
    sampling = {"n": args.sample, "epochs": args.epochs, "seed": args.seed, "order": args.order,
                "samples": len(samples)}
    if run_id is not None:
        check_resume(store, run_id, session, dataset, settings)
        store.update_run(run_id, meta={"sampling": sampling})
    else:
        if pool is None and str(session.device) == "cpu":  # the bound of a CPU run: its own CPU's ceilings
            from ..hardware import cpu_ceilings

            create["meta"] = {"calibration": cpu_ceilings(session.dtype).model_dump(mode="json")}
        run_id = create_dataset_run(store, session, dataset, settings, sampling, name=args.name, **create)
    quiet = args.json or args.no_progress
    if not quiet:
        n_pdf = sum(p.pdf_page is not None for p in dataset.pages)
        print(f"run {run_id}  ({'resumed' if args.resume else 'new'}, store {store.path})", file=sys.stderr)
        print(f"data set {dataset.source}: {len(dataset.pages)} pages ({n_pdf} from PDFs); {len(samples)} samples "
              f"({args.epochs} epoch(s), {args.order} order, seed {args.seed})"
              + (f"; {'; '.join(dataset.notes)}" if dataset.notes else ""), file=sys.stderr)
        if args.sample and args.sample > len(dataset.pages):
            print(f"note: --sample {args.sample} is more than the {len(dataset.pages)} pages; each epoch takes all",
                  file=sys.stderr)

    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=len(samples), unit="page", file=sys.stderr, dynamic_ncols=True)
    tally = {"done": 0, "oom": 0, "error": 0, "skipped": 0}

    def progress(i, total, s, status):
        if status == "recheck":  # the order check: not a page of the run
            if bar is not None:
                bar.set_postfix_str(f"order check: {s.page.label[-30:]} measured again")
            return
        tally[status] = tally.get(status, 0) + 1
        if bar is not None:
            bar.set_postfix_str(f"{s.page.label[-30:]} {status}; " + " ".join(f"{k} {v}" for k, v in tally.items() if v))
            bar.update(1)

    try:
        run_fn(session, store, run_id, samples, settings, progress=progress, order_check=not args.no_order_check)
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        print(f"interrupted; finished pages are stored. Resume with: --resume {run_id[:12]}", file=sys.stderr)
        raise
    if bar is not None:
        bar.close()

    if args.trace:
        from ..measure.operators import profile_operators, store_operator_profile

        out_dir = args.trace_dir or Path("out") / "profile" / run_id
        try:
            prof = profile_operators(session, samples, settings, n_pages=args.trace_pages,
                                     max_new_tokens=args.trace_tokens, out_dir=out_dir,
                                     record_shapes=args.record_shapes)
        except ValueError as exc:
            print(f"operator breakdown skipped: {exc}", file=sys.stderr)
        else:
            store_operator_profile(store, run_id, prof)

    code = report(store, run_id, hardware, as_json=args.json)
    return max(code, lost_to_dead_workers(driver, run_id, "page"))


def report(store, run_id: str, hardware, as_json: bool = False) -> int:
    from ..results.dataset_stats import operator_table, page_table, run_summary, stage_summary

    pages = page_table(store, run_id, hardware)
    summary = run_summary(store, run_id, pages)
    stages = stage_summary(pages)
    ops = operator_table(store, run_id)
    if as_json:
        doc = {"summary": summary, "stages": json.loads(stages.to_json(orient="records")),
               "operators": json.loads(ops.to_json(orient="records"))}
        print(json.dumps(doc))
        return 0 if summary["done"] else 1
    from ..results.store import FLAG_LABELS

    flags = [FLAG_LABELS.get(k, k) for k, v in summary["flags"].items() if v]
    print(f"\n{summary['label']}")
    print(f"samples {summary['samples']}: done {summary['done']}, error {summary['error']}, oom {summary['oom']}"
          + (f"   [{', '.join(flags)}]" if flags else ""))
    for e in summary["errors"][:10]:
        print(f"  {e['label']}: {e['message']}")
    if summary["order_check"]:
        print(summary["order_check"], file=sys.stderr if summary["order_check_failed"] else sys.stdout)
    if summary["done"]:
        print(f"pages/s {summary['pages_per_s']:.3f} (one page at a time, wall incl. preprocessing)   "
              f"tokens/page {summary['tokens_per_page']:.1f}   output tokens/s {summary['output_tokens_per_s'] or 0:.1f}")
        from ..results.tables import format_table

        cell = {"s": lambda v: f"{v * 1e3:,.2f}ms", "tokens": lambda v: f"{v:,.1f}", "FLOP": lambda v: f"{v / 1e9:,.2f} G"}
        rows = [[r["stage"] + (" FLOPs" if r["unit"] == "FLOP" else ""), r["n"]]
                + [cell.get(r["unit"], cell["FLOP"])(r[c]) if r[c] == r[c] else "-"
                   for c in ("mean", "median", "p90", "std", "analytic_mean")] for _, r in stages.iterrows()]
        print("\n" + format_table(["stage", "n", "mean", "median", "p90", "std", "analytic"], rows))
    if len(ops):
        print("\ntop operators per stage (self time, share of the stage):")
        for (stage, device), group in ops.groupby(["stage", "device"], sort=False):
            top = group.head(5)
            print(f"  {stage} [{device}] total {group['stage_total_us'].iloc[0] / 1e3:.1f} ms: " + "; ".join(
                f"{r['operator']} {r['share'] * 100:.0f}%" for _, r in top.iterrows()))
        files = (store.get_run(run_id)["meta"].get("operators") or {}).get("files") or {}
        if files.get("trace"):
            print(f"\nChrome trace (open in https://ui.perfetto.dev): {files['trace']}")
            print(f"operator CSV: {files['operators_csv']}")
    print(f"\nrun id {run_id}")
    return 0 if summary["done"] else 1
