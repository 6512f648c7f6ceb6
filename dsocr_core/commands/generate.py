"""`generate`: run one page through the session, one-shot and/or separated, with stage times, FLOPs and the
verification report."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from ..cli import UserError, add_mode_options, add_model_options, family_from_args, resolve_mode, session_from_args

DEFAULT_PROMPT = "<image>\n<|grounding|>Convert the document to markdown."


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one page with per-stage times, FLOPs and verification")
    add_model_options(p)
    p.add_argument("--image", type=Path, help="page image (default: the first bundled sample page)")
    add_mode_options(p)
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--no-repeat-ngram-size", type=int, default=20)
    p.add_argument("--path", choices=["one-shot", "separated", "both"], default="both")
    p.add_argument("--first-token", choices=["prefill", "redecode"], default="prefill")
    p.add_argument("--logits", choices=["all", "last"], default="all")
    p.add_argument("--no-flops", action="store_true", help="skip the separate FLOP-counting pass")
    p.add_argument("--trace", type=Path, help="write a torch.profiler Chrome trace of the run to this file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    p.set_defaults(func=run)


def default_image() -> Path:
    from ..grounding.samples import sample_pages

    pages = sample_pages()
    if not pages:
        raise UserError("no --image given and no bundled sample pages found in data/samples")
    return pages[0]


def run(args) -> int:
    from ..runtime.inputs import ImageError

    if args.max_new_tokens < 1:
        raise UserError("--max-new-tokens must be at least 1")
    if "<image>" not in args.prompt:
        raise UserError("the prompt must contain <image> (e.g. '<image>\\n<|grounding|>OCR this image.')")
    image = args.image or default_image()
    if not Path(image).is_file():
        raise UserError(f"image not found: {image}")
    mode, min_crops, max_crops = resolve_mode(args, family_from_args(args))
    session = session_from_args(args)
    try:
        inputs = session.prepare(image, args.prompt, mode=mode, min_crops=min_crops, max_crops=max_crops)
    except ImageError as exc:
        raise UserError(str(exc)) from None
    gen = dict(max_new_tokens=args.max_new_tokens, no_repeat_ngram_size=args.no_repeat_ngram_size,
               logits=args.logits)

    def both_paths():
        out = {}
        if args.path in ("one-shot", "both"):
            # the one-shot path is HF generate()'s call pattern on the reference model, in either session mode
            out["one-shot"] = session.generate_one_shot(inputs, **gen)
        if args.path in ("separated", "both"):
            out["separated"] = session.generate_separated(inputs, first_token=args.first_token,
                                                          reference=out.get("one-shot"), **gen)
        return out

    # warm up exactly what is timed (both paths, same logits), so the reported times exclude one-off costs:
    # allocator growth, kernel selection and, in fast mode, compilation and graph capture
    timed_tokens = gen["max_new_tokens"]
    gen["max_new_tokens"] = min(2, timed_tokens)
    both_paths()
    gen["max_new_tokens"] = timed_tokens
    if args.trace:
        results = _traced(both_paths, args.trace, session.device)
    else:
        results = both_paths()
    flops = None if args.no_flops else session.count_stage_flops(inputs, logits=args.logits, decode_steps=1)
    report = {
        "session": session.describe(),
        "image": str(image),
        "model": session.family.name,
        "vision_stages": list(session.vision_stages),
        "mode": mode,
        "grid": inputs.images_spatial_crop[0].tolist(),
        "prompt_tokens": int(inputs.input_ids.shape[1]),
        "input_ids": inputs.input_ids.tolist(),
        "paths": {name: r.to_dict() for name, r in results.items()},
        "flops": None if flops is None else {k: {kk: vv for kk, vv in v.items() if kk != "modules"}
                                             for k, v in flops.items()},
    }
    if args.trace:
        report["trace"] = str(args.trace)
    report["nsys_command"] = nsys_command(args)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    verification = results.get("separated") and results["separated"].verification
    return 0 if not verification or verification["passed"] else 1


def _traced(fn, path: Path, device):
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        out = fn()
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    return out


def nsys_command(args) -> str:
    """The `nsys profile` line that profiles this same run, with its NVTX ranges."""
    argv, skip = [], False
    for a in args.argv:  # the same command without the torch.profiler trace
        if skip or a.startswith("--trace"):
            skip = a == "--trace"
            continue
        argv.append(a)
    return ("nsys profile --trace=cuda,nvtx,osrt --capture-range=none -o dsocr_generate "
            + " ".join(shlex.quote(a) for a in [sys.executable, "-m", "dsocr_core", *argv]))


def print_report(report: dict) -> None:
    s = report["session"]
    print(f"model: {report['model']} {s['detail']}  ({'SYNTHETIC WEIGHTS' if s['synthetic'] else 'checkpoint'}), "
          f"{s['parameters']:,} parameters, {s['dtype']}, {s['device']}, {s['session_mode']} session mode"
          + ("  [CPU]" if s["cpu_fallback"] else "") + ("  [fallback tokenizer]" if s["fallback_tokenizer"] else ""))
    print(f"page: {report['image']}  mode {report['mode']}  grid {report['grid']}  prompt {report['prompt_tokens']} tokens")
    for name, r in report["paths"].items():
        t = r["timings"]
        n = len(r["generated_ids"][0])
        print(f"\n== {name}: {n} tokens  TTFT {t['ttft_s'] * 1e3:.1f} ms  "
              f"TPOT {(t['tpot_s'] or 0) * 1e3:.2f} ms  total {t['total_s']:.3f} s")
        stages = (*report["vision_stages"], "prefill", "decode")
        print("   " + "  ".join(f"{k} {t[k] * 1e3:.1f} ms" for k in stages))
        print("   text: " + (r["texts"][0][:300].replace("\n", "\\n") or "(empty)"))
        if r.get("verification"):
            print("   verification: " + json.dumps(r["verification"]))
    if report["flops"]:
        print("\nFLOPs (separate counting pass): " + "  ".join(
            f"{k} {v['flops'] / 1e9:.2f} G" for k, v in report["flops"].items()))
    if report.get("trace"):
        print(f"\nChrome trace: {report['trace']} (open in Perfetto)")
    print(f"\nprofile with Nsight Systems:\n  {report['nsys_command']}")
