"""Do the prefill's routed-expert GEMMs run as fast with the groups the router really makes as with the even
groups the time model prices?

The fast engine's prefill runs each MoE layer's experts as two grouped GEMMs (fast/moe.expert_rows: gate/up,
then down) over the (token, slot) rows sorted by expert, the shared expert's slots included. The time model looks
each GEMM up in the `grouped_gemm` table, calibrated with every expert holding the same number of rows, at the mean
rows per touched expert. A router does not spread rows evenly: some experts get several times the mean. Whether
that costs time is what this measures, layer by layer, for the pages given:

1. one eager prefill of the page (graphs and the prefill's compile off, so the MoE code runs in Python) records
   every MoE layer's rows and expert ids;
2. each layer's two grouped GEMMs are timed (CUDA events, medians over repeats) on the layer's own weights with
   (a) the groups the router made, (b) the plan's groups (the touched routed experts with the mean rows each, the
   shared slots with every token), (c) every routed expert with the same rows (the table's shape);
3. it prints, per point, the sum over the layers of each, with the largest group and the touched experts.

    python benchmarks/moe_prefill_groups.py --points tiny:1x1:b4:t20,tiny:1x1:b4:t78 --out out/moe_groups.json
    python benchmarks/moe_prefill_groups.py --device cpu --quick --out /tmp/mg.json   # smoke test (tiny model)
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dsocr_core.fast import moe  # noqa: E402


@functools.cache
def _vision_kernels():
    """benchmarks/vision_kernels.py (a script beside this one, not a package), loaded once."""
    spec = importlib.util.spec_from_file_location("vision_kernels", Path(__file__).with_name("vision_kernels.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_point(text: str) -> dict:
    """mode:WxH[:bN][:tN], as benchmarks/vision_kernels.py reads it."""
    return _vision_kernels().parse_point(text)


def record_groups(session, inputs) -> list[torch.Tensor]:
    """Each MoE layer's expert ids [T, K + S] of one eager prefill (the expert_rows calls, in layer order)."""
    seen: list[torch.Tensor] = []
    real = moe.expert_rows

    def spy(x, ids, *rest, **kwargs):
        seen.append(ids.detach().clone())
        return real(x, ids, *rest, **kwargs)

    moe.expert_rows = spy
    try:
        session.prefill(inputs)
    finally:
        moe.expert_rows = real
    return seen


def plan_counts(counts: torch.Tensor, n_routed: int) -> torch.Tensor:
    """The plan's groups: the touched routed experts with the mean rows each (rounded, the total kept), the shared
    slots as they are."""
    routed, shared = counts[:n_routed], counts[n_routed:]
    touched = int((routed > 0).sum())
    total = int(routed.sum())
    even = torch.zeros_like(routed)
    if touched:
        even[:touched] = total // touched
        even[:total % touched] += 1
    return torch.cat([even, shared])


def uniform_counts(counts: torch.Tensor, n_routed: int) -> torch.Tensor:
    routed, shared = counts[:n_routed], counts[n_routed:]
    total = int(routed.sum())
    even = torch.full_like(routed, total // n_routed)
    even[:total % n_routed] += 1
    return torch.cat([even, shared])


def time_groups(counts: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, repeats: int) -> float:
    """Median seconds of the two grouped GEMMs (gate/up, then down) with these group sizes."""
    dev = w13.device
    rows = int(counts.sum())
    ends = torch.cumsum(counts.to(dev), 0, dtype=torch.int32)
    gen = torch.Generator(device=dev).manual_seed(0)
    xs = torch.randn(rows, w13.shape[2], device=dev, dtype=w13.dtype, generator=gen)
    a = torch.randn(rows, w2.shape[2], device=dev, dtype=w2.dtype, generator=gen)

    def run():
        torch._grouped_mm(xs, w13.transpose(1, 2), offs=ends)
        torch._grouped_mm(a, w2.transpose(1, 2), offs=ends)

    if dev.type != "cuda":
        import time
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    for _ in range(3):
        run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="tiny:1x1:b4:t20,tiny:1x1:b4:t78,tiny:1x1:b12:t19,base:1x1:b4")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny synthetic model, float32 (CPU smoke test)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not hasattr(torch, "_grouped_mm"):
        ap.error("this torch has no torch._grouped_mm: the fast engine's prefill does not run grouped GEMMs here")

    from dsocr_core.measure.environment import capture_environment
    from dsocr_core.runtime.inputs import synthetic_inputs
    from dsocr_core.runtime.session import Session

    try:
        points = [parse_point(p) for p in args.points.split(",") if p]
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    preset, dtype = ("tiny", "float32") if args.quick else ("full", "bfloat16")
    base = Session.load(synthetic=preset, device=args.device, dtype=dtype)
    eager = base.with_mode("fast", graphs=False, compile_prefill=False)
    n_routed = base.spec.n_routed_experts
    moe_layers = [lw for lw in eager.engine.w.layers if lw.gate is not None]
    result = {"benchmark": "moe_prefill_groups", "environment": capture_environment(args.device),
              "weights": "synthetic " + preset, "dtype": dtype, "points": []}
    for p in points:
        inputs = synthetic_inputs(p["mode"], p["grid"], text_tokens=p["text_tokens"], batch=p["batch"], seed=1,
                                  dtype=base.torch_dtype, device=base.device)
        groups = record_groups(eager, inputs)
        if len(groups) != len(moe_layers):
            raise RuntimeError(f"recorded {len(groups)} grouped calls for {len(moe_layers)} MoE layers")
        layers = []
        for ids, lw in zip(groups, moe_layers):
            counts = torch.bincount(ids.reshape(-1).cpu(), minlength=lw.w13.shape[0])
            routed = counts[:n_routed]
            layers.append({
                "rows": int(ids.shape[0]), "touched": int((routed > 0).sum()), "max_rows": int(routed.max()),
                "mean_rows": float(routed.sum()) / max(int((routed > 0).sum()), 1),
                "router_s": time_groups(counts, lw.w13, lw.w2, args.repeats),
                "plan_s": time_groups(plan_counts(counts, n_routed), lw.w13, lw.w2, args.repeats),
                "uniform_s": time_groups(uniform_counts(counts, n_routed), lw.w13, lw.w2, args.repeats)})
        row = {**p, "layers": layers, **{k: sum(lay[k] for lay in layers) for k in ("router_s", "plan_s", "uniform_s")}}
        result["points"].append(row)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str))
        first = layers[0]
        print(f"{p['mode']} {p['grid'][0]}x{p['grid'][1]} b{p['batch']} t{p['text_tokens']}: {first['rows']} tokens, "
              f"touched {min(lay['touched'] for lay in layers)}-{max(lay['touched'] for lay in layers)}, largest "
              f"group {max(lay['max_rows'] for lay in layers)} rows (mean {first['mean_rows']:.0f}); grouped GEMMs "
              f"over {len(layers)} layers: router's groups {row['router_s'] * 1e3:.3f} ms, plan's "
              f"{row['plan_s'] * 1e3:.3f} ms, even over all experts {row['uniform_s'] * 1e3:.3f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
