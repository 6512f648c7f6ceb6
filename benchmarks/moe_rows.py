"""The grouped MoE's row movement, torch's formulation against the Triton row kernels (fast/moe_rows.py).

Around its two grouped GEMMs a prefill MoE layer finds each (token, slot) row's place in expert order (the
grouping), copies each token's row to its K places, and after the GEMMs reads the expert outputs back in token
order, weights and sums them per token and adds the residual. Inside the compiled prefill layer Inductor's kernels
for these ran far longer than their bytes take on an H200 (docs/fast-mode.md). This times each step on its own:
torch's formulation eagerly (the grouping by a stable sort) and compiled with dynamic sizes as the engine compiles
its prefill layer (first on CANONICAL tokens, then at each token count; the grouping by the one-hot scan), the
Triton kernel, and the Triton kernel inside a compiled function, at several token counts and with uniform or
skewed routing, each replayed from a CUDA graph (as the engine runs them); it prints the time, the bandwidth its
bytes reach, and whether the results agree with the eager formulation (the grouping and the copy exactly; the
combine within rounding: its float32 sum's order).

    python benchmarks/moe_rows.py --tokens 244,1822,3098,14088 --out out/moe_rows.json
    python benchmarks/moe_rows.py --device cpu --quick --out /tmp/moe_rows.json     # smoke test (torch only)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from grouped_gemm_steps import graphed, median_s  # noqa: E402

from dsocr_core.fast.moe import (combine_rows, group_rows, group_rows_sorted, to_expert_order,  # noqa: E402
                                 with_shared)

CANONICAL = 1024  # tokens the dynamic compile first sees (the engine compiles its prefill layer on a canonical size)


def routing(tokens: int, experts: int, k: int, shared: int, skew: float, gen, device):
    """Expert ids [T, k + shared] (k distinct routed experts per token, drawn with probabilities proportional to
    (rank + 1) ** -skew; 0 is uniform) and float32 weights."""
    p = (torch.arange(experts, dtype=torch.float64) + 1.0) ** -skew
    ids = torch.multinomial(p.expand(tokens, experts), k, replacement=False, generator=gen).to(device)
    w = torch.rand(tokens, k, generator=gen).to(device)
    return with_shared(w / w.sum(-1, keepdim=True), ids, experts, shared)


def variants(device, compile_: bool):
    """name -> {step: callable}: the grouping (ids -> places, group ends), the copy into expert order, the combine."""
    out = {"torch eager": {"group": group_rows_sorted, "scatter": to_expert_order, "combine": combine_rows}}
    if compile_:  # the engine's compiled layer groups with the one-hot scan
        out["torch compiled"] = {"group": torch.compile(group_rows, dynamic=True),
                                 "scatter": torch.compile(to_expert_order, dynamic=True),
                                 "combine": torch.compile(combine_rows, dynamic=True)}
    from dsocr_core.fast import moe_rows
    if moe_rows.HAS_ROW_KERNELS and device.type == "cuda":
        kernels = {"group": moe_rows.group_rows, "scatter": moe_rows.scatter_rows, "combine": moe_rows.gather_combine}
        out["triton"] = kernels
        if compile_:
            out["triton compiled"] = {step: torch.compile(lambda *a, f=f: f(*a), dynamic=True)
                                      for step, f in kernels.items()}
    return out


def inputs(tokens: int, hidden: int, experts: int, k: int, shared: int, skew: float, dtype, device, gen):
    weights, ids = routing(tokens, experts, k, shared, skew, gen, device)
    dest, _ = group_rows_sorted(ids, experts + shared)
    slots = ids.shape[1]
    x = torch.randn(tokens, hidden, generator=gen).to(device, dtype)
    ys = torch.randn(tokens * slots, hidden, generator=gen).to(device, dtype)
    return x, ids, dest, weights, ys, slots


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="244,1822,3098,6000,14088")
    ap.add_argument("--skews", default="0,1.2", help="routing skews (0: uniform)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="small sizes, no compile (CPU smoke test)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    hidden, experts, k, shared = (64, 8, 2, 1) if args.quick else (1280, 64, 6, 2)
    dtype = torch.float32 if args.quick else torch.bfloat16
    cuda = device.type == "cuda"
    run = variants(device, compile_=cuda and not args.quick)
    gen = torch.Generator().manual_seed(0)
    n_experts = experts + shared
    with torch.inference_mode():
        x, ids, dest, weights, ys, slots = inputs(CANONICAL, hidden, experts, k, shared, 0.0, dtype, device, gen)
        for fns in run.values():  # the dynamic compiles see the canonical size first
            fns["group"](ids, n_experts)
            fns["scatter"](x, dest, slots)
            fns["combine"](ys, dest, weights, x)
        rows = []
        for skew in (float(s) for s in args.skews.split(",")):
            for tokens in (int(t) for t in args.tokens.split(",")):
                x, ids, dest, weights, ys, slots = inputs(tokens, hidden, experts, k, shared, skew, dtype, device,
                                                          gen)
                calls = {"group": (ids, n_experts), "scatter": (x, dest, slots), "combine": (ys, dest, weights, x)}
                want = {step: run["torch eager"][step](*a) for step, a in calls.items()}
                size = x.element_size()
                rows_ = tokens * slots
                # the grouping: ids read, places written (int64): its bytes in memory, not the one-hot work the
                # time model prices it by (fast/plan._row_kernels)
                moved = {"group": rows_ * 8 * 2 + n_experts * 4,
                         "scatter": tokens * hidden * size * (1 + slots),
                         "combine": tokens * hidden * size * (slots + 2)}
                for name, fns in run.items():
                    for step, a in calls.items():
                        fn = (lambda f=fns[step], a=a: f(*a))
                        got = fn()
                        if step == "group":  # places and ends both exact, or not
                            same = torch.equal(got[0], want[step][0]) and torch.equal(
                                got[1].to(torch.int32), want[step][1].to(torch.int32))
                            max_diff, differing = (0.0, 0.0) if same else (float("nan"), 1.0)
                        else:
                            diff = (got.float() - want[step].float()).abs()
                            max_diff, differing = float(diff.max()), float((diff > 0).float().mean())
                        timed = graphed(fn) if cuda else fn
                        s = median_s(timed, args.repeats, device)
                        rows.append({"skew": skew, "tokens": tokens, "variant": name, "step": step, "seconds": s,
                                     "gb_per_s": moved[step] / s / 1e9, "max_abs_diff": max_diff,
                                     "differing": differing})
                        print(f"skew {skew:3.1f} tokens {tokens:6d} {step:8s} {name:16s} {s * 1e6:9.1f} us "
                              f"{moved[step] / s / 1e9:7.0f} GB/s  max diff {max_diff:.2e} "
                              f"({differing * 100:.3f}% differ)", flush=True)
    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name(device) if cuda else "cpu"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "moe_rows", "environment": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
