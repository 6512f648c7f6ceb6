"""Reference vs fast session: measured times against their hardware floors, on the GPU this runs on.

Prints the ceilings it measured (copy bandwidth, bf16 matmul) and the analytic floors first, then measures:
  parity     greedy tokens of the fast path vs the reference on the same weights (full spec, 2x2 Gundam page)
  prefill    vision + LM prefill of a 2x2 Gundam page (703 tokens) vs its roofline (datasheet and calibrated)
  decode     batch 1 time per token vs the memory floor (touched weights + KV cache over measured copy bandwidth)
  batched    tokens/s at batch 1, 8, 32, 64 with the fraction of each batch's roofline reached
  pages      pages/s for a typical Gundam page (3x2 tiles = 893 image slots, 1,000 output tokens) per batch size,
             next to the paper's 200k pages/day on one A100-40G and the analytic model's prediction
Ends with ONE JSON line holding every figure, and writes the same JSON to --out.

    python benchmarks/session_speed.py --out out/session_speed.json          # on a GPU: full spec, bf16
    python benchmarks/session_speed.py --quick --device cpu --out /tmp/s.json  # tiny spec smoke run
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsocr_core.analytic import capacity_summary, decode_floor, prefill_roofline  # noqa: E402
from dsocr_core.measure.environment import capture_environment  # noqa: E402
from dsocr_core.measure.token_parity import compare  # noqa: E402
from dsocr_core.hardware import PRESETS, calibrate, match_device_name  # noqa: E402
from dsocr_core.model.checkpoint import synthetic_model  # noqa: E402
from dsocr_core.registry import get_family  # noqa: E402
from dsocr_core.model.kv_cache import KVCache  # noqa: E402
from dsocr_core.runtime.inputs import PreparedInputs, synthetic_inputs  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.spec import Hardware, ModelSpec, Workload, tiny_spec  # noqa: E402
from dsocr_core.runtime.generate import Greedy  # noqa: E402
from dsocr_core.runtime.timing import StageTimer  # noqa: E402
from dsocr_core.runtime.tokenizer import load_tokenizer  # noqa: E402

PAPER_PAGES_PER_DAY_A100_40G = 200_000  # paper: "200k+ pages per day on one A100-40G"
LOG: list[str] = []
T0 = time.perf_counter()


def say(msg: str = "") -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}" if msg else "", flush=True)
    LOG.append(msg)


def checkpoint(out: dict, path: str) -> None:
    """Write what is measured so far (a crash later keeps every finished section)."""
    out["log"] = LOG
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=str))


# ----------------------------------------------------------------------------------------------------- inputs
def page_inputs(grid: tuple[int, int], batch: int, seed: int, device, dtype, text_tokens: int = 10) -> PreparedInputs:
    """Gundam pages of one tile grid, every row with its own random pixels and prompt text (generated on the
    device: fast for large batches), laid out like the grounding prompt (BOS, image slots, then the text ids:
    9 unless `text_tokens` says more)."""
    one = synthetic_inputs("gundam", grid, text_tokens=text_tokens, batch=1, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    crops, glob = one.images[0]
    images = [((torch.rand(crops.shape, generator=gen, device=device) * 2 - 1).to(dtype),
               (torch.rand(glob.shape, generator=gen, device=device) * 2 - 1).to(dtype)) for _ in range(batch)]
    ids = one.input_ids.to(device).repeat(batch, 1)
    mask = ids == ids[0, 1]  # slot 1 is always an image slot
    text = ~mask[0]
    text[0] = False  # BOS stays
    ids[:, text] = torch.randint(3, 128815, (batch, int(text.sum())), generator=gen, device=device)
    return PreparedInputs(ids, images, mask, one.images_spatial_crop.to(device).repeat(batch, 1), "gundam",
                          one.counts * batch, [None] * batch, [None] * batch, synthetic=True)


# ----------------------------------------------------------------------------------------------------- timing
def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def wall(fn, device) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def med(xs) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def ceilings(device) -> dict:
    """Ceilings measured here (the core's calibration: bf16 matmul, device copy) and this GPU's datasheet preset."""
    if device.type == "cuda":
        cal = calibrate(str(device), matmul_size=8192, copy_bytes=1 << 31, warmup=3, repeats=20)
    else:
        cal = calibrate("cpu", matmul_size=512, copy_bytes=1 << 26, warmup=1, repeats=3)
    return {"calibrated": cal, "datasheet": match_device_name(cal.name)}


# ----------------------------------------------------------------------------------------------------- parts
def reference_decode_times(ref: Session, cache: KVCache, token: torch.Tensor, steps: int, device,
                           record_routing: bool = False) -> tuple[list[float], float | None]:
    """Reference decode_step times (each step synchronised; the reference syncs inside its MoE anyway) and,
    optionally, the mean number of distinct routed experts per MoE layer and step."""
    distinct: list[int] = []
    hooks = []
    if record_routing:
        for layer in ref.model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                hooks.append(gate.register_forward_hook(
                    lambda mod, args, out: distinct.append(int(out[1].unique().numel()))))
    times = []
    try:
        for _ in range(steps):
            timer = StageTimer(device)
            with timer.stage("decode"):
                logits = ref.decode_step(token, cache)
                token = logits.argmax(-1)
            times.append(timer.finish()[0][1])
    finally:
        for h in hooks:
            h.remove()
    return times, (sum(distinct) / len(distinct) if distinct else None)


def fast_generate_times(fast: Session, inputs, steps: int, ngram: int) -> dict:
    """The generator through the fast engine (prefill + `steps` tokens with the n-gram ban, no EOS checks);
    per-step CUDA-event times, and the decode loop's span (first step's start to last step's end, the gaps
    between steps included)."""
    timer = StageTimer(fast.device)
    gen = Greedy(fast.engine, inputs, steps, ngram, timer=timer, stop_at_eos=False, memory="none")
    t = wall(lambda: gen.run(), fast.device)
    marks = timer.finish()
    launches = [s for name, s in marks if name == "decode"]  # an entry (one launch) may hold several tokens
    pre = sum(s for name, s in marks if name != "decode")
    tokens = len(timer.per_item("decode"))  # steps - 1: the first token comes from the prefill
    return {"wall_s": t, "prefill_s": pre, "step_s": launches, "span_s": timer.span("decode"), "tokens": tokens}


def kv_from_fast(cache, length: int) -> KVCache:
    kv = KVCache()
    st = cache.state
    for i in range(len(st.cache)):
        kv.keys.append(st.cache.layer_keys(i, length).clone())
        kv.values.append(st.cache.layer_values(i, length).clone())
    return kv


# ----------------------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/session_speed.json", help="JSON file for every figure")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny spec, few steps (smoke test, any device)")
    ap.add_argument("--parity-steps", type=int, default=64)
    ap.add_argument("--decode-steps", type=int, default=256, help="batch-1 tokens timed")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--batch-steps", type=int, default=128, help="tokens timed per batch size")
    ap.add_argument("--page-batches", default="32,64,128")
    ap.add_argument("--page-tokens", type=int, default=1000)
    ap.add_argument("--reference-steps", type=int, default=12)
    ap.add_argument("--no-reference-batched", action="store_true")
    ap.add_argument("--engine", default="{}", help="FastEngine options as JSON, e.g. '{\"compile\": false}'")
    ap.add_argument("--sections", default="parity,prefill,decode,pages,ablation",
                    help="comma list of parity, prefill, decode, pages, ablation, profile")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="skip ablation variants once this many seconds have passed since the start")
    ap.add_argument("--profile", action="store_true",
                    help="only profile (torch.profiler kernel tables) prefill and decode steps; writes *.txt")
    ap.add_argument("--profile-prefill", action=argparse.BooleanOptionalAction, default=True,
                    help="with the profile section: also profile the prefill (compiles the vision stages)")
    ap.add_argument("--profile-batches", default="1", help="with the profile section: decode batch sizes to "
                    "profile (empty: none)")
    ap.add_argument("--profile-text-tokens", type=int, default=10,
                    help="with the profile section: prompt text tokens of the decode steps' pages (default 10)")
    ap.add_argument("--variants", default="", help="ablation variants to run (comma list; default all; 'fast' "
                    "= the default engine): " + ", ".join(VARIANTS))
    ap.add_argument("--ablation", action=argparse.BooleanOptionalAction, default=True,
                    help="time batch-1 decode and prefill with each optimisation switched off in turn")
    args = ap.parse_args()
    device = torch.device(args.device)
    quick = args.quick
    if quick:
        args.parity_steps, args.decode_steps, args.batch_steps = 12, 16, 8
        args.batches, args.page_batches, args.page_tokens, args.reference_steps = "1,2", "2", 12, 3
    batches = [int(b) for b in args.batches.split(",") if b]
    page_batches = [int(b) for b in args.page_batches.split(",") if b]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dname = "bfloat16" if dtype == torch.bfloat16 else "float32"
    ngram = 20
    out: dict = {"benchmark": "session_speed", "quick": quick}
    t_start = time.perf_counter()

    env = capture_environment(str(device))
    out["environment"] = {k: env.get(k) for k in ("captured_at", "gpu_name", "driver", "torch", "cuda", "cudnn",
                                                  "python", "cpu_model", "sm_clock_max_mhz", "hostname")}
    hws = ceilings(device)
    cal, ds = hws["calibrated"], hws["datasheet"]
    out["ceilings"] = {"copy_tbs": cal.bandwidth_tbs, "matmul_tflops": cal.peak_tflops,
                       "datasheet": ds.model_dump() if ds else None}
    say(f"device {cal.name}: copy {cal.bandwidth_tbs:.2f} TB/s (read+write), bf16 matmul {cal.peak_tflops:.0f} "
        f"TFLOP/s" + (f"; datasheet {ds.bandwidth_tbs} TB/s, {ds.peak_tflops:g} TFLOP/s" if ds else ""))

    spec = tiny_spec() if quick else ModelSpec()
    t0 = time.perf_counter()
    model = synthetic_model(spec, seed=0, dtype=dtype, device=device)
    sync(device)
    tok = load_tokenizer(None)
    weights = {"source": "synthetic", "detail": "seed 0 (random weights)", "synthetic": True}
    ref = Session(model, spec, tok, device, dname, weights)
    fast = ref.with_mode("fast", **json.loads(args.engine))
    _ = fast.engine
    out["build_s"] = time.perf_counter() - t0
    say(f"model built in {out['build_s']:.1f} s ({'tiny' if quick else 'full'} spec, {dname}); fast layout copies "
        f"{fast.engine.w.extra_bytes / 1e9:.2f} GB")

    page = page_inputs((2, 2), 1, 1, device, dtype)
    sections = set(args.sections.split(","))
    if not args.ablation:
        sections.discard("ablation")
    if args.profile:  # only the kernel tables, with the profile section's options; --out's file is not written
        run_profile(ref, page, device, args)
        return
    t_prompt = page.input_ids.shape[1]

    # ------------------------------------------------------------------------------------------ parity
    if "parity" in sections:
        parity_b1(out, ref, fast, page, args)
    checkpoint(out, args.out)
    if "prefill" in sections:
        prefill_section(out, ref, fast, page, spec, cal, ds, device)
        checkpoint(out, args.out)
    if "decode" in sections:
        decode_section(out, ref, fast, page, spec, cal, ds, device, dtype, args, t_prompt, batches, ngram)
        checkpoint(out, args.out)
    if "parity" in sections:
        parity_b4(out, ref, fast, device, dtype, args, ngram)
        checkpoint(out, args.out)
    if "pages" in sections:
        pages_section(out, spec, cal, fast, device, dtype, args, page_batches, ngram)
        checkpoint(out, args.out)
    if "profile" in sections:
        run_profile(ref, page, device, args)
    if "ablation" in sections:
        out["ablation"] = ablation(ref, page, spec, cal, t_prompt, args.decode_steps, device,
                                   T0 + args.budget_s, [v for v in args.variants.split(",") if v] or None)
    out["engine"] = fast.engine.describe()
    out["seconds"] = time.perf_counter() - t_start
    if "decode" in sections and "prefill" in sections:
        summary(out)
    checkpoint(out, args.out)
    print(json.dumps(out, default=str, separators=(",", ":")))


def parity_b1(out, ref, fast, page, args, ngram=20):
    t0 = time.perf_counter()
    par = compare(ref, fast, page, args.parity_steps, ngram)
    par["seconds"] = time.perf_counter() - t0
    out["parity"] = {k: v for k, v in par.items() if k not in ("reference_tokens", "fast_tokens")}
    out["parity"]["tokens"] = {"reference": par["reference_tokens"][0], "fast": par["fast_tokens"][0]}
    tf = par["teacher_forced"]
    say(f"parity b1 ({args.parity_steps} greedy tokens, 2x2 page): equal={par['tokens_equal']} first divergence="
        f"{par['first_divergence']}; teacher-forced {tf['agree']}/{tf['total']}, all rounding flips="
        f"{tf['all_rounding_flips']}, max |dlogit| {tf['max_logit_abs_diff']:.4f}")


def prefill_section(out, ref, fast, page, spec, cal, ds, device):
    stages = PREFILL_STAGES
    pre = {}
    for mode, logits in (("reference", "all"), ("reference", "last"), ("fast", "last")):
        sess = ref if mode == "reference" else fast
        reps = 3 if mode == "reference" else 20
        runs = []
        for i in range(reps + 2):
            timer = StageTimer(device)
            res = sess.prefill(page, logits=logits, timer=timer)
            del res
            if i >= 2:
                runs.append(timer.totals())
        tot = [sum(r.get(s, 0.0) for s in stages) for r in runs]
        pre[f"{mode}_{logits}"] = {"total_s": med(tot), "stages_s": {s: med([r.get(s, 0.0) for r in runs])
                                                                     for s in stages}, "runs": len(runs)}
    roof = {"calibrated": prefill_roofline(spec, (2, 2), cal, "last")}
    if ds:
        roof["datasheet"] = prefill_roofline(spec, (2, 2), ds, "last")
    for key, r in pre.items():
        r["vs_roofline"] = {h: r["total_s"] / v["roofline_s"] for h, v in roof.items()}
        r["vs_compute_floor"] = {h: r["total_s"] / v["compute_floor_s"] for h, v in roof.items()}
    out["prefill"] = {"page": "gundam 2x2, 703 tokens, batch 1", "measured": pre, "roofline": roof}
    for key, r in pre.items():
        say(f"prefill {key:15s} {r['total_s'] * 1e3:8.2f} ms  (" + ", ".join(
            f"{s} {v * 1e3:.2f}" for s, v in r["stages_s"].items()) + ")  x roofline " + ", ".join(
            f"{h} {v:.2f}" for h, v in r["vs_roofline"].items()) + "; x compute floor " + ", ".join(
            f"{h} {v:.2f}" for h, v in r["vs_compute_floor"].items()))
    for h, v in roof.items():
        say(f"  roofline {h}: {v['roofline_s'] * 1e3:.2f} ms (analytic bytes {v['bytes'] / 1e9:.1f} GB), compute "
            f"floor {v['compute_floor_s'] * 1e3:.2f} ms ({v['flops'] / 1e12:.2f} TFLOP), per-row sum "
            f"{v['per_row_s'] * 1e3:.2f} ms")
    gc.collect()


def decode_section(out, ref, fast, page, spec, cal, ds, device, dtype, args, t_prompt, batches, ngram):
    out["decode"] = {}
    for b in batches:
        inputs = page if b == 1 else page_inputs((2, 2), b, 100 + b, device, dtype)
        n = args.decode_steps if b == 1 else args.batch_steps
        fast_generate_times(fast, inputs, n, ngram)  # warm-up: compiles and captures every bucket
        runs = [fast_generate_times(fast, inputs, n, ngram) for _ in range(2 if b == 1 else 1)]
        steps = [s for r in runs for s in r["step_s"]]
        tokens = sum(r["tokens"] for r in runs)
        # time per token = the loop's span over its tokens: what a user waits, launch gaps between steps included
        step = sum(r["span_s"] for r in runs) / tokens
        contexts = list(range(t_prompt + 1, t_prompt + n))
        # pure graph replays, no n-gram ban (what a serving stack's step costs)
        pre_res = fast.prefill(inputs, room=n + 8)
        token = pre_res.logits[:, -1].argmax(-1)
        cache = pre_res.cache
        for _ in range(3):
            fast.engine.decode_step(token, cache)
        timer = StageTimer(device)
        for _ in range(min(n, 64)):
            with timer.stage("step"):
                fast.engine.decode_step(token, cache)
        replay = med([s for _, s in timer.finish()])
        row = {"batch": b, "steps": tokens, "step_s_mean": step, "launches": len(steps),
               "launch_s_median": med(steps), "tokens_per_launch": tokens / len(steps),
               "replay_s_median": replay, "tokens_per_s": b / step, "context_first": contexts[0],
               "context_last": contexts[-1]}
        touched = None
        if not args.no_reference_batched or b == 1:
            kv = kv_from_fast(cache, cache.length)
            rt, touched = reference_decode_times(ref, kv, token, args.reference_steps, device,
                                                 record_routing=b > 1)
            row["reference_step_s_median"] = med(rt[1:] or rt)
            row["reference_tokens_per_s"] = b / row["reference_step_s_median"]
            del kv
        row["floor"] = {"calibrated": decode_floor(spec, b, contexts, cal)}
        if touched is not None:
            row["floor"]["calibrated_measured_routing"] = decode_floor(spec, b, contexts, cal, touched)
        if ds:
            row["floor"]["datasheet"] = decode_floor(spec, b, contexts, ds)
        f = row["floor"]["calibrated"]
        row["fast_vs_memory_floor"] = step / f["memory_floor_s"]
        row["roofline_fraction"] = f["roofline_s"] / step
        row["replay_roofline_fraction"] = f["roofline_s"] / replay
        if "reference_step_s_median" in row:
            row["reference_vs_memory_floor"] = row["reference_step_s_median"] / f["memory_floor_s"]
            row["reference_roofline_fraction"] = f["roofline_s"] / row["reference_step_s_median"]
        if touched is not None:
            row["roofline_fraction_measured_routing"] = (row["floor"]["calibrated_measured_routing"]["roofline_s"]
                                                         / step)
        out["decode"][str(b)] = row
        say(f"decode b{b:<3d} fast {step * 1e3:7.3f} ms/step ({b / step:9.0f} tok/s, replay only "
            f"{replay * 1e3:.3f} ms), floor {f['memory_floor_s'] * 1e3:.3f} ms -> x{row['fast_vs_memory_floor']:.2f},"
            f" roofline fraction {row['roofline_fraction']:.2f}" + (
                f"; reference {row['reference_step_s_median'] * 1e3:.2f} ms/step (x"
                f"{row['reference_vs_memory_floor']:.1f})" if "reference_step_s_median" in row else "") + (
                f"; touched experts/layer {touched:.1f} (uniform {f['expected_experts']:.1f})" if touched else ""))
        del inputs, pre_res, cache
        fast.engine.release(b)
        gc.collect()


def parity_b4(out, ref, fast, device, dtype, args, ngram):
    pb = page_inputs((2, 2), 4, 7, device, dtype)
    par4 = compare(ref, fast, pb, max(8, args.parity_steps // 2), ngram)
    out["parity_batch4"] = {k: v for k, v in par4.items() if k not in ("reference_tokens", "fast_tokens",
                                                                       "logits")}
    say(f"parity b4: equal={par4['tokens_equal']} first divergence={par4['first_divergence']}; teacher-forced "
        f"{par4['teacher_forced']['agree']}/{par4['teacher_forced']['total']}, all rounding flips="
        f"{par4['teacher_forced']['all_rounding_flips']}")


def pages_section(out, spec, cal, fast, device, dtype, args, page_batches, ngram):
    grid = (3, 2)
    out["pages"] = {"grid": list(grid), "output_tokens": args.page_tokens, "batches": {}}
    for b in page_batches:
        inputs = page_inputs(grid, b, 1000 + b, device, dtype)
        out["pages"]["prompt_tokens"] = int(inputs.input_ids.shape[1])
        try:
            fast_generate_times(fast, inputs, args.page_tokens, ngram)  # warm-up and captures
            r = fast_generate_times(fast, inputs, args.page_tokens, ngram)
        except torch.OutOfMemoryError as exc:
            out["pages"]["batches"][str(b)] = {"error": f"out of memory: {exc}"[:200]}
            say(f"pages b{b}: out of memory")
            fast.engine.release(b)
            continue
        pps = b / r["wall_s"]
        w = Workload(mode="gundam", crops=grid, text_tokens=10, batch=b, decode_steps=args.page_tokens,
                     logits="last")
        # this GPU's roofline (its measured ceilings, and its datasheet where a preset names it), then the H200's
        # and the paper's A100-40G for comparison
        analytic = {"calibrated": capacity_summary(spec, w, cal)}
        sheet = match_device_name(cal.name)
        if sheet is not None:
            analytic["datasheet"] = capacity_summary(spec, w, sheet)
        for key in ("h200", "a100-sxm-40gb"):
            analytic[key] = capacity_summary(spec, w, PRESETS[key])
        out["pages"]["batches"][str(b)] = {
            "wall_s": r["wall_s"], "prefill_s": r["prefill_s"], "decode_s": r["span_s"],
            "pages_per_s": pps, "pages_per_day": pps * 86400, "analytic": analytic,
            "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None}
        say(f"pages b{b:<3d} {pps:6.2f} pages/s ({pps * 86400 / 1e3:.0f}k/day): prefill {r['prefill_s']:.2f} s + "
            f"decode {r['span_s']:.2f} s; analytic this GPU {analytic['calibrated']['pages_per_s']:.2f} "
            f"(measured ceilings), H200 {analytic['h200']['pages_per_s']:.2f}, "
            f"A100-40G {analytic['a100-sxm-40gb']['pages_per_s']:.2f} pages/s "
            f"(fits {analytic['a100-sxm-40gb']['fits']})")
        del inputs
        fast.engine.release(b)
        gc.collect()
    done = {k: v for k, v in out["pages"]["batches"].items() if "pages_per_s" in v}
    if done:
        best = max(done, key=lambda k: done[k]["pages_per_s"])
        out["pages"]["best_batch"] = int(best)
        out["pages"]["best_pages_per_s"] = done[best]["pages_per_s"]
        out["pages"]["paper_a100_40g_pages_per_s"] = PAPER_PAGES_PER_DAY_A100_40G / 86400


def _kernel_table(prof, steps: int) -> tuple[str, dict]:
    """Top kernels by device time, and totals per step (kernel count, busy time)."""
    rows = []
    cuda_type = getattr(torch.autograd, "DeviceType", None)
    for e in prof.key_averages():
        if cuda_type is not None and getattr(e, "device_type", None) not in (None, cuda_type.CUDA):
            continue  # CPU-side records of Triton launches carry the kernel's time too: count kernels once
        t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
        if t and e.key and not e.key.startswith(("cuda", "aten::", "Memcpy", "Memset")) and e.count:
            rows.append((t, e.count, e.key))
    kernels = [r for r in rows if not r[2].startswith("ProfilerStep")]
    kernels.sort(reverse=True)
    total = sum(t for t, _, _ in kernels)
    n = sum(c for _, c, _ in kernels)
    lines = [f"{'us/step':>9s} {'count/step':>10s}  kernel"]
    for t, c, k in kernels[:40]:
        lines.append(f"{t / steps:9.1f} {c / steps:10.1f}  {k[:150]}")
    return "\n".join(lines), {"busy_us_per_step": total / steps, "kernels_per_step": n / steps}


def run_profile(ref: Session, page, device, args) -> None:
    """The profile section with the command line's options, into --out's folder."""
    profile(ref, page, device, Path(args.out).parent, json.loads(args.engine),
            batches=tuple(int(b) for b in args.profile_batches.split(",") if b), prefill=args.profile_prefill,
            text_tokens=args.profile_text_tokens)


def profile(ref: Session, page, device, folder: Path, engine_opts: dict, batches=(1, 64),
            prefill: bool = True, text_tokens: int = 10) -> None:
    """Kernel tables: prefill (graphs off, so kernels launch one by one) and decode steps at each of `batches`
    (compiled, graphs off; plus the graph-replay time of the same step for the launch-gap share); batched steps
    on pages of `text_tokens` prompt tokens (a longer cache: decode attention at 1-4k cached tokens). Each table
    is a file of its own and folder/profile_summary.json gains an entry per table (entries of earlier calls into
    the same folder are kept)."""
    from torch.profiler import ProfilerActivity, profile as tprofile

    folder.mkdir(parents=True, exist_ok=True)
    summary_rows = {}
    if prefill:
        eng = ref.with_mode("fast", graphs=False, **engine_opts)
        for _ in range(3):
            eng.prefill(page)
        sync(device)
        with tprofile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                eng.prefill(page)
            sync(device)
        table, tot = _kernel_table(prof, 3)
        (folder / "profile_prefill.txt").write_text(table)
        say("prefill (graphs off) " + json.dumps(tot))
        say(table[:6000])
        summary_rows["prefill"] = tot
    tag = "" if text_tokens == 10 else f"_t{text_tokens}"  # file and summary names of longer prompts
    for b in batches:
        inputs = page if b == 1 and text_tokens == 10 else page_inputs((2, 2), b, 100 + b, device,
                                                                         page.images[0][1].dtype, text_tokens)
        for graphs in (False, True):
            fs = ref.with_mode("fast", graphs=graphs, **engine_opts)
            pre = fs.prefill(inputs, room=64)
            token, cache = pre.logits[:, -1].argmax(-1), pre.cache
            for _ in range(8):
                fs.engine.decode_step(token, cache)
            sync(device)
            if graphs:
                timer = StageTimer(device)
                for _ in range(20):
                    with timer.stage("s"):
                        fs.engine.decode_step(token, cache)
                replay = med([x for _, x in timer.finish()])
                summary_rows[f"decode_b{b}{tag}"]["graph_replay_us"] = replay * 1e6
                say(f"decode b{b} graph replay {replay * 1e6:.0f} us")
            else:
                with tprofile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    for _ in range(10):
                        fs.engine.decode_step(token, cache)
                    sync(device)
                table, tot = _kernel_table(prof, 10)
                (folder / f"profile_decode_b{b}{tag}.txt").write_text(table)
                summary_rows[f"decode_b{b}{tag}"] = dict(tot, prompt_tokens=int(inputs.input_ids.shape[1]))
                say(f"decode b{b} (compiled, graphs off) " + json.dumps(tot))
                say(table[:5000])
            del fs, pre, cache
            gc.collect()
            torch.cuda.empty_cache()
    summary_path = folder / "profile_summary.json"
    earlier = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    summary_path.write_text(json.dumps({**earlier, **summary_rows}, indent=1))


VARIANTS = {  # each switches one optimisation off (or picks the other kernel), all else as in fast mode
    "eager_no_graphs": {"compile": False, "graphs": False},
    "graphs_no_compile": {"compile": False},
    "sdpa_decode_attention": {"attention": "sdpa"},
    "grouped_moe_at_batch1": {"moe": "grouped"},
    "no_pdl": {"pdl": False},
    "sam_flex": {"sam_attention": "flex"},
    "clip_unpacked": {"clip_packed": False},
    "lm_prefill_eager": {"compile_prefill": False},
    "no_vision_compile": {"compile_vision": False},
    "dense_sam_bias": {"sam_attention": "dense", "compile_vision": False},
}
PREFILL_ONLY = ("sam_flex", "clip_unpacked", "lm_prefill_eager", "no_vision_compile", "dense_sam_bias")
PREFILL_STAGES = (*get_family("deepseek-ocr").vision_stages, "prefill")  # the fast engine runs DeepSeek-OCR


def ablation(ref: Session, page, spec, cal: Hardware, t_prompt: int, steps: int, device,
             deadline: float = float("inf"), names: list[str] | None = None) -> dict:
    """Batch-1 decode step (graph replays where graphs are on) and prefill (per stage) per variant engine, with
    the prefill's last-position logits against the reference's; variants not started before `deadline`
    (perf_counter seconds) are skipped. `names`: a subset of VARIANTS ('fast' = the default engine)."""
    res = {}
    steps = min(steps, 128)
    floor = decode_floor(spec, 1, list(range(t_prompt + 1, t_prompt + steps)), cal)["memory_floor_s"]
    want = ref.prefill(page, logits="last").logits[:, -1].float()
    variants = {"fast": {}, **VARIANTS}
    for name in names or VARIANTS:
        if name not in variants:
            raise SystemExit(f"unknown variant {name!r}; choose from {', '.join(variants)}")
    for name, opts in ((n, variants[n]) for n in (names or VARIANTS)):
        if time.perf_counter() > deadline:
            res[name] = {"options": opts, "skipped": "time budget"}
            say(f"ablation {name}: skipped (time budget)")
            continue
        fast = None
        try:
            fast = ref.with_mode("fast", **opts)
            row = {"options": opts}
            if name not in PREFILL_ONLY:
                for _ in range(2):
                    pre = fast.prefill(page, room=steps + 8)
                    token, cache = pre.logits[:, -1].argmax(-1), pre.cache
                    timer = StageTimer(device)
                    for _ in range(steps):
                        with timer.stage("step"):
                            fast.engine.decode_step(token, cache)
                times = [s for _, s in timer.finish()]
                row["decode_step_s_median"] = med(times)
                row["decode_vs_floor"] = row["decode_step_s_median"] / floor
            runs = []
            for i in range(10):
                timer = StageTimer(device)
                got = fast.prefill(page, timer=timer).logits[:, -1].float()
                if i >= 2:
                    runs.append(timer.totals())
            row["prefill_s_median"] = med([sum(r.values()) for r in runs])
            row["prefill_stages_s"] = {s: med([r.get(s, 0.0) for r in runs]) for s in PREFILL_STAGES}
            row["prefill_logits_vs_reference"] = {"max_abs_diff": float((got - want).abs().max()),
                                                  "same_argmax": bool(torch.equal(got.argmax(-1),
                                                                                  want.argmax(-1)))}
            row["errors"] = {k: v for k, v in fast.engine.describe().items() if k.endswith("errors") and v}
            say(f"ablation {name:22s} " + (f"decode {row['decode_step_s_median'] * 1e3:.3f} ms/step "
                                          f"(x{row['decode_vs_floor']:.2f} floor), " if "decode_step_s_median" in row
                                          else "") + f"prefill {row['prefill_s_median'] * 1e3:.2f} ms ("
                + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in row["prefill_stages_s"].items())
                + f"); last logits vs reference max |d| {row['prefill_logits_vs_reference']['max_abs_diff']:.4f}")
        except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
            row = {"options": opts, "error": f"{type(exc).__name__}: {exc}"[:500]}
            say(f"ablation {name}: failed: {row['error']}")
        res[name] = row
        del fast
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


def summary(out: dict) -> None:
    say("")
    say(f"{'figure':44s} {'reference':>12s} {'fast':>12s} {'floor':>10s} {'ref/floor':>9s} {'fast/floor':>10s}")
    p = out["prefill"]
    r, f = p["measured"]["reference_all"], p["measured"]["fast_last"]
    for hw, roof in p["roofline"].items():  # calibrated (measured ceilings, like the decode floors), datasheet
        label = f"prefill 2x2 page, ms; {hw} roofline"
        say(f"{label:44s} {r['total_s'] * 1e3:12.2f} {f['total_s'] * 1e3:12.2f} {roof['roofline_s'] * 1e3:10.2f} "
            f"{r['total_s'] / roof['roofline_s']:9.2f} {f['total_s'] / roof['roofline_s']:10.2f}")
    for b, row in out["decode"].items():
        fl = row["floor"]["calibrated"]["memory_floor_s"]
        ref = row.get("reference_step_s_median")
        say(f"{'decode b' + b + ', ms/step':44s} {ref * 1e3 if ref else float('nan'):12.3f} "
            f"{row['step_s_mean'] * 1e3:12.3f} {fl * 1e3:10.3f} {ref / fl if ref else float('nan'):9.2f} "
            f"{row['step_s_mean'] / fl:10.2f}")
    for b, row in out["decode"].items():
        say(f"{'decode b' + b + ', tokens/s; roofline fraction':44s} "
            f"{row.get('reference_tokens_per_s', float('nan')):12.0f} {row['tokens_per_s']:12.0f} "
            f"{row['roofline_fraction']:10.2f}")
    pg = out.get("pages", {})
    if "best_batch" in pg:
        row = pg["batches"][str(pg["best_batch"])]
        say(f"pages/s (3x2 page, {pg['output_tokens']} tokens), best batch {pg['best_batch']}: "
            f"{pg['best_pages_per_s']:.2f} measured; analytic this GPU "
            f"{row['analytic']['calibrated']['pages_per_s']:.2f} (measured ceilings), H200 "
            f"{row['analytic']['h200']['pages_per_s']:.2f}, "
            f"A100-40G {row['analytic']['a100-sxm-40gb']['pages_per_s']:.2f}; paper A100-40G "
            f"{pg['paper_a100_40g_pages_per_s']:.2f}")


if __name__ == "__main__":
    main()
