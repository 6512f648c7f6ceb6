"""Reference GPU run: full-size model with synthetic weights, bf16, SDPA.

1. A 2x2 Gundam page through both generation paths: TTFT, time per decode token, per-stage times and FLOPs,
   the verification report (written to OUT/generate_full_2x2.json).
2. Calibration ceilings, then a measured sweep (vendor-supported grids, native modes, a few text lengths,
   batch 1 and larger batches, decode K >= 32) into a run store, exported as JSON with the comparison summary.

    python benchmarks/gpu_reference.py --out OUT [--budget-s 480] [--session-mode reference|fast]

Sub-sweeps run in order until the time budget is spent; re-running with the same --store resumes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsocr_core.results.analytic_join import compare_run, summarize, summary_json, summary_markdown  # noqa: E402
from dsocr_core.engines import SESSION_MODES  # noqa: E402
from dsocr_core.hardware import calibrate  # noqa: E402
from dsocr_core.measure.sweep import run_sweep, sweep_workloads, vendor_grids  # noqa: E402
from dsocr_core.grounding.samples import sample_pages  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.results.store import RunStore  # noqa: E402
from dsocr_core.registry import native_modes  # noqa: E402


def page_2x2() -> Path:
    from dsocr_core.runtime.inputs import load_image
    from dsocr_core.tiling import crop_grid

    for p in sample_pages():
        w, h = load_image(p).size
        if crop_grid(w, h, "gundam") == (2, 2):
            return p
    raise SystemExit("no bundled sample page tiles 2x2")


def generation_report(session: Session, tokens: int) -> dict:
    page = page_2x2()
    inputs = session.prepare(page, mode="gundam")
    session.generate_one_shot(inputs, max_new_tokens=4)  # warm-up; one-shot is the HF-like yardstick in any mode
    session.generate_separated(inputs, max_new_tokens=4)
    one = session.generate_one_shot(inputs, max_new_tokens=tokens)
    sep = session.generate_separated(inputs, max_new_tokens=tokens, reference=one)
    flops = session.count_stage_flops(inputs, logits="all", decode_steps=1)
    keep = (*session.family.stage_names, "ttft_s", "tpot_s", "total_s", "peak_memory")
    return {"page": page.name, "grid": inputs.images_spatial_crop[0].tolist(), "prompt_tokens": inputs.seq_len,
            "image_slots": inputs.image_slots, "tokens": tokens, "session": session.describe(),
            "one_shot": {k: one.timings.get(k) for k in keep},
            "separated": {k: sep.timings.get(k) for k in keep},
            "verification": sep.verification,
            "flops": {k: v["flops"] for k, v in flops.items()}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=480)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-generate", action="store_true")
    ap.add_argument("--skip-sweep", action="store_true", help="only the 2x2 generation report")
    ap.add_argument("--session-mode", choices=SESSION_MODES, default="reference")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    session = Session.load(synthetic="full", device="cuda", dtype="bfloat16", attn="sdpa",
                           session_mode=args.session_mode)
    print(f"model ready in {time.time() - t0:.0f} s: {session.describe()}", flush=True)
    if not args.skip_generate:
        rep = generation_report(session, args.tokens)
        (args.out / f"generate_full_2x2_{args.session_mode}.json").write_text(json.dumps(rep, indent=2))
        print(json.dumps(rep), flush=True)

    if args.skip_sweep:
        return 0
    hw = calibrate("cuda")
    print(f"calibrated: {hw.peak_tflops:.1f} TFLOP/s, {hw.bandwidth_tbs:.3f} TB/s", flush=True)
    store = RunStore(args.out / f"{args.session_mode}.sqlite")
    common = dict(dtype="bfloat16", attn="sdpa", logits="all")
    parts = [
        ("vendor grids", sweep_workloads(["gundam"], [(1, 1), *vendor_grids()], [10], [1], [32], **common)),
        ("native modes", sweep_workloads(native_modes(), [(1, 1)], [10], [1], [32], **common)),
        ("text lengths", sweep_workloads(["gundam"], [(2, 2)], [500, 2000], [1], [32], **common)),
        ("batches", sweep_workloads(["gundam", "base"], [(2, 2)], [10], [4, 16, 64], [32], **common)),
    ]
    run_id = None
    for name, workloads in parts:
        if time.time() - t0 > args.budget_s:
            print(f"budget spent; skipped {name}", flush=True)
            continue
        start = time.time()
        run_id = run_sweep(session, store, workloads, run_id=run_id, name=f"H200 {args.session_mode} mode (synthetic full, bf16, sdpa)",
                           repeats=args.repeats, warmup=1, kind="reference",
                           meta={"calibration": hw.model_dump(mode="json")},
                           should_stop=lambda: time.time() - t0 > args.budget_s,
                           progress=lambda i, n, w, s: print(f"  [{name} {i}/{n}] {w.mode} {w.crops} "
                                                            f"T{w.text_tokens} B{w.batch}: {s}", flush=True))
        print(f"{name}: {time.time() - start:.0f} s", flush=True)
    store.export_run(run_id, args.out / f"h200_{args.session_mode}.json")
    summary = summarize(compare_run(store, run_id))
    title = f"H200 {args.session_mode} mode: analytic vs measured"
    (args.out / f"summary_{args.session_mode}.md").write_text(summary_markdown(summary, title))
    (args.out / f"summary_{args.session_mode}.json").write_text(summary_json(summary))
    print(summary_markdown(summary, title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
