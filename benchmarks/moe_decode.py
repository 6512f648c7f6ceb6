"""Batched decode steps with the two ways the fast engine can run the MoE experts outside the fused batch-1 step,
side by side on the GPU this runs on:

  grouped   routing data prepared on the device (one-hot ranks, scans, scatters), the rows permuted into expert
            order, two CUTLASS grouped GEMMs, the rows gathered back: about 23 kernels per MoE layer
  triton    fast/triton_kernels.route_rows + moe_gemv: a routing kernel, then one program per (expert, block of
            output rows) over every token that chose the expert, straight from the routing ids: 3 kernels and the
            combine, each touched expert's weights read once (expert_fusion 'separate', the engine until 2026-11-28)
  fused     the same experts with route_hidden (the routing kernel computes the router logits) and the weighted
            combine + residual in the down kernel's last programs: 3 kernels a MoE layer after the norm, where
            'triton' runs 6 (the engine's default since 2026-11-28, expert_fusion 'fused')

For each batch: the graphed step's median time (what a serving stack's step costs), the kernels per step and their
device time (torch.profiler, graphs off), and the Triton path's teacher-forced token parity with the reference
session. The fast engine's default (`gather_max_rows`) takes the Triton kernels up to the batch where they stop
winning; this benchmark is where that limit comes from.

    python benchmarks/moe_decode.py --profile data/profiles/h100.json --out out/moe_decode.json   # on a GPU
    python benchmarks/moe_decode.py --variants fused --page small --text-tokens 20 --batches 16,32,57 \
        --profile-batches 16,32,57 --profile data/profiles/h200.json \
        --routing data/routing/h200_synthetic_decode.json --out out/moe_small.json   # a short context
    python benchmarks/moe_decode.py --device cpu --quick --out /tmp/moe.json       # smoke test (tiny, no Triton)
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsocr_core.fast import triton_kernels  # noqa: E402
from dsocr_core.measure.environment import capture_environment  # noqa: E402
from dsocr_core.measure.operators import group_events  # noqa: E402
from dsocr_core.measure.token_parity import compare  # noqa: E402
from dsocr_core.model.checkpoint import synthetic_model  # noqa: E402
from dsocr_core.runtime.inputs import synthetic_inputs  # noqa: E402
from dsocr_core.runtime.session import Session  # noqa: E402
from dsocr_core.runtime.timing import StageTimer  # noqa: E402
from dsocr_core.runtime.tokenizer import load_tokenizer  # noqa: E402
from dsocr_core.spec import ModelSpec, SpecError, tiny_spec  # noqa: E402

NGRAM = 20
# the engine each variant runs (the plan the time model prices for it); the step is timed as decode_step's graph,
# which holds no greedy choice, so every variant is priced with the host's choice (its eager ops are host time,
# which predicted_step_ms leaves out), as its runs recorded
ENGINES = {name: {**opts, "batched_choice": "host"} for name, opts in (
    ("grouped", {"moe": "grouped"}), ("triton", {"moe": "triton", "expert_fusion": "separate"}),
    ("fused", {"moe": "triton", "expert_fusion": "fused"}), ("gather", {"moe": "gather"}))}
TRITON_VARIANTS = ("triton", "fused")


DEFAULT_PAGE = ("gundam", (2, 2), 10)  # (vision mode, crop grid or None, text tokens): 703 prompt tokens


def predicted_step_ms(profile_path: str, variant: str, batch: int, routing_path: str | None = None,
                      options: dict | None = None, page: tuple = DEFAULT_PAGE) -> float:
    """The time model's device time of one graphed decode step of `variant` at `batch` (pages of `page`, the
    benchmark's context): the step's prediction without its per-step host term, which a graph replay of
    decode_step does not run. Routing from `routing_path` (a routing profile), else uniform; `options`: engine
    options beside the variant's (a run's own, e.g. moe_rows 'torch' for runs from before that option)."""
    from dsocr_core.analytic import Points, evaluate
    from dsocr_core.analytic.predict import profile_hardware, with_profile
    from dsocr_core.analytic.routing import load_routing
    from dsocr_core.calibration.profile import load_profile
    from dsocr_core.engines import EngineSpec

    profile = load_profile(profile_path)
    routing = load_routing(routing_path) if routing_path else None
    engine = EngineSpec.of("fast", {**ENGINES[variant.split()[0]], **(options or {})})
    hw = with_profile(profile_hardware(profile), profile, engine, "engine", "row", routing)
    mode, grid, text = page
    pts = Points.grid(mode=mode, crops=None if grid is None else [grid], text_tokens=[text], batch=[batch],
                      decode_steps=[1], logits="last")
    d = evaluate(ModelSpec(), pts, hw)["decode"]
    return float(d["predicted_s"][0] - d["predicted_host_s"][0]) * 1e3


def inputs_for(batch: int, device, page: tuple = DEFAULT_PAGE):
    """A page per row: by default 2x2 Gundam (703 prompt tokens, the context session_speed's decode figures use)."""
    mode, grid, text = page
    one = synthetic_inputs(mode, grid or (1, 1), text_tokens=text, batch=batch, seed=100 + batch)
    return one.to(device, torch.bfloat16 if device.type == "cuda" else None)


def parse_page(text: str, text_tokens: int) -> tuple:
    """'small' or 'gundam:2x3' and the text tokens -> (mode, grid or None, text tokens); ValueError saying why."""
    from dsocr_core.registry import mode_info

    mode, _, grid = text.partition(":")
    try:
        tiled = mode_info(mode).crop_mode
    except SpecError as e:  # an unknown mode: the registry names the modes there are
        raise ValueError(f"--page: {e}") from None
    if text_tokens < 1:
        raise ValueError(f"--text-tokens must be at least 1 (it counts BOS), got {text_tokens}")
    if not grid:
        return mode, ((2, 2) if tiled else None), text_tokens
    if not tiled:
        raise ValueError(f"--page: {mode} is not a tiled mode, so it takes no grid (got {text!r})")
    try:
        w, h = (int(v) for v in grid.lower().split("x"))
    except ValueError:
        raise ValueError(f"--page: the grid is WxH (e.g. gundam:2x3), got {grid!r}") from None
    if w < 1 or h < 1:
        raise ValueError(f"--page: a grid has at least one tile each way, got {grid!r}")
    return mode, (w, h), text_tokens


def step_ms(session: Session, inputs, steps: int) -> float:
    """Median graphed decode step, after warm-up steps that compile and capture."""
    pre = session.prefill(inputs, room=steps + 16)
    token, cache = pre.logits[:, -1].argmax(-1), pre.cache
    for _ in range(3):
        session.engine.decode_step(token, cache)
    timer = StageTimer(session.device)
    for _ in range(steps):
        with timer.stage("step"):
            session.engine.decode_step(token, cache)
    return statistics.median(s for _, s in timer.finish()) * 1e3


def kernels_per_step(session: Session, inputs, steps: int = 10) -> dict:
    """Kernel launches and device time per step with graphs off (the graph replays the same kernels). On a GPU the
    kernels are the profiler's device events themselves: the Triton kernels the engine launches directly have no
    launching torch op, so a table read through the ops (measure.operators.group_events) would leave them out."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    pre = session.prefill(inputs, room=steps + 16)
    token, cache = pre.logits[:, -1].argmax(-1), pre.cache
    for _ in range(3):
        session.engine.decode_step(token, cache)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            session.engine.decode_step(token, cache)
        if session.device.type == "cuda":
            torch.cuda.synchronize()
    if session.device.type == "cuda":  # every kernel the device ran, copies and fills aside
        import pandas as pd

        rows = [{"operator": e.name, "calls": 1, "self_us": e.time_range.elapsed_us()} for e in prof.events()
                if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]
        ops = pd.DataFrame(rows, columns=["operator", "calls", "self_us"])
    else:  # the ops
        ops, _ = group_events(prof.events())
        ops = ops[ops.device == "cpu"]
    ops = ops.groupby("operator", as_index=False)[["calls", "self_us"]].sum().sort_values("self_us", ascending=False)
    experts = ops[ops.operator.str.contains("moe|grouped|cutlass", case=False)]
    return {"kernels_per_step": float(ops.calls.sum()) / steps, "busy_us_per_step": float(ops.self_us.sum()) / steps,
            "expert_kernels_us": {r.operator[:90]: round(r.self_us / steps, 1) for r in experts.itertuples()},
            "top_kernels": [{"us_per_step": round(r.self_us / steps, 1), "per_step": r.calls / steps,
                             "kernel": r.operator[:120]} for r in ops.head(40).itertuples()]}


def save(out: dict, path: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(out, indent=1, default=str))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="tiny spec, few steps (smoke test, any device)")
    ap.add_argument("--batches", default="2,4,8,16,32,64")
    ap.add_argument("--steps", type=int, default=48, help="graphed steps timed per batch and variant")
    ap.add_argument("--variants", default=None, help="comma list of grouped, triton, fused, gather (default: "
                    "grouped,triton,fused on a GPU; grouped,gather on a CPU)")
    ap.add_argument("--blocks", default=f"{triton_kernels.MOE_BLOCK_N}x{triton_kernels.MOE_BLOCK_K}",
                    help="Triton (rows x reduction) blocks to try, e.g. 16x256,32x128 (default: the engine's)")
    ap.add_argument("--profile-batches", default="8")
    ap.add_argument("--parity-batches", default="4,16")
    ap.add_argument("--parity-steps", type=int, default=32)
    ap.add_argument("--profile", help="calibration profile: print the time model's step beside each measured one")
    ap.add_argument("--routing", help="routing profile for that prediction (default: uniform)")
    ap.add_argument("--page", default="gundam:2x2", help="each row's page: MODE or MODE:WxH (a tiled mode's grid), "
                    "e.g. small (a short context: the held-out sets' largest misses) or gundam:2x2 (the default)")
    ap.add_argument("--text-tokens", type=int, default=10, help="each row's text tokens (BOS included)")
    ap.add_argument("--out", default="out/moe_decode.json")
    args = ap.parse_args(argv)
    try:
        page = parse_page(args.page, args.text_tokens)
    except ValueError as e:
        ap.error(str(e))
    if args.quick and page[1] is not None:  # the tiny smoke model's pages are one tile (inputs_for)
        page = (page[0], (1, 1), page[2])
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    variants = (args.variants or ("grouped,triton,fused" if cuda else "grouped,gather")).split(",")
    unknown = sorted(set(variants) - set(ENGINES))
    if unknown:
        ap.error(f"unknown variants {unknown}: choose from {', '.join(ENGINES)}")
    if set(variants) & set(TRITON_VARIANTS) and not (cuda and triton_kernels.HAS_TRITON):
        ap.error("the triton and fused variants need a CUDA device and Triton")
    if args.quick:
        args.steps = min(args.steps, 4)
    batches = [int(b) for b in args.batches.split(",") if b]
    blocks = [tuple(int(v) for v in b.split("x")) for b in args.blocks.split(",") if b]
    dtype = torch.bfloat16 if cuda else torch.float32
    spec = tiny_spec() if args.quick else ModelSpec()
    model = synthetic_model(spec, seed=0, dtype=dtype, device=device)
    ref = Session(model, spec, load_tokenizer(None), device, "bfloat16" if cuda else "float32",
                  {"source": "synthetic", "detail": "seed 0 (random weights)", "synthetic": True})
    out: dict = {"benchmark": "moe_decode", "quick": args.quick, "environment": capture_environment(str(device)),
                 "page": {"mode": page[0], "grid": page[1], "text_tokens": page[2]},
                 "step_ms": {}, "kernels": {}, "parity": {}}
    # in the order given (a variant's place in the run can favour it: run them both ways round to compare)
    runs = [(v, b) for v in variants for b in (blocks if v in TRITON_VARIANTS else [None])]
    engine_blocks = triton_kernels.MOE_BLOCK_N, triton_kernels.MOE_BLOCK_K
    for variant, block in runs:
        name = variant if block is None else f"{variant} {block[0]}x{block[1]}"
        if block is not None:  # read by moe_gemv when a graph is captured
            triton_kernels.MOE_BLOCK_N, triton_kernels.MOE_BLOCK_K = block
        session = ref.with_mode("fast", **ENGINES[variant])
        times = out["step_ms"][name] = {}
        for b in batches:
            inputs = inputs_for(b, device, page)
            times[str(b)] = step_ms(session, inputs, args.steps)
            print(f"{name:18s} b{b:<3d} {times[str(b)]:8.3f} ms/step", flush=True)
            if str(b) in args.profile_batches.split(","):
                out["kernels"].setdefault(name, {})[str(b)] = kernels_per_step(ref.with_mode(
                    "fast", **ENGINES[variant], graphs=False), inputs)
            if variant != "grouped" and block in (None, blocks[0]) and str(b) in args.parity_batches.split(","):
                par = compare(ref, session, inputs, args.parity_steps, NGRAM)
                tf = par.get("teacher_forced", {})
                out["parity"].setdefault(name, {})[str(b)] = {
                    "tokens_equal": par["tokens_equal"], "agree": tf.get("agree"), "total": tf.get("total"),
                    "all_rounding_flips": tf.get("all_rounding_flips"), "max_logit_abs_diff": par["max_logit_abs_diff"]}
            save(out, args.out)  # a run cut short keeps what it measured
            session.engine.release(b)
            del inputs
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        del session
        gc.collect()
    triton_kernels.MOE_BLOCK_N, triton_kernels.MOE_BLOCK_K = engine_blocks  # the engine's blocks again
    save(out, args.out)
    names = list(out["step_ms"])
    if args.profile and not args.quick:  # the tiny smoke model has no prediction to compare
        out["predicted_ms"] = {n: {str(b): predicted_step_ms(args.profile, n, b, args.routing, page=page)
                                   for b in batches} for n in names}
        out["prediction"] = {"profile": args.profile, "routing": args.routing or "uniform (assumed)"}
        save(out, args.out)
    print(f"\n{out['environment'].get('gpu_name') or 'cpu'}: ms per decode step (graphed, median of {args.steps})"
          + (" / predicted" if "predicted_ms" in out else ""))
    print(f"{'batch':>6s} " + " ".join(f"{n:>18s}" for n in names))
    for b in batches:
        cells = [f"{out['step_ms'][n][str(b)]:.3f}" + (f" / {out['predicted_ms'][n][str(b)]:.3f}"
                                                      if "predicted_ms" in out else "") for n in names]
        print(f"{b:6d} " + " ".join(f"{c:>18s}" for c in cells))
    for n, per in out["kernels"].items():
        for b, k in per.items():
            print(f"kernels {n} b{b}: {k['kernels_per_step']:.0f} per step, {k['busy_us_per_step']:.0f} us busy")
    for n, per in out["parity"].items():
        for b, p in per.items():
            print(f"parity {n} b{b}: tokens equal {p['tokens_equal']}, teacher-forced {p['agree']}/{p['total']}, "
                  f"all rounding flips {p['all_rounding_flips']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
